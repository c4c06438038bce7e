//! The workspace's structure, checked from its sources: no import cycles
//! between the modules of any crate, and command-line parsing (clap) only
//! in the binary's crate.
//!
//! A module depends on another when its code (comments and test modules
//! aside) names a path `crate::a::b` or `super::x` that resolves to that
//! module, or, in a parent, a path `child::x` into one of its own child
//! modules: a parent that uses its child depends on it, so a cycle that
//! runs through a parent and its child (`a` → `p`, `p` → `p::c`, `p::c` →
//! `a`) is caught. A child's use of its ancestors (`super::Thing`) is the
//! tree itself and is not counted, nor is the crate root (the facade).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates whose module graphs must be acyclic.
const CRATES: [&str; 12] = [
    "proto",
    "config",
    "transport",
    "agent",
    "agent/sim",
    "agent/fake-nvml",
    "collector",
    "collector/codec",
    "collector/store",
    "selector",
    "cli",
    "tests/bench",
];

fn root() -> PathBuf {
    flopwatch_tests::repo_root()
}

/// A crate's modules: path (`a::b`, "" for the root) → code.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read src dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).expect("under src").with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&p).expect("read source");
                out.insert(parts.join("::"), text);
            }
        }
    }
    // Modules declared `#[cfg(test)] mod x;` are test code.
    let test_only: Vec<String> = out
        .iter()
        .flat_map(|(m, text)| {
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            lines
                .windows(2)
                .filter(|w| {
                    w[0] == "#[cfg(test)]" && w[1].starts_with("mod ") && w[1].ends_with(';')
                })
                .map(|w| {
                    let name = w[1].trim_start_matches("mod ").trim_end_matches(';');
                    if m.is_empty() {
                        name.to_string()
                    } else {
                        format!("{m}::{name}")
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.retain(|m, _| {
        !test_only
            .iter()
            .any(|t| m == t || m.starts_with(&format!("{t}::")))
    });
    for text in out.values_mut() {
        *text = code_only(text);
    }
    out
}

/// The code of a file without line comments and without its
/// `#[cfg(test)] mod tests { … }` block (which comes last).
fn code_only(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths after each `prefix` in `code`: `crate::a::b::C` gives
/// `["a", "b", "C"]`; a group `crate::{a, b::c}` gives each member.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for member in group[..end].split(',') {
                let p: Vec<String> = member
                    .trim()
                    .split("::")
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty() && s.chars().all(is_ident))
                    .collect();
                if !p.is_empty() {
                    out.push(p);
                }
            }
            continue;
        }
        let end = rest
            .find(|c: char| !(is_ident(c) || c == ':'))
            .unwrap_or(rest.len());
        let p: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if !p.is_empty() {
            out.push(p);
        }
    }
    out
}

/// Each module's dependencies on the crate's other modules.
fn graph(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let resolve = |base: &[String], path: &[String]| -> Option<String> {
        (1..=path.len()).rev().find_map(|n| {
            let cand: Vec<String> = base.iter().chain(&path[..n]).cloned().collect();
            let cand = cand.join("::");
            mods.contains_key(&cand).then_some(cand)
        })
    };
    // Not counted: a module's use of itself, of an ancestor, of the root,
    // and the root's uses.
    let ignored = |a: &str, b: &str| {
        a == b || b.is_empty() || a.is_empty() || a.starts_with(&format!("{b}::"))
    };
    let mut g = BTreeMap::new();
    for (m, code) in mods {
        let mut deps = BTreeSet::new();
        for p in paths_after(code, "crate::") {
            if let Some(d) = resolve(&[], &p) {
                deps.insert(d);
            }
        }
        let parent: Vec<String> = m
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if !parent.is_empty() {
            let parent = &parent[..parent.len() - 1];
            for p in paths_after(code, "super::") {
                if let Some(d) = resolve(parent, &p) {
                    deps.insert(d);
                }
            }
        }
        // A parent's paths into its own children: `child::x` (not
        // `other::child::x`) or `self::child::x`.
        let own: Vec<String> = if m.is_empty() {
            Vec::new()
        } else {
            m.split("::").map(str::to_string).collect()
        };
        for child in mods.keys().filter_map(|k| {
            let rest = if m.is_empty() {
                k.as_str()
            } else {
                k.strip_prefix(m.as_str())?.strip_prefix("::")?
            };
            (!rest.is_empty() && !rest.contains("::")).then_some(rest)
        }) {
            let code = code
                .replace("self::", "")
                .replace(&format!("::{child}::"), "::_::");
            for p in paths_after(&code, &format!("{child}::")) {
                let mut path = vec![child.to_string()];
                path.extend(p);
                if let Some(d) = resolve(&own, &path) {
                    deps.insert(d);
                }
            }
        }
        deps.retain(|d| !ignored(m, d));
        g.insert(m.clone(), deps);
    }
    g
}

