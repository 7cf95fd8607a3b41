//! The SQL edition for managed PostgreSQL (no native library can be loaded there): the
//! same state schema (`sql/schema/pg_schema.sql`), the same functions with the same arguments,
//! defaults, volatility, comments and grants (generated here from [`ratelimit_core::functions`]),
//! and bodies in PL/pgSQL (`sql/edition/`). [`script`] writes the install script that
//! `scripts/package.sh --sql` ships; a test keeps the checked-in copy current.

use crate::privileges;
use ratelimit_core::functions::{Entry, Function, ALL};

const SCHEMA: &str = include_str!("../../sql/schema/pg_schema.sql");
const STATS_VIEW: &str = include_str!("../../sql/schema/pg_stats_view.sql");
const HELPERS: &str = include_str!("../../sql/edition/helpers.sql");
const BODIES: &str = include_str!("../../sql/edition/functions.sql");

/// The core's limits that the edition's SQL names as `@NAME@`, substituted when the script
/// is written, so the two editions cannot disagree on them.
pub fn constants() -> Vec<(&'static str, String)> {
    use ratelimit_core::units;
    let mut out = vec![
        ("MAX_KEY_BYTES", units::MAX_KEY_BYTES.to_string()),
        ("MAX_TOKENS", (units::MAX_TOKENS as i64).to_string()),
        ("MAX_AMOUNT", (units::MAX_AMOUNT as i64).to_string()),
        ("MICROS_PER_UNIT", units::MICROS_PER_UNIT.to_string()),
        ("MS_PER_DAY", units::MS_PER_DAY.to_string()),
        ("MS_PER_HOUR", units::MS_PER_HOUR.to_string()),
        ("PERIODS", units::Unit::ALL.iter().map(|p| format!("'{}'", p.as_str())).collect::<Vec<_>>().join(", ")),
        ("MS_PER_MINUTE", (units::MS_PER_MINUTE as i64).to_string()),
        ("WEEKDAYS", ratelimit_core::period::WEEKDAYS.iter().map(|d| format!("'{d}'")).collect::<Vec<_>>().join(", ")),
        (
            "PERIOD_ANCHOR_FORMS",
            sql_json_literal(units::Unit::ALL.iter().map(|u| (u.as_str().to_owned(), u.anchor_form().to_owned()))),
        ),
        (
            "ZONES",
            sql_json_literal(ratelimit_core::period::zone_names().iter().map(|z| (z.to_ascii_lowercase(), z.clone()))),
        ),
        ("MAX_FREE_STRIKES", ratelimit_core::penalty::MAX_FREE_STRIKES.to_string()),
        ("MAX_DURATION_SECONDS", (units::MAX_DURATION_SECONDS as i64).to_string()),
        ("MAX_WAIT_MS", units::MAX_WAIT_MS.to_string()),
        ("MAX_NOW_MS", units::MAX_NOW_MS.to_string()),
        ("MAX_JSON_BYTES", units::MAX_JSON_BYTES.to_string()),
        ("MAX_WINDOW_ENTRIES", ratelimit_core::window::MAX_ENTRIES.to_string()),
        ("MAX_IN_FLIGHT", ratelimit_core::lease::MAX_IN_FLIGHT.to_string()),
        ("MAX_ATTEMPTS", ratelimit_core::protocol::MAX_ATTEMPTS.to_string()),
        ("REFUSED_ENTRIES", ratelimit_core::refused::ENTRIES.to_string()),
        ("REFUSED_POLICIES", ratelimit_core::refused::POLICIES.to_string()),
        ("REFUSED_SUBJECT_BYTES", ratelimit_core::refused::SUBJECT_BYTES.to_string()),
        ("MAX_NEAR", ratelimit_core::budget::MAX_NEAR.to_string()),
        ("MAX_USAGE_PERIODS", ratelimit_core::budget::MAX_USAGE_PERIODS.to_string()),
        ("USAGE_KEPT_MS", ratelimit_core::budget::USAGE_KEPT_MS.to_string()),
        ("USAGE_RETENTION_SETTING", ratelimit_core::budget::USAGE_RETENTION_SETTING.to_string()),
        ("MAX_RETENTION_DAYS", ratelimit_core::budget::MAX_RETENTION_DAYS.to_string()),
        ("MAX_ITEMS", ratelimit_core::take_all::MAX_ITEMS.to_string()),
        ("MAX_LIMITS", ratelimit_core::policy::MAX_LIMITS.to_string()),
        ("MAX_USED_UNITS", (ratelimit_core::budget::MAX_USED / units::MICROS_PER_UNIT).to_string()),
        ("MAX_NEAR_FRACTION", (ratelimit_core::budget::MAX_NEAR_FRACTION as i64).to_string()),
    ];
    out.extend(kind_constants());
    out
}

