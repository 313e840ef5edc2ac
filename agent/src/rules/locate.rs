//! Positions for rules-file errors. In: a `serde_yaml` error, or a [`Problem`] that
//! `validate` found after parsing (a path into the document). Out: a
//! [`RulesError::Invalid`] with `LINE:COL`.
//!
//! `serde_yaml` does not expose spans, so a problem is located by deserializing the text once
//! more with a probe that walks the path and fails on purpose at the node (or key) it names:
//! `serde_yaml` then puts that node's position on the probe's error. This costs one extra parse,
//! only on the error path.

use std::fmt::{self, Write as _};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::error::RulesError;

/// One step of a path into the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// A mapping key (always one of our field names).
    Key(&'static str),
    /// A sequence index.
    Index(usize),
}

/// Whether a problem is about the node at the path, or the key that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum At {
    Value,
    Key,
}

/// A problem found after parsing, in terms of the document's structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    path: Vec<Step>,
    at: At,
    message: String,
    /// Another node the message refers to; its line is appended as `(first at line N)`.
    first_at: Option<Vec<Step>>,
    /// A second node the problem is equally about; the error points at whichever of the two
    /// comes later in the file.
    or_later: Option<Vec<Step>>,
}

impl Problem {
    /// A problem with the key that names the node at `path`.
    pub fn at_key(path: Vec<Step>, message: impl Into<String>) -> Self {
        Self::new(path, At::Key, message.into())
    }

    /// A problem with the node at `path`.
    pub fn at_value(path: Vec<Step>, message: impl Into<String>) -> Self {
        Self::new(path, At::Value, message.into())
    }

    fn new(path: Vec<Step>, at: At, message: String) -> Self {
        Self {
            path,
            at,
            message,
            first_at: None,
            or_later: None,
        }
    }

    /// Appends `(first at line N)` for the node at `path`.
    pub fn first_at(self, path: Vec<Step>) -> Self {
        Self {
            first_at: Some(path),
            ..self
        }
    }

    /// Points at the node at `path` instead, if it comes later in the file.
    pub fn or_later(self, path: Vec<Step>) -> Self {
        Self {
            or_later: Some(path),
            ..self
        }
    }

    /// The same problem, its paths relative to the node at `prefix`.
    pub fn under(self, prefix: &[Step]) -> Self {
        let nest = |path: Vec<Step>| [prefix, &path].concat();
        Self {
            path: nest(self.path),
            first_at: self.first_at.map(nest),
            or_later: self.or_later.map(nest),
            ..self
        }
    }
}

/// 1-based line and column (in characters, as libyaml counts them) just after `prefix`.
pub(super) fn line_column(prefix: &str) -> (usize, usize) {
    let line = prefix.matches('\n').count() + 1;
    let last_line = prefix.rsplit('\n').next().unwrap_or_default();
    (line, last_line.chars().count() + 1)
}

/// `rules[1].trigger.syscall`, as `serde_yaml` writes paths.
fn render(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Index(index) => {
                let _ = write!(out, "[{index}]");
            }
        }
    }
    out
}

/// A `serde_yaml` error as `FILE:LINE:COL: message`; errors without a position (the whole
/// document, such as the alias repetition limit) are put at 1:1.
pub(super) fn from_yaml(text: &str, file: &str, err: &serde_yaml::Error) -> RulesError {
    let (mut line, mut column) = err
        .location()
        .map_or((1, 1), |loc| (loc.line(), loc.column()));
    let mut message = err.to_string();
    let suffix = format!(" at line {line} column {column}");
    if let Some(start) = message.find(&suffix) {
        message.replace_range(start..start + suffix.len(), "");
    }
    // libyaml's reader errors (bad characters) come with a byte offset only.
    if let Some((head, offset)) = message.rsplit_once(" at position ")
        && let Some(before) = offset.parse().ok().and_then(|at: usize| text.get(..at))
    {
        (line, column) = line_column(before);
        message.truncate(head.len());
    }
    let offending = text
        .lines()
        .nth(line.saturating_sub(1))
        .and_then(|text| text.chars().nth(column.saturating_sub(1)));
    if offending == Some('\t') {
        message.push_str(" (a tab: YAML indents with spaces only)");
    }
    if message.contains("unknown field `<<`") {
        message.push_str(" (YAML merge keys are not supported; shared settings go in `defaults:`)");
    }
    let message = match message.as_str() {
        "repetition limit exceeded" => {
            "YAML aliases expand too much (repetition limit exceeded)".to_owned()
        }
        "recursion limit exceeded" => {
            "YAML nested too deeply (recursion limit exceeded)".to_owned()
        }
        "deserializing from YAML containing more than one document is not supported" => {
            "more than one YAML document; a rules file is one document".to_owned()
        }
        _ => message,
    };
    RulesError::Invalid {
        file: file.to_owned(),
        line,
        column,
        message,
    }
}

