//! jitdump files (`jit-PID.dump`), the binary sibling of perf maps: V8 writes one with
//! `--perf-prof`, the JVM with a perf agent, and the runtime maps it executable so that
//! perf finds it in the process's maps. lookback reads the names of the code it loaded.
//!
//! In: the bytes of a jitdump file (the format of Linux's
//! `tools/perf/Documentation/jitdump-specification.txt`, version 1, little-endian). Out:
//! [`PerfMapEntry`]s in file order — one per `JIT_CODE_LOAD`, and one per `JIT_CODE_MOVE`
//! under the name its code index was loaded with — for [`super::perf_map`] to merge with
//! the perf map's lines (a later entry supersedes the earlier ones it overlaps).
//!
//! Only the names are read: the code bytes each load carries, its debug and unwinding
//! records are skipped. A record cut short (the runtime still writing it) or one whose
//! size does not fit ends the reading and is counted as malformed; the entries before it
//! are kept.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::perf_map::{MAX_NAME_BYTES, PerfMapEntry};

/// `JiTD` read as a little-endian `u32`: the file's first four bytes.
const MAGIC: u32 = 0x4A69_5444;

/// Record ids of the specification.
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
const JIT_CODE_CLOSE: u32 = 3;

/// Size of every record's prefix: id, total size, timestamp.
const RECORD_PREFIX: usize = 16;

/// Why a file is not a jitdump this reader takes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JitdumpError {
    #[error("not a jitdump file (no JiTD magic)")]
    NotJitdump,
    #[error("big-endian jitdump (only x86-64 files are read)")]
    BigEndian,
    #[error("jitdump header cut short or of size {0}")]
    Header(u32),
}

/// The code a jitdump names, in file order, and the records that could not be read.
#[derive(Debug, Default)]
pub struct Parsed {
    pub entries: Vec<PerfMapEntry>,
    pub malformed: u64,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The name at the start of `bytes` (NUL-terminated), as one line of a perf map: control
/// characters become spaces, at most [`MAX_NAME_BYTES`].
fn name_at(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0)?;
    let text = String::from_utf8_lossy(&bytes[..end]);
    let mut name: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut cut = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    (!name.is_empty()).then_some(name)
}

/// Reads the code loads and moves of the jitdump `bytes`.
///
/// # Errors
/// When the bytes do not start with a version-1-style little-endian jitdump header.
pub fn parse(bytes: &[u8]) -> Result<Parsed, JitdumpError> {
    match u32_at(bytes, 0) {
        Some(MAGIC) => {}
        Some(m) if m.swap_bytes() == MAGIC => return Err(JitdumpError::BigEndian),
        _ => return Err(JitdumpError::NotJitdump),
    }
    let header = u32_at(bytes, 8).ok_or(JitdumpError::Header(0))?;
    let mut at = usize::try_from(header).map_err(|_| JitdumpError::Header(header))?;
    if at < 40 || at > bytes.len() {
        return Err(JitdumpError::Header(header));
    }
    let mut out = Parsed::default();
    let mut names: HashMap<u64, String> = HashMap::new();
    while at < bytes.len() {
        let (Some(id), Some(size)) = (u32_at(bytes, at), u32_at(bytes, at + 4)) else {
            out.malformed += 1;
            break;
        };
        let size = size as usize;
        let Some(record) = bytes.get(at..at.saturating_add(size)) else {
            out.malformed += 1;
            break;
        };
        if size < RECORD_PREFIX {
            out.malformed += 1;
            break;
        }
        let body = &record[RECORD_PREFIX..];
        match id {
            JIT_CODE_LOAD => match load(body) {
                Some((index, entry)) => {
                    names.insert(index, entry.name.clone());
                    out.entries.push(entry);
                }
                None => out.malformed += 1,
            },
            JIT_CODE_MOVE => {
                // pid, tid, vma, old_code_addr, new_code_addr, code_size, code_index.
                let moved = (|| {
                    let start = u64_at(body, 24)?;
                    let size = u64_at(body, 32)?;
                    let name = names.get(&u64_at(body, 40)?)?.clone();
                    entry(start, size, name)
                })();
                match moved {
                    Some(entry) => out.entries.push(entry),
                    None => out.malformed += 1,
                }
            }
            JIT_CODE_CLOSE => break,
            _ => {}
        }
        at += size;
    }
    Ok(out)
}

