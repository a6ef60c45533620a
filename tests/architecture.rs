//! No import circles, in any crate of the workspace: no module (file) imports a module that
//! imports it back, directly or through others, and no top-level module of the doctor (`harness`,
//! `nodes`, `report`, …) imports one that imports it back. `cargo test architecture` prints every
//! circle it finds as a chain of files, each step with the line that makes it. Also the shape
//! rules of docs/design.md that a reader can count: a thin `main.rs`, no long function without a
//! comment that says why, and no function other modules call whose error is a `String`.
//!
//! A file's imports are read from its source, tests aside (`#[cfg(test)]` items and the files of
//! test-only modules): `use` trees (`crate::…`, `super::…`, `self::…`, and paths that start at a
//! child module), and paths written out in code (`crate::scenario::human_bytes(…)`). A path that
//! names an item of a `mod.rs` is followed through that file's `pub use` to the file that defines
//! the item, so importing `crate::schema::RankResult` depends on `schema/process.rs`, not on
//! every file `schema/mod.rs` re-exports; an item defined in the `mod.rs` itself is a dependency
//! on the `mod.rs`, which depends on the children it re-exports from.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The source folders of the workspace's crates, relative to the repository: the doctor, the
/// shared types and the trainer. An import of another crate is never an edge of a circle (cargo
/// refuses circular crate dependencies).
const CRATES: [&str; 3] = ["src", "crates/core/src", "crates/trainer/src"];

/// One file of the library: its module path and its source without comments, strings and tests.
struct Module {
    /// `src/`-relative, e.g. `harness/run/supervise.rs`.
    file: String,
    /// `["harness", "supervise"]`; empty for `lib.rs`.
    path: Vec<String>,
    code: String,
}

