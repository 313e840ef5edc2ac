//! Function names as people write them → the ELF symbols they mean, for function triggers.
//!
//! In: a binary's symbol tables and the name a rule gives. Out: the one defined function it
//! names, or an error listing the candidates (several functions) or the nearest names (none).
//! A name selects a symbol when it is, ignoring whitespace:
//! - the raw symbol (`_Z4worki`, `main.slow`, `net/http.(*conn).serve`): always wins;
//! - C++ (Itanium ABI, demangled with `cpp_demangle`, as blazesym names trace frames): the
//!   demangled name with or without its parameters and return type (`work(int)`, `work`,
//!   `ns::Class::method`, `max<int>`);
//! - Rust (legacy and v0 mangling, `rustc-demangle`): the path without the hash, with or
//!   without the crate (`myapp::engine::slow_path`, `engine::slow_path`,
//!   `<T as Trait>::method`).
//!
//! Go symbols are stored as people write them (`main.slow`, `pkg.Type.Method`,
//! `pkg.(*T).Method`), so the raw name is the Go name.
use std::collections::BTreeMap;

pub use crate::elf::index::FunctionSymbol;

/// Why a name does not select the functions a rule may probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// No function has that name; the nearest names, best first (at most 3).
    NotFound { nearest: Vec<FunctionSymbol> },
    /// Several functions (at different addresses) have that name, and the rule did not
    /// say `all: true`.
    Ambiguous { candidates: Vec<FunctionSymbol> },
    /// A glob pattern or `all: true` selects more than [`MAX_FUNCTIONS`] functions.
    TooMany { candidates: Vec<FunctionSymbol> },
}

/// How many candidates an ambiguity error lists (the rest are counted).
pub const LISTED_CANDIDATES: usize = 20;

/// The most functions one rule probes (a glob or `all: true`): each costs an entry uprobe
/// and one per exit, and a pattern matching hundreds is a mistake more often than not.
pub const MAX_FUNCTIONS: usize = 64;

/// Whether `name` is a glob pattern (`*`, `?`). Only used when the name selects nothing as
/// written: `operator*` and Go's `(*T).Method` are names, not patterns.
#[must_use]
pub fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// The functions that `wanted` names among `functions`: exactly one, unless `all` (every
/// function the name selects) or `wanted` is a glob pattern that no function is named
/// (every function a spelling of which matches it), at most [`MAX_FUNCTIONS`].
///
/// # Errors
/// [`NameError`] when none match, several do without `all`, or too many do.
pub fn select_functions(
    functions: &[FunctionSymbol],
    wanted: &str,
    all: bool,
) -> Result<Vec<FunctionSymbol>, NameError> {
    if let Some(exact) = functions.iter().find(|f| f.raw == wanted) {
        return Ok(vec![with_display(exact.clone())]);
    }
    let want = squeeze(wanted);
    let mut matches = matching(functions, |form| form == want);
    let mut all = all;
    if matches.is_empty() && is_pattern(&want) {
        matches = matching(functions, |form| {
            glob_matches(want.as_bytes(), form.as_bytes())
        });
        all = true;
    }
    match matches.len() {
        0 => Err(NameError::NotFound {
            nearest: nearest(functions, &want)
                .into_iter()
                .map(with_display)
                .collect(),
        }),
        1 => Ok(matches.into_iter().map(with_display).collect()),
        n if all && n <= MAX_FUNCTIONS => Ok(matches.into_iter().map(with_display).collect()),
        _ => {
            let candidates = matches.into_iter().map(with_display).collect();
            Err(if all {
                NameError::TooMany { candidates }
            } else {
                NameError::Ambiguous { candidates }
            })
        }
    }
}

/// The functions one of whose spellings (whitespace squeezed) `accept`s, one per address
/// (aliases such as C1/C2 constructors or ICF-folded functions share one), by address.
fn matching(functions: &[FunctionSymbol], accept: impl Fn(&str) -> bool) -> Vec<FunctionSymbol> {
    let mut by_address: BTreeMap<u64, FunctionSymbol> = BTreeMap::new();
    for f in functions {
        if name_forms(&f.raw).iter().any(|form| accept(&squeeze(form))) {
            by_address.entry(f.address).or_insert_with(|| f.clone());
        }
    }
    by_address.into_values().collect()
}

/// Whether `text` matches the glob `pattern` (`*`: any run, `?`: one byte).
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    // Iterative with one backtrack point: linear enough for symbol names.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// `f` with its demangled name: computed only for the symbols handed out, not for every
/// symbol of the binary (a raw name, the common case, demangles nothing else).
fn with_display(mut f: FunctionSymbol) -> FunctionSymbol {
    if let Some(name) = demangled(&f.raw) {
        f.display = name;
    }
    f
}

