//! The crate's layers (`src/docs/architecture.rs`), checked from the source: every
//! module's docs name its layer (`//! Layer: core.`; a module without the line is in
//! its parent's), and every `crate::` or `super::` path in a module's code (comments
//! and test modules aside) names a module of its own layer or one below. Within a
//! layer, modules import each other in one direction only: the only circles allowed
//! are the facade's constructor handles (`ReplayBuffer` and its builder, writer and
//! learner, as crossbeam's `channel.rs` and its `Sender` / `Receiver`) and a module
//! with its own children.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first.
const LAYERS: [&str; 7] = ["base", "algos", "core", "gates", "state", "api", "faces"];

/// Module circles that are allowed: the facade and its constructor handles.
const FACADE: [&str; 4] = ["buffer", "builder", "learner", "writer"];

struct Module {
    path: PathBuf,
    /// The module's own layer line, if it has one.
    own_layer: Option<String>,
    /// The modules its code names.
    imports: BTreeSet<String>,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is the root, "".
fn module_name(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without its test module and comments.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") || trimmed.starts_with("#[cfg(all(test") {
            break;
        }
        let line = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    code
}

fn layer_line(text: &str) -> Option<String> {
    text.lines()
        .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
        .find_map(|l| l.strip_prefix("//! Layer: "))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_alphabetic())
                .next()
                .unwrap()
                .to_owned()
        })
}

/// Every path the code names from `crate::` or `super::`, as module paths (the
/// braces of a `use` expanded one level).
fn named_paths(module: &str, code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let here: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    for (start, head) in [("crate::", None), ("super::", Some(()))] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().last();
            rest = &rest[at + start.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base: Vec<&str> = match head {
                None => Vec::new(),
                // `super` of `a::b` (a file b.rs, or b/mod.rs) is `a`.
                Some(()) => here[..here.len().saturating_sub(1)].to_vec(),
            };
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':' || *c == '{')
                .collect();
            let path = path.trim_end_matches(':');
            if let Some(prefix) = path.strip_suffix('{') {
                // `use crate::a::{b, c::D}`: each item.
                let close = rest.find('}').unwrap_or(rest.len());
                let inner = &rest[path.len()..close];
                for item in inner.split(',') {
                    let item = item.trim().split(" as ").next().unwrap().trim();
                    if item.is_empty() || item == "self" {
                        found.push(join(&base, prefix.trim_end_matches(':')));
                        continue;
                    }
                    found.push(join(&base, &format!("{prefix}{item}")));
                }
            } else {
                found.push(join(&base, path));
            }
        }
    }
    found
}

fn join(base: &[&str], path: &str) -> String {
    let mut parts: Vec<&str> = base.to_vec();
    parts.extend(path.split("::").filter(|p| !p.is_empty()));
    parts.join("::")
}

/// The longest known module that `path` starts with.
fn resolve(modules: &BTreeMap<String, Module>, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| modules.contains_key(m))
}

fn load() -> BTreeMap<String, Module> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeMap::new();
    let mut named = BTreeMap::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let name = module_name(&src, &file);
        named.insert(name.clone(), named_paths(&name, &code_of(&text)));
        modules.insert(
            name,
            Module {
                path: file,
                own_layer: layer_line(&text),
                imports: BTreeSet::new(),
            },
        );
    }
    for (name, paths) in named {
        let imports: BTreeSet<String> = paths
            .iter()
            .filter_map(|p| resolve(&modules, p))
            .filter(|m| *m != name && !m.is_empty())
            .collect();
        modules.get_mut(&name).unwrap().imports = imports;
    }
    modules
}

/// A module's layer: its own line's, or its nearest ancestor's.
fn layer_of(modules: &BTreeMap<String, Module>, name: &str) -> Option<usize> {
    let mut at = name.to_owned();
    loop {
        if let Some(layer) = modules.get(&at).and_then(|m| m.own_layer.as_deref()) {
            return LAYERS.iter().position(|l| *l == layer);
        }
        match at.rfind("::") {
            Some(i) => at.truncate(i),
            None if !at.is_empty() => at.clear(),
            None => return None,
        }
    }
}

#[test]
fn every_module_names_a_known_layer() {
    let modules = load();
    let mut missing = Vec::new();
    for (name, m) in &modules {
        if name.is_empty() {
            continue; // the crate root re-exports every layer
        }
        if let Some(layer) = &m.own_layer {
            assert!(
                LAYERS.contains(&layer.as_str()),
                "{}: unknown layer {layer:?} (the layers: {LAYERS:?})",
                m.path.display()
            );
        }
        if layer_of(&modules, name).is_none() {
            missing.push(m.path.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "modules whose docs name no layer (add `//! Layer: NAME.`):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_import_points_down() {
    let modules = load();
    let mut upward = Vec::new();
    for (name, m) in &modules {
        let Some(mine) = layer_of(&modules, name) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        for target in &m.imports {
            let Some(theirs) = layer_of(&modules, target) else {
                continue;
            };
            if theirs > mine {
                upward.push(format!(
                    "{name} ({}) imports {target} ({})",
                    LAYERS[mine], LAYERS[theirs]
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a layer above:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_import_circles_but_the_facades() {
    let modules = load();
    let mut circles = Vec::new();
    for (a, m) in &modules {
        for b in &m.imports {
            if a >= b || !modules[b].imports.contains(a) {
                continue;
            }
            let facade = FACADE.contains(&a.as_str()) && FACADE.contains(&b.as_str());
            let family = b.starts_with(&format!("{a}::")) || a.starts_with(&format!("{b}::"));
            if !facade && !family {
                circles.push(format!("{a} <-> {b}"));
            }
        }
    }
    // Longer circles: a module reaching itself through others, outside the facade.
    for start in modules.keys() {
        if FACADE.contains(&start.as_str()) || start.is_empty() {
            continue;
        }
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, trail)) = stack.pop() {
            for next in &modules[&at].imports {
                let family = next.starts_with(&format!("{start}::"))
                    || start.starts_with(&format!("{next}::"));
                if next == start && trail.len() > 2 && !family {
                    circles.push(format!("{} -> {start}", trail.join(" -> ")));
                } else if seen.insert(next.clone()) && !FACADE.contains(&next.as_str()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}