/// An import of one file by another, with where it is written.
#[derive(Clone)]
struct Edge {
    to: String,
    line: usize,
    text: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source with comments, string and character literals blanked out (newlines kept, so
/// line numbers stay right).
fn strip(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && {
                let start = if c == 'b' { i + 2 } else { i + 1 };
                let hashes = chars[start..].iter().take_while(|&&h| h == '#').count();
                chars.get(start + hashes) == Some(&'"')
            }
        {
            // A raw string: r"…", r#"…"#, br"…".
            let start = if c == 'b' { i + 2 } else { i + 1 };
            let hashes = chars[start..].iter().take_while(|&&h| h == '#').count();
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let body = start + hashes + 1;
            let mut j = body;
            while j < chars.len() && chars[j..].iter().take(close.len()).ne(close.iter()) {
                j += 1;
            }
            let end = (j + close.len()).min(chars.len());
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime.
            let mut j = i + 1;
            if chars.get(j) == Some(&'\\') {
                j += 2;
            } else {
                j += 1;
            }
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            out.extend(std::iter::repeat_n(' ', j + 1 - i));
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The end (exclusive) of the item that starts at `from`: through its balanced `{…}` block, or
/// its `;` when that comes first.
fn item_end(code: &[u8], from: usize) -> usize {
    let mut i = from;
    while i < code.len() && code[i] != b'{' && code[i] != b';' {
        i += 1;
    }
    if i >= code.len() || code[i] == b';' {
        return (i + 1).min(code.len());
    }
    let mut depth = 0;
    while i < code.len() {
        match code[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    code.len()
}

/// `code` without the items marked `#[cfg(test)]` (newlines kept), and the names of the
/// `mod NAME;` declarations among them (test-only files).
fn without_tests(code: &str) -> (String, Vec<String>) {
    let mut bytes = code.as_bytes().to_vec();
    let mut test_mods = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]").map(|i| i + from) {
        let end = item_end(code.as_bytes(), at + "#[cfg(test)]".len());
        let item = &code[at + "#[cfg(test)]".len()..end];
        let words: Vec<&str> = item.split_whitespace().collect();
        if let Some(pos) = words.iter().position(|w| *w == "mod")
            && let Some(name) = words.get(pos + 1).filter(|_| item.trim_end().ends_with(';'))
        {
            test_mods.push(name.trim_end_matches(';').to_string());
        }
        for b in &mut bytes[at..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        from = end;
    }
    (String::from_utf8(bytes).unwrap(), test_mods)
}

/// `foo::{bar, baz::{self, Qux as Q}, *}` → `foo::bar`, `foo::baz`, `foo::baz::Qux`, `foo::*`.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let head: Vec<String> =
                tree[..open].split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut base = prefix.to_vec();
            base.extend(head);
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&base, &inner[start..], out);
        } else {
            let path = tree.split(" as ").next().unwrap_or(tree);
            let mut full = prefix.to_vec();
            for seg in path.split("::").map(str::trim).filter(|s| !s.is_empty()) {
                if seg != "self" || full.is_empty() {
                    full.push(seg.to_string());
                }
            }
            out.push(full);
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

struct Crate {
    modules: BTreeMap<String, Module>,
    /// Module path → file.
    files: BTreeMap<Vec<String>, String>,
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut paths = Vec::new();
        rust_files(src, &mut paths);
        let mut modules = BTreeMap::new();
        let mut files = BTreeMap::new();
        let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
        for p in &paths {
            let file = p.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            if file == "main.rs" {
                continue; // the binary is another crate
            }
            let mut path: Vec<String> = file.trim_end_matches(".rs").split('/').map(String::from).collect();
            if path.last().is_some_and(|l| l == "mod" || l == "lib") {
                path.pop();
            }
            let (code, test_mods) = without_tests(&strip(&std::fs::read_to_string(p).unwrap()));
            for m in test_mods {
                let mut child = path.clone();
                child.push(m);
                test_only.insert(child);
            }
            files.insert(path.clone(), file.clone());
            modules.insert(file.clone(), Module { file, path, code });
        }
        // Files of test-only modules, and everything below them.
        let dropped: Vec<String> = modules
            .values()
            .filter(|m| test_only.iter().any(|t| m.path.starts_with(t)))
            .map(|m| m.file.clone())
            .collect();
        for file in dropped {
            let m = modules.remove(&file).unwrap();
            files.remove(&m.path);
        }
        Crate { modules, files }
    }

    /// The deepest module of `path` that is a file, and what of the path is left after it.
    fn file_of<'p>(&self, path: &'p [String]) -> Option<(&String, &'p [String])> {
        (0..=path.len()).rev().find_map(|n| self.files.get(&path[..n]).map(|f| (f, &path[n..])))
    }

    /// The file that defines `name` when `file` names it: `file` itself, or the source of its
    /// `pub use` of that name (followed further when that is a re-export again).
    fn defining(&self, file: &str, name: &str, depth: usize) -> String {
        let Some(m) = self.modules.get(file) else { return file.to_string() };
        if depth > 8 || defines(&m.code, name) {
            return file.to_string();
        }
        for (_, path) in uses(&m.code) {
            for full in expand_use(&path) {
                let last = full.last().map(String::as_str);
                let Some(abs) = self.absolute(m, &full) else { continue };
                if last == Some(name) || last == Some("*") {
                    let Some((target, rest)) = self.file_of(&abs) else { continue };
                    if target == file {
                        continue;
                    }
                    if last == Some(name) && rest.len() <= 1 {
                        return self.defining(target, name, depth + 1);
                    }
                    if last == Some("*") && rest.len() == 1 {
                        let inner = self.defining(target, name, depth + 1);
                        let inner_m = &self.modules[&inner];
                        if defines(&inner_m.code, name) {
                            return inner;
                        }
                    }
                }
            }
        }
        file.to_string()
    }

    /// A path as written in `m`, from the crate root; `None` for other crates' paths.
    fn absolute(&self, m: &Module, path: &[String]) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => m.path.clone(),
            "super" => m.path[..m.path.len().checked_sub(1)?].to_vec(),
            // A child module of this one (2018 paths: `use supervise::X` in a `mod.rs`).
            child => {
                let mut p = m.path.clone();
                p.push(child.to_string());
                if !self.files.contains_key(&p) {
                    return None;
                }
                return Some(p.into_iter().chain(rest.iter().cloned()).collect());
            }
        };
        let mut rest = rest;
        while let Some((s, more)) = rest.split_first().filter(|(s, _)| *s == "super") {
            let _ = s;
            base.pop()?;
            rest = more;
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// Every file `m` imports, with the first line that does.
    fn imports(&self, m: &Module) -> BTreeMap<String, Edge> {
        let mut refs: Vec<(usize, String, Vec<String>)> = Vec::new();
        for (line, tree) in uses(&m.code) {
            for path in expand_use(&tree) {
                refs.push((
                    line,
                    format!("use {}", tree.split_whitespace().collect::<Vec<_>>().join(" ")),
                    path,
                ));
            }
        }
        // Paths written out in code (`crate::a::b`, `super::x`, `child::y(…)`), outside the
        // `use` declarations read above.
        let mut code = m.code.clone();
        for (start, end) in use_spans(&m.code) {
            code.replace_range(start..end, &" ".repeat(end - start));
        }
        let path_re =
            regex::Regex::new(r"(?:^|[^A-Za-z0-9_:])((?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*)")
                .unwrap();
        for cap in path_re.captures_iter(&code) {
            let found = cap.get(1).unwrap();
            let path: Vec<String> = found.as_str().split("::").map(String::from).collect();
            let line = code[..found.start()].matches('\n').count() + 1;
            refs.push((line, found.as_str().to_string(), path));
        }
        let mut out: BTreeMap<String, Edge> = BTreeMap::new();
        for (line, text, path) in refs {
            let Some(abs) = self.absolute(m, &path) else { continue };
            let Some((file, rest)) = self.file_of(&abs) else { continue };
            let to = match rest.first() {
                Some(name) if name != "*" => self.defining(file, name, 0),
                _ => file.clone(),
            };
            if to != m.file {
                out.entry(to.clone()).or_insert(Edge { to, line, text });
            }
        }
        out
    }
}

/// Where every `use` declaration is (`pub use`, `pub(crate) use` too): from `use` through `;`.
fn use_spans(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(at) = code[from..].find("use ").map(|i| i + from) {
        from = at + 4;
        let before = code[..at].trim_end();
        let starts_word = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let after_item =
            before.is_empty() || [";", "{", "}", "]", "pub", ")"].iter().any(|e| before.ends_with(e));
        if !(starts_word && after_item) {
            continue;
        }
        let Some(end) = code[at..].find(';').map(|e| e + at + 1) else { break };
        out.push((at, end));
        from = end;
    }
    out
}

/// `(line, tree)` of every `use` declaration.
fn uses(code: &str) -> Vec<(usize, String)> {
    use_spans(code)
        .into_iter()
        .map(|(start, end)| (code[..start].matches('\n').count() + 1, code[start + 4..end - 1].to_string()))
        .collect()
}

/// Whether `code` defines an item called `name` (not merely re-exports it).
fn defines(code: &str, name: &str) -> bool {
    ["struct", "enum", "fn", "const", "static", "type", "trait", "mod", "union", "macro_rules!"].iter().any(
        |kw| {
            code.match_indices(&format!("{kw} {name}")).any(|(i, _)| {
                let after = code[i + kw.len() + 1 + name.len()..].chars().next();
                let before = code[..i].chars().next_back();
                !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        },
    )
}

/// A circle through `start`: the shortest chain of imports back to it.
fn circle(graph: &BTreeMap<String, BTreeMap<String, Edge>>, start: &str) -> Option<Vec<(String, Edge)>> {
    let mut queue = VecDeque::from([start.to_string()]);
    let mut came: BTreeMap<String, (String, Edge)> = BTreeMap::new();
    while let Some(at) = queue.pop_front() {
        for (next, edge) in graph.get(&at).into_iter().flatten() {
            if next == start {
                let mut chain = vec![(at.clone(), edge.clone())];
                let mut cur = at.clone();
                while let Some((prev, e)) = came.get(&cur) {
                    chain.push((prev.clone(), e.clone()));
                    cur = prev.clone();
                }
                chain.reverse();
                return Some(chain);
            }
            if !came.contains_key(next) && next != start {
                came.insert(next.clone(), (at.clone(), edge.clone()));
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// The import graph of one crate's files (`src/`-relative names).
///
/// The crate root (`lib.rs`, `main.rs`) only declares modules and re-exports; a re-export is
/// followed to the file that defines the item, and what is left pointing at the root names
/// another crate's item (`crate::scenario` is `ups_doctor_core::scenario`): not an edge.
fn import_graph_of(dir: &str) -> BTreeMap<String, BTreeMap<String, Edge>> {
    let krate = Crate::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir));
    krate
        .modules
        .values()
        .map(|m| {
            let mut edges = krate.imports(m);
            edges.retain(|to, _| to != "lib.rs" && to != "main.rs");
            (m.file.clone(), edges)
        })
        .collect()
}

/// The doctor's import graph.
fn import_graph() -> BTreeMap<String, BTreeMap<String, Edge>> {
    let graph = import_graph_of("src");
    assert!(graph.len() > 50, "found {} files", graph.len());
    graph
}

/// The graph between top-level modules: `harness/run/supervise.rs` is `harness`, `main.rs` is
/// `main`; an edge for every file-level import across two of them (the first one found kept).
fn module_graph(
    files: &BTreeMap<String, BTreeMap<String, Edge>>,
) -> BTreeMap<String, BTreeMap<String, Edge>> {
    let top =
        |file: &str| -> String { file.split('/').next().unwrap_or(file).trim_end_matches(".rs").to_string() };
    let mut out: BTreeMap<String, BTreeMap<String, Edge>> = BTreeMap::new();
    for (from, edges) in files {
        let entry = out.entry(top(from)).or_default();
        for (to, e) in edges {
            let (a, b) = (top(from), top(to));
            // lib.rs declares every module and re-exports from them: it is the root, not a peer.
            if a != b && a != "lib" && b != "lib" {
                entry.entry(b).or_insert_with(|| Edge {
                    to: to.clone(),
                    line: e.line,
                    text: format!("{from}: {}", e.text),
                });
            }
        }
    }
    out
}

/// Every circle through a node of `graph`, one line per step.
fn circles(graph: &BTreeMap<String, BTreeMap<String, Edge>>) -> Vec<String> {
    let mut seen: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    let mut out = Vec::new();
    for file in graph.keys() {
        let Some(chain) = circle(graph, file) else { continue };
        let members: BTreeSet<String> = chain.iter().map(|(f, _)| f.clone()).collect();
        if seen.insert(members) {
            let steps: Vec<String> = chain
                .iter()
                .map(|(from, e)| format!("  src/{from}:{} `{}` → src/{}", e.line, e.text, e.to))
                .collect();
            out.push(format!("{file}:\n{}", steps.join("\n")));
        }
    }
    out
}

#[test]
fn no_file_of_any_crate_imports_one_that_imports_it_back() {
    let mut found = Vec::new();
    for dir in CRATES {
        found.extend(circles(&import_graph_of(dir)).into_iter().map(|c| format!("[{dir}] {c}")));
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn no_top_level_module_of_the_doctor_imports_one_that_imports_it_back() {
    let found = circles(&module_graph(&import_graph()));
    assert!(found.is_empty(), "import circles between top-level modules:\n{}", found.join("\n"));
}

/// The check itself: it sees imports through `use` trees, `super`, child paths, re-exports and
/// paths written in code, and it finds a circle when there is one.
#[test]
fn the_import_reader_sees_every_form_and_finds_circles() {
    let graph = import_graph();
    let to = |from: &str| -> BTreeSet<String> { graph[from].keys().cloned().collect() };
    // `use super::…::{…}` in a use tree, followed through a `mod.rs`'s re-exports: the catalogue's
    // families import `super::{Finding, Pattern}`, which catalog/mod.rs re-exports from pattern.rs.
    assert!(
        to("diagnose/catalog/crash.rs").contains("diagnose/catalog/pattern.rs"),
        "{:?}",
        to("diagnose/catalog/crash.rs")
    );
    assert!(
        !to("diagnose/catalog/crash.rs").contains("diagnose/catalog/mod.rs"),
        "{:?}",
        to("diagnose/catalog/crash.rs")
    );
    // `use super::state::RankState`.
    assert!(
        to("harness/observe/gpu.rs").contains("harness/observe/state.rs"),
        "{:?}",
        to("harness/observe/gpu.rs")
    );
    // A path written in code: `crate::run_files::replace(…)` in bisect/executor.rs, and a child
    // path through a child folder: `run::supervise::supervise(…)` in harness/mod.rs.
    assert!(to("bisect/executor.rs").contains("run_files.rs"), "{:?}", to("bisect/executor.rs"));
    assert!(to("harness/mod.rs").contains("harness/run/supervise.rs"), "{:?}", to("harness/mod.rs"));
    // Another crate's items are not edges: `crate::scenario` is `ups_doctor_core::scenario`.
    assert!(!to("harness/plan/mod.rs").iter().any(|f| f == "lib.rs"), "{:?}", to("harness/plan/mod.rs"));
    // Tests are not imports: the report's fixtures and the result schema's documentation test are
    // test-only files.
    assert!(!graph.contains_key("report/schema_doc_tests.rs") && !graph.contains_key("report/fixtures.rs"));

    let mut looped = graph.clone();
    let back = Edge {
        to: "harness/observe/gpu.rs".into(),
        line: 1,
        text: "use crate::harness::observe::gpu".into(),
    };
    looped.get_mut("harness/observe/state.rs").unwrap().insert(back.to.clone(), back);
    let found = circles(&looped);
    assert!(
        found
            .iter()
            .any(|c| c.contains("src/harness/observe/gpu.rs") && c.contains("src/harness/observe/state.rs")),
        "{found:?}"
    );
}

#[test]
fn stripping_keeps_code_and_drops_comments_strings_and_tests() {
    let src = "use crate::a::b; // crate::c::d\nlet s = \"crate::e::f\"; let r = r#\"crate::g\"#; let c = '\"';\n/* crate::h */ x::y\n#[cfg(test)]\nmod tests { use crate::i; }\n#[cfg(test)]\nmod more;\n";
    let (code, test_mods) = without_tests(&strip(src));
    assert!(code.contains("use crate::a::b;") && code.contains("x::y"), "{code}");
    for gone in ["crate::c", "crate::e", "crate::g", "crate::h", "crate::i"] {
        assert!(!code.contains(gone), "{gone} in {code}");
    }
    assert_eq!(test_mods, ["more"]);
    assert_eq!(code.lines().count(), src.lines().count());
    assert_eq!(
        expand_use("crate::a::{self, b::{C, D as E}, *}"),
        [
            vec!["crate", "a"],
            vec!["crate", "a", "b", "C"],
            vec!["crate", "a", "b", "D"],
            vec!["crate", "a", "*"]
        ]
    );
}

/// The functions of a file's code (comments, strings and tests blanked) whose bodies are longer
/// than `limit` lines: `(line of the fn, name, body lines)`.
fn long_functions(code: &str, limit: usize) -> Vec<(usize, String, usize)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut search = 0;
    while let Some(found) = code[search..].find("fn ").map(|i| i + search) {
        search = found + 3;
        // A whole word `fn`, followed by a name.
        if found > 0 && (bytes[found - 1].is_ascii_alphanumeric() || bytes[found - 1] == b'_') {
            continue;
        }
        let name: String =
            code[found + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue;
        }
        // Its body: the first `{` before any `;` (a declaration has none), to its match.
        let Some(open) = code[found..].find(['{', ';']).map(|i| i + found).filter(|&i| bytes[i] == b'{')
        else {
            continue;
        };
        let mut depth = 0usize;
        let mut close = open;
        for (i, &b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let line = code[..found].lines().count().max(1);
        let body = code[open..close].lines().count().saturating_sub(1);
        if body > limit {
            out.push((line, name, body));
        }
    }
    out
}

/// No function outside tests is longer than 120 lines unless a comment right above it (its doc
/// comment) says why, starting `Long:`; and `main.rs` is dispatch, under 200 lines.
#[test]
fn long_functions_say_why_and_main_is_thin() {
    const LIMIT: usize = 120;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let main = std::fs::read_to_string(root.join("src/main.rs")).unwrap();
    assert!(main.lines().count() < 200, "src/main.rs has {} lines", main.lines().count());
    let mut unexplained = Vec::new();
    for dir in CRATES {
        let krate = Crate::load(&root.join(dir));
        for m in krate.modules.values() {
            let raw = std::fs::read_to_string(root.join(dir).join(&m.file)).unwrap();
            let raw: Vec<&str> = raw.lines().collect();
            for (line, name, body) in long_functions(&m.code, LIMIT) {
                // The comment lines directly above the fn (and its attributes).
                let above = raw[..line.saturating_sub(1)]
                    .iter()
                    .rev()
                    .take_while(|l| l.trim_start().starts_with("//") || l.trim_start().starts_with("#["));
                if !above.into_iter().any(|l| l.contains("Long:")) {
                    unexplained.push(format!("{dir}/{}:{line} `{name}`: {body} lines", m.file));
                }
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "functions over {LIMIT} lines without a `Long:` comment:\n{}",
        unexplained.join("\n")
    );
}

#[test]
fn long_functions_are_measured_from_brace_to_brace() {
    let code = "fn short() {\n    a();\n}\nfn decl();\npub fn long(x: u32) -> u32 {\n    if x {\n        b();\n    }\n    c()\n}\n";
    assert_eq!(long_functions(code, 2), [(5, "long".to_string(), 4)]);
    assert!(long_functions(code, 4).is_empty());
}

/// The ordinary string literals of `src` (`"…"`, not raw ones), with the index of the character
/// each starts at; comments skipped.
fn string_literals(src: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            i += if next == Some('\\') { 4 } else { 3 };
        } else if c == '"' {
            let start = i;
            let mut text = String::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if i < chars.len() {
                    text.push(chars[i]);
                    i += 1;
                }
            }
            out.push((start, text));
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The character ranges of `src` that are tests (`#[cfg(test)]` items), from its stripped form
/// (which is ASCII outside comments and strings, so its byte offsets are character indices).
fn test_spans(src: &str) -> Vec<(usize, usize)> {
    let stripped = strip(src);
    let (without, _) = without_tests(&stripped);
    let (a, b): (Vec<char>, Vec<char>) = (stripped.chars().collect(), without.chars().collect());
    let mut spans = Vec::new();
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            let start = i;
            while i < a.len() && (a[i] != b[i] || a[i].is_whitespace()) && b[i].is_whitespace() {
                i += 1;
            }
            spans.push((start, i));
        }
        i += 1;
    }
    spans
}

/// The non-test source files of the doctor and the shared crate, `src/`-relative with the crate's
/// folder in front (`src/harness/plan/command.rs`), with their text.
fn product_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["src", "crates/core/src"] {
        let mut paths = Vec::new();
        rust_files(&root.join(dir), &mut paths);
        for p in paths {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            // Test-only files (`tests.rs`, `fixtures.rs`, a `tests/` folder of a module).
            let name = rel.rsplit('/').next().unwrap_or_default();
            if name == "tests.rs" || name == "fixtures.rs" || rel.contains("/tests/") || name == "purity.rs" {
                continue;
            }
            out.push((rel, std::fs::read_to_string(&p).unwrap()));
        }
    }
    out
}

/// Where the launcher table is, and the serde forms of the result types (`ExitSource`'s
/// `"torchrun"` is a value of `result.json`, not a launcher matched).
const LAUNCHER_TABLE: &str = "crates/core/src/scenario/launcher.rs";

/// Every name the launcher table matches commands by: programs, `python -m` modules, the words a
/// shell script runs them by.
fn launcher_names() -> BTreeSet<String> {
    use ups_doctor_core::scenario::launcher::LAUNCHERS;
    LAUNCHERS
        .iter()
        .flat_map(|l| l.programs.iter().chain(l.modules).chain(l.in_shell).copied())
        .map(String::from)
        .collect()
}

/// String literals naming a launcher in `text` outside its tests: `(line, literal)`.
fn launcher_literals(text: &str, names: &BTreeSet<String>) -> Vec<(usize, String)> {
    let spans = test_spans(text);
    let chars: Vec<char> = text.chars().collect();
    string_literals(text)
        .into_iter()
        .filter(|(at, s)| names.contains(s) && !spans.iter().any(|(a, b)| a <= at && at < b))
        .map(|(at, s)| (chars[..at].iter().filter(|c| **c == '\n').count() + 1, s))
        .collect()
}

#[test]
fn a_launcher_is_named_only_in_the_launcher_table() {
    let names = launcher_names();
    assert!(names.contains("torchrun") && names.contains("accelerate launch"), "{names:?}");
    let mut found = Vec::new();
    for (file, text) in product_sources() {
        if file == LAUNCHER_TABLE || file.starts_with("crates/core/src/schema/") {
            continue;
        }
        for (line, s) in launcher_literals(&text, &names) {
            found.push(format!("{file}:{line}: \"{s}\""));
        }
    }
    assert!(
        found.is_empty(),
        "launcher names matched outside {LAUNCHER_TABLE} (ask the table: `launcher::of_command`, \
         `of_program`, `in_program_source`, `shell_words`):\n{}",
        found.join("\n")
    );
    // The check itself: a literal in code is found, one in a comment or a test is not.
    let planted = "fn f(p: &str) -> bool { p == \"torchrun\" } // \"srun\"\n#[cfg(test)]\nmod tests { const A: &str = \"deepspeed\"; }\n";
    assert_eq!(launcher_literals(planted, &names), [(1, "torchrun".to_string())]);
}

/// What the kernel seam (`src/harness/os/`) may import: itself, the shared types, the machine's
/// facts and the files ups-doctor writes; nothing of the harness above it, the judge or reports.
const OS_MAY_IMPORT: [&str; 6] = ["harness/os/", "probe/", "run_files.rs", "error.rs", "schema", "protocol"];

#[test]
fn the_kernel_seam_imports_nothing_above_it() {
    let graph = import_graph();
    let above = |to: &str| !OS_MAY_IMPORT.iter().any(|ok| to.starts_with(ok));
    let found: Vec<String> = graph
        .iter()
        .filter(|(from, _)| from.starts_with("harness/os/"))
        .flat_map(|(from, edges)| {
            edges
                .values()
                .filter(|e| above(&e.to))
                .map(move |e| format!("src/{from}:{} `{}` → src/{}", e.line, e.text, e.to))
        })
        .collect();
    assert!(found.is_empty(), "src/harness/os/ imports upward:\n{}", found.join("\n"));
}

/// Code outside the judge that writes a verdict: builds a `Verdict`, or sets or extends a headline.
fn verdict_writes(code: &str) -> Vec<(usize, String)> {
    let re = regex::Regex::new(
        r"(\bVerdict\s*\{|\bVerdict::default\(\)|\.headline\s*=[^=]|\.headline\.push|\bheadline\s*:\s*format!)",
    )
    .unwrap();
    re.captures_iter(code)
        .filter(|c| {
            let before = code[..c.get(1).unwrap().start()].trim_end();
            !(before.ends_with("struct") || before.ends_with("enum"))
        })
        .map(|c| {
            let m = c.get(1).unwrap();
            (code[..m.start()].matches('\n').count() + 1, m.as_str().trim().to_string())
        })
        .collect()
}

#[test]
fn verdicts_and_headlines_are_written_only_by_the_judge() {
    let krate = Crate::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut found = Vec::new();
    for m in krate.modules.values().filter(|m| !m.file.starts_with("diagnose/")) {
        for (line, what) in verdict_writes(&m.code) {
            found.push(format!("src/{}:{line}: `{what}`", m.file));
        }
    }
    assert!(
        found.is_empty(),
        "a verdict written outside src/diagnose/ (the one judge):\n{}",
        found.join("\n")
    );
    let planted =
        "fn f(v: &mut Verdict) { v.headline = x; let w = Verdict::default(); }\npub struct Verdict {}";
    assert_eq!(verdict_writes(planted).len(), 2, "{:?}", verdict_writes(planted));
}

/// Code outside the judge that builds the judge's evidence by hand (`Observed { … }`) instead of
/// through its one constructor (`Observed::of`, from the result being concluded), or that makes a
/// result's empty verdict (`Verdict::unjudged()`) in a file that never hands it to the one
/// entrance (`diagnose::conclude`).
fn judge_bypasses(code: &str) -> Vec<(usize, String)> {
    let line = |at: usize| code[..at].matches('\n').count() + 1;
    let literal = regex::Regex::new(r"\bObserved\s*\{").unwrap();
    let mut found: Vec<(usize, String)> = literal
        .find_iter(code)
        .filter(|m| !code[..m.start()].trim_end().ends_with("struct"))
        .map(|m| (line(m.start()), "`Observed { … }` built by hand: use `Observed::of(&result)`".to_string()))
        .collect();
    if !code.contains("diagnose::conclude(") {
        found.extend(code.match_indices("Verdict::unjudged()").map(|(at, _)| {
            (line(at), "`Verdict::unjudged()` never handed to `diagnose::conclude`".to_string())
        }));
    }
    found
}

#[test]
fn every_caller_enters_the_judge_through_conclude() {
    let krate = Crate::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut found = Vec::new();
    for m in krate.modules.values().filter(|m| !m.file.starts_with("diagnose/")) {
        for (line, what) in judge_bypasses(&m.code) {
            found.push(format!("src/{}:{line}: {what}", m.file));
        }
    }
    assert!(
        found.is_empty(),
        "the judge entered other than through `diagnose::conclude`:\n{}",
        found.join("\n")
    );
    // The check itself: a literal and an unjudged verdict never concluded are found; the struct's
    // own definition and a verdict handed to the judge are not.
    let planted =
        "pub struct Observed { a: u8 }\nfn f() { let o = Observed { a: 1 }; let v = Verdict::unjudged(); }";
    assert_eq!(judge_bypasses(planted).iter().map(|(l, _)| *l).collect::<Vec<_>>(), [2, 2]);
    let fine =
        "fn f(r: &mut R) { r.verdict = Verdict::unjudged(); crate::diagnose::conclude(r, Seen::Ran); }";
    assert!(judge_bypasses(fine).is_empty());
}

/// Functions callable from outside their module whose error may stay a `String`, each with why:
/// `(file, name)`. Empty: every one has a typed error (issue 55). A `TryFrom<String>` for serde
/// or a `FromStr` is a trait impl with no `pub` of its own, so it is not read here.
const STRING_ERRORS_ALLOWED: [(&str, &str); 0] = [];

/// The functions of a file's code (comments, strings and tests blanked) that code outside their
/// module may call (`pub`, `pub(crate)`, `pub(super)`) and whose error is a bare `String`:
/// `(line, name)`.
fn string_errors(code: &str) -> Vec<(usize, String)> {
    let item =
        regex::Regex::new(r"\bpub\b(?:\s*\([^)]*\))?\s+(?:(?:const|async|unsafe|extern)\s+)*fn\s+(\w+)")
            .unwrap();
    item.captures_iter(code)
        .filter(|c| return_type(&code[c.get(1).unwrap().end()..]).is_some_and(|ret| error_is_string(&ret)))
        .map(|c| (code[..c.get(0).unwrap().start()].matches('\n').count() + 1, c[1].to_string()))
        .collect()
}

/// The return type of a fn whose code after its name is `rest`, without whitespace and with
/// every `->` written `~` (so that its `>` closes no bracket); `None` when it returns nothing.
fn return_type(rest: &str) -> Option<String> {
    let rest = rest.replace("->", "~");
    // Past the generics and the parameters, which may hold brackets of their own (`F: Fn(u8)`).
    let mut depth = 0i32;
    let mut end = None;
    for (i, c) in rest.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ']' => depth -= 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(i + 1);
                    break;
                }
            }
            '{' | ';' if depth == 0 => return None,
            _ => {}
        }
    }
    let ret = rest[end?..].trim_start().strip_prefix('~')?;
    // Up to the body or the `;` of a declaration (not one inside `[u8; 4]`).
    let mut depth = 0i32;
    let stop = ret
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                _ => {}
            }
            depth == 0 && (c == '{' || c == ';')
        })
        .map_or(ret.len(), |(i, _)| i);
    let ret = &ret[..stop];
    let ret = regex::Regex::new(r"\bwhere\b").unwrap().split(ret).next().unwrap_or_default();
    Some(ret.split_whitespace().collect())
}

