//! The loadable segments of an ELF file: file offsets ↔ the virtual addresses the file
//! states. Mapped addresses become file offsets with `/proc/PID/maps` (`address -
//! map.start + map.offset`); symbols, unwind tables and uprobes speak virtual addresses.
//!
//! In: a parsed [`object::File`]. Out: a small table both directions are looked up in,
//! kept instead of the file (the symbolizer, the PLT table, the unwinder and the trigger
//! resolver all need it, long after the file's bytes are gone), and [`file_offset_of`] for
//! one address (where a uprobe goes).

use object::{Object as _, ObjectSegment as _, SegmentFlags};

/// The page size mappings are aligned to (x86-64).
const PAGE: u64 = 4096;

/// The loadable segments of one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    /// (file offset, file size, virtual address) per segment.
    segments: Vec<(u64, u64, u64)>,
    /// Whether each segment is executable (`PF_X`).
    executable: Vec<bool>,
}

impl Segments {
    /// The loadable segments of `file`.
    #[must_use]
    pub fn of<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Self {
        const PF_X: u32 = 1;
        Self {
            segments: file
                .segments()
                .map(|seg| {
                    let (offset, size) = seg.file_range();
                    (offset, size, seg.address())
                })
                .collect(),
            executable: file
                .segments()
                .map(|seg| matches!(seg.flags(), SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0))
                .collect(),
        }
    }

    /// The virtual address a mapping starts at that maps the file from `map_offset`
    /// (`/proc/PID/maps`' offset, rounded down to a page) with the segment of that
    /// executability: the offset may lie before the segment's first byte (lld places
    /// segments mid-page), and then inside the previous segment, which
    /// [`Self::address_of`] would answer with.
    #[must_use]
    pub fn mapped_address(&self, map_offset: u64, executable: bool) -> Option<u64> {
        let mapped = self
            .segments
            .iter()
            .zip(&self.executable)
            .filter(|&(_, &x)| x == executable)
            .find_map(|(&(start, size, address), _)| {
                let delta = start.checked_sub(map_offset)?;
                (start - start % PAGE <= map_offset && delta < PAGE && size > 0)
                    .then(|| address.checked_sub(delta))
                    .flatten()
            });
        mapped.or_else(|| self.address_of(map_offset))
    }

    /// The virtual address at file `offset`.
    #[must_use]
    pub fn address_of(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|&(start, size, address)| {
            let delta = offset.checked_sub(start)?;
            (delta < size).then(|| address.checked_add(delta)).flatten()
        })
    }

    /// The file offset of virtual `address`.
    #[must_use]
    pub fn offset_of(&self, address: u64) -> Option<u64> {
        self.segments.iter().find_map(|&(offset, size, start)| {
            let delta = address.checked_sub(start)?;
            (delta < size).then(|| offset.checked_add(delta)).flatten()
        })
    }
}

/// The file offset of virtual `address`, through the loadable segment that maps it.
pub fn file_offset_of<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    address: u64,
) -> Option<u64> {
    Segments::of(file).offset_of(address)
}

#[cfg(test)]
mod tests {
    use super::Segments;

    #[test]
    fn offsets_and_addresses_map_both_ways_inside_segments_only() {
        let segs = Segments {
            segments: vec![(0, 0x1000, 0), (0x1000, 0x500, 0x2000)],
            executable: vec![false, true],
        };
        assert_eq!(segs.address_of(0x1010), Some(0x2010));
        assert_eq!(segs.offset_of(0x2010), Some(0x1010));
        assert_eq!(
            segs.address_of(0x1500),
            None,
            "past the segment's file bytes"
        );
        assert_eq!(segs.offset_of(0x1800), None, "between segments");
    }

    #[test]
    fn a_mapping_from_mid_page_segments_starts_a_page_before_the_segment() {
        // lld: read-only data at offset 0, code at offset 0x13d00 but address 0x14d00; the
        // kernel maps the code from offset 0x13000 at address 0x14000.
        let segs = Segments {
            segments: vec![(0, 0x13d00, 0), (0x13d00, 0x2000, 0x14d00)],
            executable: vec![false, true],
        };
        assert_eq!(segs.mapped_address(0x13000, true), Some(0x14000));
        assert_eq!(
            segs.address_of(0x13000),
            Some(0x13000),
            "the data segment's byte"
        );
        assert_eq!(segs.mapped_address(0, false), Some(0));
    }

    #[test]
    fn this_test_binary_maps_its_own_entry_point_back() {
        let data = std::fs::read("/proc/self/exe").expect("own binary");
        let file = object::File::parse(&*data).expect("ELF");
        let segs = Segments::of(&file);
        let entry = object::Object::entry(&file);
        let offset = segs.offset_of(entry).expect("entry in a segment");
        assert_eq!(segs.address_of(offset), Some(entry));
    }
}
