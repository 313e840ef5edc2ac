//! Which processor wrote a trace, and the Intel PT errata that follow from it.
//!
//! In: a family/model/stepping (from the snapshot's CPUID, or `--cpu F/M[/S]`). Out:
//! [`Errata`], the workarounds the packet, timing and flow layers switch on. The table
//! follows the errata lists of Intel's specification updates (the same set libipt knows).

use std::fmt;
use std::str::FromStr;

/// An Intel processor, as CPUID family/model/stepping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cpu {
    pub family: u16,
    pub model: u8,
    pub stepping: u8,
}

/// A `--cpu` argument that is not `family/model[/stepping]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cpu must be given as family/model[/stepping], got {given:?}")]
pub struct CpuParseError {
    pub given: String,
}

/// No errata table entry for this processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown cpu {cpu}")]
pub struct UnknownCpu {
    pub cpu: Cpu,
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.family, self.model, self.stepping)
    }
}

/// Parses an integer the way C's `strtol(.., 0)` does: decimal, `0x` hex or `0` octal.
pub(crate) fn parse_c_uint(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let (digits, radix) = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (hex, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

impl FromStr for Cpu {
    type Err = CpuParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CpuParseError {
            given: s.to_owned(),
        };
        let mut parts = s.split('/');
        let family = parts.next().and_then(parse_c_uint).ok_or_else(err)?;
        let model = parts.next().and_then(parse_c_uint).ok_or_else(err)?;
        let stepping = match parts.next() {
            Some(part) => parse_c_uint(part).ok_or_else(err)?,
            None => 0,
        };
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Self {
            family: u16::try_from(family).map_err(|_| err())?,
            model: u8::try_from(model).map_err(|_| err())?,
            stepping: u8::try_from(stepping).map_err(|_| err())?,
        })
    }
}

/// Intel PT errata a decoder works around. All `false` means "decode by the spec".
#[expect(
    clippy::struct_excessive_bools,
    reason = "one independent flag per published erratum, named as Intel names them"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Errata {
    /// BDM70: PSB+ may contain packets from before the TIP.PGD.
    pub bdm70: bool,
    /// BDM64: an incorrect packet may be generated for a TSX abort.
    pub bdm64: bool,
    /// SKD007: a CYC may be split around an OVF (packet layer).
    pub skd007: bool,
    /// SKD022: VM entry may set IP/MODE packets inconsistently.
    pub skd022: bool,
    /// SKD010: FUP may be missing after an asynchronous event with TSX.
    pub skd010: bool,
    /// SKL014: a FUP from an address filter may carry a wrong IP.
    pub skl014: bool,
    /// APL12: a TIP.PGE or PSB may follow a VMX exit out of order.
    pub apl12: bool,
    /// APL11: a PSB may be missing its FUP after a trace stop.
    pub apl11: bool,
    /// SKL168: CYC packets right before a PSB may be dropped (timing calibration).
    pub skl168: bool,
    /// SKZ84: VMX TSC scaling/offsetting corrupts packets (TMA reserved bits).
    pub skz84: bool,
}

impl Errata {
    /// The errata of `cpu`, or [`UnknownCpu`] where the table has no entry.
    pub fn for_cpu(cpu: Cpu) -> Result<Self, UnknownCpu> {
        let unknown = Err(UnknownCpu { cpu });
        let mut e = Self::default();
        match (cpu.family, cpu.model) {
            (0x6, 0x3d | 0x47 | 0x4f | 0x56) => {
                e.bdm70 = true;
                e.bdm64 = true;
            }
            (0x6, 0x4e | 0x5e | 0x8e | 0x9e | 0xa5 | 0xa6) => {
                e.bdm70 = true;
                e.skd007 = true;
                e.skd022 = true;
                e.skd010 = true;
                e.skl014 = true;
                e.skl168 = true;
            }
            (0x6, 0x55 | 0x6a | 0x6c) => {
                e.bdm70 = true;
                e.skl014 = true;
                e.skd022 = true;
                e.skz84 = true;
            }
            (0x6, 0x8f | 0xcf | 0xad | 0xae) | (0x13, 0x01) => {
                e.bdm70 = true;
                e.skd022 = true;
                e.skz84 = true;
            }
            (0x6, 0x66 | 0x7d | 0x7e | 0x8c | 0x8d | 0xa7 | 0xa8) => {
                e.bdm70 = true;
                e.skl014 = true;
                e.skd022 = true;
            }
            (
                0x6,
                0x97 | 0x9a | 0xba | 0xb7 | 0xbf | 0xc5 | 0xc6 | 0xb5 | 0xaa | 0xac | 0xbd | 0xcc
                | 0xd5,
            )
            | (0x12, 0x01 | 0x03) => {
                e.bdm70 = true;
                e.skd022 = true;
                e.apl11 = true;
            }
            (0x6, 0x5c | 0x5f) => {
                e.apl12 = true;
                e.apl11 = true;
            }
            (0x6, 0x7a | 0x86 | 0x96 | 0x9c | 0xb6 | 0xaf | 0xdd) => {
                e.apl11 = true;
            }
            _ => return unknown,
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_family_model_and_optional_stepping() {
        let cpu: Cpu = "6/85".parse().unwrap();
        assert_eq!((cpu.family, cpu.model, cpu.stepping), (6, 85, 0));
        let cpu: Cpu = "0x6/0x55/3".parse().unwrap();
        assert_eq!((cpu.family, cpu.model, cpu.stepping), (6, 0x55, 3));
        assert!("6".parse::<Cpu>().is_err());
        assert!("6/".parse::<Cpu>().is_err());
        assert!("6/300".parse::<Cpu>().is_err());
        assert!("6/1/2/3".parse::<Cpu>().is_err());
    }

    #[test]
    fn skylake_server_has_skz84_and_unknown_cpus_are_errors() {
        let errata = Errata::for_cpu("6/85".parse().unwrap()).unwrap();
        assert!(errata.skz84 && !errata.skd007);
        let errata = Errata::for_cpu("6/78".parse().unwrap()).unwrap();
        assert!(errata.skd007 && errata.skl168);
        assert!(Errata::for_cpu("0/0".parse().unwrap()).is_err());
    }
}
