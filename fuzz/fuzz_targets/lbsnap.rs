//! The `.lbsnap` reader over arbitrary bytes: a snapshot or an error, never a panic, and
//! memory bounded by the input (lengths in the file are checked before allocating).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = lookback::snapshot::parse(data) {
        // What parses must write back out.
        let _ = lookback::snapshot::to_bytes(&snapshot);
    }
});