/// Every spelling that selects the symbol `raw` (the raw name first).
#[must_use]
pub fn name_forms(raw: &str) -> Vec<String> {
    let mut forms = vec![raw.to_owned()];
    if let Some(path) = rust_path(raw) {
        // `crate::module::f` and `module::f`; `<T as Trait>::f` has no crate to drop.
        if let Some((_, rest)) = path.split_once("::").filter(|_| !path.starts_with('<')) {
            forms.push(rest.to_owned());
        }
        forms.push(path);
    } else if let Some(sym) = cpp_symbol(raw) {
        let opts = cpp_demangle::DemangleOptions::new();
        for opts in [
            opts,
            opts.no_return_type(),
            opts.no_params().no_return_type(),
        ] {
            if let Ok(name) = sym.demangle_with_options(&opts) {
                forms.push(name);
            }
        }
        // A template instance also by its template's name (`biggest` for `biggest<int>`):
        // every instance matches, so the name is refused with them listed.
        if let Some(template) = forms.last().and_then(|f| without_template_args(f)) {
            forms.push(template);
        }
    }
    forms
}

/// `name` without its final template argument list (`ns::max<int>` → `ns::max`); `None`
/// when it has none, or is an operator (whose name may end in `>`).
fn without_template_args(name: &str) -> Option<String> {
    if !name.ends_with('>') || name.contains("operator") {
        return None;
    }
    let mut depth = 0usize;
    for (i, c) in name.char_indices().rev() {
        match c {
            '>' => depth += 1,
            '<' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(name[..i].to_owned()).filter(|n| !n.is_empty());
                }
            }
            _ => {}
        }
    }
    None
}

/// The demangled name of `raw`, when it is mangled (Rust: without the hash).
#[must_use]
pub fn demangled(raw: &str) -> Option<String> {
    if let Some(path) = rust_path(raw) {
        return Some(path);
    }
    let sym = cpp_symbol(raw)?;
    sym.demangle().ok()
}

/// A Rust symbol's path without the hash: v0 (`_R…`) or legacy (`_ZN…17h<16 hex>E`; the
/// hash tells it from a C++ nested name).
fn rust_path(raw: &str) -> Option<String> {
    let legacy_hash = raw.len() > 20 && {
        let tail = &raw[raw.len() - 20..];
        tail.starts_with("17h")
            && tail.ends_with('E')
            && tail[3..19].bytes().all(|b| b.is_ascii_hexdigit())
    };
    if !(raw.starts_with("_R") || (raw.starts_with("_ZN") && legacy_hash)) {
        return None;
    }
    let d = rustc_demangle::try_demangle(raw).ok()?;
    Some(format!("{d:#}"))
}

fn cpp_symbol(raw: &str) -> Option<cpp_demangle::Symbol<&str>> {
    if !raw.starts_with("_Z") {
        return None;
    }
    cpp_demangle::Symbol::new(raw).ok()
}

/// `text` without whitespace: `std::vector<int, std::allocator<int> >` and
/// `std::vector<int,std::allocator<int>>` are one name.
fn squeeze(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Up to 3 functions whose shortest spelling is within a few edits of `want`.
fn nearest(functions: &[FunctionSymbol], want: &str) -> Vec<FunctionSymbol> {
    let limit = (want.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &FunctionSymbol)> = functions
        .iter()
        .filter_map(|f| {
            let best = name_forms(&f.raw)
                .iter()
                .map(|form| edit_distance(&squeeze(form), want))
                .min()?;
            (best <= limit).then_some((best, f))
        })
        .collect();
    scored.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.raw.cmp(&b.1.raw)));
    scored.into_iter().take(3).map(|(_, f)| f.clone()).collect()
}

/// Levenshtein distance over chars (names are short; quadratic is fine).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `NotFound`'s hint: `; did you mean `work(int)` (_Z4worki)?`, or nothing.
#[must_use]
pub fn did_you_mean(nearest: &[FunctionSymbol]) -> String {
    if nearest.is_empty() {
        return String::new();
    }
    let names: Vec<String> = nearest.iter().map(describe).collect();
    format!("; did you mean {}?", names.join(" or "))
}

/// `` `work(int)` (_Z4worki) ``, or `` `main.slow` `` when the two are one.
#[must_use]
pub fn describe(f: &FunctionSymbol) -> String {
    if f.display == f.raw {
        format!("`{}`", f.raw)
    } else {
        format!("`{}` ({})", f.display, f.raw)
    }
}

