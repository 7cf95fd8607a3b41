//! Results handed to PostgreSQL as `jsonb`, laid out in its binary format, and `jsonb`
//! arguments read as JSON text within a bound. Writes `unsafe` (the workspace denies it
//! elsewhere): the result is a palloc'd varlena holding PostgreSQL's own numerics, and the
//! iterator is a C function over raw pointers.

#![allow(unsafe_code)]

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::nullable::Nullable;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::{pg_sys, FromDatum, IntoDatum};
use ratelimit_core::json::{number_form, Json, NumberForm};
use std::cell::RefCell;
use std::ffi::CString;
use std::rc::Rc;

/// A result of the core, returned as `jsonb` laid out here in jsonb's binary format (what
/// PostgreSQL's `JsonbValueToJsonb` writes: see [`Layout`]), so no JSON text is printed
/// only to be parsed again and no tree of `JsonbValue`s is pushed and then converted.
pub struct JsonbResult(pub Json);

impl IntoDatum for JsonbResult {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let mut layout = Layout { bytes: Vec::with_capacity(256) };
        layout.bytes.resize(VARHDRSZ, 0);
        let entry = layout.value(&self.0);
        if entry & JENTRY_TYPEMASK != JENTRY_ISCONTAINER {
            // a scalar alone is stored as an array of one marked as a scalar
            layout.bytes.truncate(VARHDRSZ);
            layout.array(std::slice::from_ref(&self.0), JB_FSCALAR);
        }
        let len = layout.bytes.len();
        // SAFETY: palloc returns `len` writable bytes in the call's memory context; the
        // header is a 4-byte varlena header (SET_VARSIZE) of the whole value.
        unsafe {
            let out = pg_sys::palloc(len) as *mut u8;
            std::ptr::copy_nonoverlapping(layout.bytes.as_ptr(), out, len);
            pgrx::set_varsize_4b(out.cast(), len as i32);
            Some(pg_sys::Datum::from(out))
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// jsonb's binary format (src/include/utils/jsonb.h): a container is a header word (its
// count and kind) and one JEntry word per element (an object's keys first, in jsonb's key
// order, then its values), then the elements' bytes. A JEntry holds its element's type and
// length, or, at every 32nd element, the end offset of the data so far.
const VARHDRSZ: usize = 4;
const JB_FSCALAR: u32 = 0x1000_0000;
const JB_FOBJECT: u32 = 0x2000_0000;
const JB_FARRAY: u32 = 0x4000_0000;
const JB_OFFSET_STRIDE: usize = 32;
const JENTRY_OFFLENMASK: u32 = 0x0FFF_FFFF;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JENTRY_ISSTRING: u32 = 0x0000_0000;
const JENTRY_ISNUMERIC: u32 = 0x1000_0000;
const JENTRY_ISBOOL_FALSE: u32 = 0x2000_0000;
const JENTRY_ISBOOL_TRUE: u32 = 0x3000_0000;
const JENTRY_ISNULL: u32 = 0x4000_0000;
const JENTRY_ISCONTAINER: u32 = 0x5000_0000;

// numeric's short format (src/backend/utils/adt/numeric.c): a 4-byte varlena header, a
// 16-bit header (sign, display scale, weight) and base-10,000 digits, most significant
// first, without leading or trailing zero digits.
const NBASE: u64 = 10_000;
const NUMERIC_SHORT: u16 = 0x8000;
const NUMERIC_SHORT_SIGN_MASK: u16 = 0x2000;

/// Appends `n` as the numeric int64_to_numeric makes (scale 0, so always the short format).
fn short_numeric(out: &mut Vec<u8>, n: i64) {
    let mut digits = [0u16; 5]; // i64's 19 decimal digits need at most 5
    let (mut rest, mut count) = (n.unsigned_abs(), 0);
    while rest > 0 {
        digits[count] = (rest % NBASE) as u16;
        rest /= NBASE;
        count += 1;
    }
    // weight: the power of NBASE of the first digit; trailing zero digits are dropped
    let weight = count.saturating_sub(1) as u16;
    let first_kept = digits[..count].iter().position(|&d| d != 0).unwrap_or(count);
    let kept = &digits[first_kept..count];
    let len = VARHDRSZ + 2 + 2 * kept.len();
    out.extend_from_slice(&((len as u32) << 2).to_ne_bytes()); // SET_VARSIZE, 4-byte header
    let sign = if n < 0 { NUMERIC_SHORT_SIGN_MASK } else { 0 };
    out.extend_from_slice(&(NUMERIC_SHORT | sign | weight).to_ne_bytes());
    for digit in kept.iter().rev() {
        out.extend_from_slice(&digit.to_ne_bytes());
    }
}

/// The positions of `keys` in jsonb's key order (shorter first, then bytewise), a
/// repeated key keeping its last value, as PostgreSQL's own builder orders an object.
fn jsonb_order(keys: &[&str]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).rev().collect();
    order.sort_by(|&a, &b| keys[a].len().cmp(&keys[b].len()).then(keys[a].as_bytes().cmp(keys[b].as_bytes())));
    order.dedup_by(|a, b| keys[*a] == keys[*b]);
    order
}

/// The addresses of an answer's keys, and their jsonb order.
type KnownOrder = (Vec<usize>, Rc<[usize]>);

thread_local! {
    /// jsonb_order of each kind of answer seen in this backend, by its keys (the core's
    /// static names, so their addresses tell the kinds apart): an answer's keys are
    /// ordered once per backend, not once per call.
    static OBJECT_ORDERS: RefCell<Vec<KnownOrder>> = const { RefCell::new(Vec::new()) };
}

/// [`jsonb_order`] of an object's static keys, remembered.
fn object_order(fields: &[(&'static str, Json)]) -> Rc<[usize]> {
    let same = |addresses: &[usize]| {
        addresses.len() == fields.len() && addresses.iter().zip(fields).all(|(&a, (k, _))| a == k.as_ptr() as usize)
    };
    OBJECT_ORDERS.with_borrow_mut(|orders| {
        if let Some((_, order)) = orders.iter().find(|(addresses, _)| same(addresses)) {
            return order.clone();
        }
        let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        let order: Rc<[usize]> = jsonb_order(&keys).into();
        orders.push((fields.iter().map(|(k, _)| k.as_ptr() as usize).collect(), order.clone()));
        order
    })
}

/// A jsonb value being laid out, varlena header first (filled in at the end).
struct Layout {
    bytes: Vec<u8>,
}

impl Layout {
    /// Pads to a 4-byte boundary (of the whole value); returns the padding's length.
    fn pad(&mut self) -> u32 {
        let pad = (4 - self.bytes.len() % 4) % 4;
        self.bytes.resize(self.bytes.len() + pad, 0);
        pad as u32
    }

    /// Appends `value`; returns its JEntry (type and length).
    fn value(&mut self, value: &Json) -> u32 {
        let start = self.bytes.len();
        match value {
            Json::Null => JENTRY_ISNULL,
            Json::Bool(b) => {
                if *b {
                    JENTRY_ISBOOL_TRUE
                } else {
                    JENTRY_ISBOOL_FALSE
                }
            }
            Json::Str(s) => self.string(s),
            Json::Int(n) => self.numeric(NumberForm::Int(*n)),
            Json::Number(x) => match number_form(*x) {
                NumberForm::Null => JENTRY_ISNULL,
                form => self.numeric(form),
            },
            Json::Array(items) => {
                self.array(items, 0);
                JENTRY_ISCONTAINER | (self.bytes.len() - start) as u32
            }
            Json::Object(fields) => {
                let order = object_order(fields);
                self.object(order.iter().map(|&i| (fields[i].0, &fields[i].1)));
                JENTRY_ISCONTAINER | (self.bytes.len() - start) as u32
            }
            Json::Map(fields) => {
                let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
                self.object(jsonb_order(&keys).into_iter().map(|i| (fields[i].0.as_str(), &fields[i].1)));
                JENTRY_ISCONTAINER | (self.bytes.len() - start) as u32
            }
        }
    }

    fn string(&mut self, s: &str) -> u32 {
        self.bytes.extend_from_slice(s.as_bytes());
        JENTRY_ISSTRING | s.len() as u32
    }

    /// A numeric at a 4-byte boundary, the padding counted in its length: an integer laid
    /// out here as PostgreSQL's int64_to_numeric makes it, a decimal by numeric_in.
    fn numeric(&mut self, form: NumberForm) -> u32 {
        let pad = self.pad();
        let start = self.bytes.len();
        match form {
            NumberForm::Int(n) => short_numeric(&mut self.bytes, n),
            NumberForm::Decimal(text) => {
                let text = CString::new(text).expect("a number has no NUL");
                // SAFETY: numeric_in(cstring, typelem, typmod -1) returns a palloc'd numeric
                // varlena; varsize_any reads its header.
                let bytes = unsafe {
                    let numeric: *const pg_sys::varlena = pgrx::direct_function_call_as_datum(
                        pg_sys::numeric_in,
                        &[Some(text.as_ptr().into()), Some(pg_sys::InvalidOid.into()), Some((-1i32).into())],
                    )
                    .expect("numeric_in returns a value for a decimal")
                    .cast_mut_ptr();
                    std::slice::from_raw_parts(numeric.cast::<u8>(), pgrx::varsize_any(numeric))
                };
                self.bytes.extend_from_slice(bytes);
            }
            NumberForm::Null => unreachable!("a null number is written as null"),
        }
        JENTRY_ISNUMERIC | (pad + (self.bytes.len() - start) as u32)
    }

    /// Reserves a container's header and `count` JEntries; returns where the JEntries start.
    fn begin(&mut self, header: u32, count: usize) -> usize {
        self.pad();
        self.bytes.extend_from_slice(&header.to_ne_bytes());
        let entries = self.bytes.len();
        self.bytes.resize(entries + 4 * count, 0);
        entries
    }

    /// Writes the JEntry of element `i` (of the container whose JEntries are at
    /// `entries`), `data_len` being the length of the elements' data so far, this one's included.
    fn entry(&mut self, entries: usize, i: usize, entry: u32, data_len: u32) {
        let entry = if i.is_multiple_of(JB_OFFSET_STRIDE) {
            (entry & JENTRY_TYPEMASK) | data_len | JENTRY_HAS_OFF
        } else {
            entry
        };
        self.bytes[entries + 4 * i..entries + 4 * i + 4].copy_from_slice(&entry.to_ne_bytes());
    }

    fn array(&mut self, items: &[Json], flags: u32) {
        let entries = self.begin(items.len() as u32 | JB_FARRAY | flags, items.len());
        let mut data_len = 0;
        for (i, item) in items.iter().enumerate() {
            let entry = self.value(item);
            data_len += entry & JENTRY_OFFLENMASK;
            self.entry(entries, i, entry, data_len);
        }
    }

    /// An object of `fields` given in jsonb's key order (see [`jsonb_order`]).
    fn object<'j>(&mut self, fields: impl ExactSizeIterator<Item = (&'j str, &'j Json)> + Clone) {
        let n = fields.len();
        let entries = self.begin(n as u32 | JB_FOBJECT, 2 * n);
        let mut data_len = 0;
        for (i, (key, _)) in fields.clone().enumerate() {
            let entry = self.string(key);
            data_len += entry & JENTRY_OFFLENMASK;
            self.entry(entries, i, entry, data_len);
        }
        for (i, (_, value)) in fields.enumerate() {
            let entry = self.value(value);
            data_len += entry & JENTRY_OFFLENMASK;
            self.entry(entries, n + i, entry, data_len);
        }
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
