-- pg_ratelimit 0.1.0 -> 0.2.0: one statement per call.
-- rl_take, rl_spend and the refunds now change their row with one guarded UPDATE that
-- calls back into the library through these internal functions. Their statements qualify
-- every name and operator, so the functions no longer pin search_path (rl_sweep still does).

CREATE FUNCTION ratelimit."rl_bucket_guard"("level" double precision, "refilled_at" bigint, "full_at" bigint)
RETURNS bool STRICT VOLATILE PARALLEL UNSAFE COST 1000
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_bucket_guard_wrapper';
CREATE FUNCTION ratelimit."rl_bucket_new_level"() RETURNS double precision STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_bucket_new_level_wrapper';
CREATE FUNCTION ratelimit."rl_bucket_new_refilled_at"() RETURNS bigint STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_bucket_new_refilled_at_wrapper';
CREATE FUNCTION ratelimit."rl_bucket_new_full_at"() RETURNS bigint STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_bucket_new_full_at_wrapper';
CREATE FUNCTION ratelimit."rl_budget_guard"("used" bigint, "resets_at" bigint)
RETURNS bool STRICT VOLATILE PARALLEL UNSAFE COST 1000
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_budget_guard_wrapper';
CREATE FUNCTION ratelimit."rl_budget_new_used"() RETURNS bigint STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_budget_new_used_wrapper';
CREATE FUNCTION ratelimit."rl_budget_new_resets_at"() RETURNS bigint STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'rl_budget_new_resets_at_wrapper';

REVOKE ALL ON FUNCTION
  ratelimit.rl_bucket_guard(double precision, bigint, bigint), ratelimit.rl_bucket_new_level(),
  ratelimit.rl_bucket_new_refilled_at(), ratelimit.rl_bucket_new_full_at(),
  ratelimit.rl_budget_guard(bigint, bigint), ratelimit.rl_budget_new_used(), ratelimit.rl_budget_new_resets_at()
FROM PUBLIC;
COMMENT ON FUNCTION ratelimit.rl_bucket_guard(double precision, bigint, bigint) IS
  'internal: hands a bucket row to the decision of the rl_* call in progress; true when it writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_level() IS 'internal: the level the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_refilled_at() IS 'internal: the refilled_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_bucket_new_full_at() IS 'internal: the full_at the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_guard(bigint, bigint) IS
  'internal: hands a budget row to the decision of the rl_* call in progress; true when it writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_used() IS 'internal: the used the call in progress writes';
COMMENT ON FUNCTION ratelimit.rl_budget_new_resets_at() IS 'internal: the resets_at the call in progress writes';

ALTER FUNCTION rl_take(text, double precision, double precision, double precision, double precision) RESET search_path;
ALTER FUNCTION rl_spend(text, text, double precision, double precision, double precision) RESET search_path;
ALTER FUNCTION rl_budget(text, text, double precision, double precision, double precision) RESET search_path;
ALTER FUNCTION rl_peek(text, double precision, double precision, double precision, double precision) RESET search_path;
ALTER FUNCTION rl_refund(text, double precision, double precision, double precision, double precision) RESET search_path;
ALTER FUNCTION rl_refund_budget(text, text, double precision, double precision) RESET search_path;
ALTER FUNCTION rl_reset(text) RESET search_path;
ALTER FUNCTION rl_take_all(jsonb, double precision) RESET search_path;
