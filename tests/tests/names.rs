//! Function triggers named as people write them, on binaries built by real compilers
//! (Debian's g++ and golang-go, rustc): every spelling of a C++ overloaded method and
//! template instance, a Rust module function, generic and trait method, and Go methods
//! probes the same instruction as the raw symbol and fires once per call; names that
//! select several functions are refused with the candidates, misspelled ones with the
//! nearest names. Needs root (run by `cargo xtask test` with --test-threads=1).
use std::{path::Path, process::Command};

use object::{Object as _, ObjectSymbol as _};

use lookback_tests::{
    dry_run_of, lookback_bin,
    toolchains::{cxx_names, go_program, rust_names},
};

/// An entry trigger on `name`: (the probed file offset, the number of triggers).
fn entry_probe(program: &Path, name: &str, args: &[&str]) -> (u64, usize) {
    let run = dry_run_of(program, &["--trigger", &format!("func:{name}")], args);
    let offset = run.summary["rules"][0]["probes"][0]["file_offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}: no probe\n{}\n{}", run.summary, run.stderr));
    (offset, run.of_rule(0).len())
}

/// Every name in `names` probes what `raw` probes and fires `calls` times.
fn same_function(program: &Path, raw: &str, names: &[&str], calls: usize, args: &[&str]) {
    let (offset, n) = entry_probe(program, raw, args);
    assert_eq!(n, calls, "{raw}");
    for name in names {
        assert_eq!(
            entry_probe(program, name, args),
            (offset, calls),
            "{name} vs {raw}"
        );
    }
}