/// An SQL literal of a JSON object of these names and texts.
fn sql_json_literal(pairs: impl Iterator<Item = (String, String)>) -> String {
    let object: serde_json::Map<String, serde_json::Value> =
        pairs.map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    format!("'{}'", serde_json::Value::Object(object).to_string().replace('\'', "''"))
}

/// Each kind of limit as the edition's parsers name it (limit_json::KINDS): its number
/// (`KIND_BUCKET`); `KIND_OF_V`, the number of the kind the jsonb `v` is (the first whose
/// marker it holds); and for an rl_take_all item (`ITEM_...`) and a policy's limit
/// (`POLICY_...`): `..._ALLOWED`, the text[] of the fields a limit of the kind numbered
/// `kind` may hold, and `..._FIELDS_BY_KIND`, every kind's fields as an unknown field's error
/// lists them. A kind added to the table reaches the edition's parsing through these alone.
fn kind_constants() -> Vec<(&'static str, String)> {
    use ratelimit_core::limit_json::{fields_by_kind, Kind, ITEM, KINDS, POLICY};
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let literals = |fields: Vec<&str>| fields.iter().map(|f| format!("'{f}'")).collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    for kind in Kind::ALL {
        out.push((leak(format!("KIND_{}", kind.name().to_uppercase())), kind.number().to_string()));
    }
    let case = |arm: &dyn Fn(&ratelimit_core::limit_json::KindSpec) -> String, default: String| {
        format!(
            "CASE {} ELSE {default} END",
            KINDS.iter().filter(|s| s.marker.is_some()).map(arm).collect::<Vec<_>>().join(" ")
        )
    };
    let unmarked = KINDS.iter().find(|s| s.marker.is_none()).expect("one kind without a marker");
    out.push((
        "KIND_OF_V",
        case(
            &|s| format!("WHEN v ? '{}' THEN {}", s.marker.unwrap_or_default(), s.kind.number()),
            unmarked.kind.number().to_string(),
        ),
    ));
    for (prefix, extra) in [("ITEM", &ITEM), ("POLICY", &POLICY)] {
        let array = |kind: Kind| format!("ARRAY[{}]", literals(kind.allowed(extra)));
        let arms = case(&|s| format!("WHEN {} THEN {}", s.kind.number(), array(s.kind)), array(unmarked.kind));
        out.push((leak(format!("{prefix}_ALLOWED")), arms.replacen("CASE ", "CASE kind ", 1)));
        out.push((leak(format!("{prefix}_FIELDS_BY_KIND")), format!("'{}'", fields_by_kind(extra))));
    }
    out
}

/// The PL/pgSQL variable a checked argument is kept in, by the parameter's name.
fn variable_of(param: &str) -> Option<&'static str> {
    Some(match param {
        "key" => "k",
        "burst" => "b",
        "refill_per_minute" => "r",
        "cost" => "c",
        "amount" => "a",
        "period" | "policy" => "p",
        "quota" => "q",
        "limit" => "lim",
        "window_seconds" => "w",
        "now_ms" => "now",
        "subject" => "s",
        "name" => "n",
        _ => return None,
    })
}

