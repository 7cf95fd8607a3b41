//! The files generated from the function table ([`crate::functions`]): `sql/pg_finalize.sql`
//! (comments and privileges of the PostgreSQL extension) and `tests/functions.json` (what
//! the client tests read). `RL_BLESS=1 cargo test -p ratelimit_core --test generated`
//! rewrites them; the same test fails while either differs from the table.

use crate::functions::{Entry, ALL};

/// `sql/pg_finalize.sql`: the comment on every function and the privileges of every object
/// ([`crate::privileges`]), written after pgrx has created them.
pub fn pg_finalize_sql() -> String {
    let quote = |s: &str| s.replace('\'', "''");
    let mut out = String::from(
        "-- Generated from shared/src/functions.rs (RL_BLESS=1 cargo test -p ratelimit_core --test generated).\n\
         -- Deliberate declarations of every function's purpose.\n",
    );
    for f in ALL {
        out += &format!("COMMENT ON FUNCTION {} IS\n  '{}';\n", f.pg_signature(), quote(f.comment));
    }
    out += "\n";
    out += &crate::privileges::normalize(crate::privileges::native_functions());
    out
}

/// The newest upgrade script of the native extension (the one to this version, still
/// open), with its generated regions rewritten: `remember` (the application functions
/// found before the update, first) and `privileges` (the block that leaves every object
/// with the privileges it should have, last). `file` is the script's text.
pub fn upgrade_script(file: &str) -> String {
    let regions = [
        ("remember", crate::privileges::remember_existing(crate::privileges::native_functions())),
        ("privileges", crate::privileges::normalize(crate::privileges::native_functions())),
    ];
    let mut out = file.to_owned();
    for (name, text) in regions {
        let open = format!("-- generated: {name} ");
        let Some(start) = out.find(&open) else { continue };
        let body = start + out[start..].find('\n').map_or(0, |n| n + 1);
        let end = body + out[body..].find("-- end generated").unwrap_or(0);
        out.replace_range(body..end, &text);
    }
    out
}

/// `tests/functions.json`: the table as the client tests read it.
pub fn tests_json() -> String {
    let functions: Vec<serde_json::Value> = ALL
        .iter()
        .map(|f| {
            let kind = match f.entry {
                Entry::State(_) => "state",
                Entry::Pure(_) => "pure",
                Entry::Internal(_) => "internal",
                Entry::Process(_) => "process",
                Entry::Server(_) => "server",
            };
            let params: Vec<serde_json::Value> = f
                .params
                .iter()
                .map(|p| {
                    serde_json::json!({"name": p.name, "type": p.sql_type.pg_name(), "default": p.default,
                                       "variadic": p.variadic})
                })
                .collect();
            serde_json::json!({
                "name": f.name, "kind": kind, "params": params, "returns": f.returns.pg_name(),
                "comment": f.comment, "result_keys": f.result_keys, "admin_only": f.admin_only,
                "volatility": f.volatility(), "parallel": f.parallel(),
            })
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&functions).expect("plain values always encode");
    text.push('\n');
    text
}
