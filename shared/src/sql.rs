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

/// Every statement, for checks that hold for all of them.
pub const ALL: [&str; 12] = [
    BUCKET_READ,
    BUCKET_LOCK,
    BUCKET_INSERT,
    BUCKET_UPDATE,
    BUDGET_READ,
    BUDGET_LOCK,
    BUDGET_INSERT,
    BUDGET_UPDATE,
    SWEEP_BUCKETS,
    SWEEP_BUDGETS,
    RESET_BUCKETS,
    RESET_BUDGETS,
];

#[cfg(test)]
mod tests {
    /// SQLite numbers `$n` parameters by first appearance, PostgreSQL by n: the two agree
    /// (and positional binding is right on both) only if first appearances ascend.
    #[test]
    fn parameters_first_appear_in_order() {
        for text in super::ALL {
            let mut seen: Vec<u32> = Vec::new();
            let mut rest = text;
            while let Some(at) = rest.find('$') {
                let digits: String = rest[at + 1..].chars().take_while(char::is_ascii_digit).collect();
                let n: u32 = digits.parse().expect("a number after $");
                if !seen.contains(&n) {
                    assert_eq!(n as usize, seen.len() + 1, "in {text}");
                    seen.push(n);
                }
                rest = &rest[at + 1 + digits.len()..];
            }
        }
    }
}
