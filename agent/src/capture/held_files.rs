//! The files traced processes map, held open while they live, so that a snapshot decoded
//! after its process crashed, exited or had its container removed still unwinds and
//! names every frame.
//!
//! A process in another container is reached only through `/proc/PID/root` (or
//! `/proc/PID/map_files/`), and both vanish with the process; a container's files vanish
//! with its removal. So when a process becomes traced (and again while its loader maps
//! libraries), each file it maps executable is opened — `/proc/PID/map_files/` where this
//! process may (`CAP_CHECKPOINT_RESTORE`), else `/proc/PID/exe` or the mapped path under
//! `/proc/PID/root` — and kept only when it is the very file mapped (same device and
//! inode). Later readers open it again through `/proc/self/fd/N`: the kernel hands out
//! the held file itself, deleted or not.
//!
//! Files are keyed by (device, inode) and shared: a hundred processes of one program hold
//! one fd for it. A process's exit releases its files after [`LINGER`] (its trigger may
//! still be on its way to the freeze); a snapshot holds the files of its processes
//! ([`HeldFiles::files_of`]) until it is written. The last holder closes the fd.
//!
//! Cost: one fd per distinct file, and the kernel keeps its inode (of a deleted file,
//! its blocks too) while held. No file memory is read here. At most
//! [`HeldFiles::set_limit`] files (default [`DEFAULT_LIMIT`]) are held, and none that
//! would leave less than an eighth of the open-files limit free (the recorders' and
//! probes' fds come first); a file not held is counted in [`HeldStats::refused`] and
//! readers fall back to its path.
//!
//! In: pids and their maps. Out: [`HeldFile`]s, found by a map entry's device and inode.
#![forbid(unsafe_code)]

use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, OnceLock, Weak},
    time::{Duration, Instant},
};

use super::procmaps::{MapEntry, parse_maps};

/// How long the files of an exited process stay held: its trigger, taken before the
/// exit, reaches the freeze (which takes its own hold) well within this.
pub const LINGER: Duration = Duration::from_secs(30);

/// Files held at most unless [`HeldFiles::set_limit`] says otherwise.
pub const DEFAULT_LIMIT: usize = 4096;

/// A file's identity: device (major, minor) and inode, as `/proc/PID/maps` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl FileKey {
    /// The key of a map entry (`dev` is `maj:min` in hex); `None` for anonymous memory and
    /// entries without a device and inode.
    pub fn of(entry: &MapEntry) -> Option<Self> {
        let (major, minor) = entry.dev.split_once(':')?;
        let key = Self {
            major: u32::from_str_radix(major, 16).ok()?,
            minor: u32::from_str_radix(minor, 16).ok()?,
            inode: entry.inode,
        };
        (key.inode != 0 && entry.path.starts_with('/')).then_some(key)
    }

    /// The key of an open file.
    fn of_file(file: &File) -> Option<Self> {
        let meta = file.metadata().ok()?;
        let dev = meta.dev();
        Some(Self {
            major: libc::major(dev),
            minor: libc::minor(dev),
            inode: meta.ino(),
        })
    }
}

/// One held file.
#[derive(Debug)]
pub struct HeldFile {
    file: File,
    pub key: FileKey,
    /// The path the process mapped it at (inside its own root).
    pub mapped_path: String,
}

impl HeldFile {
    /// A path that opens this very file from this process (`/proc/self/fd/N`), for the
    /// readers that take a path (blazesym, the unwinder's section reader).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// How many files are held, and how many were not for the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldStats {
    /// Distinct files held open now.
    pub files: usize,
    /// Files not held because [`HeldFiles::set_limit`] files already were (since start).
    pub refused: u64,
}

#[derive(Debug, Default)]
struct Inner {
    by_key: HashMap<FileKey, Weak<HeldFile>>,
    by_pid: HashMap<u32, HashMap<FileKey, Arc<HeldFile>>>,
    /// Files of exited (or untraced) processes, by pid, kept until [`LINGER`] after.
    lingering: VecDeque<(Instant, u32, Vec<Arc<HeldFile>>)>,
    limit: usize,
    refused: u64,
}

impl Inner {
    fn live(&self, key: &FileKey) -> Option<Arc<HeldFile>> {
        self.by_key.get(key).and_then(Weak::upgrade)
    }

    fn held_count(&mut self) -> usize {
        self.by_key.retain(|_, weak| weak.strong_count() > 0);
        self.by_key.len()
    }
}

/// The registry of held files (one per process: [`HeldFiles::global`]).
#[derive(Debug)]
pub struct HeldFiles {
    inner: Mutex<Inner>,
}

impl Default for HeldFiles {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                limit: DEFAULT_LIMIT,
                ..Inner::default()
            }),
        }
    }
}

impl HeldFiles {
    /// The registry every stage of this process shares: what the daemon secures, the
    /// symbolizer and unwinder find.
    pub fn global() -> &'static Self {
        static GLOBAL: OnceLock<HeldFiles> = OnceLock::new();
        GLOBAL.get_or_init(Self::default)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves plain data: keep using it.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// At most `limit` distinct files are held from now on (those held stay).
    pub fn set_limit(&self, limit: usize) {
        self.lock().limit = limit;
    }

