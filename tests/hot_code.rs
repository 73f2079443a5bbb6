//! `build/hot-code.ld` (written by `benches/hot_code.py`) names the functions a request runs, so
//! the release build links them together. A pattern that names nothing links nothing, silently:
//! after a rename, or a bump that changed what a pinned hash matched, the list would rot and the
//! build would still pass. This test fails when the list pins a hash, or when too many of the
//! proxy's own functions it names no longer exist in the source: rerun the script.

use std::path::{Path, PathBuf};

/// The share of the proxy's own functions in the list that must still exist.
const MUST_RESOLVE: f64 = 0.9;

/// The patterns of the linker script, one per listed function.
fn patterns() -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build/hot-code.ld");
    let text = std::fs::read_to_string(&script).expect("build/hot-code.ld");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("*(.text."))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The length-prefixed segments of a legacy-mangled name (`_ZN10tokenmeter5proxy...17h*`),
/// the hash left off.
fn segments(mangled: &str) -> Option<Vec<String>> {
    let mut rest = mangled.strip_prefix("_ZN")?;
    let mut out = Vec::new();
    while rest.starts_with(|c: char| c.is_ascii_digit()) {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let len: usize = rest[..digits].parse().ok()?;
        // The hash: `17h` and 16 hex digits, or a wildcard in their place.
        if len == 17 && rest[digits..].starts_with('h') {
            break;
        }
        let segment = rest.get(digits..digits + len)?;
        out.push(segment.to_string());
        rest = &rest[digits + len..];
    }
    Some(out)
}

/// Where a function of this crate named by its path (`proxy`, `http1`, `server`, `Client`,
/// `poll_fill`) is defined: its module's file, and whether `fn NAME` is there.
fn resolves(path: &[String]) -> bool {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // Closures are their function's; the function is the last plain segment.
    let plain: Vec<&String> = path.iter().filter(|s| !s.contains('$')).collect();
    let Some((name, rest)) = plain.split_last() else {
        return false;
    };
    let modules: Vec<&String> = rest
        .iter()
        .copied()
        .take_while(|s| s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .collect();
    let mut file = PathBuf::from(&src);
    for module in &modules {
        file.push(module.as_str());
    }
    let candidates = [
        file.with_extension("rs"),
        file.join("mod.rs"),
        src.join("lib.rs"),
    ];
    let needle = format!("fn {name}");
    candidates.iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|text| {
            text.match_indices(&needle).any(|(at, _)| {
                let after = text[at + needle.len()..].chars().next();
                matches!(after, Some('(') | Some('<'))
            })
        })
    })
}

#[test]
fn the_hot_code_list_pins_no_hash_and_names_functions_that_exist() {
    let all = patterns();
    assert!(all.len() >= 50, "only {} patterns", all.len());
    let pinned: Vec<&String> = all
        .iter()
        .filter(|p| {
            p.match_indices("17h").any(|(at, _)| {
                let hash = &p.as_bytes()[at + 3..];
                hash.len() >= 17 && hash[..16].iter().all(u8::is_ascii_hexdigit) && hash[16] == b'E'
            })
        })
        .collect();
    assert!(
        pinned.is_empty(),
        "{} patterns pin a hash the next toolchain or dependency bump changes, e.g. {}; \
         rerun python3 benches/hot_code.py",
        pinned.len(),
        pinned[0]
    );
    let ours: Vec<Vec<String>> = all
        .iter()
        .filter(|p| p.starts_with("_ZN10tokenmeter"))
        .filter_map(|p| segments(p))
        .map(|s| s[1..].to_vec())
        .collect();
    assert!(
        ours.len() >= 20,
        "only {} of the proxy's own functions",
        ours.len()
    );
    let missing: Vec<String> = ours
        .iter()
        .filter(|path| !resolves(path))
        .map(|path| path.join("::"))
        .collect();
    let resolved = 1.0 - missing.len() as f64 / ours.len() as f64;
    assert!(
        resolved >= MUST_RESOLVE,
        "{} of the {} functions of tokenmeter that build/hot-code.ld names no longer exist \
         (e.g. {:?}); rerun python3 benches/hot_code.py",
        missing.len(),
        ours.len(),
        &missing[..missing.len().min(5)]
    );
}

#[test]
fn a_mangled_name_is_read_into_its_path() {
    let path = segments("_ZN10tokenmeter5proxy5http16server6Client9poll_fill17h*").unwrap();
    assert_eq!(
        path,
        [
            "tokenmeter",
            "proxy",
            "http1",
            "server",
            "Client",
            "poll_fill"
        ]
    );
    assert!(resolves(&path[1..]));
    let gone = segments("_ZN10tokenmeter5proxy2h110parse_head17h*").unwrap();
    assert!(!resolves(&gone[1..]));
}
