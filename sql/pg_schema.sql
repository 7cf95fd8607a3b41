-- State of pg_ratelimit, in a schema the extension owns. Nobody but the extension's
-- owner has any privilege on it: callers change state only through the rl_* functions,
-- which run as SECURITY DEFINER statements that qualify every name and operator.
-- rl_bucket: a token bucket holds `level` tokens at `refilled_at` (epoch ms) and is full
-- again at `full_at`. rl_budget: `used` millionths of a unit in the period ending at
-- `resets_at` (epoch ms). No row means a full bucket / nothing spent. rl_entries: a
-- list per key and kind ('window': admissions per millisecond; 'lease': leases held),
-- encoded as text by the library, with no entry counting from `empty_at` (epoch ms).
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
    PRIMARY KEY (key, period)
);
CREATE TABLE ratelimit.rl_entries (
    key      text   NOT NULL,
    kind     text   NOT NULL,
    entries  text   NOT NULL,
    empty_at bigint NOT NULL,
    PRIMARY KEY (key, kind)
);
REVOKE ALL ON ratelimit.rl_bucket, ratelimit.rl_budget, ratelimit.rl_entries FROM PUBLIC;
-- State is data: pg_dump saves the rows, so a restored backup keeps every level and spend.
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_bucket', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_budget', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_entries', '');

COMMENT ON SCHEMA ratelimit IS 'pg_ratelimit state; change it only through the rl_* functions';
COMMENT ON TABLE ratelimit.rl_bucket IS 'token buckets: level tokens at refilled_at (epoch ms), full again at full_at';
COMMENT ON TABLE ratelimit.rl_budget IS 'calendar budgets: used millionths in the period ending at resets_at (epoch ms)';
COMMENT ON TABLE ratelimit.rl_entries IS 'sliding windows (kind window) and leases (kind lease): a list per key, no entry counting from empty_at (epoch ms)';
