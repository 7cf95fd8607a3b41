//! The only module of this crate that writes `unsafe` itself (the workspace denies it
//! elsewhere): a result handed to PostgreSQL as `jsonb`, and a backend-global flag read.

#![allow(unsafe_code)]

use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::{pg_sys, IntoDatum};

/// A result the core already wrote as JSON text, returned as `jsonb` by PostgreSQL's own
/// parser (no detour through a JSON value tree).
pub struct JsonbText(pub String);

impl IntoDatum for JsonbText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let text = std::ffi::CString::new(self.0).expect("the core writes no NUL into JSON");
        // SAFETY: jsonb_in reads a NUL-terminated string and returns a palloc'd jsonb.
        unsafe { pgrx::direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())]) }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: returns the datum into_datum built, or NULL, as pgrx's own return types do.
unsafe impl BoxRet for JsonbText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

// SAFETY: the SQL type named is the one into_datum produces.
unsafe impl SqlTranslatable for JsonbText {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbText);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

/// Whether the current transaction refuses writes (a read-only transaction, a standby).
pub fn transaction_is_read_only() -> bool {
    // SAFETY: a backend-global flag, read on the backend's only thread.
    unsafe { pg_sys::XactReadOnly }
}
