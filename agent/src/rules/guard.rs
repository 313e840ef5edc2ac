//! Guards on the raw text of a rules file, before YAML parsing: a size cap, UTF-8, an empty
//! file, and a cap on flow nesting (`[[[[...`), on which libyaml's scanner takes time
//! quadratic in the depth. In: bytes or text. Out: `Ok` or a [`RulesError::Invalid`].

use std::str::Utf8Error;

use super::MAX_FILE_BYTES;
use super::error::RulesError;
use super::locate::line_column;

/// Deepest flow nesting (`[` and `{`) accepted; a rules file needs about five levels.
pub(super) const MAX_FLOW_DEPTH: usize = 64;

fn invalid(file: &str, (line, column): (usize, usize), message: String) -> RulesError {
    RulesError::Invalid {
        file: file.to_owned(),
        line,
        column,
        message,
    }
}

/// The error for a file over [`MAX_FILE_BYTES`].
pub(super) fn too_large(file: &str) -> RulesError {
    let message = format!(
        "file is larger than {} MiB; a rules file is expected to be small",
        MAX_FILE_BYTES >> 20
    );
    invalid(file, (1, 1), message)
}

/// The error for bytes that are not UTF-8, at the first bad byte.
pub(super) fn not_utf8(file: &str, bytes: &[u8], err: Utf8Error) -> RulesError {
    let valid = bytes.get(..err.valid_up_to()).unwrap_or_default();
    let position = line_column(&String::from_utf8_lossy(valid));
    invalid(
        file,
        position,
        "not valid UTF-8; a rules file is UTF-8 text".to_owned(),
    )
}

/// Size, emptiness and nesting of `text`.
pub(super) fn check(text: &str, file: &str) -> Result<(), RulesError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(file));
    }
    let blank = text.lines().all(|line| {
        let line = line.trim_start_matches('\u{feff}').trim();
        line.is_empty() || line.starts_with('#')
    });
    if blank {
        let message = "empty rules file; expected `version: 1` and a `rules:` list".to_owned();
        return Err(invalid(file, (1, 1), message));
    }
    if let Some(position) = too_deep(text) {
        let message = format!(
            "YAML nested more than {MAX_FLOW_DEPTH} levels deep in [ ] or {{ }}; \
             a rules file needs only a few"
        );
        return Err(invalid(file, position, message));
    }
    Ok(())
}

/// The position of the first `[` or `{` opening a flow collection deeper than
/// [`MAX_FLOW_DEPTH`]. A light scan, not a YAML parser: it skips quoted scalars and
/// comments, and counts a bracket only where a node can start (after indentation, `:`, `-`,
/// `?`, `,` or another bracket), so brackets inside plain scalars (`foo[abi:cxx11]`) do
/// not count. It may over-count odd plain scalars, which only matters past the cap.
fn too_deep(text: &str) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut node_start = true;
    let mut after_space = true;
    let (mut line, mut column) = (1usize, 0usize);
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\n' {
            (line, column) = (line + 1, 0);
            (node_start, after_space) = (quote.is_none(), true);
            continue;
        }
        column += 1;
        if let Some(open) = quote {
            if open == '"' && ch == '\\' {
                // An escaped character, or an escaped line break.
                if chars.next_if_eq(&'\n').is_some() {
                    (line, column) = (line + 1, 0);
                } else if chars.next().is_some() {
                    column += 1;
                }
            } else if ch == open {
                if open == '\'' && chars.next_if_eq(&'\'').is_some() {
                    column += 1;
                } else {
                    (quote, node_start) = (None, false);
                }
            }
            continue;
        }
        match ch {
            ' ' | '\t' | '\r' => {}
            '#' if after_space => while chars.next_if(|&next| next != '\n').is_some() {},
            '[' | '{' if node_start => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Some((line, column));
                }
            }
            ']' | '}' => {
                depth = depth.saturating_sub(1);
                node_start = false;
            }
            '"' | '\'' if node_start => quote = Some(ch),
            ':' | '-' | '?' | ',' => node_start = true,
            _ => node_start = false,
        }
        after_space = matches!(ch, ' ' | '\t' | '\r');
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_counted_where_collections_start() {
        let deep = |n: usize| format!("a: {}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(too_deep(&deep(MAX_FLOW_DEPTH)), None);
        assert_eq!(
            too_deep(&deep(MAX_FLOW_DEPTH + 1)),
            Some((1, 4 + MAX_FLOW_DEPTH))
        );
        let maps = format!("rules:\n  - {}", "{a: ".repeat(100));
        assert_eq!(too_deep(&maps), Some((2, 5 + 4 * MAX_FLOW_DEPTH)));
    }

    #[test]
    fn brackets_in_scalars_and_comments_do_not_count() {
        let many = "[".repeat(200);
        for text in [
            format!("symbol: foo{many}"),
            format!("symbol: \"{many}\""),
            format!("symbol: '{many}'' still quoted {many}'"),
            format!("symbol: \"a\\\"{many}\""),
            format!("# {many}\nsymbol: x # {many}"),
        ] {
            assert_eq!(too_deep(&text), None, "{text}");
        }
        let quoted_then_deep = format!("a: \"x\"\nb: {}", "[".repeat(100));
        assert_eq!(too_deep(&quoted_then_deep), Some((2, 4 + MAX_FLOW_DEPTH)));
    }
}