/// A `JIT_CODE_LOAD` body: `pid`, `tid`, `vma`, `code_addr`, `code_size`, `code_index`, the name, the code.
fn load(body: &[u8]) -> Option<(u64, PerfMapEntry)> {
    let start = u64_at(body, 16)?;
    let size = u64_at(body, 24)?;
    let index = u64_at(body, 32)?;
    let name = name_at(body.get(40..)?)?;
    Some((index, entry(start, size, name)?))
}

fn entry(start: u64, size: u64, name: String) -> Option<PerfMapEntry> {
    (size > 0 && start.checked_add(size).is_some()).then_some(PerfMapEntry { start, size, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A jitdump header (40 bytes) for pid 7.
    fn header() -> Vec<u8> {
        let mut b = Vec::new();
        for v in [MAGIC, 1, 40, 62, 0, 7] {
            b.extend(v.to_le_bytes());
        }
        b.extend(0u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b
    }

    fn record(id: u32, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(id.to_le_bytes());
        b.extend(u32::try_from(body.len() + 16).expect("small").to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(body);
        b
    }

    fn load_body(addr: u64, size: u64, index: u64, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(7u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        for v in [addr, addr, size, index] {
            b.extend(v.to_le_bytes());
        }
        b.extend(name.as_bytes());
        b.push(0);
        b.extend(vec![0xcc; usize::try_from(size).expect("small")]);
        b
    }

    #[test]
    fn loads_and_moves_are_named_and_a_cut_record_is_counted() {
        let mut file = header();
        file.extend(record(
            JIT_CODE_LOAD,
            &load_body(0x1000, 0x40, 1, "JS:~f /a.js:1:1"),
        ));
        file.extend(record(2, &[0; 24])); // debug info: skipped
        let mut moved = Vec::new();
        moved.extend(7u32.to_le_bytes());
        moved.extend(7u32.to_le_bytes());
        for v in [0x1000u64, 0x1000, 0x2000, 0x40, 1] {
            moved.extend(v.to_le_bytes());
        }
        file.extend(record(JIT_CODE_MOVE, &moved));
        file.extend(record(
            JIT_CODE_LOAD,
            &load_body(0x3000, 0x10, 2, "bad\nname"),
        ));
        let mut cut = record(JIT_CODE_LOAD, &load_body(0x4000, 0x10, 3, "cut"));
        cut.truncate(30);
        file.extend(cut);
        let parsed = parse(&file).expect("a jitdump");
        let got: Vec<(u64, u64, &str)> = parsed
            .entries
            .iter()
            .map(|e| (e.start, e.size, e.name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x40, "JS:~f /a.js:1:1"),
                (0x2000, 0x40, "JS:~f /a.js:1:1"),
                (0x3000, 0x10, "bad name"),
            ]
        );
        assert_eq!(parsed.malformed, 1);
    }

    #[test]
    fn other_files_and_bad_headers_are_refused() {
        assert_eq!(parse(b"7f00 10 x\n").err(), Some(JitdumpError::NotJitdump));
        let mut big = header();
        big[..4].copy_from_slice(&MAGIC.to_be_bytes());
        assert_eq!(parse(&big).err(), Some(JitdumpError::BigEndian));
        let mut short = header();
        short[8..12].copy_from_slice(&8u32.to_le_bytes());
        assert_eq!(parse(&short).err(), Some(JitdumpError::Header(8)));
        // A zero-sized record cannot advance: counted, not looped on.
        let mut zero = header();
        zero.extend([0u8; 16]);
        assert_eq!(parse(&zero).expect("header").malformed, 1);
    }
}
