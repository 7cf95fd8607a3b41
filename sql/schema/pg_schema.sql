-- State of pg_ratelimit, in a schema the extension owns. Nobody but the extension's
-- owner has any privilege on it: callers change state only through the rl_* functions,
-- which run as SECURITY DEFINER statements that qualify every name and operator.
-- rl_bucket: a token bucket holds `level` tokens at `refilled_at` (epoch ms) and is full
-- again at `full_at`. rl_budget: `used` millionths of a unit in the period ending at
-- `resets_at` (epoch ms), against the `quota` (millionths) of the last spend (0: none).
-- No row means a full bucket / nothing spent. rl_entries: a list per key and kind
-- ('window': admissions per millisecond; 'lease': leases held), encoded as text by the
-- library, with no entry counting from `empty_at` (epoch ms).
CREATE SCHEMA ratelimit;
REVOKE ALL ON SCHEMA ratelimit FROM PUBLIC;

CREATE TABLE ratelimit.rl_bucket (
    key         text             NOT NULL PRIMARY KEY,
    level       double precision NOT NULL,
    refilled_at bigint           NOT NULL,
    full_at     bigint           NOT NULL
);
CREATE TABLE ratelimit.rl_budget (
    key       text   NOT NULL,
    period    text   NOT NULL,
    used      bigint NOT NULL,
    resets_at bigint NOT NULL,
    quota     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (key, period)
);
CREATE TABLE ratelimit.rl_entries (
    key      text   NOT NULL,
    kind     text   NOT NULL,
    entries  text   NOT NULL,
    empty_at bigint NOT NULL,
    PRIMARY KEY (key, kind)
);
CREATE TABLE ratelimit.rl_usage (
    key       text   NOT NULL,
    period    text   NOT NULL,
    starts_at bigint NOT NULL,
    ends_at   bigint NOT NULL,
    used      bigint NOT NULL,
    quota     bigint NOT NULL,
    PRIMARY KEY (key, period, ends_at)
);
CREATE TABLE ratelimit.rl_setting (
    name  text   NOT NULL PRIMARY KEY,
    value bigint NOT NULL
);
CREATE TABLE ratelimit.rl_policy (
    name       text NOT NULL PRIMARY KEY,
    definition text NOT NULL,
    revision   bigint NOT NULL
);
REVOKE ALL ON ratelimit.rl_bucket, ratelimit.rl_budget, ratelimit.rl_entries, ratelimit.rl_policy, ratelimit.rl_usage, ratelimit.rl_setting FROM PUBLIC;
-- rl_check lists the subjects with strikes or blocks (ratelimit.rl_entries rows of kind
-- 'block') without reading windows and leases; key and kind never change, so updates of
-- windows and leases stay HOT.
CREATE INDEX rl_entries_strikes ON ratelimit.rl_entries (key) WHERE kind = 'block';
COMMENT ON INDEX ratelimit.rl_entries_strikes IS 'the rows of strikes and blocks, which rl_check lists while they are few';
-- rl_usage_all pages through every key's ended periods by end, key and period, the texts in
-- byte order whatever the database's collation; rl_sweep finds those past their retention.
CREATE INDEX rl_usage_ended ON ratelimit.rl_usage (ends_at, key COLLATE "C", period COLLATE "C");
COMMENT ON INDEX ratelimit.rl_usage_ended IS 'kept periods by end, key and period in byte order: rl_usage_all''s pages and rl_sweep''s cutoff';
-- Who may change policies, lift blocks and reset keys: members of rl_admin (a role of the
-- cluster, made once by the first install) and the owner. Application roles may check
-- policies but never loosen their own limits. An installing role that may not create
-- roles (no CREATEROLE) installs all the same: administration is then its own, and
-- running the install again once rl_admin exists grants it (the privileges block at the end).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'rl_admin') THEN
        BEGIN
            CREATE ROLE rl_admin NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'pg_ratelimit: % may not create the role rl_admin, so administration is its own alone', current_user
                USING HINT = 'A role with CREATEROLE can run CREATE ROLE rl_admin NOLOGIN; then install again to grant it.';
        END;
    END IF;
END
$$;
CREATE VIEW rl_policies AS
    SELECT name, definition::jsonb AS definition FROM ratelimit.rl_policy;
COMMENT ON VIEW rl_policies IS 'every policy and its definition (rl_policy_set, rl_policy_drop); readable by rl_admin';
CREATE VIEW rl_blocks AS
    SELECT key AS subject, (entries::jsonb ->> 'strikes')::bigint AS strikes,
           CASE WHEN jsonb_typeof(entries::jsonb -> 'blocked_until') = 'number'
                THEN (entries::jsonb ->> 'blocked_until')::bigint END AS blocked_until_ms
    FROM ratelimit.rl_entries
    WHERE kind = 'block'
      AND (jsonb_typeof(entries::jsonb -> 'blocked_until') = 'null'
           OR (jsonb_typeof(entries::jsonb -> 'blocked_until') = 'number'
               AND (entries::jsonb ->> 'blocked_until')::bigint > (extract(epoch FROM clock_timestamp()) * 1000)::bigint));
COMMENT ON VIEW rl_blocks IS 'subjects blocked now (rl_penalize, rl_block): strikes, and the block''s end in epoch ms (NULL: until rl_unblock); readable by rl_admin';
-- State is data: pg_dump saves the rows, so a restored backup keeps every level and spend.
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_bucket', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_budget', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_entries', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_policy', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_usage', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_setting', '');

COMMENT ON SCHEMA ratelimit IS 'pg_ratelimit state; change it only through the rl_* functions';
COMMENT ON TABLE ratelimit.rl_bucket IS 'token buckets: level tokens at refilled_at (epoch ms), full again at full_at';
COMMENT ON TABLE ratelimit.rl_budget IS 'calendar budgets: used millionths in the period ending at resets_at (epoch ms), against the quota (millionths) of the last spend, 0 when none';
COMMENT ON TABLE ratelimit.rl_entries IS 'sliding windows (kind window) and leases (kind lease): a list per key, no entry counting from empty_at (epoch ms)';
COMMENT ON TABLE ratelimit.rl_usage IS 'ended budget periods kept for invoicing (rl_usage): used and the last spend''s quota in millionths, starts_at and ends_at in epoch ms; rl_sweep removes them 400 days after they end (rl_usage_retention)';
COMMENT ON TABLE ratelimit.rl_setting IS 'settings of the installation by name: usage_retention_ms, how long rl_sweep keeps ended budget periods (rl_usage_retention, rl_admin only)';
COMMENT ON TABLE ratelimit.rl_policy IS 'policies set by rl_policy_set: a name, its definition (canonical JSON text) and a revision drawn anew by each set';
