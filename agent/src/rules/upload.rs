//! `output.upload`: the object store a rule's snapshots go to once they are on local disk.
//!
//! In: the `upload:` mapping of a rule's or the defaults' `output` (fields merged one by
//! one, the rule's first, as for every other key). Out: an [`UploadPolicy`], or a problem
//! at the line and column of the offending key: a URL that is not an object URL, an
//! endpoint that is not `http(s)://host[:port]`, `allow_http` that does not match the
//! endpoint's scheme. Credentials are never read from the rules file: the uploader takes
//! them from the environment as every AWS, GCP and Azure tool does.

use serde::Deserialize;

use super::error::snippet;
use super::leaf::{Scalar, Size, Text};
use super::locate::{Problem, Step};

/// Pending bytes per rule before the oldest snapshot not yet uploaded is dropped.
pub const DEFAULT_MAX_PENDING: u64 = 1 << 30;

/// Where and how a rule's snapshots are uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPolicy {
    pub url: ObjectUrl,
    /// An S3-compatible server instead of AWS (`http://minio:9000`).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Plain HTTP to `endpoint` (its scheme is `http`).
    pub allow_http: bool,
    /// Also the raw `.lbsnap` (it holds raw stack memory of the traced process).
    pub include_raw: bool,
    /// Bytes of this rule's snapshots not yet uploaded that the spool keeps; beyond it the
    /// oldest is dropped (and counted).
    pub max_pending: u64,
}

/// `s3://BUCKET/PREFIX` (or `gs://`, `az://`): a bucket and a key prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    /// `s3`, `gs` or `az`.
    pub scheme: String,
    pub bucket: String,
    /// Without leading or trailing `/`; may be empty.
    pub prefix: String,
}

impl ObjectUrl {
    /// The URL of the bucket alone (`s3://BUCKET`), as object stores are opened.
    #[must_use]
    pub fn bucket_url(&self) -> String {
        format!("{}://{}", self.scheme, self.bucket)
    }

    /// `PREFIX/rest`, or `rest` without a prefix.
    #[must_use]
    pub fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.bucket_url())?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ObjectUrl {
    type Err = String;

    /// As in a rules file: `s3://BUCKET/PREFIX` (or `gs://`, `az://`).
    fn from_str(text: &str) -> Result<Self, String> {
        <Self as Scalar>::parse(text)
    }
}

impl Scalar for ObjectUrl {
    const EXPECTING: &'static str = "an object URL such as s3://bucket/prefix";