/// A dry run expected to fail (exit 2): its stderr.
fn refused(program: &Path, name: &str) -> String {
    let out = Command::new(lookback_bin())
        .args([
            "run",
            "--dry-run",
            "--trigger",
            &format!("func:{name}"),
            "--",
        ])
        .arg(program)
        .output()
        .expect("running lookback");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn cpp_names_with_or_without_parameters_select_the_function() {
    let bin = cxx_names();
    same_function(
        &bin,
        "_ZN4shop4Cart3addEi",
        &["shop::Cart::add(int)", "shop::Cart::add( int )"],
        3,
        &[],
    );
    same_function(
        &bin,
        "_ZN4shop4Cart3addEd",
        &["shop::Cart::add(double)"],
        2,
        &[],
    );
    same_function(
        &bin,
        "_Z7biggestIiET_S0_S0_",
        &[
            "biggest<int>",
            "biggest<int>(int, int)",
            "int biggest<int>(int, int)",
        ],
        3,
        &[],
    );
    // Overloads and instances: the candidates, by both names.
    let err = refused(&bin, "shop::Cart::add");
    assert!(
        err.contains("names 2 functions")
            && err.contains("shop::Cart::add(int)` (_ZN4shop4Cart3addEi)")
            && err.contains("_ZN4shop4Cart3addEd"),
        "{err}"
    );
    let err = refused(&bin, "biggest");
    assert!(err.contains("biggest<long>"), "{err}");
    // A typo: the nearest name.
    let err = refused(&bin, "shop::Cart::ad(int)");
    assert!(err.contains("did you mean `shop::Cart::add(int)`"), "{err}");
}

#[test]
fn rust_paths_without_the_hash_select_the_function() {
    let bin = rust_names();
    let raw = |needle: &str| -> String {
        let data = std::fs::read(&bin).expect("binary");
        let file = object::File::parse(&*data).expect("ELF");
        file.symbols()
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .find(|n| n.contains(needle))
            .unwrap_or_else(|| panic!("no symbol with {needle}"))
    };
    same_function(
        &bin,
        &raw("6engine9slow_path"),
        &["names::engine::slow_path", "engine::slow_path"],
        3,
        &[],
    );
    same_function(
        &bin,
        &raw("Shape$GT$4area"),
        &["<names::Square as names::Shape>::area"],
        4,
        &[],
    );
    // Two instances of a generic share their demangled path: both listed.
    let err = refused(&bin, "names::widen");
    assert!(err.contains("names 2 functions"), "{err}");
    assert_eq!(err.matches("_ZN5names5widen17h").count(), 2, "{err}");
}

/// The entry probes of a dry run (`(function, file offset)`, sorted) and its trigger count.
fn entry_probes(program: &Path, flags: &[&str]) -> (Vec<(String, u64)>, usize) {
    let run = dry_run_of(program, flags, &[]);
    let mut probes: Vec<(String, u64)> = run.summary["rules"][0]["probes"]
        .as_array()
        .unwrap_or_else(|| panic!("no probes\n{}\n{}", run.summary, run.stderr))
        .iter()
        .filter(|p| p["site"] == "entry")
        .map(|p| {
            (
                p["function"].as_str().unwrap_or_default().to_owned(),
                p["file_offset"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    probes.sort();
    (probes, run.of_rule(0).len())
}

#[test]
fn all_functions_and_globs_probe_every_match() {
    let bin = cxx_names();
    let offset = |raw: &str| entry_probe(&bin, raw, &[]).0;
    // The two overloads, each at its own entry: 3 + 2 calls.
    let (probes, fired) = entry_probes(
        &bin,
        &["--all-functions", "--trigger", "func:shop::Cart::add"],
    );
    assert_eq!(
        probes,
        [
            (
                "shop::Cart::add(double)".to_owned(),
                offset("_ZN4shop4Cart3addEd")
            ),
            (
                "shop::Cart::add(int)".to_owned(),
                offset("_ZN4shop4Cart3addEi")
            ),
        ],
    );
    assert_eq!(fired, 5);
    // A glob needs no flag: both template instances, 3 + 2 calls.
    let (probes, fired) = entry_probes(&bin, &["--trigger", "func:bigg?st*"]);
    let names: Vec<&str> = probes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "int biggest<int>(int, int)",
            "long biggest<long>(long, long)"
        ]
    );
    assert_eq!(fired, 5);
    // A pattern that selects more than a rule probes: refused with the count.
    let err = refused(&rust_names(), "*");
    assert!(err.contains("more than the 64 one rule probes"), "{err}");
}

#[test]
fn go_methods_are_their_symbols() {
    let bin = go_program();
    let args = ["1", "10000"];
    same_function(&bin, "main.(*Server).Handle", &[], 3, &args);
    same_function(&bin, "main.Counter.Value", &[], 2, &args);
    let err = refused(&bin, "main.(*Server).Handel");
    assert!(
        err.contains("did you mean `main.(*Server).Handle`"),
        "{err}"
    );
}

#[test]
fn a_thousand_random_names_are_refused_cleanly() {
    // Deterministic pseudo-random names (xorshift): printable ASCII and bits of C++/Rust
    // syntax, never a real function of the program.
    let bin = cxx_names();
    let pieces = [
        "::", "<", ">", "(", ")", "int", "_Z", "&", "*", " ", "~", "operator", "[]",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut specs = Vec::new();
    for i in 0..1000 {
        let mut name = format!("zz{i}");
        for _ in 0..(next() % 6) {
            let r = next();
            if r % 2 == 0 {
                name.push_str(pieces[usize::try_from(r / 2 % 13).expect("small")]);
            } else {
                name.push(char::from(b'a' + u8::try_from(r / 2 % 26).expect("small")));
            }
        }
        specs.push(format!("func:{name}"));
    }
    // Runs of 60 (the rule limit is 64): each name is reported, none installs, exit 2.
    for chunk in specs.chunks(60) {
        let mut c = Command::new(lookback_bin());
        c.args(["run", "--dry-run"]);
        for spec in chunk {
            c.args(["--trigger", spec]);
        }
        let out = c.arg("--").arg(&bin).output().expect("lookback");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            matches!(out.status.code(), Some(2)),
            "{:?}: {stderr}",
            out.status
        );
    }
}

#[test]
fn a_name_defined_in_two_libraries_is_refused_unless_all() {
    // Two shared libraries define lb_dup; the program links both (calls reach the first).
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let write = |name: &str, text: &str| std::fs::write(d.join(name), text).expect("write");
    write(
        "a.c",
        "__attribute__((noinline)) int lb_dup(int x) { return x + 1; }\n",
    );
    write(
        "b.c",
        "__attribute__((noinline)) int lb_dup(int x) { return x + 2; }\n",
    );
    write(
        "main.c",
        "#include <stdio.h>\nint lb_dup(int);\nint main(void) { int s = 0; \
         for (int i = 0; i < 3; i++) s += lb_dup(i); printf(\"result=%d\\n\", s); return 0; }\n",
    );
    let cc = |args: &[&str]| {
        let out = Command::new("cc")
            .current_dir(d)
            .args(args)
            .output()
            .expect("cc");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cc(&["-O1", "-shared", "-fPIC", "-o", "liba.so", "a.c"]);
    cc(&["-O1", "-shared", "-fPIC", "-o", "libb.so", "b.c"]);
    let rpath = format!("-Wl,-rpath,{}", d.display());
    // --no-as-needed: libb stays a dependency although liba satisfies every call.
    cc(&[
        "-O1",
        "-o",
        "prog",
        "main.c",
        "-L.",
        "-Wl,--no-as-needed",
        "-la",
        "-lb",
        &rpath,
    ]);
    let prog = d.join("prog");
    let err = refused(&prog, "lb_dup");
    assert!(
        err.contains("lb_dup is defined in 2 libraries")
            && err.contains(&format!("{}", d.join("liba.so").display()))
            && err.contains(&format!("{}", d.join("libb.so").display()))
            && err.contains("all: true"),
        "{err}"
    );
    let (probes, fired) = entry_probes(&prog, &["--all-functions", "--trigger", "func:lb_dup"]);
    assert_eq!(probes.len(), 2, "{probes:?}");
    assert_eq!(fired, 3, "every call, through whichever library it reaches");
}
