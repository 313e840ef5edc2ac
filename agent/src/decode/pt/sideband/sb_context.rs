//! Process contexts of ptxed's sideband session, and the image the decoder reads.
//!
//! In: the kernel's image, and MMAP/fork/exec effects from [`super::sb_session`]. Out:
//! one [`Context`] per process (its name `pid-N` and its code image), and
//! [`ActiveImage`], the [`ImageProvider`] the block decoder holds for the whole decode
//! while the session changes what it shows (the `--raw` image until the first context
//! switch, then the current process's image). The decoder keeps its reference, so the
//! changing parts sit behind locks (not `RefCell`s: every [`ImageProvider`] is `Sync`, so
//! that the parallel decoder shares one image between threads); a session runs on one
//! thread, so no lock is ever contended or held across calls.

use std::sync::{Arc, Mutex, RwLock};

use crate::decode::pt::flow::image::{Image, ImageProvider, Mapping, NoCode};

/// Why a file an MMAP record (or `--pevent:kcore`) names could not be mapped; the
/// messages are libipt's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be read (or is not an ELF file where one is needed).
    #[error("bad file")]
    BadFile,
    /// The mapping starts at or beyond the end of the file.
    #[error("invalid argument")]
    BeyondEnd,
}

/// Reads the files that sideband records map (the decoder itself never opens files).
pub trait SectionLoader {
    /// Up to `size` bytes of `path` from `offset`: fewer where the file ends first.
    fn load(&self, path: &str, offset: u64, size: u64) -> Result<Arc<[u8]>, LoadError>;
}

/// A process's ABI, which picks the vdso file mapped for `[vdso]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Abi {
    #[default]
    Unknown,
    X64,
    X32,
    Ia32,
}

impl Abi {
    /// The ABI of an ELF file from its first bytes (`Unknown` for anything else).
    pub fn of_elf(header: &[u8]) -> Self {
        const EV_CURRENT: u8 = 1;
        const ELFCLASS32: u8 = 1;
        const ELFCLASS64: u8 = 2;
        const EM_386: u16 = 3;
        const EM_X86_64: u16 = 62;
        if header.get(..4) != Some(b"\x7fELF") || header.get(6) != Some(&EV_CURRENT) {
            return Self::Unknown;
        }
        let machine = header.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]]));
        match (header.get(4).copied(), machine) {
            (Some(ELFCLASS64), _) => Self::X64,
            (Some(ELFCLASS32), Some(EM_386)) => Self::Ia32,
            (Some(ELFCLASS32), Some(EM_X86_64)) => Self::X32,
            _ => Self::Unknown,
        }
    }
}

/// A process as the sideband tells it: its code image and ABI.
#[derive(Debug)]
pub struct Context {
    pid: u32,
    name: String,
    image: RwLock<Image>,
    abi: Mutex<Abi>,
}

impl Context {
    fn new(pid: u32, image: Image) -> Arc<Self> {
        Arc::new(Self {
            pid,
            name: format!("pid-{pid:x}"),
            image: RwLock::new(image),
            abi: Mutex::new(Abi::Unknown),
        })
    }

    /// The name ptxed prints on a switch (`--sb:switch`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn abi(&self) -> Abi {
        self.abi.lock().map_or(Abi::Unknown, |abi| *abi)
    }

    pub(super) fn set_abi(&self, abi: Abi) {
        if let Ok(mut current) = self.abi.lock() {
            *current = abi;
        }
    }

    /// Maps `bytes` at `vaddr`, over whatever was there.
    pub(super) fn map(&self, name: &str, bytes: Arc<[u8]>, vaddr: u64) {
        if let Ok(mut image) = self.image.try_write() {
            image.add(name, bytes, vaddr);
        }
    }
}

/// The session's processes. A new process starts with the kernel's image.
#[derive(Debug, Default)]
pub struct Contexts {
    list: Vec<Arc<Context>>,
    kernel: Image,
}

impl Contexts {
    pub fn new(kernel: Image) -> Self {
        Self {
            list: Vec::new(),
            kernel,
        }
    }

    fn find(&self, pid: u32) -> Option<Arc<Context>> {
        self.list.iter().find(|c| c.pid == pid).cloned()
    }