/// The DECLARE lines that check `f`'s arguments by their rules ([`ratelimit_core::functions::Rule`]),
/// in the order of its parameters, each kept in its variable: what `@ARGUMENTS@` stands for.
pub fn arguments(f: &Function) -> String {
    let mut out = Vec::new();
    for param in f.params.iter() {
        let Some((helper, pg_type, named)) = param.rule.edition_helper() else { continue };
        let variable = variable_of(param.name)
            .unwrap_or_else(|| panic!("{}: no edition variable for the argument {}", f.name, param.name));
        let given = if named { format!("'{}', {}", param.name, param.pg_name()) } else { param.pg_name() };
        out.push(format!("    {variable} {pg_type} := ratelimit.{helper}(fn, {given});"));
    }
    out.join("\n")
}

/// A body with its `@ARGUMENTS@` line, if it has one, replaced by [`arguments`], each line
/// indented as that line was (a nested block's are deeper than the body's).
fn with_arguments(body: &str, f: &Function) -> String {
    let Some(at) = body.find("@ARGUMENTS@") else {
        return body.to_string();
    };
    let line_start = body[..at].rfind('\n').map_or(0, |i| i + 1);
    let indent = &body[line_start..at];
    let lines: Vec<String> = arguments(f).lines().map(|line| format!("{indent}{}", line.trim_start())).collect();
    format!("{}{}{}", &body[..line_start], lines.join("\n"), &body[at + "@ARGUMENTS@".len()..])
}

/// A body as function `f` runs it: `@FN@` its name, and each `@ANSWER@(answer)` the answer
/// itself, or for a compact answer (`Function::compact`) its text as `headers::compact`
/// writes it.
fn for_function(body: &str, f: &Function) -> String {
    let answer = if f.compact() { format!("ratelimit.rl__compact('{}', ", f.name) } else { "(".to_owned() };
    body.replace("@FN@", f.name).replace("@ANSWER@(", &answer)
}

/// `text` with every `@MSG_NAME@` of [`ratelimit_core::messages`] replaced by its template as a
/// `format()` string, then every `@NAME@` of [`constants`] (and `@VERSION@`).
fn substitute(text: &str, version: &str) -> String {
    let mut out = text.replace("@VERSION@", version);
    for m in ratelimit_core::messages::ALL {
        out = out.replace(&format!("@MSG_{}@", m.name), &m.sql_literal());
    }
    for (name, value) in constants() {
        out = out.replace(&format!("@{name}@"), &value);
    }
    out
}
const SECTION: &str = "-- function: ";

/// The name this edition installs under (pg_tle lets a file-based extension of the same
/// name win, so `pg_ratelimit` would silently shadow it on a server that has both).
pub const EXTENSION_NAME: &str = "pg_ratelimit_sql";

/// Every function the native extension offers that this edition declares too: all public
/// ones but those about the server's shared memory.
pub fn offered() -> impl Iterator<Item = &'static Function> {
    ALL.iter().filter(|f| !f.is_internal() && !matches!(f.entry, Entry::Server(_)))
}

/// The PL/pgSQL body of each function, by name, in the order of `sql/edition/functions.sql`
/// (a section that names two functions gives both the same body: see [`for_function`]).
pub fn bodies() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let mut rest = BODIES;
    while let Some(at) = rest.find(SECTION) {
        let after = &rest[at + SECTION.len()..];
        let (name, body) = after.split_once('\n').unwrap_or((after, ""));
        let end = body.find(SECTION).unwrap_or(body.len());
        for name in name.split(',') {
            out.push((name.trim(), body[..end].trim_end()));
        }
        rest = &body[end..];
    }
    out
}

