//! Field offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF programs have no CO-RE relocations, so the signal and fork programs read
//! `task_struct.tgid`/`.pid` at offsets the agent looks up here and stores in the `CONFIG`
//! map. A minimal reader: it walks the type section to find one struct's members, nothing
//! more.
use std::{fs, io, path::Path};

/// Failure to find a field offset.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("struct {0} not found in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {strukt} has no member {member} in the kernel's BTF")]
    NoMember { strukt: String, member: String },
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

/// The parsed header and the two sections we need.
pub struct Btf {
    types: Vec<u8>,
    strings: Vec<u8>,
}

struct RawType {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// For struct/union: `(name_off, type_id, offset_bits)` of each member.
    members: Vec<(u32, u32, u32)>,
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_sys_fs() -> Result<Self, BtfError> {
        Self::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Splits a little-endian BTF blob into its type and string sections.
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let u32_at = |off: usize| -> Result<u32, BtfError> {
            data.get(off..off + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(BtfError::Malformed("truncated header"))
        };
        let magic = data
            .get(0..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or(BtfError::Malformed("truncated header"))?;
        if magic != BTF_MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(4)? as usize;
        let section = |off: u32, len: u32| -> Result<Vec<u8>, BtfError> {
            let start = hdr_len
                .checked_add(off as usize)
                .ok_or(BtfError::Malformed("section offset overflow"))?;
            let end = start
                .checked_add(len as usize)
                .ok_or(BtfError::Malformed("section length overflow"))?;
            data.get(start..end)
                .map(<[u8]>::to_vec)
                .ok_or(BtfError::Malformed("section out of bounds"))
        };
        Ok(Self {
            types: section(u32_at(8)?, u32_at(12)?)?,
            strings: section(u32_at(16)?, u32_at(20)?)?,
        })
    }

    /// Byte offset of `strukt.member`, looking through anonymous struct/union members.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let types = self.all_types()?;
        let target = types
            .iter()
            .find(|t| t.kind == KIND_STRUCT && self.name(t.name_off) == Some(strukt))
            .ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        self.find_member(&types, target, member, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })
    }

    fn find_member(&self, types: &[RawType], t: &RawType, member: &str, depth: u32) -> Option<u32> {
        if depth > 8 {
            return None;
        }
        for &(name_off, type_id, offset) in &t.members {
            let bits = if t.kind_flag {
                offset & 0x00ff_ffff
            } else {
                offset
            };
            if name_off == 0 {
                // Anonymous struct/union: search inside (type ids start at 1).
                let inner = types.get((type_id as usize).checked_sub(1)?)?;
                if matches!(inner.kind, KIND_STRUCT | KIND_UNION)
                    && let Some(found) = self.find_member(types, inner, member, depth + 1)
                {
                    return Some(bits + found);
                }
            } else if self.name(name_off) == Some(member) {
                return Some(bits);
            }
        }
        None
    }

    fn name(&self, off: u32) -> Option<&str> {
        let rest = self.strings.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// Walks the type section; index `i` holds type id `i + 1`.
    fn all_types(&self) -> Result<Vec<RawType>, BtfError> {
        let d = &self.types;
        let u32_at = |off: usize| -> Result<u32, BtfError> {
            d.get(off..off + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(BtfError::Malformed("truncated type"))
        };
        let mut out = Vec::new();
        let mut pos = 0usize;
        while pos < d.len() {
            let name_off = u32_at(pos)?;
            let info = u32_at(pos + 4)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            pos += 12;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // INT, VAR, DECL_TAG
                3 => 12,          // ARRAY
                4 | 5 => {
                    for i in 0..vlen {
                        let m = pos + i * 12;
                        members.push((u32_at(m)?, u32_at(m + 4)?, u32_at(m + 8)?));
                    }
                    12 * vlen
                }
                6 | 13 => 8 * vlen,        // ENUM, FUNC_PROTO
                15 | 19 => 12 * vlen,      // DATASEC, ENUM64
                2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
                _ => return Err(BtfError::Malformed("unknown type kind")),
            };
            pos += extra;
            out.push(RawType {
                name_off,
                kind,
                kind_flag,
                members,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_task_struct_ids_in_the_running_kernel() {
        let Ok(btf) = Btf::from_sys_fs() else {
            eprintln!("skipped: /sys/kernel/btf/vmlinux not readable");
            return;
        };
        let tgid = btf.member_offset("task_struct", "tgid").expect("tgid");
        let pid = btf.member_offset("task_struct", "pid").expect("pid");
        // pid_t pid; pid_t tgid; are adjacent in every kernel since 2.6.
        assert_eq!(tgid, pid + 4, "pid at {pid}, tgid at {tgid}");
        assert!(matches!(
            btf.member_offset("task_struct", "no_such_member"),
            Err(BtfError::NoMember { .. })
        ));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(Btf::parse(&[]).is_err());
        assert!(Btf::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
        let mut blob = vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0];
        blob.extend_from_slice(&[0, 0, 0, 0, 12, 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0]);
        blob.extend_from_slice(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0x1f, 0, 0, 0, 0, 0]);
        let btf = Btf::parse(&blob).expect("sections in bounds");
        assert!(btf.member_offset("task_struct", "pid").is_err());
    }
}
