//! A real debuginfod server for the debug-file tests: Debian's `debuginfod` (elfutils; the
//! package `debuginfod`, which `cargo xtask setup` installs), serving the ELF/DWARF files
//! of one directory (`-F`) on a loopback port, with its database in a temporary directory.
//! The tests ask it with lookback's client; [`DebuginfodServer::wait_for`] uses `curl`, a
//! client of its own, to know when its scan has indexed a build-id.
use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running `debuginfod`; killed on drop (or [`DebuginfodServer::stop`]).
pub struct DebuginfodServer {
    child: Option<Child>,
    _db: tempfile::TempDir,
    port: u16,
}

impl DebuginfodServer {
    /// Starts `debuginfod -F DIR` on a free port; `None` (skip) where it is not installed
    /// and this is not CI.
    ///
    /// # Panics
    /// When it is missing on CI, or cannot be started.
    #[must_use]
    pub fn serve(dir: &Path) -> Option<Self> {
        if Command::new("debuginfod")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            assert!(
                std::env::var_os("CI").is_none(),
                "debuginfod is missing on CI: cargo xtask setup installs the Debian package"
            );
            #[expect(clippy::print_stderr, reason = "a skipped test says why")]
            {
                eprintln!("skipped: debuginfod missing (apt-get install debuginfod)");
            }
            return None;
        }
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = probe.local_addr().expect("addr").port();
        drop(probe);
        let db = tempfile::tempdir().expect("tempdir");
        let child = Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "-t", "1", "-g", "0", "-d"])
            .arg(db.path().join("db.sqlite"))
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting debuginfod");
        Some(Self {
            child: Some(child),
            _db: db,
            port,
        })
    }

    /// `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the server gives the debug file of `build_id` (its scan indexed it).
    ///
    /// # Panics
    /// When it does not within 60 s.
    pub fn wait_for(&self, build_id: &str) {
        let url = format!("{}/buildid/{build_id}/debuginfo", self.url());
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            let ok = Command::new("curl")
                .args(["-sf", "-o", "/dev/null", &url])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "debuginfod never served {url}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills the server (its port then refuses connections).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DebuginfodServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The hex GNU build-id of the ELF file at `path`: what a debuginfod server is asked by.
///
/// # Panics
/// When the file cannot be read or has no build-id note.
#[must_use]
pub fn build_id(path: &Path) -> String {
    use object::Object as _;
    let data = std::fs::read(path).expect("the binary");
    let file = object::File::parse(&*data).expect("ELF");
    let id = file.build_id().expect("notes").expect("a build-id");
    id.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// How many requests lookback's debuginfod client logged in `log` (one line each).
#[must_use]
pub fn requests_in(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("lookback::elf::debuginfod]"))
        .count()
}