/// The functions this edition does not have a body for yet.
pub fn missing() -> Vec<&'static str> {
    let bodies = bodies();
    offered().map(|f| f.name).filter(|name| !bodies.iter().any(|(n, _)| n == name)).collect()
}

/// How PostgreSQL is told to run it: the native extension's volatility and parallel
/// label; every function runs as the installing role with a pinned search_path, since
/// PL/pgSQL resolves every operator and function of its statements through it.
fn attributes(f: &Function) -> String {
    format!("{} PARALLEL {} SECURITY DEFINER", f.volatility(), f.parallel())
}

/// The schema, made so that running a newer script over an older install keeps the state.
fn schema() -> String {
    SCHEMA
        .replace("CREATE SCHEMA ratelimit;", "CREATE SCHEMA IF NOT EXISTS ratelimit;")
        .replace("CREATE TABLE ratelimit.", "CREATE TABLE IF NOT EXISTS ratelimit.")
        .replace("CREATE INDEX rl_", "CREATE INDEX IF NOT EXISTS rl_")
        // a table an earlier script made gains what this version's has (0.4.0: the quota)
        .replace(
            "REVOKE ALL ON ratelimit.rl_bucket,",
            "ALTER TABLE ratelimit.rl_budget ADD COLUMN IF NOT EXISTS quota bigint NOT NULL DEFAULT 0;\nREVOKE ALL ON ratelimit.rl_bucket,",
        )
        .replace("CREATE VIEW ", "CREATE OR REPLACE VIEW ")
        .lines()
        // pg_dump saves the rows of the tables in any case; only an extension marks them
        .filter(|l| !l.contains("pg_extension_config_dump") || l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The plain script's opening, for psql: stop at the first error, and take the schema of
/// the application functions from `-v rl_schema=NAME` when given.
const PSQL_OPENING: &str = r"\set ON_ERROR_STOP on
\if :{?rl_schema}
\else
\set rl_schema ''
\endif
BEGIN;
SET LOCAL client_min_messages = warning;
SELECT pg_catalog.set_config('pg_ratelimit_install.schema', :'rl_schema', true) AS rl_schema \gset
";

/// Before anything is created: the schema the application functions go in (the plain
/// script's `rl_schema`, made if missing, else the first of `search_path`; an extension's
/// own under pg_tle), and what would be in the way, named before anything is made.
const PREFLIGHT: &str = r#"-- Where the functions go, and what is in the way (nothing is created before this passes).
DO $rl_install$
DECLARE
    target text := nullif(pg_catalog.current_setting('pg_ratelimit_install.schema', true), '');
    found record;
BEGIN
    IF target IS NOT NULL THEN
        EXECUTE pg_catalog.format('CREATE SCHEMA IF NOT EXISTS %I', target);
        PERFORM pg_catalog.set_config('search_path', pg_catalog.quote_ident(target), true);
    ELSIF pg_catalog.current_schema() IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '3F000',
            MESSAGE = 'pg_ratelimit_sql: no schema of search_path exists to create the functions in',
            HINT = 'Run the script with psql -v rl_schema=NAME, or set search_path to an existing schema.';
    END IF;
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
        RAISE WARNING 'pg_ratelimit_sql: installed by the superuser %, every rl_* function runs as a superuser', current_user
            USING HINT = 'Install as a role of its own instead (docs/managed-postgres.md, "any install by a superuser").';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_ratelimit') THEN
        RAISE EXCEPTION USING ERRCODE = '42710',
            MESSAGE = 'pg_ratelimit_sql: the native extension pg_ratelimit is installed in this database, '
                      'and its functions and schema ratelimit are the ones the SQL edition would create';
    END IF;
    FOR found IN
        SELECT c.oid::regclass::text AS name, c.relkind, 'view' AS wanted
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.current_schema()::regnamespace
          AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['rl_policies', 'rl_blocks', 'rl_stats', 'rl_refused']) AND c.relkind <> 'v'
        UNION ALL
        SELECT c.oid::regclass::text, c.relkind, 'table'
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) 'ratelimit')
          AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['rl_bucket', 'rl_budget', 'rl_entries', 'rl_policy']) AND c.relkind <> 'r'
    LOOP
        RAISE EXCEPTION USING ERRCODE = '42P07',
            MESSAGE = pg_catalog.format('pg_ratelimit_sql: %s exists and is not a %s (relkind %s): it is in the way of the %s the edition creates',
                                        found.name, found.wanted, found.relkind, found.wanted),
            HINT = 'Rename or drop it, then run the install again; nothing was installed.';
    END LOOP;
