//! The SQL surface: every function described once and what it runs, its arguments read and checked, its answers, errors and texts, and the units and ranges they share.

pub mod args;
pub mod call_args;
pub mod calls;
pub mod error;
pub mod functions;
pub mod headers;
pub mod json;
pub mod key;
pub mod messages;
pub mod render;
pub mod units;
