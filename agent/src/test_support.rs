//! Test support: where the external corpora (`shared/corpus/...`) are. The repository is
//! cloned next to `shared/`; `LOOKBACK_SHARED_DIR` overrides (e.g. from a git worktree).
use std::path::{Path, PathBuf};

/// `<shared>/corpus/<sub>` when it holds `marker`, else `None` (the caller skips, saying so).
pub(crate) fn shared_corpus(sub: &str, marker: &str) -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var_os("LOOKBACK_SHARED_DIR").map(PathBuf::from),
        Some(manifest.join("../../shared")),
        Some(manifest.join("../../../shared")), // a git worktree under wt/
    ];
    candidates
        .into_iter()
        .flatten()
        .map(|shared| shared.join("corpus").join(sub))
        .find(|dir| dir.join(marker).is_file())
}

/// A perf sideband record as the PT recorder's events write it: `kind`, `misc`, `body`,
/// then the `sample_id_all` trailer of `capture::intel_pt::SIDEBAND_SAMPLE_TYPE` (pid/tid,
/// time, cpu, identifier).
pub(crate) fn sideband_record(
    kind: u32,
    misc: u16,
    body: &[u8],
    (pid, tid): (u32, u32),
    time: u64,
    cpu: u32,
) -> Vec<u8> {
    let mut rec = Vec::new();
    let mut body = body.to_vec();
    body.resize(body.len().next_multiple_of(8), 0);
    let size = u16::try_from(8 + body.len() + 32).expect("small record");
    rec.extend(kind.to_le_bytes());
    rec.extend(misc.to_le_bytes());
    rec.extend(size.to_le_bytes());
    rec.extend(body);
    rec.extend(pid.to_le_bytes());
    rec.extend(tid.to_le_bytes());
    rec.extend(time.to_le_bytes());
    rec.extend(u64::from(cpu).to_le_bytes());
    rec.extend(0u64.to_le_bytes());
    rec
}

/// `PERF_RECORD_ITRACE_START` and `PERF_RECORD_COMM` for a thread at `time`.
pub(crate) fn thread_start_records(pid: u32, tid: u32, comm: &str, time: u64, cpu: u32) -> Vec<u8> {
    let ids = [pid.to_le_bytes(), tid.to_le_bytes()].concat();
    let mut comm_body = ids.clone();
    comm_body.extend(comm.as_bytes());
    comm_body.push(0);
    let mut out = sideband_record(3, 0, &comm_body, (pid, tid), time, cpu);
    out.extend(sideband_record(12, 0, &ids, (pid, tid), time, cpu));
    out
}
