//! The statement texts in the repository's `sql/` folder, written once for both engines.
//!
//! They are written for PostgreSQL, fully qualified: the functions that run them are
//! SECURITY DEFINER without a pinned search_path (pinning costs every call a search_path
//! switch), so no name and no operator may depend on the caller's search_path. SQLite
//! runs the same text through [`sqlite`], which drops the qualification.
//! The one exception is the `IN` of the sweeps, which only rl_sweep runs, under a pinned
//! search_path.
//!
//! Parameters are written `$1`, `$2`, ... in order of first use, which PostgreSQL reads
//! as positions and SQLite as names numbered by first appearance: the same binding.

use crate::functions::SqlType;

pub const SQLITE_SCHEMA: &str = include_str!("../../../sql/schema/sqlite_schema.sql");

/// A value bound to a statement parameter, or read from a result column.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Text(&'a str),
    Float(f64),
    Int(i64),
    /// Text read from a result column.
    String(String),
}

impl Value<'_> {
    /// The parameter's SQL type (PostgreSQL prepares each statement with these).
    pub fn sql_type(&self) -> SqlType {
        match self {
            Value::Text(_) | Value::String(_) => SqlType::Text,
            Value::Float(_) => SqlType::Float8,
            Value::Int(_) => SqlType::Int8,
        }
    }

    pub fn as_f64(&self) -> f64 {
        match *self {
            Value::Float(f) => f,
            Value::Int(i) => i as f64,
            Value::Text(_) | Value::String(_) => f64::NAN,
        }
    }

    /// A text column's value ("" for other kinds).
    pub fn as_text(&self) -> &str {
        match self {
            Value::Text(t) => t,
            Value::String(s) => s,
            _ => "",
        }
    }

    pub fn as_i64(&self) -> i64 {
        match *self {
            Value::Int(i) => i,
            Value::Float(f) => f as i64,
            Value::Text(_) | Value::String(_) => 0,
        }
    }
}

/// The statements that read and write one kind of table row ([`crate::store::TableRow`]):
/// each binds the key and the row's second key part, in that order, and the row's columns
/// as [`crate::store::TableRow::columns`] gives them (the update: the new columns, the
/// address, the old columns; the sweep: the cutoff and the limit).
#[derive(Debug)]
pub struct RowStatements {
    pub read: Statement,
    /// The read that holds the row until the unit ends (FOR UPDATE).
    pub lock: Statement,
    pub insert: Statement,
    pub update: Statement,
    pub sweep: Statement,
}