    /// Holds the executable files `pid` maps now (read from `/proc/PID/maps`); returns how
    /// many were newly held for it. A process that is gone holds nothing.
    pub fn secure_pid(&self, pid: u32) -> usize {
        match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
            Ok(text) => self.secure(pid, &parse_maps(&text)),
            Err(_) => 0,
        }
    }

    /// Holds the executable files of `maps` (`pid`'s, read while it lives) for `pid`;
    /// returns how many were newly held for it.
    pub fn secure(&self, pid: u32, maps: &[MapEntry]) -> usize {
        let mut added = 0;
        for entry in maps.iter().filter(|e| e.executable()) {
            let Some(key) = FileKey::of(entry) else {
                continue;
            };
            let mut inner = self.lock();
            if inner.by_pid.get(&pid).is_some_and(|m| m.contains_key(&key)) {
                continue;
            }
            let held = if let Some(held) = inner.live(&key) {
                held
            } else {
                if inner.held_count() >= inner.limit {
                    inner.refused += 1;
                    continue;
                }
                // Opening reads no file data, but /proc lookups may block a little: not
                // under the lock.
                drop(inner);
                let Some(file) = open_mapped(pid, entry, key) else {
                    continue;
                };
                inner = self.lock();
                if !leaves_room(&file) {
                    inner.refused += 1;
                    continue;
                }
                // Another thread may have held it meanwhile: one fd per file.
                inner.live(&key).unwrap_or_else(|| {
                    let held = Arc::new(HeldFile {
                        file,
                        key,
                        mapped_path: entry.path.clone(),
                    });
                    inner.by_key.insert(key, Arc::downgrade(&held));
                    held
                })
            };
            inner.by_pid.entry(pid).or_default().insert(key, held);
            added += 1;
        }
        added
    }

    /// `pid` is gone (or no longer traced): its files are released after [`LINGER`].
    pub fn release(&self, pid: u32) {
        let mut inner = self.lock();
        if let Some(files) = inner.by_pid.remove(&pid) {
            inner
                .lingering
                .push_back((Instant::now(), pid, files.into_values().collect()));
        }
    }

    /// Holds the files of a process that just hit a trigger, for [`LINGER`] only: the
    /// process may crash right after, and may be one the daemon does not trace itself (a
    /// child recorded through its parent), which would never release them. A process
    /// already holding files (traced) is left alone: they are secured already.
    pub fn secure_for_trigger(&self, pid: u32) {
        if self.lock().by_pid.contains_key(&pid) {
            return;
        }
        self.secure_pid(pid);
        self.release(pid);
    }

    /// Lets go of what exited processes held longer than `linger` ago (the daemon's
    /// tick calls it with [`LINGER`]).
    pub fn expire(&self, linger: Duration) {
        let mut inner = self.lock();
        while inner
            .lingering
            .front()
            .is_some_and(|(at, _, _)| at.elapsed() >= linger)
        {
            inner.lingering.pop_front();
        }
    }

    /// The files `pid` holds, also while they linger: a snapshot keeps them until written.
    pub fn files_of(&self, pid: u32) -> Vec<Arc<HeldFile>> {
        let inner = self.lock();
        let mut out: Vec<Arc<HeldFile>> = inner
            .by_pid
            .get(&pid)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for (_, _, files) in inner.lingering.iter().filter(|(_, p, _)| *p == pid) {
            out.extend(files.iter().cloned());
        }
        out
    }

    /// Every file still held that a map entry of any of `maps` names: the files of a
    /// snapshot's processes, alive or lingering.
    pub fn files_for(&self, maps: &[MapEntry]) -> Vec<Arc<HeldFile>> {
        let inner = self.lock();
        let mut out: Vec<Arc<HeldFile>> = Vec::new();
        for key in maps.iter().filter_map(FileKey::of) {
            if let Some(held) = inner.live(&key)
                && !out.iter().any(|h| h.key == key)
            {
                out.push(held);
            }
        }
        out
    }

    /// The held file a map entry names, if it is held.
    pub fn find(&self, entry: &MapEntry) -> Option<Arc<HeldFile>> {
        let key = FileKey::of(entry)?;
        self.lock().live(&key)
    }

    /// How many files are held, and how many the limit turned away.
    pub fn stats(&self) -> HeldStats {
        let mut inner = self.lock();
        HeldStats {
            files: inner.held_count(),
            refused: inner.refused,
        }
    }
}

/// Whether holding `file` leaves the recorders, probes and the HTTP server their fds:
/// the kernel hands out the lowest free descriptor, so when this one is within an eighth
/// of the open-files limit (at least 16) of it, few or none are left above it.
fn leaves_room(file: &File) -> bool {
    let Ok((soft, _)) = crate::sys::rlimit::open_files() else {
        return true;
    };
    let fd = u64::try_from(file.as_raw_fd()).unwrap_or(u64::MAX);
    fd.saturating_add((soft / 8).max(16)) < soft
}

