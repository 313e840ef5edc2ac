//! The object layout: `PREFIX/NODE/RULE/<stem>.<ext>`, made and read back.
//!
//! In: a rule's [`ObjectUrl`], the node, the rule and a spool file; or an object key found
//! by a listing. Out: the key ([`object_key`]), or its parts ([`parse_key`]) with the
//! snapshot's time from its stem (`YYYYmmddTHHMMSS.ffffffZ-PID-TID`, UTC).
use std::path::Path;

use object_store::path::Path as ObjectPath;

use crate::rules::ObjectUrl;

/// `PREFIX/NODE/RULE/<file name>`.
#[must_use]
pub fn object_key(url: &ObjectUrl, node: &str, rule: &str, file: &Path) -> ObjectPath {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    ObjectPath::from(url.key(&format!("{node}/{rule}/{name}")))
}

/// What a key under the layout says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyParts {
    pub node: String,
    pub rule: String,
    pub stem: String,
    /// `json` (metadata), `fxt.gz`, `json.gz`, `lbsnap`.
    pub ext: String,
    /// The snapshot's trigger time from the stem, ns since the Unix epoch.
    pub unix_ns: Option<u64>,
}

/// The parts of `key` below `prefix` (`NODE/RULE/<stem>.<ext>`); `None` for other keys.
#[must_use]
pub fn parse_key(prefix: &str, key: &str) -> Option<KeyParts> {
    let rest = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('/')?
    };
    let mut parts = rest.split('/');
    let (node, rule, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let ext = ["fxt.gz", "json.gz", "lbsnap", "json"]
        .into_iter()
        .find(|ext| name.ends_with(&format!(".{ext}")))?;
    let stem = &name[..name.len() - ext.len() - 1];
    Some(KeyParts {
        node: node.to_owned(),
        rule: rule.to_owned(),
        stem: stem.to_owned(),
        ext: ext.to_owned(),
        unix_ns: stem_unix_ns(stem),
    })
}

/// The UTC time at the start of a stem, in ns since the Unix epoch.
#[must_use]
pub fn stem_unix_ns(stem: &str) -> Option<u64> {
    let b = stem.as_bytes();
    if b.len() < 23 || b[8] != b'T' || b[15] != b'.' || b[22] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| stem.get(r)?.parse::<u64>().ok();
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss, us) = (num(9..11)?, num(11..13)?, num(13..15)?, num(16..22)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || y < 1970 {
        return None;
    }
    let days = days_from_civil(y, m, d);
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(secs * 1_000_000_000 + us * 1000)
}

/// Days since 1970-01-01 of a Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_and_read_back() {
        let url = ObjectUrl {
            scheme: "s3".to_owned(),
            bucket: "b".to_owned(),
            prefix: "fleet/lb".to_owned(),
        };
        let stem = "20261206T233126.563004Z-8045-8045";
        let key = object_key(
            &url,
            "node-1",
            "slow",
            Path::new(&format!("/o/{stem}.fxt.gz")),
        );
        assert_eq!(key.as_ref(), format!("fleet/lb/node-1/slow/{stem}.fxt.gz"));
        let parts = parse_key("fleet/lb", key.as_ref()).unwrap();
        assert_eq!(
            (parts.node.as_str(), parts.rule.as_str(), parts.ext.as_str()),
            ("node-1", "slow", "fxt.gz")
        );
        assert_eq!(parts.stem, stem);
        // 2026-12-06T23:31:26.563004Z
        assert_eq!(parts.unix_ns, Some(1_796_599_886_563_004_000));
        assert!(parse_key("fleet/lb", "other/node/r/x.json").is_none());
        assert!(parse_key("", "n/r/x.json").is_some());
        assert_eq!(parse_key("", "n/r/x.json.gz").unwrap().ext, "json.gz");
    }
}
