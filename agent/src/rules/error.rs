//! Errors of the rules stage: [`RulesError`] for rules files (always with `FILE:LINE:COL`
//! once the file has been read) and [`SpecError`] for `--trigger` specs. Unit errors live
//! beside their parsers in `units`.

use std::io;

/// Longest piece of user input quoted back in a message.
const SNIPPET_CHARS: usize = 48;

/// User input as quoted in a message: control characters escaped (a message stays on one
/// line) and cut after [`SNIPPET_CHARS`] characters.
pub(crate) fn snippet(text: &str) -> String {
    let mut out = String::new();
    for (count, ch) in text.chars().enumerate() {
        if count == SNIPPET_CHARS {
            out.push('\u{2026}');
            break;
        }
        if ch.is_control() {
            out.extend(ch.escape_default());
        } else {
            out.push(ch);
        }
    }
    out
}

/// A rules file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The file could not be read at all (missing, unreadable); no position applies.
    #[error("cannot read rules file {file}")]
    Read {
        file: String,
        #[source]
        source: io::Error,
    },
    /// The file's content is invalid; displays as `FILE:LINE:COL: message` (1-based line and
    /// column; `1:1` for problems of the whole file such as its size).
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
}

impl RulesError {
    /// The file name as given to [`RuleSet::from_file`](super::RuleSet::from_file) or
    /// [`RuleSet::from_str`](super::RuleSet::from_str).
    pub fn file(&self) -> &str {
        match self {
            Self::Read { file, .. } | Self::Invalid { file, .. } => file,
        }
    }

    /// `(line, column)`, both 1-based, for content errors.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            Self::Read { .. } => None,
            Self::Invalid { line, column, .. } => Some((*line, *column)),
        }
    }

    /// The message without the file and position.
    pub fn message(&self) -> String {
        match self {
            Self::Read { source, .. } => source.to_string(),
            Self::Invalid { message, .. } => message.clone(),
        }
    }
}

/// A `--trigger SPEC` that does not parse. Each message quotes the spec and says what was
/// expected, so that clap can show it as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not `func:`, `syscall:` or `signal:`.
    #[error(
        "invalid trigger `{spec}`: expected func:SYMBOL[>DURATION], \
         syscall:NAME[,NAME...][>DURATION][=ERRNO[,ERRNO...]] or signal:SIG[,SIG...]"
    )]
    Kind { spec: String },
    /// `func:` without a symbol, or a symbol with control characters.
    #[error(
        "invalid trigger `{spec}`: expected a function symbol after `func:`, \
         e.g. func:handle_request>2ms"
    )]
    Symbol { spec: String },
    /// A list, or an element of a comma-separated list, is empty: `syscall:`, `read,,write`.
    #[error("invalid trigger `{spec}`: expected {what}, e.g. {example}")]
    Empty {
        spec: String,
        what: &'static str,
        example: &'static str,
    },
    /// An unknown syscall, errno or signal name, or `any` mixed with names.
    #[error("invalid trigger `{spec}`: {message}")]
    Name { spec: String, message: String },
    /// The part after `>` is not a duration.
    #[error("invalid trigger `{spec}`: {message}")]
    Duration { spec: String, message: String },
    /// A part this kind of trigger does not take, e.g. `signal:SIGSEGV>5ms`.
    #[error("invalid trigger `{spec}`: {message}")]
    Unsupported { spec: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_escapes_and_shortens() {
        assert_eq!(snippet("a\nb\tc"), "a\\nb\\tc");
        let long = "x".repeat(1000);
        assert_eq!(snippet(&long).chars().count(), SNIPPET_CHARS + 1);
        assert_eq!(snippet("\u{2603}"), "\u{2603}");
    }

    #[test]
    fn invalid_displays_as_file_line_column() {
        let err = RulesError::Invalid {
            file: "r.yaml".to_owned(),
            line: 3,
            column: 7,
            message: "boom".to_owned(),
        };
        assert_eq!(err.to_string(), "r.yaml:3:7: boom");
        assert_eq!(err.location(), Some((3, 7)));
        assert_eq!(err.file(), "r.yaml");
        assert_eq!(err.message(), "boom");
    }
}
