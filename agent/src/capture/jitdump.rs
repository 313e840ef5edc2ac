//! jitdump files (`jit-PID.dump`), the binary sibling of perf maps: V8 writes one with
//! `--perf-prof`, the JVM with a perf agent, and the runtime maps it executable so that
//! perf finds it in the process's maps. lookback reads the names of the code it loaded.
//!
//! In: the bytes of a jitdump file (the format of Linux's
//! `tools/perf/Documentation/jitdump-specification.txt`, version 1, little-endian), whole
//! or as it grows ([`JitdumpReader::feed`]). Out: [`JitCode`] in file order — one per
//! `JIT_CODE_LOAD`, and one per `JIT_CODE_MOVE` under the name its code index was loaded
//! with — which the perf map stage merges with the perf map's lines (a later entry
//! supersedes the earlier ones it overlaps).
//!
//! Only the names are kept: the code bytes each load carries, its debug and unwinding
//! records are skipped. A record whose size cannot be (under 16 bytes) ends the reading
//! and is counted as malformed; one not yet wholly written waits for the next feed. The
//! entries before either are kept.
#![forbid(unsafe_code)]

use std::collections::HashMap;

/// A name longer than this is cut (at a character boundary), as a perf map's.
const MAX_NAME_BYTES: usize = 1024;

/// The code one record names: `[start, start + size)` is `name`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitCode {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

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

/// A jitdump read as it grows: what its records named so far, and where reading stopped.
#[derive(Debug, Default)]
pub struct JitdumpReader {
    /// Bytes of the file read so far (the header and whole records).
    pub offset: u64,
    /// The names loads gave their code indexes (for moves).
    names: HashMap<u64, String>,
    /// The code named, in file order.
    pub entries: Vec<JitCode>,
    /// Records that could not be read.
    pub malformed: u64,
    /// `JIT_CODE_CLOSE`, or a record no reader can step over: nothing more is read.
    pub ended: bool,
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

impl JitdumpReader {
    /// Reads the whole records at the start of `bytes`, the file from [`Self::offset`] on
    /// (the header first); returns how many bytes it consumed (and adds them to
    /// [`Self::offset`]). A record not yet wholly in `bytes` is left for the next feed.
    ///
    /// # Errors
    /// When the file does not start with a little-endian jitdump header.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<usize, JitdumpError> {
        if self.ended {
            return Ok(0);
        }
        let mut at = 0;
        if self.offset == 0 {
            match header_size(bytes)? {
                Some(size) => at = size,
                None => return Ok(0),
            }
        }
        while let (Some(id), Some(size)) = (u32_at(bytes, at), u32_at(bytes, at + 4)) {
            let size = size as usize;
            if size < RECORD_PREFIX {
                self.malformed += 1;
                self.ended = true;
                break;
            }
            let Some(record) = bytes.get(at..at.saturating_add(size)) else {
                break;
            };
            self.record(id, &record[RECORD_PREFIX..]);
            at += size;
            if id == JIT_CODE_CLOSE {
                self.ended = true;
                break;
            }
        }
        self.offset += at as u64;
        Ok(at)
    }

    fn record(&mut self, id: u32, body: &[u8]) {
        match id {
            JIT_CODE_LOAD => match load(body) {
                Some((index, code)) => {
                    self.names.insert(index, code.name.clone());
                    self.entries.push(code);
                }
                None => self.malformed += 1,
            },
            JIT_CODE_MOVE => {
                // pid, tid, vma, old_code_addr, new_code_addr, code_size, code_index.
                let moved = (|| {
                    let start = u64_at(body, 24)?;
                    let size = u64_at(body, 32)?;
                    let name = self.names.get(&u64_at(body, 40)?)?.clone();
                    code(start, size, name)
                })();
                match moved {
                    Some(code) => self.entries.push(code),
                    None => self.malformed += 1,
                }
            }
            _ => {}
        }
    }
}

/// The size of the jitdump header at the start of `bytes`; `None` while it is not all
/// there.
fn header_size(bytes: &[u8]) -> Result<Option<usize>, JitdumpError> {
    match u32_at(bytes, 0) {
        Some(MAGIC) => {}
        Some(m) if m.swap_bytes() == MAGIC => return Err(JitdumpError::BigEndian),
        Some(_) => return Err(JitdumpError::NotJitdump),
        None => return Ok(None),
    }
    let Some(size) = u32_at(bytes, 8) else {
        return Ok(None);
    };
    let at = usize::try_from(size).map_err(|_| JitdumpError::Header(size))?;
    if at < 40 {
        return Err(JitdumpError::Header(size));
    }
    Ok((at <= bytes.len()).then_some(at))
}

/// Reads the code loads and moves of the whole jitdump `bytes`; a record cut short at
/// its end is counted as malformed.
///
/// # Errors
/// When the bytes do not start with a little-endian jitdump header (or are shorter).
pub fn parse(bytes: &[u8]) -> Result<JitdumpReader, JitdumpError> {
    let mut reader = JitdumpReader::default();
    let used = reader.feed(bytes)?;
    if reader.offset == 0 {
        return Err(JitdumpError::Header(0));
    }
    if used < bytes.len() && !reader.ended {
        reader.malformed += 1;
    }
    Ok(reader)
}

/// A `JIT_CODE_LOAD` body: `pid`, `tid`, `vma`, `code_addr`, `code_size`, `code_index`, the name, the code.
fn load(body: &[u8]) -> Option<(u64, JitCode)> {
    let start = u64_at(body, 16)?;
    let size = u64_at(body, 24)?;
    let index = u64_at(body, 32)?;
    let name = name_at(body.get(40..)?)?;
    Some((index, code(start, size, name)?))
}

fn code(start: u64, size: u64, name: String) -> Option<JitCode> {
    (size > 0 && start.checked_add(size).is_some()).then_some(JitCode { start, size, name })
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
        for v in [0xdead_0000, addr, size, index] {
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
        for v in [0xdead_0000u64, 0x1000, 0x2000, 0x40, 1] {
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
        assert_eq!(parse(&header()[..20]).err(), Some(JitdumpError::Header(0)));
        // A zero-sized record cannot advance: counted, not looped on.
        let mut zero = header();
        zero.extend([0u8; 16]);
        assert_eq!(parse(&zero).expect("header").malformed, 1);
    }

    #[test]
    fn a_growing_file_is_read_in_whole_records_each_once() {
        let mut file = header();
        file.extend(record(JIT_CODE_LOAD, &load_body(0x1000, 0x40, 1, "first")));
        let second = record(JIT_CODE_LOAD, &load_body(0x2000, 0x40, 2, "second"));
        let cut = file.len() + second.len() / 2;
        file.extend(second);
        let mut reader = JitdumpReader::default();
        // The header alone is not read until it is whole.
        assert_eq!(reader.feed(&file[..30]), Ok(0));
        // Half of the second record: left for later, not counted.
        let used = reader.feed(&file[..cut]).expect("a jitdump");
        assert_eq!((reader.entries.len(), reader.malformed), (1, 0));
        let rest = &file[used..];
        reader.feed(rest).expect("more");
        let names: Vec<&str> = reader.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
        assert_eq!(reader.offset, file.len() as u64);
    }
}