/// Whether a return type (as [`return_type`] gives it) is a `Result` whose error is `String`.
fn error_is_string(ret: &str) -> bool {
    let Some((head, args)) = ret.split_once('<') else { return false };
    if !(head == "Result" || head.ends_with("::Result")) || !args.ends_with('>') {
        return false;
    }
    let args = &args[..args.len() - 1];
    let mut depth = 0;
    let mut last = None;
    for (i, c) in args.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => last = Some(i + 1),
            _ => {}
        }
    }
    last.is_some_and(|at| {
        matches!(
            &args[at..],
            "String" | "std::string::String" | "::std::string::String" | "alloc::string::String"
        )
    })
}

#[test]
fn functions_used_across_modules_return_typed_errors_not_strings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    for dir in ["src", "crates/core/src"] {
        for m in Crate::load(&root.join(dir)).modules.values() {
            let file = format!("{dir}/{}", m.file);
            for (line, name) in string_errors(&m.code) {
                match STRING_ERRORS_ALLOWED.iter().find(|(f, n)| *f == file && *n == name) {
                    Some(allowed) => {
                        allowed_seen.insert(*allowed);
                    }
                    None => found.push(format!("{file}:{line} `fn {name}`")),
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "functions callable from other modules whose error is a `String`: give each a `thiserror` error that \
         carries its values (as `src/error.rs`, `HarnessError`, `ReportError` do), or allow it in \
         STRING_ERRORS_ALLOWED saying why:\n{}",
        found.join("\n")
    );
    let stale: Vec<_> = STRING_ERRORS_ALLOWED.iter().filter(|a| !allowed_seen.contains(*a)).collect();
    assert!(stale.is_empty(), "allowed `String` errors that are gone; remove them from the list: {stale:?}");
    // The check itself: any visibility beyond the module, a return type over several lines, nested
    // generics and `->` inside them; not a private fn, a `String` as the value, a parameter, or
    // `io::Result`.
    let planted = "pub fn a() -> Result<u8, String> {}\n\
                   pub(crate) fn b<F: Fn() -> u8>(f: F)\n    -> Result<Vec<(u32, String)>, String>\nwhere F: Copy {}\n\
                   impl S { pub unsafe fn c(&self) -> std::result::Result<Box<dyn Fn() -> u8>, String>; }\n\
                   fn d() -> Result<u8, String> {}\n\
                   pub fn e() -> Result<String, Error> {}\n\
                   pub fn f(r: Result<u8, String>) -> u8 {}\n\
                   pub fn g() -> io::Result<String> {}\n\
                   pub fn h() {}\n\
                   pub fn i(x: [u8; 4]) -> Result<[u8; 4], String> {}\n";
    let names: Vec<(usize, String)> = string_errors(planted);
    assert_eq!(
        names,
        [(1, "a".to_string()), (2, "b".to_string()), (5, "c".to_string()), (11, "i".to_string())]
    );
}
