//! Code images: where the flow layer gets the instruction bytes it decodes.
//!
//! In: code bytes the caller loaded (raw files mapped at an address, ELF segments, the
//! code a snapshot bundle saved) added as sections. Out: bytes at a virtual address
//! through the [`ImageProvider`] trait, which is all the decoder asks for (sans-IO: the
//! decoder never opens files). [`Image`] is the simple in-memory provider: sections added
//! later shadow the parts of earlier ones they overlap, as libipt's images do, and each
//! section keeps an id ("isid") so a decoded block can say where its code came from.
//! [`RawSpec`] parses `ptxed --raw FILE[:OFFSET[-END]]:ADDR` arguments.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::decode::pt::packets::cpu::parse_c_uint;

/// Where a read was served from: the section id and the mapped range it lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// The section's id (1-based; 0 is never used).
    pub isid: u32,
    /// First mapped address of the contiguous piece the read came from.
    pub begin: u64,
    /// One past the last mapped address of that piece.
    pub end: u64,
}

impl Mapping {
    pub fn contains(&self, ip: u64) -> bool {
        self.begin <= ip && ip < self.end
    }
}

/// Nothing is mapped at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no code mapped at {addr:#x}")]
pub struct NoCode {
    pub addr: u64,
}

/// What the decoder asks for code bytes. `Sync`, so that the threads of a parallel
/// decode (`branches_parallel.rs`) read one image.
pub trait ImageProvider: Sync {
    /// Copies the bytes at `addr` into `buf`, stopping at the end of the mapped piece
    /// that contains `addr` (so fewer than `buf.len()` bytes may come back). Returns how
    /// many bytes were read (at least one) and where they came from.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(usize, Mapping), NoCode>;

    /// The piece of mapped code `addr` is in.
    fn mapping(&self, addr: u64) -> Result<Mapping, NoCode> {
        self.read(addr, &mut [0u8; 1]).map(|(_, mapping)| mapping)
    }

    /// The bytes of the mapped piece `addr` is in, and the address of the first: lent,
    /// for the walk that decodes a run of code it has not seen (a copy and a lookup an
    /// instruction were a third of that walk). `None` where the provider cannot lend
    /// them (the walk then reads).
    fn code(&self, addr: u64) -> Option<(u64, &[u8])> {
        let _ = addr;
        None
    }
}

/// One contiguous mapped piece of a section.
#[derive(Debug, Clone)]
struct Piece {
    begin: u64,
    end: u64,
    isid: u32,
    /// The section's bytes; the piece maps `bytes[offset..offset + (end - begin)]`.
    bytes: Arc<[u8]>,
    offset: usize,
}

/// An image made of sections held in memory.
#[derive(Debug, Clone, Default)]
pub struct Image {
    /// Non-overlapping pieces, sorted by address.
    pieces: Vec<Piece>,
    names: Vec<String>,
    /// The piece the last lookup found.
    last: LastPiece,
}

/// The index of the piece the last lookup found: code is read where it was read before
/// (the next instruction, the same page), and a search of hundreds of pieces (one per
/// page of a `--raw` page dump) costs ~150 instructions a read. Atomic because the
/// threads of a parallel decode share the image; relaxed, because any index is only a
/// guess that the lookup checks.
#[derive(Debug, Default)]
struct LastPiece(AtomicUsize);

impl Clone for LastPiece {
    fn clone(&self) -> Self {
        Self(AtomicUsize::new(self.0.load(Ordering::Relaxed)))
    }
}

impl Image {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `bytes` at `vaddr`, shadowing whatever it overlaps; returns the section id.
    /// Empty sections and sections that would wrap the address space map nothing.
    pub fn add(&mut self, name: &str, bytes: impl Into<Arc<[u8]>>, vaddr: u64) -> u32 {
        let bytes: Arc<[u8]> = bytes.into();
        self.names.push(name.to_owned());
        let isid = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        let Some(end) = u64::try_from(bytes.len())
            .ok()
            .and_then(|len| vaddr.checked_add(len))
            .filter(|&end| end > vaddr)
        else {
            return isid;
        };
        let mut pieces = Vec::with_capacity(self.pieces.len() + 2);
        for piece in self.pieces.drain(..) {
            if piece.end <= vaddr || end <= piece.begin {
                pieces.push(piece);
                continue;
            }
            if piece.begin < vaddr {
                pieces.push(Piece {
                    end: vaddr,
                    ..piece.clone()
                });
            }
            if end < piece.end {
                let skip = usize::try_from(end - piece.begin).unwrap_or(usize::MAX);
                pieces.push(Piece {
                    begin: end,
                    offset: piece.offset.saturating_add(skip),
                    ..piece
                });
            }
        }
        pieces.push(Piece {
            begin: vaddr,
            end,
            isid,
            bytes,
            offset: 0,
        });
        pieces.sort_by_key(|p| p.begin);
        self.pieces = pieces;
        isid
    }