    fn parse(text: &str) -> Result<Self, String> {
        let Text(text) = Text::parse(text)?;
        let text = text.trim();
        let wrong = || {
            format!(
                "`{}` is not an object URL: expected s3://BUCKET/PREFIX (or gs://, az://)",
                snippet(text)
            )
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(wrong)?;
        if !matches!(scheme, "s3" | "gs" | "az") {
            return Err(wrong());
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
        if !bucket_ok {
            return Err(format!(
                "bucket `{}` in `{}`: expected 3 to 63 of a-z, 0-9, `-`, `.`, `_`",
                snippet(bucket),
                snippet(text)
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|part| part == "." || part == "..")
            || prefix.contains("//")
            || prefix.chars().any(char::is_whitespace)
        {
            return Err(format!("prefix `{}`: not a key prefix", snippet(prefix)));
        }
        Ok(Self {
            scheme: scheme.to_owned(),
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

/// `http(s)://host[:port][/path]`: an S3-compatible server.
#[derive(Debug, Clone)]
pub(super) struct Endpoint(pub String);

impl Endpoint {
    fn is_plain_http(&self) -> bool {
        self.0.starts_with("http://")
    }
}

impl Scalar for Endpoint {
    const EXPECTING: &'static str = "an endpoint such as http://minio:9000";

    fn parse(text: &str) -> Result<Self, String> {
        let Text(text) = Text::parse(text)?;
        let text = text.trim();
        let rest = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"));
        match rest {
            Some(host) if !host.is_empty() && !host.starts_with('/') && !host.contains(' ') => {
                Ok(Self(text.trim_end_matches('/').to_owned()))
            }
            _ => Err(format!(
                "`{}` is not an endpoint: expected http://HOST[:PORT] or https://HOST[:PORT]",
                snippet(text)
            )),
        }
    }
}

macro_rules! deserialize_scalar {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::leaf::deserialize_with_scalar(d)
            }
        }
    )*};
}
deserialize_scalar!(ObjectUrl, Endpoint);

/// `upload:` as serde reads it.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of url, endpoint, region, allow_http, include_raw, max_pending"
)]
pub(super) struct RawUpload {
    pub url: Option<ObjectUrl>,
    pub endpoint: Option<Endpoint>,
    pub region: Option<Text>,
    pub allow_http: Option<bool>,
    pub include_raw: Option<bool>,
    pub max_pending: Option<Size>,
}

/// The rule's upload (`rule` over `defaults`, field by field), or `None` when neither has
/// one. Problems are relative to the rule, at its `output.upload` (or the field at fault).
pub(super) fn merge(
    rule: Option<&RawUpload>,
    defaults: Option<&RawUpload>,
) -> Result<Option<UploadPolicy>, Problem> {
    if rule.is_none() && defaults.is_none() {
        return Ok(None);
    }
    let at = |key: &'static str| vec![Step::Key("output"), Step::Key("upload"), Step::Key(key)];
    let pick = |field: &dyn Fn(&RawUpload) -> bool| rule.is_some_and(field);
    let Some(url) = rule
        .and_then(|u| u.url.clone())
        .or_else(|| defaults.and_then(|u| u.url.clone()))
    else {
        return Err(Problem::at_key(
            vec![Step::Key("output"), Step::Key("upload")],
            "upload needs url: s3://BUCKET/PREFIX (here or in defaults.output.upload)",
        ));
    };
    let endpoint = rule
        .and_then(|u| u.endpoint.clone())
        .or_else(|| defaults.and_then(|u| u.endpoint.clone()));
    let allow_http = rule
        .and_then(|u| u.allow_http)
        .or_else(|| defaults.and_then(|u| u.allow_http))
        .unwrap_or(false);
    let plain = endpoint.as_ref().is_some_and(Endpoint::is_plain_http);
    if allow_http && !plain {
        let why = match &endpoint {
            Some(e) => format!("allow_http is for plain-HTTP endpoints; {} is https", e.0),
            None => "allow_http without an http:// endpoint".to_owned(),
        };
        let key = if pick(&|u| u.allow_http.is_some()) {
            at("allow_http")
        } else {
            at("endpoint")
        };
        return Err(Problem::at_key(key, why));
    }
    if plain && !allow_http {
        let key = if pick(&|u| u.endpoint.is_some()) {
            at("endpoint")
        } else {
            at("allow_http")
        };
        return Err(Problem::at_key(
            key,
            "a plain-HTTP endpoint needs allow_http: true (credentials and snapshots go \
             unencrypted)",
        ));
    }
    Ok(Some(UploadPolicy {
        url,
        endpoint: endpoint.map(|e| e.0),
        region: rule
            .and_then(|u| u.region.as_ref())
            .or_else(|| defaults.and_then(|u| u.region.as_ref()))
            .map(|r| r.0.clone()),
        allow_http,
        include_raw: rule
            .and_then(|u| u.include_raw)
            .or_else(|| defaults.and_then(|u| u.include_raw))
            .unwrap_or(false),
        max_pending: rule
            .and_then(|u| u.max_pending.as_ref())
            .or_else(|| defaults.and_then(|u| u.max_pending.as_ref()))
            .map_or(DEFAULT_MAX_PENDING, |s| s.0),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_urls_name_a_bucket_and_a_prefix() {
        let url = ObjectUrl::parse("s3://snaps/prod/lookback/").unwrap();
        assert_eq!(
            (url.bucket.as_str(), url.prefix.as_str()),
            ("snaps", "prod/lookback")
        );
        assert_eq!(url.key("n1/r/x.json"), "prod/lookback/n1/r/x.json");
        assert_eq!(url.to_string(), "s3://snaps/prod/lookback");
        assert_eq!(ObjectUrl::parse("gs://b-1").unwrap().key("k"), "k");
        for bad in [
            "/var/lib",
            "http://x/y",
            "s3://",
            "s3://B/x",
            "s3://ok/../x",
            "s3://ab",
        ] {
            assert!(ObjectUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(Endpoint::parse("https://s3.local:9000/").is_ok());
        assert!(Endpoint::parse("minio:9000").is_err());
    }
}

#[cfg(test)]
mod file_tests {
    use crate::rules::RuleSet;
    use crate::rules::tests::assert_error;

    fn file(upload: &str) -> String {
        format!(
            "version: 1\nrules:\n  - name: r\n    target: {{pid: 1}}\n    trigger: {{signal: \
             {{signals: [SIGSEGV]}}}}\n    output:\n      upload:\n{upload}"
        )
    }

    #[test]
    fn an_upload_is_read_with_its_defaults_and_merged_field_by_field() {
        let text = "version: 1\ndefaults:\n  output:\n    upload: {url: 's3://snaps/fleet', \
                    region: eu-west-1}\nrules:\n  - name: r\n    target: {pid: 1}\n    \
                    trigger: {signal: {signals: [SIGSEGV]}}\n    output:\n      upload: \
                    {endpoint: 'http://minio:9000', allow_http: true, max_pending: 64MiB}\n";
        let rules = RuleSet::from_str(text, "t.yaml").expect("valid");
        let upload = rules.rules[0].output.upload.clone().expect("upload");
        assert_eq!(upload.url.to_string(), "s3://snaps/fleet");
        assert_eq!(upload.region.as_deref(), Some("eu-west-1"));
        assert_eq!(upload.endpoint.as_deref(), Some("http://minio:9000"));
        assert!(upload.allow_http && !upload.include_raw);
        assert_eq!(upload.max_pending, 64 << 20);
    }

    #[test]
    fn bad_upload_values_are_refused_at_their_position() {
        assert_error(
            &file("        url: /var/lib/x\n"),
            8,
            14,
            "is not an object URL",
        );
        assert_error(
            &file("        url: s3://b-1/x\n        secret_key: k\n"),
            9,
            9,
            "unknown field `secret_key`",
        );
        assert_error(
            &file(
                "        url: s3://b-1/x\n        endpoint: https://s3.local\n        allow_http: true\n",
            ),
            10,
            9,
            "allow_http is for plain-HTTP endpoints",
        );
        assert_error(
            &file("        url: s3://b-1/x\n        endpoint: http://minio:9000\n"),
            9,
            9,
            "needs allow_http: true",
        );
        assert_error(
            &file("        region: us-east-1\n"),
            7,
            7,
            "upload needs url",
        );
    }
}