/// Declares [`Statement`], its [`Statement::ALL`] and its texts from one list: each
/// statement with the file of `sql/` it is read from.
macro_rules! statements {
    ($($(#[$doc:meta])* $name:ident => $file:literal,)*) => {
        /// Every statement, by name, so that an engine can keep its own form of each.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Statement {
            $($(#[$doc])* $name,)*
        }

        impl Statement {
            /// Every statement, in declaration order (`ALL[s as usize] == s`).
            pub const ALL: &'static [Statement] = &[$(Statement::$name,)*];

            /// The PostgreSQL text (of the two SQLite-only statements, the text SQLite's is
            /// made from). The `Lock` statements (FOR UPDATE) are PostgreSQL only;
            /// BucketChange, BudgetChange and the two BucketChange...s of rl_check are the
            /// guarded UPDATEs (see [`crate::decision_slot`]).
            pub const fn text(self) -> &'static str {
                match self {
                    $(Statement::$name => include_str!(concat!("../../../sql/statements/", $file, ".sql")),)*
                }
            }
        }
    };
}

statements! {
    BucketRead => "bucket_read",
    BucketLock => "bucket_lock",
    BucketInsert => "bucket_insert",
    BucketUpdate => "bucket_update",
    BucketChange => "bucket_change",
    BudgetRead => "budget_read",
    BudgetLock => "budget_lock",
    BudgetInsert => "budget_insert",
    BudgetUpdate => "budget_update",
    BudgetChange => "budget_change",
    SweepBuckets => "sweep_buckets",
    SweepBudgets => "sweep_budgets",
    ResetBuckets => "reset_buckets",
    ResetBudgets => "reset_budgets",
    EntriesRead => "entries_read",
    EntriesLock => "entries_lock",
    EntriesInsert => "entries_insert",
    EntriesUpdate => "entries_update",
    SweepEntries => "sweep_entries",
    ResetEntries => "reset_entries",
    PolicyRead => "policy_read",
    PolicyPut => "policy_put",
    PolicyDelete => "policy_delete",
    BucketChangeForPolicy => "bucket_change_for_policy",
    StrikeRowsRead => "strike_rows_read",
    /// rl_budgets_near's list: a scan of every budget row (no index keeps spends HOT).
    BudgetsNear => "budgets_near",
    /// An ended period kept for invoicing (rl_usage), once.
    UsageKeep => "usage_keep",
    /// The budget rows rl_sweep keeps before it removes them.
    BudgetsEnded => "budgets_ended",
    /// rl_usage: one key's kept periods in a range (the primary key's order).
    UsageRead => "usage_read",
    /// rl_usage_all: a page of every key's kept periods in a range, after a place in the
    /// order of the index rl_usage_ended.
    UsagePage => "usage_page",
    SweepUsage => "sweep_usage",
    /// A setting of the installation (rl_setting), such as how long ended periods are kept.
    SettingRead => "setting_read",
    SettingPut => "setting_put",
    /// SQLite only, as is ChecksEpochRead: PostgreSQL keeps the checks epoch in memory.
    BucketChangeInEpoch => "bucket_change_in_epoch",
    ChecksEpochRead => "checks_epoch_read",
}

impl Statement {
    /// The types of the columns a reading statement returns (empty for the others).
    pub const fn columns(self) -> &'static [SqlType] {
        match self {
            Statement::BucketRead | Statement::BucketLock => &[SqlType::Float8, SqlType::Int8, SqlType::Int8],
            Statement::BudgetRead | Statement::BudgetLock => &[SqlType::Int8, SqlType::Int8, SqlType::Int8],
            Statement::EntriesRead | Statement::EntriesLock => &[SqlType::Text, SqlType::Int8],
            Statement::PolicyRead => &[SqlType::Text, SqlType::Int8],
            Statement::StrikeRowsRead => &[SqlType::Text, SqlType::Text],
            Statement::BudgetsNear => &[SqlType::Text, SqlType::Text, SqlType::Int8, SqlType::Int8, SqlType::Int8],
            Statement::BudgetsEnded => &[SqlType::Text, SqlType::Text, SqlType::Int8, SqlType::Int8, SqlType::Int8],
            Statement::UsageRead | Statement::UsagePage => {
                &[SqlType::Text, SqlType::Text, SqlType::Int8, SqlType::Int8, SqlType::Int8, SqlType::Int8]
            }
            Statement::ChecksEpochRead => &[SqlType::Text],
            Statement::SettingRead => &[SqlType::Int8],
            _ => &[],
        }
    }
}

/// A result row as an engine reads it, one column at a time (`i` from 0), by the type
/// the statement's column has.
pub trait RowColumns {
    type Error;
    fn real(&self, i: usize) -> Result<f64, Self::Error>;
    fn text(&self, i: usize) -> Result<String, Self::Error>;
    fn integer(&self, i: usize) -> Result<i64, Self::Error>;
}

/// A result row of `statement` as values, each column read by its type.
pub fn decode_row<R: RowColumns>(statement: Statement, row: &R) -> Result<Vec<Value<'static>>, R::Error> {
    (statement.columns().iter().enumerate())
        .map(|(i, t)| match t {
            SqlType::Float8 => row.real(i).map(Value::Float),
            SqlType::Text => row.text(i).map(Value::String),
            _ => row.integer(i).map(Value::Int),
        })
        .collect()
}

const SCHEMA: &str = "ratelimit.";
const OPERATOR: &str = "OPERATOR(pg_catalog.";