/// Strongly connected components of more than one module.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability by depth-first search from each node; the graphs are
    // small (tens of modules).
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for d in g.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|k| (k, reach(k))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for a in g.keys() {
        if done.contains(a) || !reachable[a].contains(a) {
            continue;
        }
        let comp: Vec<String> = g
            .keys()
            .filter(|b| reachable[a].contains(*b) && reachable[b].contains(a))
            .cloned()
            .collect();
        done.extend(comp.iter().cloned());
        out.push(comp);
    }
    out
}

#[test]
fn no_crate_has_an_import_cycle() {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root().join(krate).join("src");
        let mods = modules(&src);
        assert!(
            mods.len() > 1 || krate == "agent/fake-nvml",
            "{krate}: no modules found"
        );
        let g = graph(&mods);
        for c in cycles(&g) {
            for a in &c {
                for b in &g[a] {
                    if c.contains(b) {
                        eprintln!("EDGE {krate}: {a} -> {b}");
                    }
                }
            }
            found.push(format!("{krate}: {}", c.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The checker itself finds a cycle through a `super::` path and a grouped
/// `crate::{…}` import, and ignores comments and test modules.
#[test]
fn the_checker_finds_cycles_and_ignores_comments_and_tests() {
    let mods = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(m, c)| (m.to_string(), code_only(c)))
            .collect()
    };
    let cyclic = mods(&[
        ("", "mod a; mod b;"),
        ("a", "use crate::{b::Thing, c};"),
        ("b", "use super::a::Other;"),
        ("c", "fn f() {}"),
    ]);
    assert_eq!(
        cycles(&graph(&cyclic)),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
    // Through a parent and its child: `a` uses `p`, `p` uses its child
    // `p::c`, which uses `a`.
    let through_a_child = mods(&[
        ("", "mod a; mod p;"),
        ("a", "use crate::p::Thing;"),
        ("p", "mod c; pub fn f() { c::g() }"),
        ("p::c", "use crate::a::X; pub fn g() {}"),
    ]);
    assert_eq!(
        cycles(&graph(&through_a_child)),
        vec![vec!["a".to_string(), "p".to_string(), "p::c".to_string()]]
    );
    // A child's use of its parent, and a parent's of its child, are the
    // tree; so is another module's child of the same name.
    let tree = mods(&[
        ("", "mod p; mod q;"),
        ("p", "mod c; pub struct Thing; pub fn f() { c::g() }"),
        ("p::c", "use super::Thing; pub fn g() {}"),
        ("q", "pub fn h() { crate::p::f(); other::c::g() }"),
    ]);
    assert!(cycles(&graph(&tree)).is_empty());
    let fine = mods(&[
        ("", "mod a; mod b;"),
        ("a", "use crate::b::Thing; // see crate::c"),
        (
            "b",
            "/// [`crate::a`]\nfn g() {}\n#[cfg(test)]\nmod tests { use crate::a::X; }",
        ),
        ("c", "fn f() {}"),
    ]);
    assert!(cycles(&graph(&fine)).is_empty());
}

/// clap is the binaries': no library crate depends on it (the binaries are
/// `cli/`, the shipped `flopwatch`, and `tests/bench/`, `flopwatch-bench`).
#[test]
fn only_the_binary_parses_command_lines() {
    let manifest: toml::Table = toml::from_str(
        &std::fs::read_to_string(root().join("Cargo.toml")).expect("workspace manifest"),
    )
    .expect("workspace manifest parses");
    let members = manifest["workspace"]["members"]
        .as_array()
        .expect("workspace members");
    assert!(members.len() >= CRATES.len());
    for m in members {
        let m = m.as_str().expect("member path");
        if m == "cli" || m == "tests/bench" {
            continue;
        }
        let text = std::fs::read_to_string(root().join(m).join("Cargo.toml")).expect("manifest");
        let t: toml::Table = toml::from_str(&text).expect("member manifest parses");
        for section in ["dependencies", "build-dependencies"] {
            let deps = t.get(section).and_then(|d| d.as_table());
            assert!(
                !deps.is_some_and(|d| d.contains_key("clap")),
                "{m}/Cargo.toml depends on clap in [{section}]"
            );
        }
    }
}
