//! `lookback agent --web-config FILE`: TLS and basic auth for the HTTP endpoint, in the
//! format of the Prometheus exporter toolkit's web configuration file, so that one file
//! serves `node_exporter` and lookback alike:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: /etc/lookback/tls/tls.crt      # PEM, the chain (paths relative to FILE)
//!   key_file: /etc/lookback/tls/tls.key       # PEM, PKCS#8, PKCS#1 or SEC1
//!   client_auth_type: NoClientCert            # or VerifyClientCertIfGiven,
//!                                             #    RequireAndVerifyClientCert
//!   client_ca_file: /etc/lookback/tls/ca.crt  # for the two above
//!   min_version: TLS12                        # TLS12 | TLS13
//!   max_version: TLS13
//! http_server_config:
//!   headers: { X-Frame-Options: deny }        # added to every response
//! basic_auth_users:
//!   prometheus: $2y$10$...                    # bcrypt hashes (htpasswd -nbB)
//! ```
//!
//! Every part is optional; without a file (the default) the endpoint is plain HTTP and
//! open. `/healthz` and `/readyz` never ask for credentials (kubelet probes send none);
//! with TLS they too are served over TLS only. What the toolkit has and lookback does not
//! (TLS 1.0/1.1, `RequestClientCert`, `RequireAnyClientCert`, cipher and curve
//! preferences, HTTP/2) is refused by name with `FILE:LINE:COL`, never ignored.
//!
//! In: the file. Out: a [`WebConfig`]: a rustls server configuration and the users.
#![forbid(unsafe_code)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use base64::Engine as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use serde::{Deserialize, Deserializer};
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig, server::WebPkiClientVerifier};

/// A web configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("cannot read web config file {file}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// Displays as `FILE:LINE:COL: message`.
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// A file the configuration names, or what it holds.
    #[error("{file}: {key}: {message}")]
    Value {
        file: String,
        key: &'static str,
        message: String,
    },
}

/// The endpoint's TLS and users.
#[derive(Clone, Default)]
pub struct WebConfig {
    /// `None`: plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// User → bcrypt hash; empty: no credentials asked.
    pub users: BTreeMap<String, String>,
    /// Added to every response.
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// A hash of the users' cost that no password matches, checked for an unknown user so
    /// that a wrong name takes as long to refuse as a wrong password (no user enumeration
    /// by timing).
    dummy: Option<String>,
}

impl std::fmt::Debug for WebConfig {
    /// Without the hashes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebConfig {
    #[serde(default)]
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    http_server_config: Option<RawHttp>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, BcryptHash>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_auth_type: ClientAuth,
    #[serde(default)]
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    min_version: Option<TlsVersion>,
    #[serde(default)]
    max_version: Option<TlsVersion>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    /// Only `false` is accepted: the endpoint speaks HTTP/1.1.
    #[serde(default, deserialize_with = "http2_off")]
    #[expect(
        dead_code,
        reason = "validated while parsing; there is nothing to keep"
    )]
    http2: bool,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

fn http2_off<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    if bool::deserialize(d)? {
        Err(serde::de::Error::custom(
            "http2: true is not served: the endpoint speaks HTTP/1.1 only",
        ))
    } else {
        Ok(false)
    }
}

/// `client_auth_type`, of those rustls can enforce as the toolkit means them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
enum ClientAuth {
    #[default]
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum TlsVersion {
    #[serde(rename = "TLS12")]
    Tls12,
    #[serde(rename = "TLS13")]
    Tls13,
}

/// A bcrypt hash (`$2a$`, `$2b$`, `$2x$`, `$2y$`), checked when read.
#[derive(Debug, Clone)]
struct BcryptHash(String);

impl<'de> Deserialize<'de> for BcryptHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.parse::<bcrypt::HashParts>().is_err() {
            return Err(serde::de::Error::custom(
                "not a bcrypt hash (make one with `htpasswd -nbB USER PASSWORD`)",
            ));
        }
        Ok(Self(text))
    }
}

