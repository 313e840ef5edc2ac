//! The unwind sections of one ELF image, and where a process mapped it.
//!
//! In: a file path or an embedded image (`[vdso]`), and a process's maps. Out: framehop
//! [`Module`]s: the image's `.eh_frame`, `.eh_frame_hdr`, `.debug_frame`, `.text` and the
//! `.got` range, placed at the process's load bias. Only those sections are read (through
//! a read cache, not the whole file): a Go or Chrome binary is hundreds of MB, its CFI a
//! few.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use framehop::{ExplicitModuleSectionInfo, Module};
use object::{Object as _, ObjectSection as _, ReadCache};

use crate::capture::{MapEntry, ProcessMaps};
use crate::elf::segments::Segments;

/// Where a process mapped an image: its first executable mapping, and the range of all
/// its mappings (framehop finds the module of an address by it).
#[derive(Debug, Clone)]
pub struct Placement<'a> {
    pub entry: &'a MapEntry,
    pub avma: Range<u64>,
}

/// One placement per mapped file or `[vdso]` with executable code, in map order.
pub fn placements(maps: &ProcessMaps) -> Vec<Placement<'_>> {
    let mut out: Vec<Placement<'_>> = Vec::new();
    for entry in maps.maps.iter().filter(|m| m.executable()) {
        if !(entry.is_file() || entry.path == "[vdso]")
            || out.iter().any(|p| p.entry.path == entry.path)
        {
            continue;
        }
        let same = maps
            .maps
            .iter()
            .filter(|m| m.path == entry.path && m.inode == entry.inode);
        let (start, end) = same.fold((entry.start, entry.end), |(lo, hi), m| {
            (lo.min(m.start), hi.max(m.end))
        });
        out.push(Placement {
            entry,
            avma: start..end,
        });
    }
    out
}

/// Section `name` of `file`, decompressed.
fn section_of<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    name: &str,
) -> Option<Section> {
    let s = file.section_by_name(name)?;
    let data = s.uncompressed_data().ok()?;
    Some(Section {
        svma: s.address()..s.address().saturating_add(s.size()),
        data: Arc::from(&*data),
    })
}

/// A section's stated address range and bytes.
#[derive(Debug, Clone)]
struct Section {
    svma: Range<u64>,
    data: Arc<[u8]>,
}

/// The sections of one image that unwinding reads.
#[derive(Debug)]
pub struct UnwindSections {
    segments: Segments,
    text: Option<Section>,
    eh_frame: Option<Section>,
    eh_frame_hdr: Option<Section>,
    debug_frame: Option<Section>,
    got: Option<Range<u64>>,
    /// Bytes of code each CFI section describes: framehop reads one of them (`.eh_frame`
    /// when there is one), so the one that covers more is the one it is given.
    eh_frame_covers: u64,
    debug_frame_covers: u64,
}

impl UnwindSections {
    /// The sections of the ELF file at `path`, CFI or not (see [`Self::has_cfi`]); `None`
    /// when it cannot be read or parsed.
    pub fn read_file(path: &Path) -> Option<Self> {
        let file = File::open(path).ok()?;
        let cache = ReadCache::new(file);
        Some(Self::sections_of(&object::File::parse(&cache).ok()?))
    }

    /// The sections of an ELF image in memory (embedded `[vdso]`); `None` when it does
    /// not parse or has no CFI.
    pub fn parse(image: &[u8]) -> Option<Self> {
        let sections = Self::sections_of(&object::File::parse(image).ok()?);
        sections.has_cfi().then_some(sections)
    }

    /// Whether it has a CFI section (without, frame pointers are all there is, without a
    /// module).
    pub fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// Whether the image's own CFI describes less than half of its `.text`: built without
    /// unwind tables (`-fno-asynchronous-unwind-tables`), its `.eh_frame` holding only the C
    /// runtime's `_start` and the PLT and its `.debug_frame` stripped into a separate debug
    /// file. That file's `.debug_frame` ([`Self::with_debug_file`]) may hold the rest.
    pub fn cfi_is_thin(&self) -> bool {
        thin(
            self.eh_frame_covers.max(self.debug_frame_covers),
            self.text.as_ref(),
        )
    }

