//! Tests of the event layer on small hand-made traces.

use super::*;
use crate::decode::pt::events::event::EventKind;

const PSB: [u8; 16] = [
    2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82,
];

fn trace(tail: &[u8]) -> Vec<u8> {
    let mut t = PSB.to_vec();
    t.extend_from_slice(tail);
    t
}

#[test]
fn psb_with_fup_reports_enabled_then_branches() {
    // PSB, FUP 0x1000 (16-bit update), PSBEND, TNT.8 (one taken bit), TIP 0x2000.
    let t = trace(&[0x3d, 0x00, 0x10, 0x02, 0x23, 0x06, 0x2d, 0x00, 0x20]);
    let mut dec = EventDecoder::new(&t, EventConfig::default());
    dec.sync_forward().unwrap();
    let ev = dec.next_event().unwrap();
    assert_eq!(
        ev.kind,
        EventKind::Enabled {
            ip: 0x1000,
            resumed: false
        }
    );
    assert!(ev.status_update);
    assert_eq!(
        dec.next_event().unwrap().kind,
        EventKind::Tnt { bits: 1, size: 1 }
    );
    assert_eq!(
        dec.next_event().unwrap().kind,
        EventKind::Tip { ip: 0x2000 }
    );
    assert_eq!(dec.next_event(), Err(FlowError::Eos));
}

#[test]
fn tnt_while_disabled_is_an_error_and_no_psb_is_eos() {
    let t = trace(&[0x02, 0x23, 0x06]);
    let mut dec = EventDecoder::new(&t, EventConfig::default());
    dec.sync_forward().unwrap();
    let ev = dec.next_event().unwrap();
    assert_eq!(ev.kind, EventKind::Disabled { ip: 0 });
    assert_eq!(dec.next_event(), Err(FlowError::BadContext));
    let mut dec = EventDecoder::new(&[0u8; 40], EventConfig::default());
    assert_eq!(dec.sync_forward(), Err(FlowError::Eos));
}

/// A decoder over `t` (a PSB+ with an IP, then a TNT) past its first TNT event.
fn at_first_tnt(t: &[u8]) -> EventDecoder<'_> {
    let mut dec = EventDecoder::new(t, EventConfig::default());
    dec.sync_forward().unwrap();
    let enabled = dec.next_event().unwrap().kind;
    assert!(matches!(enabled, EventKind::Enabled { .. }), "{enabled:?}");
    let tnt = dec.next_event().unwrap().kind;
    assert!(matches!(tnt, EventKind::Tnt { .. }), "{tnt:?}");
    dec
}

/// Skipping a run of TNTs (the resync after an error drops their events) leaves the
/// decoder where reading them one event at a time does: the same next event (with its
/// time), position and state. Short and long TNTs with PADs between them; a timing
/// packet, a TIP or the end of the trace ends the run; while tracing is off the TNT in
/// hand stays (it is an error the decode reports), as it does when none is in hand.
#[test]
fn skipping_a_tnt_run_is_reading_its_events() {
    let long_tnt = [0x02, 0xa3, 0x5a, 0x01, 0, 0, 0, 0x10];
    let tails: Vec<Vec<u8>> = vec![
        // TIP 0x3000 after the run.
        vec![0x2d, 0x00, 0x30],
        // An MTC in the middle: the run ends there, the rest is read as it comes.
        [&[0x59, 0x07, 0x06, 0x0c][..], &[0x2d, 0x00, 0x30]].concat(),
        // A CYC, then the end of the trace.
        vec![0x0b, 0x0a],
        // The end of the trace right after the run.
        vec![],
    ];
    for (n, tail) in tails.iter().enumerate() {
        // PSB, FUP 0x1000, PSBEND, a TNT (the event in hand), then the run.
        let mut t = trace(&[0x3d, 0x00, 0x10, 0x02, 0x23, 0x0a]);
        t.extend_from_slice(&[0x0e, 0, 0, 0x06]);
        t.extend_from_slice(&long_tnt);
        t.extend_from_slice(&[0, 0x7e, 0x04]);
        t.extend_from_slice(tail);
        let mut read = at_first_tnt(&t);
        // As the resync does: past the TNT events to the next other one, skipping each
        // run (the run after the one in hand, after a timing packet) or reading it.
        let past_tnts = |dec: &mut EventDecoder<'_>, skip: bool| {
            let mut tnts = 0;
            loop {
                if skip {
                    dec.skip_tnt_run();
                }
                match dec.next_event() {
                    Ok(Event {
                        kind: EventKind::Tnt { .. },
                        ..
                    }) => tnts += 1,
                    other => break (other, tnts),
                }
            }
        };
        let mut skipped = read.clone();
        if n == 0 {
            // The whole run at once, PADs and the long TNT too: the TIP is in hand.
            let mut once = read.clone();
            once.skip_tnt_run();
            assert!(
                matches!(once.packet, Some((_, Packet::Tip(_), _))),
                "{:?}",
                once.packet
            );
        }
        let (after_skip, _) = past_tnts(&mut skipped, true);
        let (after_read, tnts) = past_tnts(&mut read, false);
        assert!(tnts >= 5, "tail {n}: {tnts} TNTs read");
        assert_eq!(after_skip, after_read, "tail {n}");
        assert_eq!(skipped.pkt.position(), read.pkt.position(), "tail {n}");
        assert_eq!(skipped.packet, read.packet, "tail {n}");
        assert_eq!(skipped.status, read.status, "tail {n}");
        assert_eq!(skipped.time, read.time, "tail {n}");
    }
    // Tracing off (a TIP.PGD after the first TNT): the TNT stays in hand, and the
    // decode reports it.
    let t = trace(&[
        0x3d, 0x00, 0x10, 0x02, 0x23, 0x0a, 0x01, 0x06, 0x06, 0x2d, 0x00, 0x30,
    ]);
    let mut dec = at_first_tnt(&t);
    assert!(matches!(
        dec.next_event().unwrap().kind,
        EventKind::Disabled { .. }
    ));
    assert!(
        matches!(dec.packet, Some((_, Packet::Tnt8(_), _))),
        "{:?}",
        dec.packet
    );
    let before = dec.pkt.position();
    dec.skip_tnt_run();
    assert_eq!(dec.pkt.position(), before);
    assert_eq!(dec.next_event(), Err(FlowError::BadContext));
}
