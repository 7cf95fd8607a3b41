//! Each kind of limit's arithmetic, pure (no parsing, no output), and of several at once all or nothing; the one parser of limit objects.

pub mod bucket;
pub mod budget;
pub mod lease;
pub mod limit_json;
pub mod period;
pub mod take_all;
pub mod window;
