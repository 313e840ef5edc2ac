//! A real browser for the speedscope test: `tests/scripts/speedscope_page.mjs` opens a
//! profile in the speedscope web app (the npm package `speedscope`) inside Debian's
//! Chromium, headless, driven by `playwright-core`, and reports what the page shows. The
//! npm packages live in `.tools/node` and Chromium is the Debian package `chromium`, all
//! installed by `cargo xtask setup`.
use std::{
    io::Read as _,
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::workspace_root;

/// The browser speedscope runs in.
const CHROMIUM: &str = "/usr/bin/chromium";
/// How long one run may take: the script's own limit for the page is 30 s, and starting
/// Chromium and reading the page take a few more.
const TIMEOUT: Duration = Duration::from_secs(90);

/// Whether the speedscope test can run here.
///
/// In: nothing (the machine: `/usr/bin/chromium`, `node` on PATH, and the `speedscope`
/// and `playwright-core` packages under `<workspace>/.tools/node/node_modules`).
/// Out: `true` when all are there.
#[must_use]
pub fn have_browser() -> bool {
    let modules = workspace_root().join(".tools/node/node_modules");
    Path::new(CHROMIUM).is_file()
        && modules.join("speedscope/dist/release/index.html").is_file()
        && modules.join("playwright-core/package.json").is_file()
        && Command::new("node")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Opens `profile` in speedscope (its Sandwich view) and reads the page.
///
/// In: `profile`, a file speedscope imports (its name is the one speedscope sees);
/// `screenshot`, where the page's PNG goes.
/// Out: the script's JSON object: `frames` (the Sandwich table's Symbol Names of the
/// profile shown, every row, in the table's order), `rows` (the same with `file`, `total`,
/// `self`), `profiles` (the selector's profile names, in order), `profile` (the one shown),
/// `by_profile` (`[{name, frames, rows}]` for every profile), `title`, `errors` (what
/// speedscope reported: empty when it showed the profile). `Err` with the script's stderr
/// when it fails (the page did not load the profile within 30 s, or threw), prints no
/// JSON, or takes longer than 90 s (then it is killed, with the browser).
pub fn speedscope_page(profile: &Path, screenshot: &Path) -> Result<serde_json::Value, String> {
    let root = workspace_root();
    let script = root.join("tests/scripts/speedscope_page.mjs");
    let mut child = Command::new("node")
        .arg(&script)
        .arg(profile)
        .arg(screenshot)
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout kills the browser with it.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run node {}: {e}", script.display()))?;
    // Read both pipes while waiting, so that a full pipe cannot stall the script.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                if let Ok(pid) = i32::try_from(child.id()) {
                    // SAFETY: signalling the process group of our own child.
                    unsafe { libc::kill(-pid, libc::SIGKILL) };
                }
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Err(e) => return Err(format!("waiting for node {}: {e}", script.display())),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(format!(
            "{} on {} took over {} s (killed); stderr:\n{stderr}",
            script.display(),
            profile.display(),
            TIMEOUT.as_secs()
        ));
    };
    if !status.success() {
        return Err(format!(
            "{} on {}: {status}; stderr:\n{stderr}",
            script.display(),
            profile.display()
        ));
    }
    serde_json::from_str(stdout.trim()).map_err(|e| {
        format!(
            "{} on {}: no JSON on stdout ({e}): {stdout}\nstderr:\n{stderr}",
            script.display(),
            profile.display()
        )
    })
}
