//! The Intel PT packet layer over arbitrary bytes: every packet or error, no panic, and
//! the decoder always moves forward (no unbounded loop).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lookback::decode::pt::{Errata, PacketDecoder};

fuzz_target!(|data: &[u8]| {
    let mut decoder = PacketDecoder::new(data, Errata::default());
    let mut items = 0usize;
    while decoder.next().is_some() {
        items += 1;
        // Every packet is at least one byte long; errors resync past their offset.
        assert!(
            items <= 2 * data.len() + 2,
            "packet decoder does not advance"
        );
    }
    // Syncing to every PSB must end too.
    let mut decoder = PacketDecoder::new(data, Errata::default());
    let mut syncs = 0usize;
    while decoder.sync_forward().is_ok() {
        syncs += 1;
        assert!(
            syncs <= data.len() / 16 + 1,
            "sync_forward does not advance"
        );
        if decoder.next_packet().is_none() {
            break;
        }
    }
});
