//! Finding PSB packets, the points where an Intel PT trace can be entered.
//!
//! In: trace bytes and a start offset. Out: the offset of the next PSB. The search is
//! libipt's (so tools agree on where decoding resumes): look at 8-byte aligned words for
//! the PSB's `02 82` pattern, walk to the end of that run of pattern bytes and take the
//! 16 bytes before it. Runs already looked at are skipped, so the search is linear.

/// A PSB is `02 82` repeated eight times.
pub const PSB_LEN: usize = 16;

const PSB_HI: u8 = 0x02;
const PSB_LO: u8 = 0x82;

/// Whether `bytes` starts with a complete PSB.
pub fn is_psb(bytes: &[u8]) -> bool {
    bytes.len() >= PSB_LEN
        && bytes[..PSB_LEN]
            .chunks_exact(2)
            .all(|pair| pair == [PSB_HI, PSB_LO])
}

/// An 8-byte word of PSB payload, in either phase.
fn is_pattern_word(word: &[u8]) -> bool {
    let phase_a = word.chunks_exact(2).all(|pair| pair == [PSB_HI, PSB_LO]);
    let phase_b = word.chunks_exact(2).all(|pair| pair == [PSB_LO, PSB_HI]);
    word.len() == 8 && (phase_a || phase_b)
}

/// From a pattern word at `at`, walks to the end of the run of `02 82` pairs. Returns the
/// PSB that ends there, if the 16 bytes before the end are one, and the end of the run.
fn psb_before_run_end(trace: &[u8], at: usize) -> (Option<usize>, usize) {
    let mut pos = at;
    if trace.get(pos) != Some(&PSB_HI) {
        pos += 1;
    }
    while trace.get(pos) == Some(&PSB_HI) && trace.get(pos + 1) == Some(&PSB_LO) {
        pos += 2;
    }
    let psb = pos
        .checked_sub(PSB_LEN)
        .filter(|&start| trace.get(start..).is_some_and(is_psb));
    (psb, pos)
}

fn align_up(offset: usize) -> usize {
    offset.div_ceil(8).saturating_mul(8)
}

/// The first PSB starting at or after `start`, as libipt's `pt_sync_forward` finds it.
///
/// A PSB that starts before `start` but reaches past it is not found. Of two PSBs back to
/// back, the later one is found (the search walks to the end of the pattern run). `None`
/// when there is none up to the end of the trace.
pub fn find_psb_forward(trace: &[u8], start: usize) -> Option<usize> {
    if start > trace.len() {
        return None;
    }
    let mut pos = align_up(start);
    loop {
        let current = pos;
        let end = current.checked_add(8)?;
        let word = trace.get(current..end)?;
        pos = end;
        if !is_pattern_word(word) {
            continue;
        }
        let (psb, run_end) = psb_before_run_end(trace, current);
        if let Some(psb) = psb
            && psb >= start
        {
            return Some(psb);
        }
        // Every later word inside the same run ends at the same place: skip them.
        pos = pos.max(align_up(run_end.saturating_sub(7)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSB: [u8; 16] = [
        2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82,
    ];

    #[test]
    fn finds_psb_at_any_alignment() {
        for lead in 0..20 {
            let mut trace = vec![0u8; lead];
            trace.extend_from_slice(&PSB);
            trace.extend_from_slice(&[0x02, 0x23]);
            assert_eq!(find_psb_forward(&trace, 0), Some(lead), "lead {lead}");
        }
    }

    #[test]
    fn no_psb_in_short_or_patternless_traces() {
        assert_eq!(find_psb_forward(&[], 0), None);
        assert_eq!(find_psb_forward(&PSB[..15], 0), None);
        assert_eq!(find_psb_forward(&[0x99; 100], 0), None);
        assert_eq!(find_psb_forward(&PSB, 17), None);
    }

    #[test]
    fn skips_a_psb_before_start() {
        let mut trace = PSB.to_vec();
        trace.extend_from_slice(&[0; 5]);
        trace.extend_from_slice(&PSB);
        assert_eq!(find_psb_forward(&trace, 0), Some(0));
        assert_eq!(find_psb_forward(&trace, 1), Some(21));
    }

    #[test]
    fn of_back_to_back_psbs_the_later_is_found_as_libipt_does() {
        let trace = [PSB, PSB].concat();
        assert_eq!(find_psb_forward(&trace, 0), Some(16));
    }

    #[test]
    fn a_long_run_of_pattern_bytes_is_linear_and_ends_in_a_psb() {
        let trace: Vec<u8> = PSB.iter().copied().cycle().take(1 << 20).collect();
        // The run's last 16 bytes form the PSB libipt reports.
        assert_eq!(find_psb_forward(&trace, 0), Some((1 << 20) - 16));
        assert_eq!(find_psb_forward(&trace, (1 << 20) - 15), None);
    }
}
