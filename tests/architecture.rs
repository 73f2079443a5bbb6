//! The source tree's floors, checked: every module imports only from its own floor or the
//! floors below it, the tools use only the crate's public API, `parse` stays pure, and no import
//! circle exists anywhere. What must never happen again: a floor reaching up (the recorder
//! holding the HTTP client, `config` taking constants from `metrics`), or two modules importing
//! each other.
//!
//! The graph is read from the source: every `crate::…` and `super::…` path outside comments and
//! test modules. Its nodes are a floor's root (its `mod.rs`, which only declares and re-exports)
//! and the floor's modules one level down; a module that is a directory (`parse/dialect/`,
//! `tools/bench/`) is one node, its files being its private parts. `lib.rs` is the node `crate`:
//! the public API, re-exports only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top.
const FLOORS: [&str; 7] = [
    "parse", "config", "policy", "publish", "measure", "proxy", "tools",
];

/// Crates the pure `parse` floor must not use.
const IMPURE: [&str; 5] = ["tokio", "hyper", "http_body", "http::", "prometheus"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
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

/// The module path of a file, relative to `src`: `parse/dialect/openai.rs` is
/// `["parse", "dialect", "openai"]`, `parse/mod.rs` is `["parse"]`, `lib.rs` is `[]`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Directories of peer modules: each file in them is a node of its own, as the files were when
/// they sat one level up (`proxy/http1/` holds the HTTP/1.1 stack by concern: its framing sits
/// below the request body the services see, its server and client above it).
const PEER_DIRS: [(&str, &str); 1] = [("proxy", "http1")];

fn peer_dir(floor: &str, first: &str) -> bool {
    PEER_DIRS.contains(&(floor, first))
}

/// The node a module belongs to: its floor and, below the floor's root, its first module (its
/// second, in a directory of peer modules).
fn node_of(module: &[String]) -> String {
    match module {
        [] => "crate".to_string(),
        [floor] => floor.clone(),
        [floor, first, second, ..] if peer_dir(floor, first) => {
            format!("{floor}/{first}/{second}")
        }
        [floor, first, ..] => format!("{floor}/{first}"),
    }
}

fn floor_of(node: &str) -> Option<usize> {
    let floor = node.split('/').next()?;
    FLOORS.iter().position(|f| *f == floor)
}

/// The code of a file without comments and without its test modules.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // A test module (`mod tests { … }` to the end of the file, or `mod tests;`).
            if lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
            {
                break;
            }
        }
        let without_comment = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

/// Every path that follows `prefix` (`crate::` or `super::`), as its first two segments at
/// most, with brace groups expanded: `crate::a::{b, c::d}` gives `[a, b]` and `[a, c]`.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        // `super::super::` and `self::crate` and identifiers ending in "crate" are not ours.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut found = Vec::new();
        expand(rest, Vec::new(), &mut found);
        out.extend(found);
    }
    out
}

fn expand(text: &str, head: Vec<String>, out: &mut Vec<Vec<String>>) {
    let text = text.trim_start();
    if head.len() >= 2 {
        out.push(head);
        return;
    }
    if let Some(inner) = text.strip_prefix('{') {
        // Split the group at its top-level commas.
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    expand(&inner[start..i], head.clone(), out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], head.clone(), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let ident: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if ident.is_empty() || ident == "self" {
        if !head.is_empty() {
            out.push(head);
        }
        return;
    }
    let mut head = head;
    head.push(ident.clone());
    let after = text[ident.len()..].trim_start();
    match after.strip_prefix("::") {
        Some(more) => expand(more, head, out),
        None => out.push(head),
    }
}

/// The module tree: which module paths exist.
fn modules(files: &[PathBuf]) -> BTreeSet<Vec<String>> {
    files
        .iter()
        .map(|f| module_of(f.strip_prefix(src()).unwrap()))
        .collect()
}

/// The node a path from the crate root names: a module one level under a floor if it is one,
/// else the floor's root (a re-export), else `crate` (the public API).
fn resolve(path: &[String], known: &BTreeSet<Vec<String>>) -> String {
    match path {
        [floor, ..] if !FLOORS.contains(&floor.as_str()) => "crate".to_string(),
        [floor, first, second, ..]
            if peer_dir(floor, first)
                && known.contains(&vec![floor.clone(), first.clone(), second.clone()]) =>
        {
            format!("{floor}/{first}/{second}")
        }
        [floor, first, ..] if known.contains(&vec![floor.clone(), first.clone()]) => {
            format!("{floor}/{first}")
        }
        [floor, ..] => floor.clone(),
        [] => "crate".to_string(),
    }
}

struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    /// Where each edge was seen, for the failure message.
    seen_in: BTreeMap<(String, String), String>,
}