END
$rl_install$;
"#;

/// The install script: the plain one a database owner runs with `psql -f` (in one
/// transaction: a failure leaves nothing behind), or (for pg_tle, `extension` true) the
/// extension script, which also marks the state tables' rows for pg_dump.
pub fn script(extension: bool) -> String {
    let version = env!("CARGO_PKG_VERSION");
    let quote = |s: &str| s.replace('\'', "''");
    let mut out = format!(
        "-- pg_ratelimit {version}, SQL edition ({EXTENSION_NAME}): generated by codegen/src/sql_edition.rs from\n\
         -- sql/schema/pg_schema.sql, sql/edition/ and the function table; do not edit.\n"
    );
    if extension {
        out += "-- Registered with pg_tle (see the .pg_tle.sql file), then CREATE EXTENSION pg_ratelimit_sql [SCHEMA s].\n\n";
    } else {
        out += &format!(
            "-- Run by a role with CREATE on the database and on the target schema (the owner, a managed\n\
             -- service's master user; no superuser), in one transaction:\n\
             --   psql -v ON_ERROR_STOP=1 [-v rl_schema=NAME] -f {EXTENSION_NAME}-{version}.sql\n\n{PSQL_OPENING}\n"
        );
    }
    out += PREFLIGHT;
    out += "\n";
    out += &privileges::remember_existing(offered());
    out += "\n";
    out += &schema();
    out += "\n\n";
    if extension {
        for table in ["rl_bucket", "rl_budget", "rl_entries", "rl_policy"] {
            out += &format!("SELECT pg_catalog.pg_extension_config_dump('ratelimit.{table}', '');\n");
        }
        out += "\n";
    }
    out += &substitute(HELPERS.trim_end(), version);
    out += "\n\n-- The functions: the native extension's declarations, PL/pgSQL bodies.\n";
    let bodies = bodies();
    for f in offered() {
        let Some((_, body)) = bodies.iter().find(|(n, _)| *n == f.name) else { continue };
        out += &format!(
            "CREATE OR REPLACE FUNCTION {}({}) RETURNS {}\nLANGUAGE plpgsql {}\nSET search_path = pg_catalog, pg_temp\nAS $rl$\n{}\n$rl$;\n",
            f.name,
            f.pg_arguments(),
            f.returns.pg_name(),
            attributes(f),
            substitute(&with_arguments(&for_function(body.trim(), f), f), version)
        );
        out += &format!("COMMENT ON FUNCTION {} IS\n  '{}';\n\n", f.pg_signature(), quote(f.comment));
    }
    out += &STATS_VIEW.replace("CREATE VIEW ", "CREATE OR REPLACE VIEW ");
    out += "\n";
    out += &privileges::normalize(offered());
    if !extension {
        out += "\nCOMMIT;\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_is_a_function_of_the_table_once() {
        let bodies = bodies();
        for (i, (name, body)) in bodies.iter().enumerate() {
            assert!(offered().any(|f| f.name == *name), "{name} is no function the edition offers");
            assert!(!bodies[..i].iter().any(|(n, _)| n == name), "{name} twice");
            assert!(body.trim_start().starts_with("DECLARE") || body.trim_start().starts_with("BEGIN"), "{name}");
            assert!(body.trim_end().ends_with("END"), "{name}");
        }
    }

    #[test]
    fn the_editions_sql_names_the_cores_constants_instead_of_repeating_them() {
        // outside comments, each constant the core defines reaches the SQL as `@NAME@`
        let repeated = |value: &str| {
            [HELPERS, BODIES]
                .iter()
                .flat_map(|text| text.lines())
                .filter(|line| !line.trim_start().starts_with("--"))
                .filter(|line| {
                    line.match_indices(value).any(|(at, _)| {
                        let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit() || c == '.');
                        !digit(line[..at].chars().next_back()) && !digit(line[at + value.len()..].chars().next())
                    })
                })
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let literal: Vec<String> = constants()
            .into_iter()
            .filter(|(_, value)| value.len() >= 5) // 1000 is also milliseconds per second
            .flat_map(|(name, value)| repeated(&value).into_iter().map(move |line| format!("{name}: {}", line.trim())))
            .collect();
        assert_eq!(literal, Vec::<String>::new(), "constants written as literals");
    }

    #[test]
    fn every_function_has_a_body() {
        assert_eq!(missing(), Vec::<&str>::new());
    }

    #[test]
    fn the_plain_script_keeps_state_and_the_extension_one_marks_it() {
        let plain = script(false);
        assert!(plain.contains("CREATE TABLE IF NOT EXISTS ratelimit.rl_bucket"));
        assert!(!plain.contains("SELECT pg_catalog.pg_extension_config_dump"));
        assert!(script(true).contains("SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_policy', '');"));
        assert!(!plain.contains("@VERSION@"));
    }

    #[test]
    fn generated_argument_checks_call_helpers_that_exist_once_each() {
        let bodies = bodies();
        let mut generated = 0;
        for f in offered() {
            let Some((_, body)) = bodies.iter().find(|(n, _)| *n == f.name) else { continue };
            if !body.contains("    @ARGUMENTS@") {
                continue;
            }
            generated += 1;
            let filled = with_arguments(body, f);
            for line in arguments(f).lines() {
                assert_eq!(filled.matches(line).count(), 1, "{}: {line}", f.name);
                let helper = line.split("ratelimit.").nth(1).unwrap().split('(').next().unwrap();
                assert!(HELPERS.contains(&format!("FUNCTION ratelimit.{helper}(")), "{helper} is no helper");
            }
        }
        assert!(generated >= 15, "bodies whose argument checks are generated: {generated}");
    }

    #[test]
    fn every_placeholder_is_a_constant_of_the_core() {
        for form in [false, true] {
            let script = script(form);
            let left: Vec<&str> = script
                .match_indices('@')
                .filter_map(|(i, _)| {
                    let rest = &script[i + 1..];
                    let end = rest.find('@')?;
                    let name = &rest[..end];
                    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')).then_some(name)
                })
                .collect();
            assert_eq!(left, Vec::<&str>::new(), "placeholders no constant replaced");
        }
        for (name, _) in constants() {
            assert!(
                HELPERS.contains(&format!("@{name}@")) || BODIES.contains(&format!("@{name}@")),
                "{name} is named by no SQL of the edition"
            );
        }
    }

    /// A message of the core's table is what both editions say: the edition names each
    /// (so a text changed in Rust changes the edition's), and names no other.
    #[test]
    fn every_message_is_the_editions_too() {
        for m in ratelimit_core::messages::ALL {
            let placeholder = format!("@MSG_{}@", m.name);
            assert!(
                HELPERS.contains(&placeholder) || BODIES.contains(&placeholder),
                "{} is a message the edition never gives",
                m.name
            );
        }
        for text in [HELPERS, BODIES] {
            for (i, _) in text.match_indices("@MSG_") {
                let name = &text[i + 5..][..text[i + 5..].find('@').unwrap()];
                assert!(
                    ratelimit_core::messages::ALL.iter().any(|m| m.name == name),
                    "@MSG_{name}@ is no message of the core"
                );
            }
        }
    }
}
