//! The `.lbsnap` byte layout: writing (to any `Write`, or atomically to a path) and parsing
//! (from a byte slice; every length is checked against what is left before anything is
//! allocated, so truncated, foreign or hostile files are errors, never panics).

use std::{
    fs::OpenOptions,
    io::{self, BufWriter, Write},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use serde::{Serialize, de::DeserializeOwned};

use super::{Metadata, Snapshot};
use crate::capture::perf_map::PerfMap;
use crate::capture::{CodeRegion, ProcessMaps, RingData, SidebandData};

/// The first 8 bytes of every snapshot (PNG-style: a high byte and a newline catch text-mode
/// transfers).
pub const MAGIC: [u8; 8] = *b"\x89LBSNAP\n";
/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

const HEADER_LEN: usize = 24;
const SECTION_HEADER_LEN: usize = 16;
/// Descriptors are small JSON objects; anything bigger is corruption.
const MAX_DESCRIPTOR: u32 = 1 << 20;

const KIND_RING: u32 = 1;
const KIND_SIDEBAND: u32 = 2;
const KIND_MAPS: u32 = 3;
const KIND_CODE: u32 = 4;
const KIND_PERF_MAP: u32 = 5;
const KIND_END: u32 = u32::MAX;

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the snapshot")]
    Stream(#[source] io::Error),
    #[error(
        "not a lookback snapshot (starts with {found:02x?}; an .lbsnap starts with 89 4c 42 53 4e 41 50 0a)"
    )]
    NotASnapshot { found: Vec<u8> },
    #[error(
        "snapshot format version {found} is newer than this lookback reads (up to {supported}): upgrade lookback"
    )]
    NewerVersion { found: u32, supported: u32 },
    #[error("snapshot format version 0 is invalid")]
    ZeroVersion,
    #[error("snapshot truncated: {what} at byte {offset} needs {needed} bytes, {available} left")]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("bad {what} JSON at byte {offset}")]
    BadJson {
        what: &'static str,
        offset: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "section descriptor at byte {offset} is {len} bytes (more than {MAX_DESCRIPTOR}): corrupt file"
    )]
    DescriptorTooLarge { offset: u64, len: u32 },
    #[error("snapshot ends after {sections} sections without its end marker: truncated")]
    MissingEnd { sections: u64 },
    #[error("end marker counts {expected} sections but the file has {found}: corrupt file")]
    SectionCount { expected: u64, found: u64 },
    #[error("{extra} bytes after the end marker")]
    TrailingBytes { extra: u64 },
    #[error("sample_type {sample_type:#x} of the recorder {problem}: corrupt snapshot")]
    SampleType {
        sample_type: u64,
        problem: &'static str,
    },
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising these plain structs (strings, numbers, maps with string keys) cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

fn write_section(w: &mut impl Write, kind: u32, descriptor: &[u8], data: &[u8]) -> io::Result<()> {
    let desc_len = u32::try_from(descriptor.len()).map_err(io::Error::other)?;
    w.write_all(&kind.to_le_bytes())?;
    w.write_all(&desc_len.to_le_bytes())?;
    w.write_all(&(data.len() as u64).to_le_bytes())?;
    w.write_all(descriptor)?;
    w.write_all(data)
}

/// Writes `snap` to `w` in the `.lbsnap` format.
pub fn write_to(w: &mut impl Write, snap: &Snapshot) -> Result<(), SnapshotError> {
    write_all(w, snap).map_err(SnapshotError::Stream)
}