fn graph() -> Graph {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let known = modules(&files);
    let mut graph = Graph {
        edges: BTreeMap::new(),
        seen_in: BTreeMap::new(),
    };
    for file in &files {
        let relative = file.strip_prefix(src()).unwrap();
        if relative.file_name().is_some_and(|n| n == "tests.rs") || relative == Path::new("main.rs")
        {
            continue;
        }
        let module = module_of(relative);
        let from = node_of(&module);
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let mut targets: Vec<String> = paths_after(&code, "crate::")
            .iter()
            .map(|p| resolve(p, &known))
            .collect();
        // `super::x` from a file is `crate::<its parent module>::x`.
        // A `mod.rs` is its directory's module, so its parent is one up, as for any file.
        let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
        for path in paths_after(&code, "super::") {
            if path.first().is_some_and(|p| p == "super") {
                continue;
            }
            let mut full = parent.clone();
            full.extend(path);
            targets.push(if full.len() >= 2 {
                resolve(&full, &known)
            } else {
                node_of(&full)
            });
        }
        for to in targets {
            if to != from {
                graph
                    .seen_in
                    .entry((from.clone(), to.clone()))
                    .or_insert_with(|| relative.display().to_string());
                graph.edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

#[test]
fn every_floor_imports_only_from_below() {
    let graph = graph();
    let mut wrong = Vec::new();
    for (from, tos) in &graph.edges {
        for to in tos {
            let file = &graph.seen_in[&(from.clone(), to.clone())];
            let ok = match (floor_of(from), floor_of(to)) {
                // The tools see the public API and each other, nothing else.
                (Some(6), _) => to == "crate" || to.starts_with("tools"),
                (Some(a), Some(b)) => b <= a,
                // Below the tools, the public API's re-exports would hide an upward import.
                (Some(_), None) => false,
                (None, _) => true,
            };
            if !ok {
                wrong.push(format!("{file}: {from} imports {to}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the floors (parse < config < policy < publish < measure < proxy < tools; \
         tools use only what lib.rs exports):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_import_circle() {
    let graph = graph();
    // Depth-first search with colours; report the first circle found, by name.
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|n| n == next).unwrap();
                    let mut circle = stack[at..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                Some(_) => {}
                None => {
                    if let Some(circle) = visit(next, graph, state, stack) {
                        return Some(circle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.edges.keys() {
        if !state.contains_key(node) {
            if let Some(circle) = visit(node, &graph, &mut state, &mut Vec::new()) {
                let steps: Vec<String> = circle
                    .windows(2)
                    .map(|w| {
                        format!(
                            "{} -> {} ({})",
                            w[0],
                            w[1],
                            graph.seen_in[&(w[0].clone(), w[1].clone())]
                        )
                    })
                    .collect();
                panic!("an import circle:\n{}", steps.join("\n"));
            }
        }
    }
}

#[test]
fn parse_is_pure() {
    let mut files = Vec::new();
    rust_files(&src().join("parse"), &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for name in IMPURE {
            if code.contains(name) {
                wrong.push(format!("{}: uses {name}", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "parse/ must stay pure:\n{}",
        wrong.join("\n")
    );
}

/// The check itself: it sees grouped imports, `super::` paths and circles.
#[test]
fn the_reader_of_paths_sees_groups_and_parents() {
    let code = code_of(
        "use crate::a::{b, c::{d, e}};\n// use crate::z::y;\nlet x = crate::f::g::h();\n#[cfg(test)]\nmod tests {\n use crate::t::u;\n}\n",
    );
    let paths = paths_after(&code, "crate::");
    let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(names, ["a::b", "a::c", "f::g"]);
    assert_eq!(
        module_of(Path::new("parse/dialect/mod.rs")),
        ["parse", "dialect"]
    );
    assert_eq!(
        node_of(&module_of(Path::new("publish/live/ring.rs"))),
        "publish/live"
    );
}
