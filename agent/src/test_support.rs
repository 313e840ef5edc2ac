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