    /// The name a section was added with.
    pub fn name(&self, isid: u32) -> Option<&str> {
        let index = usize::try_from(isid).ok()?.checked_sub(1)?;
        self.names.get(index).map(String::as_str)
    }

    /// Removes every section.
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.names.clear();
    }

    fn piece(&self, addr: u64) -> Option<&Piece> {
        let last = self.last.0.load(Ordering::Relaxed);
        if let Some(piece) = self.pieces.get(last)
            && piece.begin <= addr
            && addr < piece.end
        {
            return Some(piece);
        }
        let index = self
            .pieces
            .partition_point(|p| p.begin <= addr)
            .checked_sub(1)?;
        let piece = self.pieces.get(index)?;
        if addr < piece.end {
            self.last.0.store(index, Ordering::Relaxed);
            return Some(piece);
        }
        None
    }
}

impl ImageProvider for Image {
    fn code(&self, addr: u64) -> Option<(u64, &[u8])> {
        let piece = self.piece(addr)?;
        let len = usize::try_from(piece.end - piece.begin).ok()?;
        let bytes = piece
            .bytes
            .get(piece.offset..piece.offset.checked_add(len)?)?;
        Some((piece.begin, bytes))
    }

    fn mapping(&self, addr: u64) -> Result<Mapping, NoCode> {
        let piece = self.piece(addr).ok_or(NoCode { addr })?;
        Ok(Mapping {
            isid: piece.isid,
            begin: piece.begin,
            end: piece.end,
        })
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(usize, Mapping), NoCode> {
        let piece = self.piece(addr).ok_or(NoCode { addr })?;
        let skip = usize::try_from(addr - piece.begin).map_err(|_| NoCode { addr })?;
        let left = usize::try_from(piece.end - addr).unwrap_or(usize::MAX);
        let len = buf.len().min(left);
        let from = piece.offset.checked_add(skip).ok_or(NoCode { addr })?;
        let src = piece
            .bytes
            .get(from..from.saturating_add(len))
            .ok_or(NoCode { addr })?;
        buf[..len].copy_from_slice(src);
        Ok((
            len,
            Mapping {
                isid: piece.isid,
                begin: piece.begin,
                end: piece.end,
            },
        ))
    }
}

impl<T: ImageProvider + ?Sized> ImageProvider for &T {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(usize, Mapping), NoCode> {
        (**self).read(addr, buf)
    }

    fn mapping(&self, addr: u64) -> Result<Mapping, NoCode> {
        (**self).mapping(addr)
    }

    fn code(&self, addr: u64) -> Option<(u64, &[u8])> {
        (**self).code(addr)
    }
}

/// A `--raw FILE[:OFFSET[-END]]:ADDR` argument: which part of a file to map where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSpec {
    pub path: String,
    /// First file byte to map.
    pub offset: u64,
    /// One past the last file byte to map; `None` for the end of the file.
    pub end: Option<u64>,
    /// The address the first mapped byte goes to.
    pub addr: u64,
}

/// A `--raw` argument without an address, or with a bad range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected FILE[:OFFSET[-END]]:ADDR, got {given:?}")]
pub struct RawSpecError {
    pub given: String,
}

