//! Writer stage, FXT half: the Fuchsia trace format
//! (<https://fuchsia.dev/fuchsia-src/reference/tracing/trace-format>), which ui.perfetto.dev
//! and magic-trace.org open.
//!
//! In: [`TraceSink`] calls (tracks, duration begin/end, instants with args). Out: FXT records
//! streamed to any `Write`: the magic record, provider info, initialization (1 tick = 1 ns),
//! then string and thread records as names and threads first appear (their 15-bit and 8-bit
//! tables are refilled from index 1 when full), kernel-object records naming processes and
//! threads, and event records that refer to the tables.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::{self, Write};
use std::rc::Rc;

use super::{Arg, ArgValue, TraceSink};
use crate::decode::pt::flow::cache::IpHasher;

/// The magic number record: `0x0016547846040010`.
const MAGIC: u64 = 0x0016_5478_4604_0010;
const PROVIDER_ID: u64 = 1;
const PROVIDER_NAME: &str = "lookback";
/// Longest string an FXT string record or inline string can hold (the format's limit).
const MAX_STRING: usize = 32_000;
const MAX_STRING_INDEX: u16 = 0x7fff;
const MAX_THREAD_INDEX: u8 = 0xff;
/// At most this many args fit an event record's header.
const MAX_ARGS: usize = 15;
/// Slots of the recently-interned-strings cache (a power of two).
const RECENT: usize = 256;

const RECORD_METADATA: u64 = 0;
const RECORD_INITIALIZATION: u64 = 1;
const RECORD_STRING: u64 = 2;
const RECORD_THREAD: u64 = 3;
const RECORD_EVENT: u64 = 4;
const RECORD_KERNEL_OBJECT: u64 = 7;

const EVENT_INSTANT: u64 = 0;
const EVENT_BEGIN: u64 = 2;
const EVENT_END: u64 = 3;

const ARG_INT64: u64 = 3;
const ARG_UINT64: u64 = 4;
const ARG_STRING: u64 = 6;
const ARG_POINTER: u64 = 7;
const ARG_KOID: u64 = 8;

const OBJ_PROCESS: u64 = 1;
const OBJ_THREAD: u64 = 2;

/// `s` cut to at most `MAX_STRING` bytes on a character boundary.
fn clip(s: &str) -> &str {
    if s.len() <= MAX_STRING {
        return s;
    }
    let mut end = MAX_STRING;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Words (8 bytes) that `len` bytes of string data take, padded.
fn words(len: usize) -> u64 {
    len.div_ceil(8) as u64
}

/// A string interned lately, found again by the address of the caller's `&str`.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    ptr: usize,
    len: usize,
    index: u16,
    generation: u64,
}

/// The `recent` slot of `s`, by its address: names of a PT trace are shared strings, so the
/// same name comes back from the same address.
fn recent_slot(s: &str) -> usize {
    let ptr = s.as_ptr() as usize;
    ((ptr >> 3) ^ (ptr >> 11) ^ s.len()) & (RECENT - 1)
}

/// Streams FXT records to `W`.
pub struct FxtWriter<W: Write> {
    out: W,
    /// The fast hash of the decoder's block cache: a PT trace interns a name per slice.
    strings: HashMap<Rc<str>, u16, BuildHasherDefault<IpHasher>>,
    /// The string of each index of the current table (index 0: the empty string).
    texts: Vec<Rc<str>>,
    /// A cache in front of `strings`: an event interns 3–7 strings (name, category, args)
    /// and hashing them was the writer's largest cost. A hit is verified against `texts`,
    /// so a reused address never yields a wrong index.
    recent: Box<[Recent; RECENT]>,
    next_string: u16,
    /// Bumped each time the string table is refilled.
    generation: u64,
    threads: HashMap<(u32, u32), u8, BuildHasherDefault<IpHasher>>,
    next_thread: u8,
}

