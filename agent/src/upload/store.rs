//! The object store behind an upload URL, and what its errors mean.
//!
//! In: an [`ObjectUrl`] with the endpoint, region and `allow_http` of a rule (or of the
//! `snapshots` command line). Out: an [`ObjectStore`] with credentials taken the way every
//! AWS, GCP and Azure tool takes them (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
//! `AWS_SESSION_TOKEN`, `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` for IRSA, the
//! instance metadata service; `GOOGLE_*`, `AZURE_*`), never from the rules file; and
//! [`ErrorCode`]: the store's own error code (`AccessDenied`, `NoSuchBucket`, ...) found in
//! an error, and whether retrying can help.
//!
//! The client retries a request once at most: the uploader retries with its own backoff
//! for as long as the store is down, so a request never hangs a snapshot.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::rules::ObjectUrl;

/// Opening a store failed: a URL or option the client refuses.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the object store {url}")]
pub struct OpenError {
    pub url: String,
    #[source]
    pub source: object_store::Error,
}

/// How to reach a store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreConfig {
    pub url: ObjectUrl,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub allow_http: bool,
}

/// Opens the store of `config` (no request is made yet).
pub fn open(config: &StoreConfig) -> Result<Arc<dyn ObjectStore>, OpenError> {
    let url = config.url.bucket_url();
    let client = ClientOptions::new()
        // One PUT carries a whole file: room for tens of MB on a slow link.
        .with_timeout(Duration::from_mins(5))
        .with_connect_timeout(Duration::from_secs(5))
        .with_allow_http(config.allow_http);
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 1,
        retry_timeout: Duration::from_secs(30),
    };
    let fail = |source| OpenError {
        url: url.clone(),
        source,
    };
    let store: Arc<dyn ObjectStore> = match config.url.scheme.as_str() {
        "gs" => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_url(&url)
                .with_client_options(client)
                .with_retry(retry)
                .build()
                .map_err(fail)?,
        ),
        "az" => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(&url)
                .with_client_options(client)
                .with_retry(retry)
                .build()
                .map_err(fail)?,
        ),
        _ => {
            let mut s3 = AmazonS3Builder::from_env()
                .with_url(&url)
                .with_client_options(client)
                .with_retry(retry)
                .with_allow_http(config.allow_http);
            if let Some(endpoint) = &config.endpoint {
                // S3-compatible servers (MinIO, SeaweedFS) address buckets by path.
                s3 = s3
                    .with_endpoint(endpoint)
                    .with_virtual_hosted_style_request(false);
            }
            if let Some(region) = &config.region {
                s3 = s3.with_region(region);
            }
            Arc::new(s3.build().map_err(fail)?)
        }
    };
    Ok(store)
}

/// What a failed request says: the store's error code and whether the store is wrongly
/// configured (credentials, bucket), which waiting does not fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCode {
    /// `AccessDenied`, `NoSuchBucket`, `InvalidAccessKeyId`, ... as the store names it;
    /// `Unreachable` when no answer came; `Other` else.
    pub code: String,
    /// Credentials or bucket: the operator must act.
    pub configuration: bool,
    /// This request will be refused again (an object too large, a bad argument): retrying
    /// the same snapshot does not help.
    pub permanent: bool,
}

/// Codes that refuse the request itself, whatever the store's state.
const PERMANENT: [&str; 9] = [
    "EntityTooLarge",
    "InvalidArgument",
    "InvalidRequest",
    "MalformedXML",
    "KeyTooLongError",
    "InvalidObjectName",
    "MetadataTooLarge",
    "InvalidDigest",
    "BadDigest",
];

/// Codes that mean the store is wrongly configured, not down.
const CONFIGURATION: [&str; 14] = [
    "AccessDenied",
    "AllAccessDisabled",
    "AuthorizationHeaderMalformed",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidBucketName",
    "InvalidToken",
    "NoSuchBucket",
    "SignatureDoesNotMatch",
    "Unauthenticated",
    "PermissionDenied",
    "ContainerNotFound",
    "AuthenticationFailed",
    "InvalidAuthenticationInfo",
];

impl ErrorCode {
    /// The code of `error`: the `<Code>` of the store's XML answer (S3, Azure) or the
    /// `"reason"`/`"status"` of its JSON one (GCS) where the chain carries it, else the kind
    /// of error the client saw.
    #[must_use]
    pub fn of(error: &object_store::Error) -> Self {
        let text = crate::sys::error_chain(error);
        let code = tagged(&text, "<Code>", "</Code>")
            .or_else(|| tagged(&text, "\"reason\": \"", "\""))
            .map_or_else(|| fallback(error, &text).to_owned(), str::to_owned);
        let configuration = CONFIGURATION.contains(&code.as_str());
        let permanent = PERMANENT.contains(&code.as_str());
        Self {
            code,
            configuration,
            permanent,
        }
    }
}

/// The text between `open` and `close` in `text`, if it is a plausible code.
fn tagged<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let len = text[start..].find(close)?;
    let code = &text[start..start + len];
    (!code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then_some(code)
}

/// A code from the error's kind, where the answer had none.
fn fallback(error: &object_store::Error, text: &str) -> &'static str {
    match error {
        object_store::Error::NotFound { .. } => "NotFound",
        object_store::Error::PermissionDenied { .. } => "PermissionDenied",
        object_store::Error::Unauthenticated { .. } => "Unauthenticated",
        _ if text.contains("error sending request")
            || text.contains("onnection refused")
            || text.contains("timed out")
            || text.contains("dns error") =>
        {
            "Unreachable"
        }
        _ => "Other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(body: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: body.to_owned().into(),
        }
    }

    #[test]
    fn the_stores_own_code_is_found_and_classified() {
        let e = generic(
            "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\
             <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist\
             </Message></Error>",
        );
        let code = ErrorCode::of(&e);
        assert_eq!(code.code, "NoSuchBucket");
        assert!(code.configuration);
        let down = ErrorCode::of(&generic(
            "error sending request for url (http://127.0.0.1:1/b/k): Connection refused",
        ));
        assert_eq!(down.code, "Unreachable");
        assert!(!down.configuration);
        assert_eq!(
            ErrorCode::of(&generic("<Code>Slow Down</Code>")).code,
            "Other"
        );
    }

    #[test]
    fn a_url_opens_without_a_request() {
        let config = StoreConfig {
            url: ObjectUrl {
                scheme: "s3".to_owned(),
                bucket: "snaps".to_owned(),
                prefix: "p".to_owned(),
            },
            endpoint: Some("http://127.0.0.1:1".to_owned()),
            region: Some("us-east-1".to_owned()),
            allow_http: true,
        };
        assert!(open(&config).is_ok());
    }
}
