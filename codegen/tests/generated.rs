//! Files generated from the function table (`shared/src/surface/functions.rs`) and checked in, so
//! that the SQL and the client tests read them as plain files. This test fails when one is
//! stale; `RL_BLESS=1 cargo test -p ratelimit_codegen --test generated` rewrites them.

use ratelimit_codegen::generated;
use std::path::Path;

fn check(relative: &str, generated: String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative);
    if std::env::var_os("RL_BLESS").is_some() {
        std::fs::write(&path, generated).expect("write the generated file");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{relative} is not what shared/src/surface/functions.rs generates: run RL_BLESS=1 cargo test -p ratelimit_codegen --test generated"
    );
}

#[test]
fn pg_finalize_sql_is_generated_from_the_table() {
    check("sql/schema/pg_finalize.sql", generated::pg_finalize_sql());
}

#[test]
fn tests_functions_json_is_generated_from_the_table() {
    check("tests/functions.json", generated::tests_json());
}

#[test]
fn the_open_upgrade_script_carries_the_generated_privileges() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pg_ext/sql");
    let suffix = format!("--{}.sql", env!("CARGO_PKG_VERSION"));
    let newest = std::fs::read_dir(&folder)
        .expect("pg_ext/sql")
        .map(|e| e.expect("an entry").file_name().into_string().expect("a UTF-8 name"))
        .find(|name| name.ends_with(&suffix))
        .expect("an upgrade script to this version");
    let text = std::fs::read_to_string(folder.join(&newest)).expect("the upgrade script");
    assert!(text.contains("-- generated: remember ") && text.contains("-- generated: privileges "), "{newest}");
    check(&format!("pg_ext/sql/{newest}"), generated::upgrade_script(&text));
}

#[test]
fn docs_reference_md_is_generated_from_the_table() {
    check("docs/reference.md", generated::reference_md());
}

#[test]
fn the_node_limit_type_is_generated_from_the_kinds() {
    check("integrations/node/src/limits.ts", generated::node_limits_ts());
}

#[test]
fn the_operator_page_reads_limits_as_the_kinds_say() {
    for page in
        ["integrations/spec/admin.html", "integrations/python/ratelimit_web/admin.html", "integrations/node/admin.html"]
    {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(page);
        let text = std::fs::read_to_string(&path).expect("the operator's page");
        assert!(text.contains("// generated: how each kind of limit reads "), "{page} has no generated region");
        check(page, generated::admin_page(&text));
    }
}

#[test]
fn the_specs_limit_schema_is_generated_from_the_kinds() {
    check("integrations/spec/limit.schema.json", generated::spec_limit_schema());
}