fn write_all(w: &mut impl Write, snap: &Snapshot) -> io::Result<()> {
    let meta = json(&snap.meta);
    w.write_all(&MAGIC)?;
    w.write_all(&FORMAT_VERSION.to_le_bytes())?;
    w.write_all(&0u32.to_le_bytes())?;
    w.write_all(&(meta.len() as u64).to_le_bytes())?;
    w.write_all(&meta)?;
    let mut sections = 0u64;
    for ring in &snap.rings {
        write_section(w, KIND_RING, &json(ring), &ring.data)?;
        sections += 1;
    }
    for sb in &snap.sideband {
        write_section(w, KIND_SIDEBAND, &json(sb), &sb.data)?;
        sections += 1;
    }
    for maps in &snap.maps {
        write_section(w, KIND_MAPS, &json(maps), &[])?;
        sections += 1;
    }
    for code in &snap.code {
        write_section(w, KIND_CODE, &json(code), &code.data)?;
        sections += 1;
    }
    for map in &snap.perf_maps {
        write_section(w, KIND_PERF_MAP, &json(map), &map.to_text())?;
        sections += 1;
    }
    write_section(w, KIND_END, &[], &sections.to_le_bytes())?;
    w.flush()
}

/// The snapshot as bytes.
pub fn to_bytes(snap: &Snapshot) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = write_all(&mut out, snap);
    out
}

/// Writes `snap` to `path` atomically: a temporary file (mode 0600) in the same directory,
/// synced, then renamed over `path`.
pub fn write_atomic(path: &Path, snap: &Snapshot) -> Result<(), SnapshotError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().map_or_else(
        || "snapshot".to_owned(),
        |n| n.to_string_lossy().into_owned(),
    );
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp-{}-{seq}", std::process::id()));
    let err = |source| SnapshotError::Write {
        path: tmp.clone(),
        source,
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    let mut w = BufWriter::new(file);
    let written = write_all(&mut w, snap)
        .and_then(|()| w.into_inner().map_err(io::IntoInnerError::into_error))
        .and_then(|file| file.sync_all());
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(SnapshotError::Write {
            path: tmp.clone(),
            source,
        });
    }
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        SnapshotError::Write {
            path: path.to_owned(),
            source,
        }
    })
}

/// Reads and parses the snapshot at `path`.
pub fn read(path: &Path) -> Result<Snapshot, SnapshotError> {
    let bytes = std::fs::read(path).map_err(|source| SnapshotError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&bytes)
}

