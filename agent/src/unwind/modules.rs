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
}

impl UnwindSections {
    /// The sections of the ELF file at `path`; `None` when it cannot be read or parsed,
    /// or has no CFI at all (then frame pointers are all there is, without a module).
    pub fn read_file(path: &Path) -> Option<Self> {
        let file = File::open(path).ok()?;
        let cache = ReadCache::new(file);
        Self::from_object(&object::File::parse(&cache).ok()?)
    }

    /// The sections of an ELF image in memory (embedded `[vdso]`).
    pub fn parse(image: &[u8]) -> Option<Self> {
        Self::from_object(&object::File::parse(image).ok()?)
    }

    fn from_object<'data, R: object::ReadRef<'data>>(
        file: &object::File<'data, R>,
    ) -> Option<Self> {
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            let data = s.uncompressed_data().ok()?;
            Some(Section {
                svma: s.address()..s.address().saturating_add(s.size()),
                data: Arc::from(&*data),
            })
        };
        let sections = Self {
            segments: Segments::of(file),
            text: section(".text"),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame"),
            got: file
                .section_by_name(".got")
                .map(|s| s.address()..s.address().saturating_add(s.size())),
        };
        (sections.eh_frame.is_some() || sections.debug_frame.is_some()).then_some(sections)
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
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(&self.text),
            text: data(&self.text),
            got_svma: self.got.clone(),
            eh_frame_svma: range(&self.eh_frame),
            eh_frame: data(&self.eh_frame),
            eh_frame_hdr_svma: range(&self.eh_frame_hdr),
            eh_frame_hdr: data(&self.eh_frame_hdr),
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