impl<W: Write> FxtWriter<W> {
    /// Writes the file preamble (magic, provider, 1 ns ticks).
    pub fn new(out: W) -> io::Result<Self> {
        let mut w = Self {
            out,
            strings: HashMap::default(),
            texts: vec!["".into()],
            recent: Box::new([Recent::default(); RECENT]),
            next_string: 1,
            generation: 0,
            threads: HashMap::default(),
            next_thread: 1,
        };
        w.word(MAGIC)?;
        let name = PROVIDER_NAME.as_bytes();
        let header = RECORD_METADATA
            | ((1 + words(name.len())) << 4)
            | (1 << 16) // provider info
            | (PROVIDER_ID << 20)
            | ((name.len() as u64) << 52);
        w.word(header)?;
        w.padded(name)?;
        w.word(RECORD_INITIALIZATION | (2 << 4))?;
        w.word(1_000_000_000)?;
        w.string("lookback")?;
        Ok(w)
    }

    fn word(&mut self, v: u64) -> io::Result<()> {
        self.out.write_all(&v.to_le_bytes())
    }

    fn padded(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        let pad = (8 - bytes.len() % 8) % 8;
        self.out.write_all(&[0u8; 8][..pad])
    }

    /// The string-table index of `s`, writing a string record the first time. The empty
    /// string is index 0.
    fn string(&mut self, s: &str) -> io::Result<u16> {
        let s = clip(s);
        if s.is_empty() {
            return Ok(0);
        }
        let slot = recent_slot(s);
        let hit = self.recent[slot];
        if hit.ptr == s.as_ptr() as usize
            && hit.len == s.len()
            && hit.generation == self.generation
            && self
                .texts
                .get(usize::from(hit.index))
                .is_some_and(|t| **t == *s)
        {
            return Ok(hit.index);
        }
        let remember = |w: &mut Self, index| {
            w.recent[slot] = Recent {
                ptr: s.as_ptr() as usize,
                len: s.len(),
                index,
                generation: w.generation,
            };
        };
        if let Some(&i) = self.strings.get(s) {
            remember(self, i);
            return Ok(i);
        }
        if self.next_string > MAX_STRING_INDEX {
            // Table full: start over; records after this refer to the new definitions.
            self.strings.clear();
            self.texts.truncate(1);
            self.next_string = 1;
            self.generation += 1;
        }
        let index = self.next_string;
        self.next_string += 1;
        let header = RECORD_STRING
            | ((1 + words(s.len())) << 4)
            | (u64::from(index) << 16)
            | ((s.len() as u64) << 32);
        self.word(header)?;
        self.padded(s.as_bytes())?;
        let text: Rc<str> = s.into();
        self.texts.push(Rc::clone(&text));
        self.strings.insert(text, index);
        remember(self, index);
        Ok(index)
    }

    /// The thread-table index of (pid, tid), writing a thread record the first time.
    fn thread(&mut self, pid: u32, tid: u32) -> io::Result<u8> {
        if let Some(&i) = self.threads.get(&(pid, tid)) {
            return Ok(i);
        }
        if self.next_thread == 0 {
            self.threads.clear();
            self.next_thread = 1;
        }
        let index = self.next_thread;
        self.next_thread = if index == MAX_THREAD_INDEX {
            0
        } else {
            index + 1
        };
        self.word(RECORD_THREAD | (3 << 4) | (u64::from(index) << 16))?;
        self.word(u64::from(pid))?;
        self.word(u64::from(tid))?;
        self.threads.insert((pid, tid), index);
        Ok(index)
    }

