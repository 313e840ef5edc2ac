//! Blocking access to the two API calls the agent makes: list the pods of a node, and watch
//! them from a resource version (newline-delimited JSON events). ureq with rustls; the
//! service account's CA as the only root when it is present.

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ureq::http::Response;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};
use ureq::{Agent, Body, BodyReader};

use super::KubeError;
use super::config::KubeConfig;
use super::pods::{ApiStatus, PodList, WatchEvent};

/// Largest `PodList` body read (a node runs at most a few hundred pods).
const MAX_LIST_BYTES: u64 = 64 << 20;
/// Longest watch event line (one pod object).
const MAX_EVENT_BYTES: u64 = 4 << 20;
/// Longest error body quoted in a message.
const MAX_ERROR_CHARS: usize = 300;

/// A client for the pods API of one cluster.
#[derive(Debug)]
pub struct KubeClient {
    api_url: String,
    token_file: Option<PathBuf>,
    list_agent: Agent,
    watch_agent: Agent,
    watch_timeout: Duration,
}

impl KubeClient {
    /// Builds the HTTP agents; reads the CA file now (a missing or empty one is an error).
    pub fn new(config: &KubeConfig) -> Result<KubeClient, KubeError> {
        let tls = match &config.ca_file {
            Some(path) => TlsConfig::builder().root_certs(read_ca(path)?).build(),
            None => TlsConfig::default(),
        };
        let list_agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls.clone())
            .timeout_global(Some(Duration::from_mins(1)))
            .build()
            .into();
        // A watch stays open for `watch_timeout`; the server sends bookmarks meanwhile, so
        // a read that waits much longer means a dead connection.
        let watch_agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_mins(1)))
            .timeout_per_read(Some(config.watch_timeout + Duration::from_mins(1)))
            .build()
            .into();
        Ok(KubeClient {
            api_url: config.api_url.clone(),
            token_file: config.token_file.clone(),
            list_agent,
            watch_agent,
            watch_timeout: config.watch_timeout,
        })
    }

    /// `GET /api/v1/pods?fieldSelector=spec.nodeName=NODE`.
    pub fn list_pods(&self, node_name: &str) -> Result<PodList, KubeError> {
        let url = format!(
            "{}/api/v1/pods?fieldSelector={}",
            self.api_url,
            encode(&format!("spec.nodeName={node_name}"))
        );
        let response = self.get(&self.list_agent, &url)?;
        let text = response
            .into_body()
            .into_with_config()
            .limit(MAX_LIST_BYTES)
            .read_to_string()
            .map_err(|source| KubeError::Http {
                url: url.clone(),
                source,
            })?;
        PodList::from_json(&text)
    }

    /// `GET /api/v1/pods?watch=1&resourceVersion=RV&allowWatchBookmarks=true&…`: the events
    /// after `resource_version`, until the server ends the request.
    pub fn watch_pods(
        &self,
        node_name: &str,
        resource_version: &str,
    ) -> Result<WatchStream, KubeError> {
        let url = format!(
            "{}/api/v1/pods?fieldSelector={}&watch=1&resourceVersion={}\
             &allowWatchBookmarks=true&timeoutSeconds={}",
            self.api_url,
            encode(&format!("spec.nodeName={node_name}")),
            encode(resource_version),
            self.watch_timeout.as_secs().max(1),
        );
        let response = self.get(&self.watch_agent, &url)?;
        Ok(WatchStream {
            reader: BufReader::new(response.into_body().into_with_config().reader()),
            line: Vec::new(),
        })
    }

    /// A GET with the current token; non-2xx answers become [`KubeError::Status`] or
    /// [`KubeError::Gone`].
    fn get(&self, agent: &Agent, url: &str) -> Result<Response<Body>, KubeError> {
        let mut request = agent.get(url).header("Accept", "application/json");
        if let Some(path) = &self.token_file {
            // Read every time: projected tokens are rotated by the kubelet (about hourly).
            let token = fs::read_to_string(path).map_err(|source| KubeError::Read {
                path: path.clone(),
                source,
            })?;
            request = request.header("Authorization", format!("Bearer {}", token.trim()));
        }
        let response = request.call().map_err(|source| KubeError::Http {
            url: url.to_owned(),
            source,
        })?;
        let code = response.status().as_u16();
        if (200..300).contains(&code) {
            return Ok(response);
        }
        let body = response
            .into_body()
            .with_config()
            .limit(64 << 10)
            .read_to_string()
            .unwrap_or_default();
        let status: ApiStatus = serde_json::from_str(&body).unwrap_or_default();
        if code == 410 || status.is_gone() {
            return Err(KubeError::Gone {
                url: url.to_owned(),
            });
        }
        let message = if status.message.is_empty() {
            body.chars().take(MAX_ERROR_CHARS).collect()
        } else {
            status.message.chars().take(MAX_ERROR_CHARS).collect()
        };
        Err(KubeError::Status {
            url: url.to_owned(),
            code,
            message,
        })
    }
}

/// The events of one watch request; ends when the server closes the stream.
pub struct WatchStream {
    reader: BufReader<BodyReader<'static>>,
    line: Vec<u8>,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream").finish_non_exhaustive()
    }
}

impl Iterator for WatchStream {
    type Item = Result<WatchEvent, KubeError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.line.clear();
            let read = (&mut self.reader)
                .take(MAX_EVENT_BYTES + 1)
                .read_until(b'\n', &mut self.line);
            match read {
                Ok(0) => return None,
                Ok(n) if n as u64 > MAX_EVENT_BYTES => {
                    return Some(Err(KubeError::LineTooLong {
                        limit: MAX_EVENT_BYTES,
                    }));
                }
                Ok(_) => {}
                Err(source) => return Some(Err(KubeError::Stream { source })),
            }
            let text = String::from_utf8_lossy(&self.line);
            if !text.trim().is_empty() {
                return Some(WatchEvent::from_json(text.trim()));
            }
        }
    }
}

/// Every certificate of a PEM file, as the only trusted roots.
fn read_ca(path: &PathBuf) -> Result<RootCerts, KubeError> {
    let pem = fs::read(path).map_err(|source| KubeError::Read {
        path: path.clone(),
        source,
    })?;
    let mut certs: Vec<Certificate<'static>> = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(cert)) => certs.push(cert),
            Ok(_) => {}
            Err(source) => {
                return Err(KubeError::Certificate {
                    path: path.clone(),
                    source,
                });
            }
        }
    }
    if certs.is_empty() {
        return Err(KubeError::NoCertificate { path: path.clone() });
    }
    Ok(RootCerts::Specific(Arc::new(certs)))
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("spec.nodeName=node-a"), "spec.nodeName%3Dnode-a");
        assert_eq!(encode("12345"), "12345");
        assert_eq!(encode("a b&c"), "a%20b%26c");
    }
}
