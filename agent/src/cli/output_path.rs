//! The `-o` path of `run`/`attach`, checked before anything is traced: a snapshot taken
//! and then lost because its file cannot be written is the worst outcome of a recording.
//!
//! In: the path and `--mkdir`. Out: `Ok` when lookback writes that format and can create
//! files in its directory (created first with `--mkdir`); else the reason, for exit 2.
use std::{
    fs::{self, OpenOptions},
    io,
    path::{Path, PathBuf},
};

/// The names `-o` may end in (case-insensitive).
pub const OUTPUT_SUFFIXES: [&str; 5] = [".fxt", ".fxt.gz", ".json", ".json.gz", ".lbsnap"];

/// Why `-o` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OutputPathError {
    #[error(
        "-o {}: lookback writes .fxt, .fxt.gz, .json, .json.gz (traces), .speedscope.json \
         (speedscope) or .lbsnap (raw snapshots); name the file after the format wanted",
        path.display()
    )]
    Format { path: PathBuf },
    #[error("-o {}: the directory {} does not exist (create it, or pass --mkdir)", path.display(), dir.display())]
    NoDirectory { path: PathBuf, dir: PathBuf },
    #[error("-o {}: cannot create files in {}", path.display(), dir.display())]
    NotWritable {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Checks `path` as the output of a recording (see the module docs).
///
/// # Errors
/// [`OutputPathError`] when the format is unknown, the directory is missing (without
/// `mkdir`) or cannot be created or written to.
pub fn check_output(path: &Path, mkdir: bool) -> Result<(), OutputPathError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if !OUTPUT_SUFFIXES
        .iter()
        .any(|suffix| name.len() > suffix.len() && name.ends_with(suffix))
    {
        return Err(OutputPathError::Format {
            path: path.to_owned(),
        });
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        if !mkdir {
            return Err(OutputPathError::NoDirectory {
                path: path.to_owned(),
                dir,
            });
        }
        fs::create_dir_all(&dir).map_err(|source| OutputPathError::NotWritable {
            path: path.to_owned(),
            dir: dir.clone(),
            source,
        })?;
    }
    // A file created and removed: permissions, read-only mounts and pseudo file systems
    // all answer the way the real write will.
    let probe = dir.join(format!(".lookback-write-check-{}", std::process::id()));
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|source| OutputPathError::NotWritable {
            path: path.to_owned(),
            dir: dir.clone(),
            source,
        });
    if created.is_ok() {
        let _ = fs::remove_file(&probe);
    }
    created.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_directories_and_mkdir() {
        let dir = tempfile::tempdir().expect("tempdir");
        for ok in ["t.fxt", "t.FXT.GZ", "t.json", "t.json.gz", "t.lbsnap"] {
            check_output(&dir.path().join(ok), false).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["t.txt", "t", ".fxt", "t.gz"] {
            assert!(
                matches!(
                    check_output(&dir.path().join(bad), false),
                    Err(OutputPathError::Format { .. })
                ),
                "{bad}"
            );
        }
        let nested = dir.path().join("a/b/t.fxt.gz");
        let err = check_output(&nested, false).expect_err("no directory");
        assert!(err.to_string().contains("--mkdir"), "{err}");
        assert!(
            !dir.path().join("a").exists(),
            "not created without --mkdir"
        );
        check_output(&nested, true).expect("--mkdir");
        assert!(dir.path().join("a/b").is_dir());
        // No probe file is left behind.
        assert_eq!(fs::read_dir(dir.path().join("a/b")).expect("ls").count(), 0);
        assert!(matches!(
            check_output(Path::new("/proc/t.fxt.gz"), false),
            Err(OutputPathError::NotWritable { .. })
        ));
    }
}
