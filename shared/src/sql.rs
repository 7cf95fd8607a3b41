//! The statement texts in the repository's `sql/` folder, the same text on both engines.
//! Parameters are written `$1`, `$2`, ... in order of first use, which PostgreSQL reads
//! as positions and SQLite as names numbered by first appearance: the same binding.

pub const BUCKET_READ: &str = include_str!("../../sql/bucket_read.sql");
/// PostgreSQL only: the read that locks the row.
pub const BUCKET_LOCK: &str = include_str!("../../sql/bucket_lock.sql");
pub const BUCKET_INSERT: &str = include_str!("../../sql/bucket_insert.sql");
pub const BUCKET_UPDATE: &str = include_str!("../../sql/bucket_update.sql");
pub const BUDGET_READ: &str = include_str!("../../sql/budget_read.sql");
/// PostgreSQL only: the read that locks the row.
pub const BUDGET_LOCK: &str = include_str!("../../sql/budget_lock.sql");
pub const BUDGET_INSERT: &str = include_str!("../../sql/budget_insert.sql");
pub const BUDGET_UPDATE: &str = include_str!("../../sql/budget_update.sql");
pub const SWEEP_BUCKETS: &str = include_str!("../../sql/sweep_buckets.sql");
pub const SWEEP_BUDGETS: &str = include_str!("../../sql/sweep_budgets.sql");
pub const RESET_BUCKETS: &str = include_str!("../../sql/reset_buckets.sql");
pub const RESET_BUDGETS: &str = include_str!("../../sql/reset_budgets.sql");
pub const SQLITE_SCHEMA: &str = include_str!("../../sql/sqlite_schema.sql");
