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