/// The candidates of an ambiguity, listed (at most [`LISTED_CANDIDATES`]).
#[must_use]
pub fn list_candidates(candidates: &[FunctionSymbol]) -> String {
    let mut out: Vec<String> = candidates
        .iter()
        .take(LISTED_CANDIDATES)
        .map(describe)
        .collect();
    if candidates.len() > LISTED_CANDIDATES {
        out.push(format!("and {} more", candidates.len() - LISTED_CANDIDATES));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_names_with_and_without_parameters() {
        let forms = name_forms("_ZN2ns5Klass6methodEi");
        assert!(
            forms.contains(&"ns::Klass::method(int)".to_owned()),
            "{forms:?}"
        );
        assert!(forms.contains(&"ns::Klass::method".to_owned()), "{forms:?}");
        let forms = name_forms("_Z4worki");
        assert!(forms.contains(&"work(int)".to_owned()) && forms.contains(&"work".to_owned()));
        // A template function: `int max<int>(int, int)` also without its return type.
        let forms = name_forms("_Z3maxIiET_S0_S0_");
        assert!(
            forms.iter().any(|f| squeeze(f) == "max<int>(int,int)"),
            "{forms:?}"
        );
        assert!(forms.iter().any(|f| f == "max<int>"), "{forms:?}");
        assert!(forms.iter().any(|f| f == "max"), "{forms:?}");
        assert_eq!(without_template_args("a::b<c<d>>"), Some("a::b".to_owned()));
        assert_eq!(without_template_args("operator>"), None);
        assert_eq!(without_template_args("f"), None);
    }

    #[test]
    fn rust_paths_without_the_hash_and_the_crate() {
        let raw = "_ZN5myapp6engine9slow_path17h5c4b2ede6ccfbb34E";
        let forms = name_forms(raw);
        assert!(
            forms.contains(&"myapp::engine::slow_path".to_owned()),
            "{forms:?}"
        );
        assert!(forms.contains(&"engine::slow_path".to_owned()), "{forms:?}");
        assert_eq!(demangled(raw).as_deref(), Some("myapp::engine::slow_path"));
        // A C++ nested name is not taken for Rust.
        assert!(rust_path("_ZN2ns5Klass6methodEi").is_none());
    }

    #[test]
    fn plain_and_go_names_are_their_own_only_form() {
        assert_eq!(name_forms("main.slow"), ["main.slow"]);
        assert_eq!(
            name_forms("net/http.(*conn).serve"),
            ["net/http.(*conn).serve"]
        );
    }

    #[test]
    fn globs_match_runs_and_single_bytes() {
        assert!(glob_matches(b"handle_*", b"handle_get"));
        assert!(glob_matches(b"*_get", b"handle_get"));
        assert!(glob_matches(b"h?ndle*t", b"handle_get"));
        assert!(glob_matches(b"*", b""));
        assert!(!glob_matches(b"handle_*", b"handl"));
        assert!(!glob_matches(b"a*b", b"acbd"));
        assert!(is_pattern("handle_*") && !is_pattern("work(int)"));
    }

    fn symbol(raw: &str, address: u64) -> FunctionSymbol {
        FunctionSymbol {
            raw: raw.into(),
            display: raw.into(),
            address,
            size: 8,
            global: true,
        }
    }

    #[test]
    fn all_and_globs_select_several_and_stop_at_the_limit() {
        let functions = vec![
            symbol("_Z4worki", 0x10),
            symbol("_Z4workd", 0x20),
            symbol("handle_get", 0x30),
            symbol("handle_put", 0x40),
        ];
        assert!(matches!(
            select_functions(&functions, "work", false),
            Err(NameError::Ambiguous { candidates }) if candidates.len() == 2
        ));
        let both = select_functions(&functions, "work", true).expect("all");
        assert_eq!(both.len(), 2);
        assert_eq!(both[0].display, "work(int)");
        let handlers = select_functions(&functions, "handle_*", false).expect("glob");
        assert_eq!(handlers.len(), 2);
        let many: Vec<_> = (0..=MAX_FUNCTIONS as u64)
            .map(|i| symbol(&format!("f{i}"), 0x100 + i))
            .collect();
        assert!(matches!(
            select_functions(&many, "f*", false),
            Err(NameError::TooMany { candidates }) if candidates.len() == MAX_FUNCTIONS + 1
        ));
        assert!(matches!(
            select_functions(&functions, "nothing_*", false),
            Err(NameError::NotFound { .. })
        ));
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("work", "wrok"), 2);
        assert_eq!(edit_distance("work", "work"), 0);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn hints_read_well() {
        let f = FunctionSymbol {
            raw: "_Z4worki".into(),
            display: "work(int)".into(),
            address: 1,
            size: 1,
            global: true,
        };
        assert_eq!(
            did_you_mean(std::slice::from_ref(&f)),
            "; did you mean `work(int)` (_Z4worki)?"
        );
        assert_eq!(did_you_mean(&[]), "");
        let many = vec![f; LISTED_CANDIDATES + 2];
        assert!(list_candidates(&many).ends_with("and 2 more"));
    }
}
