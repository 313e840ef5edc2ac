//! Decode, input side: the `perf.data` file format (`perf record` output, file and pipe
//! mode), read far enough to decode an Intel PT recording.
//!
//! In: the file's bytes. Out: a [`PerfFile`]: the events' attributes (type, config,
//! `sample_type`, ids), the kernel records in file order (whole, header included), the AUX
//! data of each `PERF_RECORD_AUXTRACE` (the trace bytes follow that record in the file),
//! `PERF_RECORD_AUXTRACE_INFO`, `PERF_RECORD_TIME_CONV`, and from the feature sections the
//! build-ids, OS release and CPU id. Sans-IO: the caller reads the file.
//!
//! Why its own reader: perf's own library is GPL C and not a crate; the layout is the
//! kernel's ABI (`perf_event_attr`, `perf_event_header`) plus perf's file header and
//! feature sections (`tools/perf/Documentation/perf.data-file-format.txt`).
//!
//! Bad input loses nothing already read: a record that runs past the end, or a size
//! smaller than its header, stops the walk with [`PerfFile::stopped`] saying where and
//! why; the records before it are kept. Only a file that is not perf.data at all (or
//! big-endian, or compressed with zstd) is an error.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

/// `PERFILE2`, little-endian.
const MAGIC: &[u8; 8] = b"PERFILE2";
/// `PERFILE2` written by a big-endian machine.
const MAGIC_BIG_ENDIAN: &[u8; 8] = b"2ELIFREP";
/// The file header's size in pipe mode (magic and size only).
const PIPE_HEADER_SIZE: u64 = 16;

const PERF_RECORD_SAMPLE: u32 = 9;
/// The last kernel record type this reader knows to carry a `sample_id_all` trailer.
const LAST_KERNEL_RECORD: u32 = 21;
const PERF_RECORD_HEADER_ATTR: u32 = 64;
const PERF_RECORD_HEADER_TRACING_DATA: u32 = 66;
const PERF_RECORD_HEADER_BUILD_ID: u32 = 67;
const PERF_RECORD_AUXTRACE_INFO: u32 = 70;
const PERF_RECORD_AUXTRACE: u32 = 71;
const PERF_RECORD_TIME_CONV: u32 = 79;
const PERF_RECORD_HEADER_FEATURE: u32 = 80;
const PERF_RECORD_COMPRESSED: u32 = 81;
const PERF_RECORD_COMPRESSED2: u32 = 83;

/// Feature bits of the file header (`HEADER_*` in perf's `header.h`).
const HEADER_BUILD_ID: u32 = 2;
const HEADER_OSRELEASE: u32 = 4;
const HEADER_CPUID: u32 = 9;

/// `perf_event_attr.flags` bit of `sample_id_all`.
const ATTR_SAMPLE_ID_ALL: u64 = 1 << 18;
/// `perf_event_attr.flags` bit of `exclude_kernel`.
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
/// `PERF_RECORD_MISC_BUILD_ID_SIZE`: the build-id's length is in byte 20 of its field.
const MISC_BUILD_ID_SIZE: u16 = 1 << 15;

/// Why a file could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PerfFileError {
    #[error("not a perf.data file (no PERFILE2 magic)")]
    NotPerfData,
    #[error("a perf.data file of a big-endian machine: not supported")]
    BigEndian,
    #[error("the perf.data header is cut short ({0} bytes)")]
    ShortHeader(usize),
    #[error("the {0} section lies outside the file")]
    BadSection(&'static str),
    #[error(
        "records compressed with zstd (perf record -z): decompress with `perf inject -i FILE -o OUT` first"
    )]
    Compressed,
}

/// One event of the recording (`perf_event_attr` and its ids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attr {
    pub kind: u32,
    pub config: u64,
    pub sample_type: u64,
    pub sample_id_all: bool,
    pub exclude_kernel: bool,
    pub ids: Vec<u64>,
}

/// One `PERF_RECORD_AUXTRACE` and the trace bytes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxChunk<'a> {
    /// Where the bytes go in the AUX area's stream.
    pub offset: u64,
    /// The mmap index (the CPU in per-CPU mode).
    pub idx: u32,
    pub tid: u32,
    /// `u32::MAX` in per-thread mode.
    pub cpu: u32,
    pub data: &'a [u8],
}

