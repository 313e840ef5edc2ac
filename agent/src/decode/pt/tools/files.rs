//! Files that raw Intel PT decoding reads besides the trace: perf sideband files, the
//! files their MMAP records map, and kernel core dumps.
//!
//! In: paths as the command line and the sideband records give them, relative ones taken
//! from a root directory (the current one for `lookback decode` and `lookback-pt`, a corpus directory in
//! the conformance tests). Out: bytes for the decoder, which never opens files itself:
//! [`read_pevent`] (a sideband file or its `:FROM-TO` part), [`FileLoader`] (the
//! [`SectionLoader`] of ptxed's sideband session) and [`kernel_image`]
//! (`--pevent:kcore`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object as _, ObjectSegment as _};

use crate::decode::pt::flow::image::Image;
use crate::decode::pt::sideband::sb_context::{LoadError, SectionLoader};
use crate::decode::pt::tools::ptdump_opts::PeventFile;

/// The bytes of a sideband file named on the command line, or of its byte range.
pub fn read_pevent(root: &Path, file: &PeventFile) -> io::Result<Vec<u8>> {
    let bytes = fs::read(root.join(&file.path))?;
    let from = usize::try_from(file.range.0)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let to = file
        .range
        .1
        .map_or(bytes.len(), |to| usize::try_from(to).unwrap_or(usize::MAX))
        .clamp(from, bytes.len());
    Ok(bytes[from..to].to_vec())
}

/// Reads mapped files from the file system; relative paths are taken from `root`.
#[derive(Debug, Clone)]
pub struct FileLoader {
    pub root: PathBuf,
}

impl SectionLoader for FileLoader {
    fn load(&self, path: &str, offset: u64, size: u64) -> Result<Arc<[u8]>, LoadError> {
        let bytes = fs::read(self.root.join(path)).map_err(|_| LoadError::BadFile)?;
        let from = usize::try_from(offset)
            .ok()
            .filter(|&from| from < bytes.len())
            .ok_or(LoadError::BeyondEnd)?;
        // Like libipt, a mapping longer than the file is cut at its end.
        let len = usize::try_from(size)
            .unwrap_or(usize::MAX)
            .min(bytes.len() - from);
        Ok(Arc::from(&bytes[from..from + len]))
    }
}

/// The kernel's image from core dumps (ELF files): each loadable segment with file
/// contents mapped at its address, later files over earlier ones.
pub fn kernel_image(root: &Path, kcore: &[String]) -> anyhow::Result<Image> {
    use anyhow::Context as _;
    let mut image = Image::new();
    for path in kcore {
        let data = fs::read(root.join(path)).with_context(|| format!("reading {path}"))?;
        let file = object::File::parse(&*data).with_context(|| format!("parsing {path}"))?;
        for segment in file.segments() {
            let (offset, size) = segment.file_range();
            let bytes = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(size).ok())
                .and_then(|(from, len)| data.get(from..from.checked_add(len)?))
                .with_context(|| format!("{path}: segment outside the file"))?;
            if !bytes.is_empty() {
                image.add(path, bytes.to_vec(), segment.address());
            }
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_cut_at_the_end_of_the_file() {
        let dir = std::env::temp_dir().join(format!("lookback-pt-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("code.bin"), [1u8, 2, 3, 4]).unwrap();
        let loader = FileLoader { root: dir.clone() };
        assert_eq!(&*loader.load("code.bin", 1, 100).unwrap(), &[2, 3, 4]);
        assert_eq!(loader.load("code.bin", 4, 1), Err(LoadError::BeyondEnd));
        assert_eq!(loader.load("missing.bin", 0, 1), Err(LoadError::BadFile));
        let file = PeventFile {
            path: "code.bin".to_owned(),
            range: (1, Some(3)),
            config: crate::decode::pt::sideband::pevent::PeventConfig::default(),
            primary: true,
        };
        assert_eq!(read_pevent(&dir, &file).unwrap(), vec![2, 3]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
