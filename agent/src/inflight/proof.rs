//! Is a probed call still running? The judgement of one look at its thread.
//!
//! In: the call's entry frame (`RUNNING_TIMES`: SP at entry = `height`, the return address
//! there, the function's code `[func, func_end)`) and a look at the thread: its SP, its
//! stack from SP upwards, unwound into frames with their CFAs. Out: [`Proof`].
//!
//! Why unwinding and not the stack pointer alone: after the probed call returns, a sibling
//! called by the same caller from the same site sits at the same height with the same
//! return address. Only the frame whose CFA is `height + 8` says whose code it is; it must
//! be the probed function's.

use lookback_common::rule::RunningFrame;

use crate::unwind::CfaFrame;

/// What one look proves about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The probed function's frame, entered at the recorded height, is on the stack.
    Inside,
    /// The call is over: SP rose above its return address, or another function's frame
    /// (or no frame) is where its frame was.
    Ended,
    /// The walk stopped before the call's height: nothing is known.
    Unproven,
}

/// Judges `frame` against a look: `sp` and `stack` (the bytes from `sp` up), unwound into
/// `frames` (leaf first).
#[must_use]
pub fn judge(frame: &RunningFrame, sp: u64, stack: &[u8], frames: &[CfaFrame]) -> Proof {
    let height = frame.height;
    if sp > height {
        return Proof::Ended;
    }
    let cfa = height.wrapping_add(8);
    let Some(own) = frames.iter().find(|f| f.cfa >= cfa) else {
        return Proof::Unproven;
    };
    if own.cfa != cfa {
        return Proof::Ended; // the walk stepped over the height: no frame begins there
    }
    let lookup = if own.is_return {
        own.address.wrapping_sub(1)
    } else {
        own.address
    };
    let in_function = (frame.func..frame.func_end).contains(&lookup);
    let slot = usize::try_from(height - sp)
        .ok()
        .and_then(|at| stack.get(at..at.checked_add(8)?))
        .and_then(|word| word.try_into().ok())
        .map(u64::from_le_bytes);
    if in_function && slot == Some(frame.return_address) {
        Proof::Inside
    } else {
        Proof::Ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 0x7ffc_0000_1000;

    fn entry() -> RunningFrame {
        RunningFrame {
            height: H,
            entry_ns: 1,
            return_address: 0x40_1234,
            func: 0x40_2000,
            func_end: 0x40_2100,
        }
    }

    /// A stack copied from `sp` with the return address at `H`.
    fn stack(sp: u64, ra: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; usize::try_from(H - sp).unwrap() + 64];
        let at = usize::try_from(H - sp).unwrap();
        bytes[at..at + 8].copy_from_slice(&ra.to_le_bytes());
        bytes
    }

    fn frame(address: u64, is_return: bool, cfa: u64) -> CfaFrame {
        CfaFrame {
            address,
            is_return,
            cfa,
        }
    }

    #[test]
    fn the_probed_functions_frame_at_its_height_is_inside() {
        let sp = H - 0x200;
        let frames = [
            frame(0x7f00_0000_0100, false, H - 0x100), // a libc leaf
            frame(0x40_2050, true, H + 8),             // returns into the probed function
            frame(0x40_1234, true, H + 0x40),
        ];
        assert_eq!(
            judge(&entry(), sp, &stack(sp, 0x40_1234), &frames),
            Proof::Inside
        );
        let leaf = [frame(0x40_2010, false, H + 8)];
        assert_eq!(
            judge(&entry(), H - 8, &stack(H - 8, 0x40_1234), &leaf),
            Proof::Inside
        );
    }

    #[test]
    fn a_sibling_at_the_same_height_from_the_same_site_is_not_the_call() {
        let sp = H - 0x200;
        let frames = [
            frame(0x7f00_0000_0100, false, H - 0x100),
            frame(0x40_3050, true, H + 8), // the sibling's code
        ];
        assert_eq!(
            judge(&entry(), sp, &stack(sp, 0x40_1234), &frames),
            Proof::Ended
        );
    }

    #[test]
    fn a_return_address_just_past_the_function_is_still_its_call() {
        // A call as the function's last instruction returns to func_end.
        let frames = [frame(0x40_2100, true, H + 8)];
        assert_eq!(
            judge(&entry(), H - 64, &stack(H - 64, 0x40_1234), &frames),
            Proof::Inside
        );
    }

    #[test]
    fn sp_above_the_height_a_changed_return_slot_or_a_skipped_height_ended_it() {
        assert_eq!(judge(&entry(), H + 16, &[], &[]), Proof::Ended);
        let frames = [frame(0x40_2050, true, H + 8)];
        assert_eq!(
            judge(&entry(), H - 64, &stack(H - 64, 0x40_9999), &frames),
            Proof::Ended
        );
        let skipped = [frame(0x40_5050, true, H + 0x20)];
        assert_eq!(
            judge(&entry(), H - 64, &stack(H - 64, 0x40_1234), &skipped),
            Proof::Ended
        );
    }

    #[test]
    fn a_walk_that_stops_below_the_height_proves_nothing() {
        let frames = [frame(0x7f00_0000_0100, false, H - 0x100)];
        assert_eq!(
            judge(&entry(), H - 0x200, &stack(H - 0x200, 0x40_1234), &frames),
            Proof::Unproven
        );
        assert_eq!(judge(&entry(), H - 0x200, &[], &[]), Proof::Unproven);
    }
}
