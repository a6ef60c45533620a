//! `diagnose/` stays pure and out of import circles: its sources (tests aside) name no IO, no
//! processes and no filesystem, and never reach into `harness`: they read the result types from
//! `schema`, which does not import `diagnose` back.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.ends_with("tests.rs")
            && !path.ends_with("purity.rs")
        {
            out.push(path);
        }
    }
}

/// The source without its `#[cfg(test)] mod tests { … }` block (always last in a file).
fn product_code(text: &str) -> &str {
    text.split("#[cfg(test)]\nmod tests {").next().unwrap_or(text)
}

#[test]
fn diagnose_does_no_io_and_imports_no_module_that_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root.join("diagnose"), &mut files);
    assert!(files.len() >= 10, "{files:?}");
    const IO: [&str; 10] = [
        "std::fs",
        "std::process",
        "std::net",
        "std::io",
        "std::env",
        "libc::",
        "nix::",
        "procfs::",
        "File::",
        "Command::",
    ];
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = product_code(&text);
        for needle in IO {
            assert_eq!(code.matches(needle).count(), 0, "{} uses `{needle}`", file.display());
        }
        assert!(
            !code.contains("crate::harness"),
            "{} reaches into harness: the result types are in `crate::schema`",
            file.display()
        );
    }
    // Inside diagnose the layers go one way: evidence ← catalog ← verdict.
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = product_code(&text);
        let name = file.display().to_string();
        if name.contains("/catalog/") {
            assert!(
                !code.contains("diagnose::verdict"),
                "{name} imports verdict, which imports the catalogue"
            );
        }
        if name.ends_with("evidence.rs") {
            assert!(!code.contains("catalog") && !code.contains("verdict::"), "{name} imports a later layer");
        }
    }
    // The modules diagnose imports do not import it back. The scenario model, the marker protocol
    // and the result schema live in `ups-doctor-core`, a crate that does not depend on this one,
    // so they cannot; of this crate's own files, diagnose reads the environment summary's probe.
    for back in ["probe/env.rs"] {
        let text = std::fs::read_to_string(root.join(back)).unwrap();
        let code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
        assert!(
            !code.into_iter().any(|l| l.contains("diagnose")),
            "{back} imports diagnose: an import circle"
        );
    }
}

/// The modules meant to be pure data and logic (the marker protocol, the outcome classifier and
/// all of `diagnose`, its tests included) hold no `unsafe` and call no libc: signals are named
/// through `protocol::Signal`. Comments may mention either.
#[test]
fn pure_modules_hold_no_unsafe_and_no_libc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/core/src");
    let mut files = vec![core.join("protocol.rs"), root.join("harness/classify.rs")];
    fn all(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                all(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("purity.rs") {
                out.push(path);
            }
        }
    }
    all(&root.join("diagnose"), &mut files);
    assert!(files.len() >= 12, "{files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for needle in ["unsafe", "libc::"] {
                assert!(!code.contains(needle), "{}:{} uses `{needle}`: {line}", file.display(), n + 1);
            }
        }
    }
}
