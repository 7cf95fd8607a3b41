//! Results handed to PostgreSQL as `jsonb`, built value by value, and `jsonb` arguments read
//! as JSON text within a bound. Writes `unsafe` (the workspace denies it elsewhere): the
//! jsonb builder and iterator are C functions over raw pointers.

#![allow(unsafe_code)]

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::nullable::Nullable;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::{pg_sys, FromDatum, IntoDatum};
use ratelimit_core::render::{number_form, Json, NumberForm};
use std::ffi::CString;
use std::ptr::null_mut;

/// A result of the core, returned as `jsonb` built value by value (PostgreSQL's
/// pushJsonbValue): no JSON text is printed only to be parsed again by `jsonb_in`.
pub struct JsonbResult(pub Json);

impl IntoDatum for JsonbResult {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let mut state: *mut pg_sys::JsonbParseState = null_mut();
        // SAFETY: push hands pushJsonbValue a well-formed sequence of tokens (objects and
        // arrays opened and closed in order, keys before values) whose strings live until
        // JsonbValueToJsonb has copied them into the palloc'd result.
        unsafe {
            let root = push(&mut state, &self.0, None);
            Some(pg_sys::Datum::from(pg_sys::JsonbValueToJsonb(root)))
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

fn scalar(type_: pg_sys::jbvType::Type) -> pg_sys::JsonbValue {
    // SAFETY: an all-zero JsonbValue is a valid jbvNull; the caller sets type and value.
    let mut v: pg_sys::JsonbValue = unsafe { std::mem::zeroed() };
    v.type_ = type_;
    v
}

fn numeric(form: NumberForm) -> pg_sys::JsonbValue {
    let mut v = scalar(pg_sys::jbvType::jbvNumeric);
    v.val.numeric = match form {
        NumberForm::Null => return scalar(pg_sys::jbvType::jbvNull),
        // SAFETY: int64_to_numeric returns a palloc'd numeric.
        NumberForm::Int(n) => unsafe { pg_sys::int64_to_numeric(n) },
        NumberForm::Decimal(text) => {
            let text = CString::new(text).expect("a number has no NUL");
            // SAFETY: numeric_in(cstring, typelem, typmod -1) parses the decimal the core wrote.
            let datum = unsafe {
                pgrx::direct_function_call_as_datum(
                    pg_sys::numeric_in,
                    &[Some(text.as_ptr().into()), Some(pg_sys::InvalidOid.into()), Some((-1i32).into())],
                )
            };
            datum.expect("numeric_in returns a value for a decimal").cast_mut_ptr()
        }
    };
    v
}

/// Pushes `value` (after `key`, inside an object) and returns what pushJsonbValue returned
/// for its last token: the finished value once the outermost container is closed.
///
/// # Safety
/// See [`JsonbResult::into_datum`].
unsafe fn push(state: &mut *mut pg_sys::JsonbParseState, value: &Json, key: Option<&str>) -> *mut pg_sys::JsonbValue {
    use pg_sys::JsonbIteratorToken::*;
    // SAFETY: as the function's contract says.
    unsafe {
        if let Some(key) = key {
            let mut k = scalar(pg_sys::jbvType::jbvString);
            k.val.string.len = key.len() as i32;
            k.val.string.val = key.as_ptr().cast_mut().cast();
            pg_sys::pushJsonbValue(state, WJB_KEY, &mut k);
        }
        let in_object = key.is_some();
        let mut item = match value {
            Json::Null => scalar(pg_sys::jbvType::jbvNull),
            // The string stays alive (in `value`) until JsonbValueToJsonb has copied it.
            Json::Str(s) => {
                let mut v = scalar(pg_sys::jbvType::jbvString);
                v.val.string.len = s.len() as i32;
                v.val.string.val = s.as_ptr().cast_mut().cast();
                v
            }
            Json::Bool(b) => {
                let mut v = scalar(pg_sys::jbvType::jbvBool);
                v.val.boolean = *b;
                v
            }
            Json::Int(n) => numeric(NumberForm::Int(*n)),
            Json::Number(x) => numeric(number_form(*x)),
            Json::Array(items) => {
                pg_sys::pushJsonbValue(state, WJB_BEGIN_ARRAY, null_mut());
                for item in items {
                    push(state, item, None);
                }
                return pg_sys::pushJsonbValue(state, WJB_END_ARRAY, null_mut());
            }
            Json::Object(fields) => {
                // In jsonb's key order (shorter first, then bytewise), the sort that
                // closing the object runs finds its input sorted at once.
                let mut fields: Vec<&(&str, Json)> = fields.iter().collect();
                fields.sort_unstable_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then(a.cmp(b)));
                pg_sys::pushJsonbValue(state, WJB_BEGIN_OBJECT, null_mut());
                for (k, v) in fields {
                    push(state, v, Some(k));
                }
                return pg_sys::pushJsonbValue(state, WJB_END_OBJECT, null_mut());
            }
            Json::Map(fields) => {
                pg_sys::pushJsonbValue(state, WJB_BEGIN_OBJECT, null_mut());
                for (k, v) in fields {
                    push(state, v, Some(k));
                }
                return pg_sys::pushJsonbValue(state, WJB_END_OBJECT, null_mut());
            } // Only rl_headers answers with text, and only at the top: parse it there.
        };
        pg_sys::pushJsonbValue(state, if in_object { WJB_VALUE } else { WJB_ELEM }, &mut item)
    }
}

// SAFETY: returns the datum into_datum built, or NULL, as pgrx's own return types do.
unsafe impl BoxRet for JsonbResult {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

// SAFETY: the SQL type named is the one into_datum produces.
unsafe impl SqlTranslatable for JsonbResult {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbResult);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

/// A `jsonb` argument as PostgreSQL passed it, not yet converted: [`JsonbArg::text`] reads it
/// within a bound (pgrx's `JsonB` prints and parses all of it first, panicking on a number
/// beyond a double's range).
pub struct JsonbArg(pg_sys::Datum);

impl FromDatum for JsonbArg {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        (!is_null).then_some(JsonbArg(datum))
    }
}

// SAFETY: the argument is a jsonb datum (the SQL type below), held only for the call.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonbArg {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

// SAFETY: the SQL type named is the one from_datum reads.
unsafe impl SqlTranslatable for JsonbArg {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbArg);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

impl JsonbArg {
    /// The value as compact JSON text, or Err(bytes) once it is larger than `max` bytes:
    /// stored (uncompressed) or as text, whichever is reached first, so the work done is
    /// bounded by `max` whatever the value (a number such as 1e-16000 prints 16,000
    /// digits). Cancellation and statement_timeout are honoured while it walks.
    pub fn text(&self, max: usize) -> Result<String, usize> {
        // SAFETY: the datum is a jsonb varlena, valid for the call; toast_raw_datum_size reads
        // its header (or toast pointer) only; the detoasted copy lives in the call's memory
        // context; the iterator walks the container it was made from.
        unsafe {
            let stored = pg_sys::toast_raw_datum_size(self.0);
            if stored > max {
                return Err(stored);
            }
            let jsonb = pg_sys::pg_detoast_datum(self.0.cast_mut_ptr()) as *mut pg_sys::Jsonb;
            let mut it = pg_sys::JsonbIteratorInit(&mut (*jsonb).root);
            let mut v: pg_sys::JsonbValue = std::mem::zeroed();
            let mut out = String::new();
            // per open container: whether it has a member yet (a comma goes before the next)
            let mut open: Vec<bool> = Vec::new();
            let (mut after_key, mut raw_scalar) = (false, false);
            loop {
                pg_sys::check_for_interrupts!();
                let token = pg_sys::JsonbIteratorNext(&mut it, &mut v, false);
                use pg_sys::JsonbIteratorToken::*;
                let begins = matches!(token, WJB_BEGIN_ARRAY | WJB_BEGIN_OBJECT | WJB_KEY | WJB_ELEM | WJB_VALUE);
                if begins && !after_key && !(token == WJB_BEGIN_ARRAY && v.val.array.rawScalar) {
                    if let Some(has_member) = open.last_mut() {
                        if std::mem::replace(has_member, true) {
                            out.push(',');
                        }
                    }
                }
                after_key = token == WJB_KEY;
                match token {
                    WJB_DONE => break,
                    WJB_BEGIN_ARRAY if v.val.array.rawScalar => raw_scalar = true,
                    WJB_END_ARRAY if raw_scalar && open.is_empty() => {}
                    WJB_BEGIN_ARRAY | WJB_BEGIN_OBJECT => {
                        out.push(if token == WJB_BEGIN_ARRAY { '[' } else { '{' });
                        open.push(false);
                    }
                    WJB_END_ARRAY | WJB_END_OBJECT => {
                        out.push(if token == WJB_END_ARRAY { ']' } else { '}' });
                        open.pop();
                    }
                    WJB_KEY => {
                        push_scalar(&mut out, &v);
                        out.push(':');
                    }
                    _ => push_scalar(&mut out, &v),
                }
                if out.len() > max {
                    return Err(out.len());
                }
            }
            Ok(out)
        }
    }
}

/// One scalar of a jsonb value as JSON text.
///
/// # Safety
/// `v` is a scalar the iterator just returned.
unsafe fn push_scalar(out: &mut String, v: &pg_sys::JsonbValue) {
    unsafe {
        match v.type_ {
            pg_sys::jbvType::jbvNull => out.push_str("null"),
            pg_sys::jbvType::jbvBool => out.push_str(if v.val.boolean { "true" } else { "false" }),
            pg_sys::jbvType::jbvNumeric => {
                let text = pgrx::direct_function_call::<&std::ffi::CStr>(
                    pg_sys::numeric_out,
                    &[Some(pg_sys::Datum::from(v.val.numeric))],
                );
                out.push_str(text.and_then(|t| t.to_str().ok()).unwrap_or("null"));
            }
            _ => {
                let s = v.val.string;
                let bytes = std::slice::from_raw_parts(s.val as *const u8, s.len.max(0) as usize);
                // jsonb strings are valid UTF-8 in the database encoding the extension requires
                let text = String::from_utf8_lossy(bytes);
                out.push_str(&serde_json::to_string(&text).unwrap_or_else(|_| "\"\"".into()));
            }
        }
    }
}