    /// The context of `pid`, created (with the kernel's image) if there is none.
    pub fn get(&mut self, pid: u32) -> Arc<Context> {
        if let Some(context) = self.find(pid) {
            return context;
        }
        self.add(pid, self.kernel.clone())
    }

    /// A new context for `pid` (a fork or an exec) with the image of `parent`, or the
    /// kernel's where there is no parent or it is unknown. The old context lives on only
    /// while a stream still uses it: an exec does not change the image being decoded.
    pub fn replace(&mut self, pid: u32, parent: Option<u32>) -> Arc<Context> {
        let image = parent
            .and_then(|parent| self.image_of(parent))
            .unwrap_or_else(|| self.kernel.clone());
        self.add(pid, image)
    }

    fn add(&mut self, pid: u32, image: Image) -> Arc<Context> {
        self.list.retain(|c| c.pid != pid);
        let context = Context::new(pid, image);
        self.list.push(Arc::clone(&context));
        context
    }

    fn image_of(&self, pid: u32) -> Option<Image> {
        let context = self.find(pid)?;
        let image = context.image.try_read().ok()?;
        Some(image.clone())
    }
}

/// The image the decoder reads: `raw` until a context is switched to, then that
/// context's.
pub struct ActiveImage<'i> {
    raw: &'i dyn ImageProvider,
    context: RwLock<Option<Arc<Context>>>,
}

impl<'i> ActiveImage<'i> {
    pub fn new(raw: &'i dyn ImageProvider) -> Self {
        Self {
            raw,
            context: RwLock::new(None),
        }
    }

    pub fn switch_to(&self, context: Arc<Context>) {
        if let Ok(mut current) = self.context.try_write() {
            *current = Some(context);
        }
    }
}

impl ImageProvider for ActiveImage<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(usize, Mapping), NoCode> {
        let current = self.context.try_read().map_err(|_| NoCode { addr })?;
        match current.as_ref() {
            None => self.raw.read(addr, buf),
            Some(context) => context
                .image
                .try_read()
                .map_err(|_| NoCode { addr })?
                .read(addr, buf),
        }
    }

    fn mapping(&self, addr: u64) -> Result<Mapping, NoCode> {
        let current = self.context.try_read().map_err(|_| NoCode { addr })?;
        match current.as_ref() {
            None => self.raw.mapping(addr),
            Some(context) => context
                .image
                .try_read()
                .map_err(|_| NoCode { addr })?
                .mapping(addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_image_follows_switches_and_mappings() {
        let mut raw = Image::new();
        raw.add("raw", vec![0x90u8], 0x1000);
        let active = ActiveImage::new(&raw);
        assert!(active.mapping(0x1000).is_ok());
        let mut contexts = Contexts::new(Image::new());
        let context = contexts.get(1);
        assert_eq!(context.name(), "pid-1");
        active.switch_to(Arc::clone(&context));
        assert!(active.mapping(0x1000).is_err());
        context.map("a", Arc::from(vec![0xccu8, 0xc3]), 0x2000);
        let mut buf = [0u8; 4];
        assert_eq!(active.read(0x2001, &mut buf).map(|(n, _)| n), Ok(1));
        assert_eq!(buf[0], 0xc3);
        // An exec replaces the context; the decoder keeps the old image until it switches.
        let child = contexts.replace(2, Some(1));
        assert!(child.image.read().unwrap().mapping(0x2000).is_ok());
        let fresh = contexts.replace(1, None);
        assert!(!Arc::ptr_eq(&fresh, &context));
        assert!(active.mapping(0x2000).is_ok());
        assert!(fresh.image.read().unwrap().mapping(0x2000).is_err());
    }

    #[test]
    fn elf_headers_tell_the_abi() {
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(20, 0);
        assert_eq!(Abi::of_elf(&elf), Abi::X64);
        elf[4] = 1;
        elf[18] = 3;
        assert_eq!(Abi::of_elf(&elf), Abi::Ia32);
        elf[18] = 62;
        assert_eq!(Abi::of_elf(&elf), Abi::X32);
        assert_eq!(Abi::of_elf(b"\x7fEL"), Abi::Unknown);
    }
}