/// The extension's tables: SQLite finds them in `main` alone (unqualified, a name is looked
/// up in temp, then main, then every attached database).
pub const TABLES: [&str; 7] =
    ["rl_bucket", "rl_budget", "rl_entries", "rl_policy", "rl_meta", "rl_usage", "rl_setting"];

/// A statement as SQLite runs it: the tables in `main`, the functions without a schema,
/// plain operators, and texts compared in SQLite's own byte order (PostgreSQL's `COLLATE
/// "C"`, which SQLite does not name).
pub fn sqlite(text: &str) -> String {
    let mut text = text.replace(" COLLATE \"C\"", "");
    for table in TABLES {
        let qualified = format!("{SCHEMA}{table}");
        let mut at = 0;
        while let Some(found) = text[at..].find(&qualified) {
            let start = at + found;
            let end = start + qualified.len();
            // rl_bucket_guard is a function, not the table rl_bucket
            let whole_name = !text[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
            if whole_name {
                text.replace_range(start..start + SCHEMA.len(), "main.");
            }
            at = end;
        }
    }
    let text = text.replace(SCHEMA, "");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(OPERATOR) {
        out.push_str(&rest[..at]);
        let op = &rest[at + OPERATOR.len()..];
        let end = op.find(')').expect("OPERATOR(pg_catalog.x) is closed");
        out.push_str(&op[..end]);
        rest = &op[end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hijack a qualified statement prevents: a caller's search_path putting its own
    /// table, function or `=` operator before the extension's.
    #[test]
    fn every_name_and_comparison_is_qualified() {
        for text in Statement::ALL.iter().map(|s| s.text()) {
            for name in TABLES {
                for (at, _) in text.match_indices(name) {
                    assert!(text[..at].ends_with(SCHEMA), "unqualified {name} in {text}");
                }
            }
            let Some(at) = text.find("WHERE") else { continue };
            let mut condition = text[at..].to_string();
            while let Some(op) = condition.find(OPERATOR) {
                let end = op + condition[op..].find(')').unwrap();
                condition.replace_range(op..=end, " ");
            }
            let exempt =
                [Statement::SweepBuckets, Statement::SweepBudgets, Statement::SweepEntries, Statement::SweepUsage]
                    .map(Statement::text)
                    .contains(&text);
            for bare in ['=', '<', '>'] {
                assert!(!condition.contains(bare), "bare {bare} in {text}");
            }
            assert!(exempt || !condition.contains(" IN "), "IN resolves = through search_path: {text}");
        }
    }

    #[test]
    fn sqlite_text_drops_the_qualification() {
        assert_eq!(
            sqlite("DELETE FROM ratelimit.rl_bucket WHERE key OPERATOR(pg_catalog.=) $1 AND full_at OPERATOR(pg_catalog.<=) $2"),
            "DELETE FROM main.rl_bucket WHERE key = $1 AND full_at <= $2"
        );
        assert_eq!(
            sqlite("UPDATE ratelimit.rl_bucket SET level = ratelimit.rl_bucket_new_level()"),
            "UPDATE main.rl_bucket SET level = rl_bucket_new_level()"
        );
        for (i, statement) in Statement::ALL.iter().enumerate() {
            assert_eq!(*statement as usize, i, "ALL is in declaration order");
            let s = sqlite(statement.text());
            assert!(!s.contains("ratelimit") && !s.contains("OPERATOR") && !s.contains("pg_catalog"), "{s}");
            for table in TABLES {
                for (at, _) in s.match_indices(table) {
                    let whole_name =
                        !s[at + table.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
                    assert!(!whole_name || s[..at].ends_with("main."), "{table} outside main in {s}");
                }
            }
        }
    }

    /// SQLite numbers `$n` parameters by first appearance, PostgreSQL by n: the two agree
    /// (and positional binding is right on both) only if first appearances ascend.
    #[test]
    fn parameters_first_appear_in_order() {
        for text in Statement::ALL.iter().map(|s| s.text()) {
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