/// A [`Problem`] as `FILE:LINE:COL: path: message`, located in `text`.
pub(super) fn from_problem(text: &str, file: &str, problem: Problem) -> RulesError {
    let mut path = problem.path;
    let mut position = locate(text, &path, problem.at);
    if let Some(other) = problem.or_later {
        let other_position = locate(text, &other, problem.at);
        if other_position > position {
            (path, position) = (other, other_position);
        }
    }
    let (line, column) = position.unwrap_or((1, 1));
    let mut message = format!("{}: {}", render(&path), problem.message);
    if let Some(first) = &problem.first_at
        && let Some((first_line, _)) = locate(text, first, At::Value)
    {
        let _ = write!(message, " (first at line {first_line})");
    }
    RulesError::Invalid {
        file: file.to_owned(),
        line,
        column,
        message,
    }
}

/// The 1-based `(line, column)` of the node at `path` (or of its key), if it exists.
fn locate(text: &str, path: &[Step], at: At) -> Option<(usize, usize)> {
    let probe = Probe { rest: path, at };
    let err = probe
        .deserialize(serde_yaml::Deserializer::from_str(text))
        .err()?;
    // Any other error (e.g. `serde_yaml`'s length check after a probe that found nothing)
    // carries a position that means nothing here.
    if !err.to_string().contains(FOUND) {
        return None;
    }
    let location = err.location()?;
    Some((location.line(), location.column()))
}

/// Walks `rest` and fails at its end.
#[derive(Clone, Copy)]
struct Probe<'p> {
    rest: &'p [Step],
    at: At,
}

const FOUND: &str = "probe found its node";

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FOUND)
    }

    // Scalars: at the end of the path the default `visit_*` methods fail with an
    // "invalid type" error, which is all a probe needs; before it, the path does not exist.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.leaf()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.leaf()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.leaf()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.leaf()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.leaf()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Step::Key(wanted), rest)) = self.rest.split_first() else {
            return self.leaf();
        };
        let fail_on_key = rest.is_empty() && self.at == At::Key;
        while let Some(matched) = map.next_key_seed(KeyProbe {
            wanted,
            fail_on_key,
        })? {
            if matched {
                return map.next_value_seed(Probe { rest, at: self.at });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Step::Index(wanted), rest)) = self.rest.split_first() else {
            return self.leaf();
        };
        for _ in 0..*wanted {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Probe { rest, at: self.at })?;
        Ok(())
    }
}

impl Probe<'_> {
    fn leaf<E: de::Error>(self) -> Result<(), E> {
        if self.rest.is_empty() {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

/// Reads a mapping key: `Ok(true)` when it is `wanted`, or an error there when
/// `fail_on_key` (`serde_yaml` marks it with the key's position).
struct KeyProbe<'k> {
    wanted: &'k str,
    fail_on_key: bool,
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyProbe<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        match (key == self.wanted, self.fail_on_key) {
            (true, true) => Err(E::custom(FOUND)),
            (matched, _) => Ok(matched),
        }
    }

    // Keys that are not strings (numbers, lists) never name one of our fields.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str =
        "version: 1\nrules:\n  - name: a\n    trigger:\n      signal: x\n  - name: b\n";

    #[test]
    fn probe_finds_values_and_keys() {
        let name = [Step::Key("rules"), Step::Index(1), Step::Key("name")];
        assert_eq!(locate(DOC, &name, At::Value), Some((6, 11)));
        assert_eq!(locate(DOC, &name, At::Key), Some((6, 5)));
        let signal = [
            Step::Key("rules"),
            Step::Index(0),
            Step::Key("trigger"),
            Step::Key("signal"),
        ];
        assert_eq!(locate(DOC, &signal, At::Key), Some((5, 7)));
        assert_eq!(locate(DOC, &[Step::Key("rules")], At::Value), Some((3, 3)));
    }

    #[test]
    fn probe_misses_absent_paths() {
        let absent = [Step::Key("rules"), Step::Index(5), Step::Key("name")];
        assert_eq!(locate(DOC, &absent, At::Value), None);
        assert_eq!(locate(DOC, &[Step::Key("nope")], At::Key), None);
    }

    #[test]
    fn paths_render_like_serde_yaml() {
        let path = [Step::Key("rules"), Step::Index(1), Step::Key("trigger")];
        assert_eq!(render(&path), "rules[1].trigger");
    }
}
