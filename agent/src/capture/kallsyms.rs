//! Kernel function names for `--include-kernel`: `/proc/kallsyms` read once when the
//! recorder opens, and at each freeze the functions the copied samples' kernel frames fall
//! in, which the snapshot keeps (a few hundred names, not the 120,000 lines of the file),
//! so a trace decoded later or elsewhere names them.
//!
//! In: `/proc/kallsyms` text (`ADDRESS TYPE NAME [MODULE]`). Out: [`KernelSymbol`]s. Only
//! text symbols (`t`/`T`, `w`/`W`) count; a file whose addresses are all zero
//! (`kptr_restrict`, not root) gives no symbols, and kernel frames are then `[kernel]`.

use std::{collections::BTreeSet, sync::OnceLock};

use serde::{Deserialize, Serialize};

/// One kernel function a snapshot's samples were in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSymbol {
    /// Its first byte.
    pub address: u64,
    pub name: String,
    /// The module it belongs to (`[module]` in kallsyms); `None`: the kernel image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// The kernel's text symbols, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct Kallsyms {
    symbols: Vec<KernelSymbol>,
}

impl Kallsyms {
    /// `/proc/kallsyms`, or nothing when it cannot be read.
    #[must_use]
    pub fn read() -> Self {
        std::fs::read_to_string("/proc/kallsyms")
            .map(|text| Self::parse(&text))
            .unwrap_or_default()
    }

    /// `/proc/kallsyms` as read the first time this process asked (it is ~120,000 lines:
    /// the agent's recorders and trigger writers share one copy). Modules loaded later
    /// are not in it.
    #[must_use]
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<Kallsyms> = OnceLock::new();
        SHARED.get_or_init(Self::read)
    }

    /// The text symbols of kallsyms `text`.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<KernelSymbol> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let address = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                let module = fields
                    .next()
                    .map(|m| m.trim_start_matches('[').trim_end_matches(']').to_owned());
                (address != 0 && matches!(kind, "t" | "T" | "w" | "W")).then(|| KernelSymbol {
                    address,
                    name: name.to_owned(),
                    module,
                })
            })
            .collect();
        symbols.sort_by_key(|s| s.address);
        Self { symbols }
    }

    /// Every text symbol, sorted by address.
    #[must_use]
    pub fn into_symbols(self) -> Vec<KernelSymbol> {
        self.symbols
    }

    /// Whether there are any symbols.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The function `addr` is in: the last symbol at or below it.
    #[must_use]
    pub fn lookup(&self, addr: u64) -> Option<&KernelSymbol> {
        lookup(&self.symbols, addr)
    }

    /// The functions `addrs` are in, each once, sorted by address.
    pub fn symbols_for(&self, addrs: impl IntoIterator<Item = u64>) -> Vec<KernelSymbol> {
        let starts: BTreeSet<u64> = addrs
            .into_iter()
            .filter_map(|a| self.lookup(a).map(|s| s.address))
            .collect();
        starts
            .into_iter()
            .filter_map(|start| self.lookup(start).cloned())
            .collect()
    }
}

/// The last of `sorted` (by address) at or below `addr`.
#[must_use]
pub fn lookup(sorted: &[KernelSymbol], addr: u64) -> Option<&KernelSymbol> {
    let i = sorted.partition_point(|s| s.address <= addr);
    sorted.get(i.checked_sub(1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "ffffffff81000000 T _stext\n\
                        ffffffff81001000 t do_thing\n\
                        ffffffff81002000 D some_data\n\
                        ffffffffc0a01000 t mod_fn\t[e1000]\n\
                        0000000000000000 T hidden\n";

    #[test]
    fn text_symbols_are_found_by_address_with_their_module() {
        let k = Kallsyms::parse(TEXT);
        assert_eq!(
            k.lookup(0xffff_ffff_8100_1010).map(|s| s.name.as_str()),
            Some("do_thing")
        );
        // Data symbols do not count: past do_thing is still do_thing.
        assert_eq!(
            k.lookup(0xffff_ffff_8100_2010).map(|s| s.name.as_str()),
            Some("do_thing")
        );
        let m = k.lookup(0xffff_ffff_c0a0_1004).expect("module function");
        assert_eq!(
            (m.name.as_str(), m.module.as_deref()),
            ("mod_fn", Some("e1000"))
        );
        assert!(k.lookup(0x1000).is_none());
        let used = k.symbols_for([0xffff_ffff_8100_1010, 0xffff_ffff_8100_1020, 0x5]);
        assert_eq!(used.len(), 1);
        assert!(
            Kallsyms::parse("0000000000000000 T x\n").is_empty(),
            "kptr_restrict"
        );
    }
}
