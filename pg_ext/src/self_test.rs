//! The in-server tests, shipped as `rl_self_test()`: checks that need the inside of the
//! server, run by the very library a user installs (the test command calls it on every
//! major, from the one build of that major, and again on each .deb and tarball):
//! - every answer laid out in `jsonb` ([`crate::jsonb`]) is byte for byte what this
//!   server's own `jsonb_in` makes of the same text;
//! - every function's catalog entry (arguments with defaults, result, volatility, parallel
//!   label, SECURITY DEFINER, schema, comment) is what the core's table says, and the
//!   extension has no function the table lacks.
//!
//! Writes `unsafe` (the workspace denies it elsewhere) to read a datum's bytes and to call
//! `jsonb_in` directly.
#![allow(unsafe_code)]

use crate::jsonb::JsonbResult;
use pgrx::prelude::*;
use pgrx::IntoDatum;
use ratelimit_core::functions::{Entry, ALL};
use ratelimit_core::json::Json;

/// What the checks found: how many ran, and a line for each that failed.
#[derive(Default)]
struct Report {
    checks: i64,
    failed: Vec<String>,
}

impl Report {
    fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.failed.push(failure());
        }
    }
}

#[pg_extern(volatile, parallel_restricted)]
fn rl_self_test() -> JsonbResult {
    let mut report = Report::default();
    jsonb_layout(&mut report);
    catalog(&mut report);
    let failed = report.failed.into_iter().map(Json::Str).collect();
    JsonbResult(Json::Object(vec![("checks", Json::Int(report.checks)), ("failed", Json::Array(failed))]))
}

/// The bytes of a plain (untoasted) varlena datum built in this call's memory context.
fn bytes_of(datum: pg_sys::Datum) -> Vec<u8> {
    // SAFETY: the datum is a varlena palloc'd in this call (by jsonb_in or by
    // JsonbResult::into_datum), never toasted; varsize_any reads its own header.
    unsafe {
        let ptr = datum.cast_mut_ptr::<pg_sys::varlena>();
        std::slice::from_raw_parts(ptr.cast::<u8>(), pgrx::varsize_any(ptr)).to_vec()
    }
}

/// Values of every shape an answer takes, and the corners of jsonb's layout: numbers of
/// every size and sign, more than 64 entries (an offset stride), keys out of order and
/// repeated, strings that need escapes, nested containers, and scalars alone.
fn jsonb_cases() -> Vec<Json> {
    let mut many: Vec<Json> = (0..70).map(|i| Json::Int(i * 1_000_003 - 35)).collect();
    for n in [0, 1, -1, 9_999, 10_000, 10_001, 100_000_000, -20_000_000_000, i64::MAX, i64::MIN] {
        many.push(Json::Int(n));
    }
    let keys: Vec<(String, Json)> = (0..40).map(|i| (format!("k{}", 97 * i % 41), Json::Int(i))).collect();
    vec![
        Json::Object(vec![
            ("limit", Json::Number(1e9)),
            ("admitted", Json::Bool(true)),
            ("remaining", Json::Number(999_999_999.0)),
            ("exceeds_limit", Json::Bool(false)),
            ("retry_after_ms", Json::Int(0)),
            ("level", Json::Number(-0.000123)),
            ("huge", Json::Number(1.5e300)),
            ("nan", Json::Number(f64::NAN)),
            ("null", Json::Null),
        ]),
        Json::Object(vec![]),
        Json::Array(vec![]),
        Json::Array(many),
        Json::Map(keys),
        Json::Map(vec![("é \"quoted\"\n".into(), Json::Str("tier ✓".into())), ("a".into(), Json::Null)]),
        Json::Map(vec![("same".into(), Json::Int(1)), ("same".into(), Json::Int(2))]),
        Json::Object(vec![
            ("items", Json::Array(vec![Json::Object(vec![("x", Json::Number(0.5))]), Json::Str("s".into())])),
            ("nested", Json::Array(vec![Json::Array(vec![Json::Bool(false), Json::Number(3.25)])])),
        ]),
        Json::Int(42),
        Json::Str("alone".into()),
        Json::Null,
        Json::Bool(true),
    ]
}

fn jsonb_layout(report: &mut Report) {
    for value in jsonb_cases() {
        let text = value.to_text();
        let Ok(cstring) = std::ffi::CString::new(text.clone()) else {
            report.check(false, || format!("jsonb: {text} holds a NUL"));
            continue;
        };
        // SAFETY: jsonb_in takes a NUL-terminated JSON text and returns a palloc'd jsonb.
        let expected =
            unsafe { pgrx::direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(cstring.as_ptr().into())]) };
        let built = JsonbResult(value).into_datum();
        match (expected, built) {
            (Some(expected), Some(built)) => report.check(bytes_of(built) == bytes_of(expected), || {
                format!("jsonb: {text} is laid out otherwise than jsonb_in lays it out")
            }),
            _ => report.check(false, || format!("jsonb: {text} gave no datum")),
        }
    }
}

/// A boolean as concat_ws shows it.
fn pg_bool(b: bool) -> &'static str {
    if b {
        "t"
    } else {
        "f"
    }
}

fn catalog(report: &mut Report) {
    for f in ALL {
        let row = Spi::get_one_with_args::<String>(
            "SELECT concat_ws(' | ', pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
                    p.provolatile, p.proparallel, p.prosecdef, n.nspname = 'ratelimit', obj_description(p.oid, 'pg_proc'))
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             JOIN pg_catalog.pg_depend d ON d.objid = p.oid AND d.classid = 'pg_catalog.pg_proc'::regclass AND d.deptype = 'e'
             JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_ratelimit'
             WHERE p.proname = $1",
            &[f.name.into()],
        );
        let row = match row {
            Ok(Some(row)) => row,
            _ => {
                report.check(false, || format!("catalog: {} is not a function of the extension", f.name));
                continue;
            }
        };
        let definer = matches!(f.entry, Entry::State(_));
        let expected = [
            f.pg_arguments(),
            f.returns.pg_name().to_owned(),
            f.volatility()[..1].to_lowercase(),
            f.parallel()[..1].to_lowercase(),
            pg_bool(definer).to_owned(),
            pg_bool(f.is_internal()).to_owned(),
            f.comment.to_owned(),
        ]
        .join(" | ");
        report.check(row == expected, || format!("catalog: {} is `{row}`, the table says `{expected}`", f.name));
    }
    let installed = Spi::get_one::<i64>(
        "SELECT count(*) FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
         AND d.classid = 'pg_catalog.pg_proc'::regclass
         JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid WHERE e.extname = 'pg_ratelimit'",
    );
    report.check(installed == Ok(Some(ALL.len() as i64)), || {
        format!("catalog: the extension has {installed:?} functions, the table {}", ALL.len())
    });
}
