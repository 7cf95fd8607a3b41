//! The SQL edition names, in its comments, the Rust item each of its helpers mirrors
//! (`args::token_number`, `units::Period::end_ms`, `protocol::take_all`). This test fails
//! when such an item no longer exists in the core, so a rename or a removal in Rust is
//! seen where its hand-written PL/pgSQL counterpart lives.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Rust source of module `name` of the core (`name.rs`, or every file of `name/`, in
/// `shared/src` or one of its groups: `kinds/`, `storage/` and the rest), None when the
/// core has no such module.
fn module_source(name: &str) -> Option<String> {
    let top = root().join("shared/src");
    let groups = fs::read_dir(&top).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir());
    let src = std::iter::once(top.clone())
        .chain(groups)
        .find(|dir| dir.join(format!("{name}.rs")).exists() || dir.join(name).is_dir())
        .unwrap_or(top);
    let file = src.join(format!("{name}.rs"));
    let dir = src.join(name);
    let mut text = fs::read_to_string(&file).unwrap_or_default();
    if dir.is_dir() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                text += &fs::read_to_string(path).unwrap();
            }
        }
    }
    (file.exists() || dir.is_dir()).then_some(text)
}

/// Whether `source` defines `item`: a function, a constant, a type, a trait or a variant.
fn defines(source: &str, item: &str) -> bool {
    ["fn ", "const ", "struct ", "enum ", "trait ", "type ", "static "].iter().any(|kind| {
        source.match_indices(&format!("{kind}{item}")).any(|(i, m)| {
            let next = source[i + m.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    }) || source.contains(&format!("    {item}(")) // an enum variant with fields
        || source.contains(&format!("    {item},"))
        || source.contains(&format!("    {item} {{"))
}

/// Every `module::Item[::member]` in the comments of the edition's SQL whose first part
/// is a module of the core.
fn counterparts() -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for file in ["sql/edition/helpers.sql", "sql/edition/functions.sql"] {
        let text = fs::read_to_string(root().join(file)).unwrap();
        for line in text.lines() {
            let Some(comment) = line.split_once("--").map(|(_, c)| c) else { continue };
            for word in comment.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                let parts: Vec<String> = word.split("::").map(str::to_string).collect();
                if parts.len() >= 2 && parts.iter().all(|p| !p.is_empty()) && module_source(&parts[0]).is_some() {
                    found.push((format!("{file}: {word}"), parts));
                }
            }
        }
    }
    found
}

#[test]
fn the_editions_sql_names_counterparts_that_exist() {
    let found = counterparts();
    assert!(found.len() >= 30, "the edition names its counterparts ({} found)", found.len());
    let missing: Vec<&String> = found
        .iter()
        .filter(|(_, parts)| {
            let source = module_source(&parts[0]).unwrap();
            !parts[1..].iter().all(|item| defines(&source, item))
        })
        .map(|(at, _)| at)
        .collect();
    assert!(missing.is_empty(), "named in SQL comments, gone from the core: {missing:?}");
}

#[test]
fn a_renamed_item_is_seen() {
    let source = module_source("bucket").unwrap();
    assert!(defines(&source, "take"));
    assert!(!defines(&source, "take_renamed_away"));
    assert!(module_source("multi").is_none(), "multi.rs is take_all.rs now");
}