/// A kernel record (`perf_event_header` and body, trailer included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub kind: u32,
    pub misc: u16,
    /// The body after the 8-byte header.
    pub body: &'a [u8],
}

/// A `HEADER_BUILD_ID` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildId {
    pub pid: i32,
    /// Lower-case hex.
    pub build_id: String,
    pub path: String,
}

/// What a perf.data file holds, as far as decoding needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfFile<'a> {
    pub pipe: bool,
    pub attrs: Vec<Attr>,
    /// Kernel records (types 1–21), samples included, in file order.
    pub records: Vec<Record<'a>>,
    pub aux: Vec<AuxChunk<'a>>,
    /// `PERF_RECORD_AUXTRACE_INFO`: its type (1: Intel PT) and private words.
    pub auxtrace_info: Option<(u32, Vec<u64>)>,
    /// `PERF_RECORD_TIME_CONV`: `(time_shift, time_mult, time_zero)`.
    pub time_conv: Option<(u64, u64, u64)>,
    pub build_ids: Vec<BuildId>,
    /// `HEADER_OSRELEASE`.
    pub os_release: Option<String>,
    /// `HEADER_CPUID` (`GenuineIntel,6,142,10`).
    pub cpuid: Option<String>,
    /// Where and why the record walk stopped early (a corrupt or cut file).
    pub stopped: Option<(u64, String)>,
    /// Records of types this reader skips, by type.
    pub skipped: BTreeMap<u32, u64>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The bytes of a `{offset, size}` section, when inside the file.
fn section<'a>(bytes: &'a [u8], at: usize, name: &'static str) -> Result<&'a [u8], PerfFileError> {
    let (offset, size) = u64_at(bytes, at)
        .zip(u64_at(bytes, at + 8))
        .ok_or(PerfFileError::BadSection(name))?;
    let from = usize::try_from(offset).map_err(|_| PerfFileError::BadSection(name))?;
    let len = usize::try_from(size).map_err(|_| PerfFileError::BadSection(name))?;
    bytes
        .get(
            from..from
                .checked_add(len)
                .ok_or(PerfFileError::BadSection(name))?,
        )
        .ok_or(PerfFileError::BadSection(name))
}

/// The ids of a file-mode attribute: `ids_at` is its `{offset, size}` section.
fn ids_of(bytes: &[u8], ids_at: &[u8]) -> Vec<u64> {
    let range = || {
        let off = usize::try_from(u64_at(ids_at, 0)?).ok()?;
        let len = usize::try_from(u64_at(ids_at, 8)?).ok()?;
        bytes.get(off..off.checked_add(len)?)
    };
    range().map(u64s).unwrap_or_default()
}

/// A `perf_event_attr` (its first `attr.size` bytes) with `ids`.
fn attr(raw: &[u8], ids: Vec<u64>) -> Option<Attr> {
    let flags = u64_at(raw, 40)?;
    Some(Attr {
        kind: u32_at(raw, 0)?,
        config: u64_at(raw, 8)?,
        sample_type: u64_at(raw, 24)?,
        sample_id_all: flags & ATTR_SAMPLE_ID_ALL != 0,
        exclude_kernel: flags & ATTR_EXCLUDE_KERNEL != 0,
        ids,
    })
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
        .collect()
}

/// A `perf_header_string` (`u32` length, then that many bytes, NUL-padded).
fn header_string(bytes: &[u8]) -> Option<String> {
    let len = usize::try_from(u32_at(bytes, 0)?).ok()?;
    let text = bytes.get(4..4 + len)?;
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Some(String::from_utf8_lossy(&text[..end]).into_owned())
}

/// The build-id entries of a `HEADER_BUILD_ID` section (or one pipe-mode record body).
fn build_ids(mut bytes: &[u8], out: &mut Vec<BuildId>) {
    while let (Some(misc), Some(size)) = (u16_at(bytes, 4), u16_at(bytes, 6)) {
        let size = usize::from(size);
        let Some(entry) = bytes.get(8..size).filter(|_| size >= 8) else {
            return;
        };
        if let Some(id) = build_id_entry(misc, entry) {
            out.push(id);
        }
        bytes = &bytes[size..];
    }
}