impl RawSpec {
    pub fn parse(arg: &str) -> Result<Self, RawSpecError> {
        let err = || RawSpecError {
            given: arg.to_owned(),
        };
        let (rest, addr) = arg.rsplit_once(':').ok_or_else(err)?;
        let addr = parse_c_uint(addr).ok_or_else(err)?;
        // An optional range; a suffix that doesn't parse is part of the file name.
        if let Some((path, range)) = rest.rsplit_once(':') {
            let parsed = match range.split_once('-') {
                None => parse_c_uint(range).map(|from| (from, None)),
                Some((from, to)) => parse_c_uint(from)
                    .zip(parse_c_uint(to))
                    .map(|(from, to)| (from, Some(to))),
            };
            if let Some((offset, end)) = parsed {
                if end.is_some_and(|end| end <= offset) {
                    return Err(err());
                }
                return Ok(Self {
                    path: path.to_owned(),
                    offset,
                    end,
                    addr,
                });
            }
        }
        if rest.is_empty() {
            return Err(err());
        }
        Ok(Self {
            path: rest.to_owned(),
            offset: 0,
            end: None,
            addr,
        })
    }

    /// The part of `file` this spec maps (empty when the offset is past the end).
    pub fn slice<'f>(&self, file: &'f [u8]) -> &'f [u8] {
        let len = file.len();
        let from = usize::try_from(self.offset).unwrap_or(usize::MAX).min(len);
        let to = self
            .end
            .map_or(len, |end| usize::try_from(end).unwrap_or(usize::MAX))
            .clamp(from, len);
        &file[from..to]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_sections_shadow_what_they_overlap() {
        let mut image = Image::new();
        let a = image.add("a", vec![0xaa; 16], 0x1000);
        let b = image.add("b", vec![0xbb; 4], 0x1004);
        let mut buf = [0u8; 15];
        let (len, map) = image.read(0x1000, &mut buf).unwrap();
        assert_eq!((len, map.isid, map.end), (4, a, 0x1004));
        let (len, map) = image.read(0x1005, &mut buf).unwrap();
        assert_eq!((len, map.isid, &buf[..len]), (3, b, &[0xbb; 3][..]));
        let (len, map) = image.read(0x1008, &mut buf).unwrap();
        assert_eq!((len, map.isid, map.begin, map.end), (8, a, 0x1008, 0x1010));
        assert_eq!(image.read(0x1010, &mut buf), Err(NoCode { addr: 0x1010 }));
        assert_eq!(image.read(0xfff, &mut buf), Err(NoCode { addr: 0xfff }));
        assert_eq!(image.name(b), Some("b"));
    }

    /// The last piece found is a guess the lookup checks: a section added or removed
    /// after a read changes what later reads see, and a copy of the image reads alike.
    #[test]
    fn reads_after_the_pieces_change_see_the_change() {
        let mut image = Image::new();
        image.add("a", vec![0xaa; 0x100], 0x1000);
        image.add("c", vec![0xcc; 0x100], 0x3000);
        let mut buf = [0u8; 1];
        assert_eq!(image.read(0x1080, &mut buf).map(|_| buf[0]), Ok(0xaa));
        // A section over the piece the last read found: it now sits at another index.
        let b = image.add("b", vec![0xbb; 0x10], 0x1080);
        let (_, map) = image.read(0x1080, &mut buf).unwrap();
        assert_eq!((map.isid, buf[0]), (b, 0xbb));
        assert_eq!(image.read(0x1090, &mut buf).map(|_| buf[0]), Ok(0xaa));
        assert_eq!(image.read(0x3000, &mut buf).map(|_| buf[0]), Ok(0xcc));
        let copy = image.clone();
        assert_eq!(copy.read(0x1081, &mut buf).map(|_| buf[0]), Ok(0xbb));
        image.clear();
        assert_eq!(image.read(0x3000, &mut buf), Err(NoCode { addr: 0x3000 }));
        assert_eq!(copy.read(0x3000, &mut buf).map(|_| buf[0]), Ok(0xcc));
    }

    #[test]
    fn raw_specs_take_optional_ranges() {
        let spec = RawSpec::parse("code.bin:0x100000").unwrap();
        assert_eq!(
            (spec.path.as_str(), spec.offset, spec.addr),
            ("code.bin", 0, 0x0010_0000)
        );
        let spec = RawSpec::parse("t.bin:0x2:0x1002").unwrap();
        assert_eq!((spec.offset, spec.end, spec.addr), (2, None, 0x1002));
        assert_eq!(spec.slice(&[1, 2, 3, 4]), &[3, 4]);
        let spec = RawSpec::parse("c:\\x:1-3:7").unwrap();
        assert_eq!((spec.path.as_str(), spec.end), ("c:\\x", Some(3)));
        assert!(RawSpec::parse("nobase").is_err());
        assert!(RawSpec::parse("f:3-2:7").is_err());
    }
}
