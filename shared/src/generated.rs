//! The files generated from the function table ([`crate::functions`]): `sql/pg_finalize.sql`
//! (comments and privileges of the PostgreSQL extension) and `tests/functions.json` (what
//! the client tests read). `RL_BLESS=1 cargo test -p ratelimit_core --test generated`
//! rewrites them; the same test fails while either differs from the table.

use crate::functions::{Entry, Function, ALL};

/// `sql/pg_finalize.sql`: the comment on every function and the privileges of the internal
/// ones, written after pgrx has created them.
pub fn pg_finalize_sql() -> String {
    let quote = |s: &str| s.replace('\'', "''");
    let mut out = String::from(
        "-- Generated from shared/src/functions.rs (RL_BLESS=1 cargo test -p ratelimit_core --test generated).\n\
         -- Deliberate declarations of every function's purpose.\n",
    );
    for f in ALL.iter().filter(|f| !f.is_internal()) {
        out += &format!("COMMENT ON FUNCTION {} IS\n  '{}';\n", f.pg_signature(), quote(f.comment));
    }
    let admin: Vec<String> = ALL.iter().filter(|f| f.admin_only).map(Function::pg_signature).collect();
    out += "\n-- Administration: members of rl_admin (and the owner) only, never an application role.\n";
    out += &format!("REVOKE ALL ON FUNCTION\n  {}\nFROM PUBLIC;\n", admin.join(",\n  "));
    out += &format!("GRANT EXECUTE ON FUNCTION\n  {}\nTO rl_admin;\n", admin.join(",\n  "));
    let internal: Vec<String> = ALL.iter().filter(|f| f.is_internal()).map(Function::pg_signature).collect();
    out += "\n-- Internal: called only by the guarded UPDATEs of rl_take, rl_spend and the refunds.\n";
    out += &format!("REVOKE ALL ON FUNCTION\n  {}\nFROM PUBLIC;\n", internal.join(",\n  "));
    for f in ALL.iter().filter(|f| f.is_internal()) {
        out += &format!("COMMENT ON FUNCTION {} IS\n  '{}';\n", f.pg_signature(), quote(f.comment));
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
                Entry::Server => "server",
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
            })
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&functions).expect("plain values always encode");
    text.push('\n');
    text
}