    /// Interns the names of `args` (at most [`MAX_ARGS`]), returning them with their size
    /// in words.
    fn intern_args(&mut self, args: &[Arg<'_>]) -> io::Result<([u16; MAX_ARGS], u64)> {
        let mut names = [0; MAX_ARGS];
        let mut size = 0;
        for (arg, slot) in args.iter().zip(&mut names) {
            *slot = self.string(arg.name)?;
            if let ArgValue::Str(s) = &arg.value {
                self.string(s)?;
            }
            size += if matches!(arg.value, ArgValue::Str(_)) {
                1
            } else {
                2
            };
        }
        Ok((names, size))
    }

    fn write_args(&mut self, args: &[Arg<'_>], names: &[u16]) -> io::Result<()> {
        for (arg, &name) in args.iter().zip(names) {
            let name = u64::from(name) << 16;
            match &arg.value {
                ArgValue::Str(s) => {
                    let value = u64::from(self.string(s)?);
                    self.word(ARG_STRING | (1 << 4) | name | (value << 32))?;
                }
                ArgValue::U64(v) => {
                    self.word(ARG_UINT64 | (2 << 4) | name)?;
                    self.word(*v)?;
                }
                ArgValue::I64(v) => {
                    self.word(ARG_INT64 | (2 << 4) | name)?;
                    self.word(v.cast_unsigned())?;
                }
                ArgValue::Pointer(v) => {
                    self.word(ARG_POINTER | (2 << 4) | name)?;
                    self.word(*v)?;
                }
            }
        }
        Ok(())
    }

    fn event(
        &mut self,
        kind: u64,
        (pid, tid): (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        // More args than the header holds are dropped (none of ours has that many).
        let args = &args[..args.len().min(MAX_ARGS)];
        let thread = self.thread(pid, tid)?;
        // Intern until no refill of the string table happened in between, so every index
        // this record uses is current.
        let (name, names, arg_words, category) = loop {
            let generation = self.generation;
            let name = self.string(name)?;
            let (names, arg_words) = self.intern_args(args)?;
            let category = self.string("lookback")?;
            if generation == self.generation {
                break (name, names, arg_words, category);
            }
        };
        let header = RECORD_EVENT
            | ((2 + arg_words) << 4)
            | (kind << 16)
            | ((args.len() as u64) << 20)
            | (u64::from(thread) << 24)
            | (u64::from(category) << 32)
            | (u64::from(name) << 48);
        self.word(header)?;
        self.word(ts)?;
        self.write_args(args, &names)
    }

    fn kernel_object(
        &mut self,
        kind: u64,
        koid: u64,
        name: &str,
        process: Option<u64>,
    ) -> io::Result<()> {
        let (name, arg_name) = loop {
            let generation = self.generation;
            let name = self.string(name)?;
            let arg_name = if process.is_some() {
                self.string("process")?
            } else {
                0
            };
            if generation == self.generation {
                break (name, arg_name);
            }
        };
        let nargs = u64::from(process.is_some());
        let header = RECORD_KERNEL_OBJECT
            | ((2 + 2 * nargs) << 4)
            | (kind << 16)
            | (u64::from(name) << 24)
            | (nargs << 40);
        self.word(header)?;
        self.word(koid)?;
        if let Some(pid) = process {
            self.word(ARG_KOID | (2 << 4) | (u64::from(arg_name) << 16))?;
            self.word(pid)?;
        }
        Ok(())
    }

    /// Flushes and returns the inner writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> TraceSink for FxtWriter<W> {
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        self.kernel_object(OBJ_PROCESS, u64::from(pid), name, None)
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.kernel_object(OBJ_THREAD, u64::from(tid), name, Some(u64::from(pid)))?;
        FxtWriter::thread(self, pid, tid).map(drop)
    }

    fn begin(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.event(EVENT_BEGIN, thread, ts, name, args)
    }

    fn end(&mut self, thread: (u32, u32), ts: u64, name: &str) -> io::Result<()> {
        self.event(EVENT_END, thread, ts, name, &[])
    }

    fn instant(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.event(EVENT_INSTANT, thread, ts, name, args)
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64s(bytes: &[u8]) -> Vec<u64> {
        bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn preamble_is_magic_provider_and_ns_ticks() {
        let w = FxtWriter::new(Vec::new()).unwrap();
        let words = u64s(&w.into_inner().unwrap());
        assert_eq!(words[0], MAGIC);
        assert_eq!(words[1] & 0xf, RECORD_METADATA);
        assert_eq!((words[1] >> 4) & 0xfff, 2, "header + 'lookback' (8 bytes)");
        assert_eq!(&words[2].to_le_bytes(), b"lookback");
        assert_eq!(words[3], RECORD_INITIALIZATION | (2 << 4));
        assert_eq!(words[4], 1_000_000_000);
        // The category string record.
        assert_eq!(words[5] & 0xf, RECORD_STRING);
    }

    #[test]
    fn strings_are_interned_once_and_every_record_size_is_exact() {
        let mut w = FxtWriter::new(Vec::new()).unwrap();
        let args = [
            Arg::new("address", ArgValue::Pointer(0x1234)),
            Arg::new("file", ArgValue::Str("a.c:3")),
        ];
        w.begin((1, 2), 10, "main", &args).unwrap();
        w.begin((1, 2), 11, "main", &args).unwrap();
        w.end((1, 2), 12, "main").unwrap();
        let words = u64s(&w.into_inner().unwrap());
        // Walk the records by their size field: it must land exactly on the end.
        let mut at = 1; // after the magic
        let mut strings = 0;
        let mut events = 0;
        while at < words.len() {
            let size = usize::try_from((words[at] >> 4) & 0xfff).unwrap();
            assert!(size > 0);
            match words[at] & 0xf {
                RECORD_STRING => strings += 1,
                RECORD_EVENT => events += 1,
                _ => {}
            }
            at += size;
        }
        assert_eq!(at, words.len());
        assert_eq!(events, 3);
        // lookback, main, address, file, a.c:3
        assert_eq!(strings, 5);
    }

    /// Reads back the name of every event record, resolving string references through the
    /// string records seen so far (the table as a reader keeps it).
    fn event_names(words: &[u64]) -> Vec<String> {
        let mut table = HashMap::new();
        let mut names = Vec::new();
        let mut at = 1;
        while at < words.len() {
            let h = words[at];
            let size = usize::try_from((h >> 4) & 0xfff).unwrap();
            match h & 0xf {
                RECORD_STRING => {
                    let len = usize::try_from((h >> 32) & 0x7fff).unwrap();
                    let bytes: Vec<u8> = words[at + 1..at + size]
                        .iter()
                        .flat_map(|w| w.to_le_bytes())
                        .take(len)
                        .collect();
                    table.insert((h >> 16) & 0x7fff, String::from_utf8(bytes).unwrap());
                }
                RECORD_EVENT => names.push(table[&(h >> 48)].clone()),
                _ => {}
            }
            at += size;
        }
        names
    }

    #[test]
    fn a_reused_string_buffer_with_new_text_is_a_new_string() {
        let mut w = FxtWriter::new(Vec::new()).unwrap();
        // Same address and length, different text: the recent-strings cache must not
        // answer with the first string's index.
        let mut buf = String::from("alpha");
        w.instant((1, 1), 1, &buf, &[]).unwrap();
        buf.replace_range(.., "omega");
        w.instant((1, 1), 2, &buf, &[]).unwrap();
        w.instant((1, 1), 3, &buf, &[]).unwrap();
        let copy = String::from("alpha");
        w.instant((1, 1), 4, &copy, &[]).unwrap();
        let words = u64s(&w.into_inner().unwrap());
        assert_eq!(event_names(&words), ["alpha", "omega", "omega", "alpha"]);
    }

    #[test]
    fn a_full_string_table_is_refilled_and_references_stay_right() {
        let mut w = FxtWriter::new(Vec::new()).unwrap();
        let n = 40_000;
        for i in 0..n {
            w.instant((1, 1), i, &format!("f{i}"), &[]).unwrap();
        }
        // An early name again, after the refill: defined anew.
        w.instant((1, 1), n, "f3", &[]).unwrap();
        let words = u64s(&w.into_inner().unwrap());
        let names = event_names(&words);
        assert_eq!(names.len(), 40_001);
        assert!(
            names[..40_000]
                .iter()
                .enumerate()
                .all(|(i, s)| *s == format!("f{i}"))
        );
        assert_eq!(names[40_000], "f3");
    }

    #[test]
    fn long_strings_are_clipped_on_a_char_boundary() {
        let s = "é".repeat(20_000);
        let c = clip(&s);
        assert!(c.len() <= MAX_STRING);
        assert!(s.is_char_boundary(c.len()));
    }
}
