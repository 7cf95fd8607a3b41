//! Each kind of limit's arithmetic, pure (no parsing, no output), behind one trait (`kind`), and of several at once all or nothing; the one parser of limit objects and the table of kinds.

pub mod bucket;
pub mod budget;
pub mod kind;
pub mod lease;
pub mod limit_json;
pub mod period;
pub mod take_all;
pub mod window;
