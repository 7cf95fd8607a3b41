-- State of pg_ratelimit, in a schema the extension owns. Nobody but the extension's
-- owner has any privilege on it: callers change state only through the rl_* functions,
-- which run as SECURITY DEFINER statements that qualify every name and operator.
-- rl_bucket: a token bucket holds `level` tokens at `refilled_at` (epoch ms) and is full
-- again at `full_at`. rl_budget: `used` millionths of a unit in the period ending at
-- `resets_at` (epoch ms). No row means a full bucket / nothing spent.
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
REVOKE ALL ON ratelimit.rl_bucket, ratelimit.rl_budget FROM PUBLIC;
-- State is data: pg_dump saves the rows, so a restored backup keeps every level and spend.
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_bucket', '');
SELECT pg_catalog.pg_extension_config_dump('ratelimit.rl_budget', '');

COMMENT ON SCHEMA ratelimit IS 'pg_ratelimit state; change it only through the rl_* functions';
COMMENT ON TABLE ratelimit.rl_bucket IS 'token buckets: level tokens at refilled_at (epoch ms), full again at full_at';
COMMENT ON TABLE ratelimit.rl_budget IS 'calendar budgets: used millionths in the period ending at resets_at (epoch ms)';
