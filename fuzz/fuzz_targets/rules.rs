//! The rules parser (YAML into validated rules) over arbitrary text: a rule set or an
//! error with a position, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lookback::rules::RuleSet;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = RuleSet::from_str(text, "fuzz.yaml");
    }
});
