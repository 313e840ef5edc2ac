//! Where the Kubernetes API is and how to authenticate, from the pod's environment.
//!
//! In a pod (the DaemonSet): `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`,
//! the service account's token and CA under
//! `/var/run/secrets/kubernetes.io/serviceaccount/`, and the node from `NODE_NAME` (set by
//! the downward API from `spec.nodeName`).
//!
//! `LOOKBACK_KUBE_API=URL` overrides the API address, for tests and out-of-cluster use
//! (e.g. `kubectl proxy` → `LOOKBACK_KUBE_API=http://127.0.0.1:8001`). It is the only way
//! to get plain HTTP, and over plain HTTP no token is sent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::KubeError;

/// The service account directory every pod gets.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The API override (tests, out-of-cluster).
pub const API_OVERRIDE_ENV: &str = "LOOKBACK_KUBE_API";
/// The node this agent runs on (downward API `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// How to reach the API server and which node's pods to follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeConfig {
    /// `https://host:port` or, by override only, `http://…`; no trailing slash.
    pub api_url: String,
    pub node_name: String,
    /// Bearer token file, read before every request (projected tokens rotate); `None`
    /// sends no token.
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that signed the API server's certificate; `None`: the
    /// built-in web PKI roots.
    pub ca_file: Option<PathBuf>,
    /// Server-side length of one watch request (`timeoutSeconds`); the watch then resumes
    /// from the last resource version.
    pub watch_timeout: Duration,
    /// First pause after a failure; doubled on each further failure up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl KubeConfig {
    /// The in-cluster configuration from the process environment (see the module docs).
    pub fn from_env() -> Result<KubeConfig, KubeError> {
        Self::from_lookup(
            |name| std::env::var(name).ok(),
            Path::new(SERVICE_ACCOUNT_DIR),
        )
    }

    /// [`Self::from_env`] with the environment given by `lookup` and the service account
    /// files under `sa_dir`. Token and CA are used when their files exist.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        sa_dir: &Path,
    ) -> Result<KubeConfig, KubeError> {
        let get = |name: &'static str| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or(KubeError::MissingEnv { name })
        };
        let node_name = get(NODE_NAME_ENV)?.trim().to_owned();
        let api_url = match lookup(API_OVERRIDE_ENV).filter(|v| !v.trim().is_empty()) {
            Some(url) => {
                let url = url.trim().trim_end_matches('/').to_owned();
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(KubeError::InvalidEnv {
                        name: API_OVERRIDE_ENV,
                        value: url,
                    });
                }
                url
            }
            None => in_cluster_url(
                &get("KUBERNETES_SERVICE_HOST")?,
                &get("KUBERNETES_SERVICE_PORT")?,
            )?,
        };
        let existing = |name: &str| Some(sa_dir.join(name)).filter(|p| p.is_file());
        let plain = api_url.starts_with("http://");
        Ok(KubeConfig {
            token_file: if plain { None } else { existing("token") },
            ca_file: if plain { None } else { existing("ca.crt") },
            api_url,
            node_name,
            watch_timeout: Duration::from_secs(290),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        })
    }
}

/// `https://HOST:PORT`, with brackets around an IPv6 host.
fn in_cluster_url(host: &str, port: &str) -> Result<String, KubeError> {
    let host = host.trim();
    let port = port.trim();
    if port.parse::<u16>().is_err() {
        return Err(KubeError::InvalidEnv {
            name: "KUBERNETES_SERVICE_PORT",
            value: port.chars().take(32).collect(),
        });
    }
    if host.contains(':') {
        Ok(format!("https://[{host}]:{port}"))
    } else {
        Ok(format!("https://{host}:{port}"))
    }
}