/// Opens the file `entry` of process `pid` maps, when what opens is that very file.
fn open_mapped(pid: u32, entry: &MapEntry, key: FileKey) -> Option<File> {
    let path = entry.path.strip_suffix(" (deleted)").unwrap_or(&entry.path);
    let candidates = [
        // The mapping itself: the exact file even when deleted or replaced
        // (CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN).
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            entry.start, entry.end
        )),
        // The executable: the exact file whatever its path now (ptrace read access).
        PathBuf::from(format!("/proc/{pid}/exe")),
        // The path inside the process's root (containers), while it lives.
        PathBuf::from(format!("/proc/{pid}/root{path}")),
    ];
    // Regular files only: opening a device (a mapped `/dev/...`) may have effects.
    candidates
        .iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .filter_map(|p| File::open(p).ok())
        .find(|f| FileKey::of_file(f) == Some(key))
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;
    use crate::elf::build_id::build_id_of;

    fn entry(dev: &str, inode: u64, path: &str) -> MapEntry {
        MapEntry {
            start: 0x1000,
            end: 0x2000,
            perms: "r-xp".to_owned(),
            offset: 0,
            dev: dev.to_owned(),
            inode,
            path: path.to_owned(),
            build_id: None,
        }
    }

    #[test]
    fn keys_come_from_the_maps_device_and_inode() {
        let key = FileKey::of(&entry("fe:01", 77, "/usr/bin/x")).expect("key");
        assert_eq!((key.major, key.minor, key.inode), (0xfe, 1, 77));
        assert_eq!(FileKey::of(&entry("00:00", 0, "")), None);
        assert_eq!(FileKey::of(&entry("00:00", 5, "[vdso]")), None);
        assert_eq!(FileKey::of(&entry("zz", 5, "/x")), None);
    }

    /// A copy of a real program, run, held, then deleted and its process killed: the held
    /// file is still the program, read through its `/proc/self/fd` path.
    #[test]
    fn a_deleted_program_of_an_exited_process_stays_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("sleeper");
        std::fs::copy("/bin/sleep", &copy).expect("copy /bin/sleep");
        let id = build_id_of(&copy);
        let mut child = Command::new(&copy)
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn");
        let pid = child.id();
        // The loader maps the program before exec returns; wait for the maps to name it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let held = HeldFiles::default();
        while held.secure_pid(pid) == 0 {
            assert!(Instant::now() < deadline, "nothing held for {pid}");
            std::thread::sleep(Duration::from_millis(10));
        }
        let maps = parse_maps(&std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps"));
        let exe = maps
            .iter()
            .find(|e| e.executable() && e.path.ends_with("/sleeper"))
            .expect("the program's code mapping")
            .clone();
        std::fs::remove_file(&copy).expect("delete");
        let _ = child.kill();
        let _ = child.wait();
        held.release(pid);
        assert!(
            held.files_of(pid)
                .iter()
                .any(|f| f.key == FileKey::of(&exe).expect("key")),
            "its files while they linger"
        );
        let file = held.find(&exe).expect("held after exit, while lingering");
        assert_eq!(build_id_of(&file.path()), id);
        drop(file);
        assert!(held.stats().files >= 1);
        // A snapshot keeps it beyond the linger.
        let kept = held.files_for(std::slice::from_ref(&exe));
        held.expire(Duration::ZERO);
        assert!(held.find(&exe).is_some(), "held by the snapshot");
        drop(kept);
        assert!(held.find(&exe).is_none(), "closed with its last holder");
        assert_eq!(held.stats().files, 0);
    }

    #[test]
    fn files_are_shared_and_the_limit_is_counted() {
        let held = HeldFiles::default();
        let me = std::process::id();
        assert!(held.secure_pid(me) > 0);
        let files = held.stats().files;
        // The same files for a second holder: no new fd.
        let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps").expect("maps"));
        assert!(held.secure(u32::MAX, &maps) > 0);
        assert_eq!(held.stats().files, files);
        held.release(me);
        held.release(u32::MAX);
        held.expire(Duration::ZERO);
        assert_eq!(held.stats(), HeldStats::default());
        held.set_limit(1);
        held.secure_pid(me);
        let stats = held.stats();
        assert_eq!(stats.files, 1);
        assert!(stats.refused >= 1, "{stats:?}");
    }

    #[test]
    fn a_file_replaced_at_its_path_is_not_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"first").expect("write");
        let inode = std::fs::metadata(&path).expect("stat").ino();
        std::fs::remove_file(&path).expect("remove");
        std::fs::write(&path, b"second").expect("write again");
        // Our own root: the path now opens another inode than the (fake) mapping's.
        let meta = std::fs::metadata(&path).expect("stat");
        let mut stale = entry(
            &format!(
                "{:02x}:{:02x}",
                libc::major(meta.dev()),
                libc::minor(meta.dev())
            ),
            inode,
            path.to_str().expect("utf-8"),
        );
        stale.start = 1;
        stale.end = 2;
        if meta.ino() != inode {
            let held = HeldFiles::default();
            assert_eq!(held.secure(std::process::id(), &[stale]), 0);
        }
    }
}