/// `pid`, a 24-byte build-id field, the file name.
fn build_id_entry(misc: u16, body: &[u8]) -> Option<BuildId> {
    let pid = i32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let field = body.get(4..28)?;
    let len = if misc & MISC_BUILD_ID_SIZE != 0 {
        usize::from(field[20]).min(20)
    } else {
        20
    };
    let name = body.get(28..)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(BuildId {
        pid,
        build_id: field[..len].iter().fold(String::new(), |mut hex, b| {
            use std::fmt::Write as _;
            let _ = write!(hex, "{b:02x}");
            hex
        }),
        path: String::from_utf8_lossy(&name[..end]).into_owned(),
    })
}

impl<'a> PerfFile<'a> {
    /// Reads a perf.data file (file or pipe mode).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, PerfFileError> {
        match bytes.get(..8) {
            Some(m) if m == MAGIC => {}
            Some(m) if m == MAGIC_BIG_ENDIAN => return Err(PerfFileError::BigEndian),
            _ => return Err(PerfFileError::NotPerfData),
        }
        let size = u64_at(bytes, 8).ok_or(PerfFileError::ShortHeader(bytes.len()))?;
        let mut file = Self::default();
        if size == PIPE_HEADER_SIZE {
            file.pipe = true;
            file.walk(bytes, 16)?;
            return Ok(file);
        }
        if bytes.len() < 104 {
            return Err(PerfFileError::ShortHeader(bytes.len()));
        }
        let attr_size = usize::try_from(u64_at(bytes, 16).unwrap_or(0))
            .map_err(|_| PerfFileError::BadSection("attrs"))?;
        let attrs = section(bytes, 24, "attrs")?;
        if attr_size > 16 {
            for entry in attrs.chunks_exact(attr_size) {
                let (raw, ids_at) = entry.split_at(attr_size - 16);
                let ids = ids_of(bytes, ids_at);
                if let Some(a) = attr(raw, ids) {
                    file.attrs.push(a);
                }
            }
        }
        let data_offset = u64_at(bytes, 40).unwrap_or(0);
        let Ok(data) = section(bytes, 40, "data") else {
            // A file cut short (a recording killed, a partial copy): the records there are.
            let from = usize::try_from(data_offset)
                .ok()
                .filter(|&from| from <= bytes.len())
                .ok_or(PerfFileError::BadSection("data"))?;
            let declared = u64_at(bytes, 48).unwrap_or(0);
            let had = bytes.len() - from;
            file.walk_records(&bytes[from..], data_offset)?;
            file.stopped.get_or_insert((
                bytes.len() as u64,
                format!("the file ends {had} bytes into a data section of {declared}"),
            ));
            return Ok(file);
        };
        file.walk_records(data, data_offset)?;
        file.features(bytes, data_offset.saturating_add(data.len() as u64));
        Ok(file)
    }

    /// Pipe mode: records from `at` to the end.
    fn walk(&mut self, bytes: &'a [u8], at: usize) -> Result<(), PerfFileError> {
        self.walk_records(bytes.get(at..).unwrap_or_default(), at as u64)
    }

    /// The records of `data`, which starts at file offset `base`.
    fn walk_records(&mut self, data: &'a [u8], base: u64) -> Result<(), PerfFileError> {
        let mut at = 0usize;
        while at < data.len() {
            let stop = |why: &str| Some((base + at as u64, why.to_owned()));
            let Some(header) = data.get(at..at + 8) else {
                self.stopped = stop("a record header cut at the end of the file");
                break;
            };
            let kind = u32_at(header, 0).unwrap_or(0);
            let misc = u16_at(header, 4).unwrap_or(0);
            let size = usize::from(u16_at(header, 6).unwrap_or(0));
            if size < 8 {
                self.stopped = stop(&format!("a record of type {kind} with size {size}"));
                break;
            }
            let Some(body) = data.get(at + 8..at + size) else {
                self.stopped = stop(&format!(
                    "a record of type {kind} cut at the end of the file"
                ));
                break;
            };
            let mut next = at + size;
            match kind {
                1..=LAST_KERNEL_RECORD => self.records.push(Record { kind, misc, body }),
                PERF_RECORD_AUXTRACE => {
                    let len = u64_at(body, 0)
                        .and_then(|l| usize::try_from(l).ok())
                        .unwrap_or(usize::MAX);
                    let end = next.saturating_add(len);
                    // Data cut at the end of the file is kept: it is the oldest part.
                    let trace = data.get(next..end.min(data.len())).unwrap_or_default();
                    if end > data.len() {
                        self.stopped = stop(&format!(
                            "AUX data of {len} bytes cut after {} at the end of the file",
                            trace.len()
                        ));
                    }
                    self.aux.push(AuxChunk {
                        offset: u64_at(body, 8).unwrap_or(0),
                        idx: u32_at(body, 24).unwrap_or(0),
                        tid: u32_at(body, 28).unwrap_or(0),
                        cpu: u32_at(body, 32).unwrap_or(u32::MAX),
                        data: trace,
                    });
                    if self.stopped.is_some() {
                        break;
                    }
                    next = end;
                }
                PERF_RECORD_AUXTRACE_INFO => {
                    let kind = u32_at(body, 0).unwrap_or(0);
                    self.auxtrace_info = Some((kind, u64s(body.get(8..).unwrap_or_default())));
                }
                PERF_RECORD_TIME_CONV => {
                    self.time_conv = u64_at(body, 0)
                        .zip(u64_at(body, 8))
                        .zip(u64_at(body, 16))
                        .map(|((s, m), z)| (s, m, z));
                }
                PERF_RECORD_HEADER_ATTR => {
                    let attr_len = u32_at(body, 4).and_then(|l| usize::try_from(l).ok());
                    if let Some(a) = attr_len.and_then(|len| {
                        let raw = body.get(..len)?;
                        attr(raw, u64s(body.get(len..).unwrap_or_default()))
                    }) {
                        self.attrs.push(a);
                    }
                }
                PERF_RECORD_HEADER_BUILD_ID => {
                    if let Some(id) = build_id_entry(misc, body) {
                        self.build_ids.push(id);
                    }
                }
                PERF_RECORD_HEADER_TRACING_DATA => {
                    let len = u32_at(body, 0).and_then(|l| usize::try_from(l).ok());
                    next += len.map_or(0, |l| l.next_multiple_of(8));
                }
                PERF_RECORD_HEADER_FEATURE => {
                    let feature = u64_at(body, 0).and_then(|f| u32::try_from(f).ok());
                    if let Some(f) = feature {
                        self.feature(f, body.get(8..).unwrap_or_default());
                    }
                }
                PERF_RECORD_COMPRESSED | PERF_RECORD_COMPRESSED2 => {
                    return Err(PerfFileError::Compressed);
                }
                _ => *self.skipped.entry(kind).or_default() += 1,
            }
            at = next;
        }
        Ok(())
    }

    /// File mode: the feature sections, whose table follows the data section.
    fn features(&mut self, bytes: &'a [u8], table: u64) {
        let Ok(mut at) = usize::try_from(table) else {
            return;
        };
        for bit in 0..256u32 {
            let word = usize::try_from(bit / 64).unwrap_or(0);
            let set = u64_at(bytes, 72 + word * 8).is_some_and(|w| w & (1 << (bit % 64)) != 0);
            if !set {
                continue;
            }
            if let Ok(body) = section(bytes, at, "feature") {
                self.feature(bit, body);
            }
            at += 16;
        }
    }

    fn feature(&mut self, bit: u32, body: &[u8]) {
        match bit {
            HEADER_BUILD_ID => build_ids(body, &mut self.build_ids),
            HEADER_OSRELEASE => self.os_release = header_string(body),
            HEADER_CPUID => self.cpuid = header_string(body),
            _ => {}
        }
    }

    /// The attribute of the event with sample id `id`.
    pub fn attr_of(&self, id: u64) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.ids.contains(&id))
    }

    /// Whether `kind` is a sample (its fields follow `sample_type`, not the trailer).
    pub fn is_sample(kind: u32) -> bool {
        kind == PERF_RECORD_SAMPLE
    }
}

#[cfg(test)]
#[path = "perf_file_tests.rs"]
pub(crate) mod tests;