impl WebConfig {
    /// Reads and checks `path`.
    pub fn from_file(path: &Path) -> Result<Self, WebConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| WebConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_str_in(&text, &file, base)
    }

    /// Parses `text` (of `file`; relative paths in it are under `base`).
    pub fn from_str_in(text: &str, file: &str, base: &Path) -> Result<Self, WebConfigError> {
        let raw: RawWebConfig = if text.trim().is_empty() {
            RawWebConfig {
                tls_server_config: None,
                http_server_config: None,
                basic_auth_users: BTreeMap::new(),
            }
        } else {
            serde_yaml::from_str(text).map_err(|e| {
                let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
                WebConfigError::Invalid {
                    file: file.to_owned(),
                    line,
                    column,
                    message: e
                        .to_string()
                        .split(" at line ")
                        .next()
                        .unwrap_or("")
                        .to_owned(),
                }
            })?
        };
        let value = |key: &'static str, message: String| WebConfigError::Value {
            file: file.to_owned(),
            key,
            message,
        };
        let tls = raw
            .tls_server_config
            .map(|t| server_config(&t, base).map_err(|(key, message)| value(key, message)))
            .transpose()?;
        let mut headers = Vec::new();
        for (name, text) in raw
            .http_server_config
            .map(|h| h.headers)
            .unwrap_or_default()
        {
            let name = hyper::header::HeaderName::try_from(name.as_str())
                .map_err(|e| value("http_server_config.headers", format!("{name}: {e}")))?;
            let text = hyper::header::HeaderValue::try_from(text.as_str())
                .map_err(|e| value("http_server_config.headers", format!("{name}: {e}")))?;
            headers.push((name, text));
        }
        let users: BTreeMap<String, String> = raw
            .basic_auth_users
            .into_iter()
            .map(|(user, hash)| (user, hash.0))
            .collect();
        let dummy = users
            .values()
            .next()
            .and_then(|h| h.parse::<bcrypt::HashParts>().ok())
            .and_then(|parts| bcrypt::hash("lookback: no such user", parts.get_cost()).ok());
        Ok(Self {
            tls,
            users,
            headers,
            dummy,
        })
    }
}