/// A bounds-checked reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, what: &'static str, len: u64) -> Result<&'a [u8], SnapshotError> {
        let available = (self.bytes.len() - self.at) as u64;
        if len > available {
            return Err(SnapshotError::Truncated {
                what,
                offset: self.at as u64,
                needed: len,
                available,
            });
        }
        // `len <= available <= usize::MAX`.
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let out = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, SnapshotError> {
        let b = self.take(what, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, SnapshotError> {
        let b = self.take(what, 8)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(b);
        Ok(u64::from_le_bytes(word))
    }

    fn json<T: DeserializeOwned>(
        &mut self,
        what: &'static str,
        len: u64,
    ) -> Result<T, SnapshotError> {
        let offset = self.at as u64;
        let bytes = self.take(what, len)?;
        serde_json::from_slice(bytes).map_err(|source| SnapshotError::BadJson {
            what,
            offset,
            source,
        })
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
}

fn parse_header(c: &mut Cursor<'_>) -> Result<Metadata, SnapshotError> {
    let magic_len = c.bytes.len().min(MAGIC.len());
    if c.bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(SnapshotError::NotASnapshot {
            found: c.bytes[..magic_len].to_vec(),
        });
    }
    c.take("magic", MAGIC.len() as u64)?;
    let version = c.u32("format version")?;
    match version {
        0 => return Err(SnapshotError::ZeroVersion),
        v if v > FORMAT_VERSION => {
            return Err(SnapshotError::NewerVersion {
                found: v,
                supported: FORMAT_VERSION,
            });
        }
        _ => {}
    }
    let _flags = c.u32("header flags")?;
    let meta_len = c.u64("metadata length")?;
    debug_assert_eq!(c.at, HEADER_LEN);
    c.json("metadata", meta_len)
}

/// Bits of `perf_event_attr.sample_type` the kernel knows (below `PERF_SAMPLE_MAX`,
/// Linux 6.x: `1 << 25`).
const SAMPLE_TYPE_KNOWN: u64 = (1 << 25) - 1;

/// Refuses a sampling snapshot whose `sample_type` cannot describe its records: without
/// the IP, thread and time every sample would be skipped, and a corrupt value decoded to
/// an empty trace that looked like an idle process.
fn check_sample_type(meta: &Metadata) -> Result<(), SnapshotError> {
    use crate::capture::records::{SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME};
    if meta.backend != crate::capture::Backend::Sampling {
        return Ok(());
    }
    let sample_type = meta.recorder.sample_type;
    let problem = if sample_type & !SAMPLE_TYPE_KNOWN != 0 {
        "has bits no kernel defines"
    } else if sample_type & (SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME)
        != SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME
    {
        "lacks IP, TID or TIME, which every sample of lookback's has"
    } else {
        return Ok(());
    };
    Err(SnapshotError::SampleType {
        sample_type,
        problem,
    })
}

/// Parses a snapshot from its bytes.
pub fn parse(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    let mut c = Cursor { bytes, at: 0 };
    let meta = parse_header(&mut c)?;
    check_sample_type(&meta)?;
    let mut snap = Snapshot {
        meta,
        rings: Vec::new(),
        sideband: Vec::new(),
        maps: Vec::new(),
        code: Vec::new(),
        perf_maps: Vec::new(),
    };
    let mut sections = 0u64;
    loop {
        if c.remaining() == 0 {
            return Err(SnapshotError::MissingEnd { sections });
        }
        let offset = c.at as u64;
        if c.remaining() < SECTION_HEADER_LEN {
            c.take("section header", SECTION_HEADER_LEN as u64)?;
        }
        let kind = c.u32("section kind")?;
        let desc_len = c.u32("descriptor length")?;
        let data_len = c.u64("data length")?;
        if desc_len > MAX_DESCRIPTOR {
            return Err(SnapshotError::DescriptorTooLarge {
                offset,
                len: desc_len,
            });
        }
        let desc_len = u64::from(desc_len);
        match kind {
            KIND_END => {
                c.take("end marker", desc_len)?;
                if data_len != 8 {
                    return Err(SnapshotError::Truncated {
                        what: "end marker",
                        offset,
                        needed: 8,
                        available: data_len,
                    });
                }
                let expected = c.u64("end marker")?;
                if expected != sections {
                    return Err(SnapshotError::SectionCount {
                        expected,
                        found: sections,
                    });
                }
                if c.remaining() > 0 {
                    return Err(SnapshotError::TrailingBytes {
                        extra: c.remaining() as u64,
                    });
                }
                return Ok(snap);
            }
            KIND_RING => {
                let mut ring: RingData = c.json("ring descriptor", desc_len)?;
                ring.data = c.take("ring data", data_len)?.to_vec();
                snap.rings.push(ring);
            }
            KIND_SIDEBAND => {
                let mut sb: SidebandData = c.json("sideband descriptor", desc_len)?;
                sb.data = c.take("sideband data", data_len)?.to_vec();
                snap.sideband.push(sb);
            }
            KIND_MAPS => {
                snap.maps
                    .push(c.json::<ProcessMaps>("process maps", desc_len)?);
                c.take("process maps data", data_len)?;
            }
            KIND_CODE => {
                let mut code: CodeRegion = c.json("code descriptor", desc_len)?;
                code.data = c.take("code bytes", data_len)?.to_vec();
                snap.code.push(code);
            }
            KIND_PERF_MAP => {
                let mut map: PerfMap = c.json("perf map descriptor", desc_len)?;
                map.set_text(c.take("perf map entries", data_len)?);
                snap.perf_maps.push(map);
            }
            _ => {
                // A section kind from a newer writer: skip it.
                c.take("unknown section", desc_len.saturating_add(data_len))?;
            }
        }
        sections += 1;
    }
}
