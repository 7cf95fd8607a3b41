-- State of the SQLite extension, created in the main database on first use.
-- rl_bucket: a token bucket holds `level` tokens at `refilled_at` (epoch ms) and is full
-- again at `full_at`. rl_budget: `used` millionths of a unit in the period ending at
-- `resets_at` (epoch ms), against the `quota` (millionths) of the last spend (0: none).
-- No row means a full bucket / nothing spent. rl_entries: a list per key and kind
-- ('window': admissions per millisecond; 'lease': leases held), encoded as text by the
-- library, with no entry counting from `empty_at` (epoch ms). rl_meta
-- records the layout of these tables (schema_version) and the checks epoch (below);
-- PRAGMA user_version is the application's. A database without rl_meta was written by
-- 0.1.0 or 0.2.0, in schema_version 1; schema_version 2 adds rl_entries, rl_policy, the
-- views rl_policies, rl_blocks and rl_stats and the checks epoch (0.3.0), created on
-- first use; schema_version 3 (0.4.0) adds rl_budget.quota, rl_usage (ended budget
-- periods kept for invoicing), rl_setting (rl_usage_retention) and the view rl_refused: a
-- database of an earlier version gains them (ALTER TABLE, then this script) the first time
-- a statement of 0.4.0 finds the column missing.
CREATE TABLE IF NOT EXISTS main.rl_bucket (
    key         TEXT    NOT NULL PRIMARY KEY,
    level       REAL    NOT NULL,
    refilled_at INTEGER NOT NULL,
    full_at     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS main.rl_budget (
    key       TEXT    NOT NULL,
    period    TEXT    NOT NULL,
    used      INTEGER NOT NULL,
    resets_at INTEGER NOT NULL,
    quota     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, period)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS main.rl_entries (
    key      TEXT    NOT NULL,
    kind     TEXT    NOT NULL,
    entries  TEXT    NOT NULL,
    empty_at INTEGER NOT NULL,
    PRIMARY KEY (key, kind)
) WITHOUT ROWID;
-- rl_check lists the subjects with strikes or blocks without reading windows and leases.
CREATE INDEX IF NOT EXISTS main.rl_entries_strikes ON rl_entries (key) WHERE kind = 'block';
CREATE TABLE IF NOT EXISTS main.rl_usage (
    key       TEXT    NOT NULL,
    period    TEXT    NOT NULL,
    starts_at INTEGER NOT NULL,
    ends_at   INTEGER NOT NULL,
    used      INTEGER NOT NULL,
    quota     INTEGER NOT NULL,
    PRIMARY KEY (key, period, ends_at)
) WITHOUT ROWID;
-- rl_usage_all pages through every key's ended periods by end, key and period.
CREATE INDEX IF NOT EXISTS main.rl_usage_ended ON rl_usage (ends_at, key, period);
CREATE TABLE IF NOT EXISTS main.rl_setting (
    name  TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS main.rl_policy (
    name       TEXT NOT NULL PRIMARY KEY,
    definition TEXT NOT NULL,
    revision   INTEGER NOT NULL
) WITHOUT ROWID;
-- Views and triggers name tables without a schema: SQLite then finds them in the view's
-- own database (a schema name would tie the file to being "main", and ATTACH refuses it).
CREATE VIEW IF NOT EXISTS main.rl_policies AS SELECT name, definition FROM rl_policy;
CREATE VIEW IF NOT EXISTS main.rl_blocks AS
    SELECT key AS subject, json_extract(entries, '$.strikes') AS strikes,
           CASE json_type(entries, '$.blocked_until') WHEN 'integer'
                THEN json_extract(entries, '$.blocked_until') END AS blocked_until_ms
    FROM rl_entries
    WHERE kind = 'block'
      AND (json_type(entries, '$.blocked_until') = 'null'
           OR (json_type(entries, '$.blocked_until') = 'integer'
               AND json_extract(entries, '$.blocked_until') > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)));
CREATE VIEW IF NOT EXISTS main.rl_stats AS
    SELECT key AS policy, json_extract(value, '$.admitted') AS admitted, json_extract(value, '$.refused') AS refused,
           json_extract(value, '$.would_refuse') AS would_refuse, json_extract(value, '$.refused_blocked') AS refused_blocked
    FROM json_each(rl_policy_stats(), '$.policies');
CREATE VIEW IF NOT EXISTS main.rl_refused AS
    SELECT p.key AS policy, json_extract(e.value, '$.subject') AS subject, json_extract(e.value, '$.refusals') AS refusals,
           json_extract(e.value, '$.error') AS error, json_extract(e.value, '$.last_refused_ms') AS last_refused_ms
    FROM json_each(rl_policy_stats(), '$.policies') AS p, json_each(rl_top_refused(p.key, 64), '$.subjects') AS e;
CREATE TABLE IF NOT EXISTS main.rl_meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT OR REPLACE INTO main.rl_meta (key, value) VALUES ('schema_version', '3');
-- The checks epoch: a random number drawn anew whenever a policy changes or a subject
-- comes to have a recorded block (blocked_until other than false, ended or not; the rule
-- of penalty::records_new_block), by a function or by any other write. A connection
-- trusts what rl_check read (policies, the subjects with blocks) while it stands; a
-- row that is not JSON counts as a block.
INSERT OR IGNORE INTO main.rl_meta (key, value) VALUES ('checks_epoch', CAST(random() AS TEXT));
CREATE TRIGGER IF NOT EXISTS main.rl_policy_inserted AFTER INSERT ON rl_policy BEGIN
    UPDATE rl_meta SET value = CAST(random() AS TEXT) WHERE key = 'checks_epoch';
END;
CREATE TRIGGER IF NOT EXISTS main.rl_policy_updated AFTER UPDATE ON rl_policy BEGIN
    UPDATE rl_meta SET value = CAST(random() AS TEXT) WHERE key = 'checks_epoch';
END;
CREATE TRIGGER IF NOT EXISTS main.rl_policy_deleted AFTER DELETE ON rl_policy BEGIN
    UPDATE rl_meta SET value = CAST(random() AS TEXT) WHERE key = 'checks_epoch';
END;
CREATE TRIGGER IF NOT EXISTS main.rl_block_inserted AFTER INSERT ON rl_entries
WHEN NEW.kind = 'block'
 AND CASE WHEN json_valid(NEW.entries) THEN json_type(NEW.entries, '$.blocked_until') IS NOT 'false' ELSE 1 END
BEGIN
    UPDATE rl_meta SET value = CAST(random() AS TEXT) WHERE key = 'checks_epoch';
END;
CREATE TRIGGER IF NOT EXISTS main.rl_block_updated AFTER UPDATE ON rl_entries
WHEN NEW.kind = 'block'
 AND CASE WHEN json_valid(NEW.entries) THEN json_type(NEW.entries, '$.blocked_until') IS NOT 'false' ELSE 1 END
 AND (OLD.kind IS NOT 'block'
      OR CASE WHEN json_valid(OLD.entries) THEN json_type(OLD.entries, '$.blocked_until') IS 'false' ELSE 1 END)
BEGIN
    UPDATE rl_meta SET value = CAST(random() AS TEXT) WHERE key = 'checks_epoch';
END;