    /// These sections with the `.debug_frame` of the image's separate debug file at `debug`
    /// (same addresses) when it describes more code than the image's own.
    #[must_use]
    pub fn with_debug_file(mut self, debug: &Path) -> Self {
        let theirs = File::open(debug)
            .ok()
            .map(ReadCache::new)
            .and_then(|cache| {
                let object = object::File::parse(&cache).ok()?;
                section_of(&object, ".debug_frame")
            });
        if let Some(theirs) = theirs {
            let covers = debug_frame_covers(&theirs, self.text.as_ref());
            if covers > self.debug_frame_covers {
                self.debug_frame = Some(theirs);
                self.debug_frame_covers = covers;
            }
        }
        self
    }

    fn sections_of<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Self {
        let section = |name: &str| section_of(file, name);
        let text = section(".text");
        let eh_frame = section(".eh_frame");
        let eh_frame_covers = eh_frame
            .as_ref()
            .map_or(0, |eh| eh_frame_covers(eh, text.as_ref()));
        let debug_frame = section(".debug_frame");
        // `.debug_frame` is only counted (and used) when `.eh_frame` is thin: counting
        // walks every FDE, and a complete `.eh_frame` is what the kernel and perf use.
        let debug_frame_covers = if thin(eh_frame_covers, text.as_ref()) {
            debug_frame
                .as_ref()
                .map_or(0, |d| debug_frame_covers(d, text.as_ref()))
        } else {
            0
        };
        Self {
            segments: Segments::of(file),
            eh_frame_covers,
            debug_frame_covers,
            text,
            eh_frame,
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame,
            got: file
                .section_by_name(".got")
                .map(|s| s.address()..s.address().saturating_add(s.size())),
        }
    }

    /// The module of this image as `placed`: the load bias is where the mapping's file
    /// offset is minus the address the file states for it.
    pub fn module(&self, placed: &Placement<'_>) -> Option<Module<Arc<[u8]>>> {
        let stated = self
            .segments
            .mapped_address(placed.entry.offset, placed.entry.executable())?;
        let bias = placed.entry.start.checked_sub(stated)?;
        let range = |s: &Option<Section>| s.as_ref().map(|s| s.svma.clone());
        let data = |s: &Option<Section>| s.as_ref().map(|s| Arc::clone(&s.data));
        // framehop reads `.eh_frame` when it is given one, `.debug_frame` only otherwise.
        let none = None;
        let (eh_frame, eh_frame_hdr) = if self.debug_frame_covers > self.eh_frame_covers {
            (&none, &none)
        } else {
            (&self.eh_frame, &self.eh_frame_hdr)
        };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(&self.text),
            text: data(&self.text),
            got_svma: self.got.clone(),
            eh_frame_svma: range(eh_frame),
            eh_frame: data(eh_frame),
            eh_frame_hdr_svma: range(eh_frame_hdr),
            eh_frame_hdr: data(eh_frame_hdr),
            debug_frame: data(&self.debug_frame),
            ..ExplicitModuleSectionInfo::default()
        };
        Some(Module::new(
            placed.entry.path.clone(),
            placed.avma.clone(),
            bias,
            info,
        ))
    }
}

/// Whether CFI describing `covers` bytes of `text` describes less than half of it.
fn thin(covers: u64, text: Option<&Section>) -> bool {
    let size = text.map_or(0, |t| t.svma.end - t.svma.start);
    covers < size / 2
}

/// Bytes of `.text` the FDEs of `.eh_frame` describe (those that parse).
fn eh_frame_covers(eh: &Section, text: Option<&Section>) -> u64 {
    let section = gimli::EhFrame::new(&eh.data, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(eh.svma.start);
    if let Some(text) = text {
        bases = bases.set_text(text.svma.start);
    }
    fde_bytes(&section, &bases, text)
}

/// Bytes of `.text` the FDEs of `.debug_frame` describe (those that parse).
fn debug_frame_covers(debug: &Section, text: Option<&Section>) -> u64 {
    let mut section = gimli::DebugFrame::new(&debug.data, gimli::LittleEndian);
    section.set_address_size(8);
    fde_bytes(&section, &gimli::BaseAddresses::default(), text)
}

/// The summed address ranges of the FDEs of `section` within `text` (`.debug_frame` keeps
/// the FDEs of functions the linker discarded, at address 0 or wherever), skipping those
/// that do not parse, up to the first entry the iterator cannot read.
fn fde_bytes<'a, S>(section: &S, bases: &gimli::BaseAddresses, text: Option<&Section>) -> u64
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let Some(text) = text else {
        return 0;
    };
    let mut total = 0u64;
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(S::cie_from_offset)
        {
            let start = fde.initial_address().max(text.svma.start);
            let end = fde.end_address().min(text.svma.end);
            total = total.saturating_add(end.saturating_sub(start));
        }
    }
    total
}