/// The rustls configuration of `tls`; on failure the key at fault and why.
fn server_config(tls: &RawTls, base: &Path) -> Result<Arc<ServerConfig>, (&'static str, String)> {
    let at = |p: &Path| base.join(p);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(at(&tls.cert_file))
        .and_then(Iterator::collect)
        .map_err(|e| {
            (
                "tls_server_config.cert_file",
                format!("{}: {e}", tls.cert_file.display()),
            )
        })?;
    if certs.is_empty() {
        return Err((
            "tls_server_config.cert_file",
            format!("{}: no certificate in it", tls.cert_file.display()),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(at(&tls.key_file)).map_err(|e| {
        (
            "tls_server_config.key_file",
            format!("{}: {e}", tls.key_file.display()),
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let min = tls.min_version.unwrap_or(TlsVersion::Tls12);
    let max = tls.max_version.unwrap_or(TlsVersion::Tls13);
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|&(v, _)| version_rank(min) <= version_rank(v) && version_rank(v) <= version_rank(max))
    .map(|(_, p)| p)
    .collect();
    if versions.is_empty() {
        return Err((
            "tls_server_config.min_version",
            "min_version is above max_version".to_owned(),
        ));
    }
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| ("tls_server_config.min_version", e.to_string()))?;
    let builder = match (tls.client_auth_type, &tls.client_ca_file) {
        (ClientAuth::NoClientCert, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err((
                "tls_server_config.client_ca_file",
                "client_auth_type verifies client certificates: client_ca_file is needed"
                    .to_owned(),
            ));
        }
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(at(ca)).map_err(|e| {
                (
                    "tls_server_config.client_ca_file",
                    format!("{}: {e}", ca.display()),
                )
            })? {
                let cert = cert.map_err(|e| {
                    (
                        "tls_server_config.client_ca_file",
                        format!("{}: {e}", ca.display()),
                    )
                })?;
                roots.add(cert).map_err(|e| {
                    (
                        "tls_server_config.client_ca_file",
                        format!("{}: {e}", ca.display()),
                    )
                })?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let verifier = if auth == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| ("tls_server_config.client_ca_file", e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        (
            "tls_server_config.key_file",
            format!(
                "{}: does not go with cert_file: {e}",
                tls.key_file.display()
            ),
        )
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn version_rank(v: TlsVersion) -> u8 {
    match v {
        TlsVersion::Tls12 => 12,
        TlsVersion::Tls13 => 13,
    }
}

/// What an `Authorization` header says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// None sent, or not `Basic`.
    Missing,
    /// `Basic`, but not `base64(USER:PASSWORD)`.
    Malformed,
    Given {
        user: String,
        password: String,
    },
}

impl Credentials {
    /// From the value of an `Authorization` header.
    pub fn of(header: Option<&[u8]>) -> Self {
        let Some(value) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
            return Self::Missing;
        };
        let Some((scheme, encoded)) = value.trim().split_once(' ') else {
            return Self::Missing;
        };
        if !scheme.eq_ignore_ascii_case("basic") {
            return Self::Missing;
        }
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return Self::Malformed;
        };
        let Ok(text) = String::from_utf8(decoded) else {
            return Self::Malformed;
        };
        match text.split_once(':') {
            Some((user, password)) => Self::Given {
                user: user.to_owned(),
                password: password.to_owned(),
            },
            None => Self::Malformed,
        }
    }
}

impl WebConfig {
    /// Whether `credentials` name a user with its password (bcrypt: milliseconds of CPU;
    /// call it off the async workers). No users configured: every request passes.
    pub fn authorized(&self, credentials: &Credentials) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Credentials::Given { user, password } = credentials else {
            return false;
        };
        if let Some(hash) = self.users.get(user) {
            return bcrypt::verify(password, hash).unwrap_or(false);
        }
        if let Some(dummy) = &self.dummy {
            let _ = bcrypt::verify(password, dummy);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WebConfig, WebConfigError> {
        WebConfig::from_str_in(text, "web.yml", Path::new("/nonexistent"))
    }

    fn position(err: &WebConfigError) -> (usize, usize) {
        match err {
            WebConfigError::Invalid { line, column, .. } => (*line, *column),
            other => panic!("no position: {other}"),
        }
    }

    #[test]
    fn an_empty_file_is_plain_and_open() {
        let config = parse("").expect("empty");
        assert!(config.tls.is_none() && config.users.is_empty());
        assert!(config.authorized(&Credentials::Missing));
    }

    #[test]
    fn what_is_not_served_is_refused_with_its_position() {
        let err =
            parse("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n")
                .expect_err("unknown key");
        assert_eq!(position(&err), (4, 3), "{err}");
        assert!(err.to_string().contains("cipher_suites"), "{err}");
        let err =
            parse("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n")
                .expect_err("TLS 1.0");
        assert_eq!(position(&err).0, 4, "{err}");
        assert!(err.to_string().contains("TLS12"), "{err}");
        let err = parse("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n")
            .expect_err("client auth");
        assert_eq!(position(&err).0, 4, "{err}");
        let err = parse("http_server_config:\n  http2: true\n").expect_err("http2");
        assert!(err.to_string().starts_with("web.yml:2:"), "{err}");
        let err = parse("basic_auth_users:\n  alice: plaintext\n").expect_err("not a hash");
        assert_eq!(position(&err).0, 2, "{err}");
        assert!(err.to_string().contains("bcrypt"), "{err}");
    }

    #[test]
    fn files_that_cannot_be_read_are_named() {
        let err = parse("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
            .expect_err("missing files");
        let text = err.to_string();
        assert!(
            text.starts_with("web.yml: tls_server_config.cert_file: tls.crt:"),
            "{text}"
        );
    }

    #[test]
    fn basic_auth_takes_the_right_password_only() {
        let hash = bcrypt::hash("s3cret", 4).expect("hash");
        let config = parse(&format!("basic_auth_users:\n  alice: {hash}\n")).expect("config");
        let header = |text: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(text)
            )
        };
        let creds = |text: &str| Credentials::of(Some(header(text).as_bytes()));
        assert!(config.authorized(&creds("alice:s3cret")));
        assert!(!config.authorized(&creds("alice:wrong")));
        assert!(!config.authorized(&creds("bob:s3cret")));
        assert!(!config.authorized(&Credentials::Missing));
        assert_eq!(Credentials::of(Some(b"Basic !!!")), Credentials::Malformed);
        assert_eq!(Credentials::of(Some(b"Bearer abc")), Credentials::Missing);
        assert!(!config.authorized(&Credentials::of(Some(b"Basic !!!"))));
    }
}
