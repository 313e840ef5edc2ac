//! The Intel PT flow layer: arbitrary trace bytes over arbitrary code bytes, decoded to
//! branch events. No panic, and decoding ends (the decoder gives up on code that loops
//! without trace). The first two bytes split the input into code and trace; the code is
//! mapped at 0x1000, where a trace's FUP or TIP may well point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lookback::decode::pt::{Branches, FlowConfig, Image};

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let split = usize::from(u16::from_le_bytes(*head)).min(rest.len());
    let (code, trace) = rest.split_at(split);
    let mut image = Image::new();
    image.add("code", code.to_vec(), 0x1000);
    let config = FlowConfig {
        tick_events: head[0] & 1 == 1,
        ..FlowConfig::default()
    };
    let mut events = 0u64;
    for _ in Branches::new(trace, &image, config) {
        events += 1;
    }
    // Each event needs trace or an instruction; instructions without trace are capped.
    assert!(events < 1 << 26, "too many events: {events}");
});
