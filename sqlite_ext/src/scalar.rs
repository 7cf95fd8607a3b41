//! Scalar functions registered with SQLite directly, so that an error reaches the caller
//! with its own result code.
//!
//! rusqlite reports a function's error by setting the code and then the message, and
//! `sqlite3_result_error` (the message) sets the code back to SQLITE_ERROR: a busy or full
//! database would reach drivers as SQLITE_ERROR, and their busy handling, which tests the
//! code, would never fire. Here the message is set first and the code last.
//!
//! This module may use `unsafe` (the workspace denies it elsewhere, handle.rs aside): the
//! callback SQLite calls, reading its arguments and setting its result. Invariants: the
//! body lives in a `Box` owned by SQLite from registration until it drops the function
//! (`destroy`); the argument slices are read only during the call, while SQLite keeps
//! them valid; no panic leaves `call`.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ratelimit_core::{Answer, Arg};
use rusqlite::functions::FunctionFlags;
use rusqlite::{ffi, Connection};

/// What a function runs on each call: the arguments in, an answer or an error out.
pub type Body = Box<dyn Fn(&[Arg]) -> rusqlite::Result<Answer> + Send + 'static>;

/// A registered function, as SQLite holds it.
struct Registered {
    name: &'static str,
    body: Body,
}

/// Registers `body` as the function `name` of any number of arguments on `conn`.
pub fn create(conn: &Connection, name: &'static str, flags: FunctionFlags, body: Body) -> rusqlite::Result<()> {
    let c_name = CString::new(name)?;
    let user_data = Box::into_raw(Box::new(Registered { name, body })).cast::<c_void>();
    // SAFETY: the handle is the open connection's; SQLite owns `user_data` from here and
    // frees it with `destroy`, also when registration fails.
    let rc = unsafe {
        ffi::sqlite3_create_function_v2(
            conn.handle(),
            c_name.as_ptr(),
            -1,
            flags.bits(),
            user_data,
            Some(call),
            None,
            None,
            Some(destroy),
        )
    };
    match rc {
        ffi::SQLITE_OK => Ok(()),
        code => Err(rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(format!("cannot register {name}")))),
    }
}

unsafe extern "C" fn destroy(user_data: *mut c_void) {
    // SAFETY: made by Box::into_raw in `create`, dropped once, here.
    drop(unsafe { Box::from_raw(user_data.cast::<Registered>()) });
}

/// Arguments read onto the stack; a call with more allocates.
const FEW_ARGS: usize = 8;

unsafe extern "C" fn call(ctx: *mut ffi::sqlite3_context, argc: c_int, argv: *mut *mut ffi::sqlite3_value) {
    // SAFETY: SQLite passes the user data given at registration and argc valid values.
    let function = unsafe { &*ffi::sqlite3_user_data(ctx).cast::<Registered>() };
    let values = match argc {
        0 => &[][..],
        n => unsafe { std::slice::from_raw_parts(argv, n as usize) },
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // on the stack for the usual few arguments (no allocation in the guarded UPDATE's
        // callbacks, nor in most calls)
        let mut few = [Arg::Null; FEW_ARGS];
        if values.len() <= FEW_ARGS {
            for (slot, &v) in few.iter_mut().zip(values) {
                *slot = unsafe { arg_of(v) };
            }
            (function.body)(&few[..values.len()])
        } else {
            let args: Vec<Arg> = values.iter().map(|&v| unsafe { arg_of(v) }).collect();
            (function.body)(&args)
        }
    }));
    match outcome {
        Ok(Ok(answer)) => unsafe { set_answer(ctx, answer) },
        Ok(Err(rusqlite::Error::SqliteFailure(e, message))) => {
            let message = message.unwrap_or_else(|| e.to_string());
            unsafe { set_error(ctx, e.extended_code, &message) }
        }
        Ok(Err(e)) => unsafe { set_error(ctx, ffi::SQLITE_ERROR, &e.to_string()) },
        Err(_) => {
            let message = format!("{}: internal error in the extension (a bug: please report it)", function.name);
            unsafe { set_error(ctx, ffi::SQLITE_INTERNAL, &message) }
        }
    }
}

/// An argument as a core value, borrowed for the call. Text that is not UTF-8 arrives as
/// a blob.
unsafe fn arg_of<'a>(v: *mut ffi::sqlite3_value) -> Arg<'a> {
    // SAFETY (all below): `v` is a valid value for the length of the call; the pointer of
    // text or a blob is read after its type and before its length, as SQLite asks.
    unsafe {
        match ffi::sqlite3_value_type(v) {
            ffi::SQLITE_INTEGER => Arg::Integer(ffi::sqlite3_value_int64(v)),
            ffi::SQLITE_FLOAT => Arg::Real(ffi::sqlite3_value_double(v)),
            ffi::SQLITE_TEXT => {
                let bytes = bytes_of(ffi::sqlite3_value_text(v), v);
                std::str::from_utf8(bytes).map_or(Arg::Blob(bytes), Arg::Text)
            }
            ffi::SQLITE_BLOB => Arg::Blob(bytes_of(ffi::sqlite3_value_blob(v).cast(), v)),
            _ => Arg::Null,
        }
    }
}

unsafe fn bytes_of<'a>(data: *const u8, v: *mut ffi::sqlite3_value) -> &'a [u8] {
    let len = unsafe { ffi::sqlite3_value_bytes(v) };
    match data.is_null() || len <= 0 {
        true => &[],
        false => unsafe { std::slice::from_raw_parts(data, len as usize) },
    }
}

/// An answer as the SQLite value it returns: JSON as text, booleans as 0 or 1.
unsafe fn set_answer(ctx: *mut ffi::sqlite3_context, answer: Answer) {
    let text = |ctx, t: &str| match c_int::try_from(t.len()) {
        Ok(len) => unsafe { ffi::sqlite3_result_text(ctx, t.as_ptr().cast(), len, ffi::SQLITE_TRANSIENT()) },
        Err(_) => unsafe { ffi::sqlite3_result_error_toobig(ctx) },
    };
    match answer {
        Answer::Json(j) => text(ctx, &j.to_text()),
        Answer::Text(t) => text(ctx, &t),
        Answer::Int(n) => unsafe { ffi::sqlite3_result_int64(ctx, n) },
        Answer::Real(r) => unsafe { ffi::sqlite3_result_double(ctx, r) },
        Answer::Bool(b) => unsafe { ffi::sqlite3_result_int64(ctx, b.into()) },
    }
}

/// The message first, then the code: setting the message resets the code to SQLITE_ERROR.
unsafe fn set_error(ctx: *mut ffi::sqlite3_context, code: c_int, message: &str) {
    let len = c_int::try_from(message.len()).unwrap_or(c_int::MAX);
    unsafe {
        ffi::sqlite3_result_error(ctx, message.as_ptr().cast(), len);
        ffi::sqlite3_result_error_code(ctx, code);
    }
}
