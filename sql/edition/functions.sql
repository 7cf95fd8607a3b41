-- The bodies of the SQL edition's public functions, one section per function, each
-- opened by a marker line: two dashes, "function:" and the name. Their CREATE FUNCTION lines (arguments,
-- defaults, volatility, security), comments and grants are generated from the native
-- library's function table (codegen/src/sql_edition.rs), so both editions declare the
-- same functions. Arguments are checked in the order the native one parses them, so the
-- first bad one is the one named. A body's `@ARGUMENTS@` line becomes one DECLARE line per
-- argument with a rule in the function table (functions::Rule; sql_edition::arguments),
-- in that order; the bodies without it check their arguments themselves.
-- A section may name two functions, a JSON one and its compact answer (rl_take,
-- rl_take_compact): one body serves both, `@FN@` standing for the function's name and
-- each `RETURN @ANSWER@(answer)` returning the JSON answer, or its compact text
-- (ratelimit.rl__compact, headers::compact).

-- function: rl_take, rl_take_compact
DECLARE
    -- The hot path tests the arguments with the rules' own predicates, which cannot fail,
    -- and leaves a call they reject to the checked path below, which raises in the core's
    -- order. (A check that can raise has an error branch calling PL/pgSQL, which PL/pgSQL
    -- sets up in every transaction though the branch never runs; so does every function
    -- of an expression, run or not, which is why the explicit clock has its own statement.)
    now bigint := CASE WHEN now_ms IS NULL THEN ratelimit.rl__clock_ms() END;
    row_level double precision;
    row_refilled_at bigint;
    row_full_at bigint;
BEGIN
    IF now_ms IS NOT NULL THEN
        now := ratelimit.rl__now_or_null(now_ms);
    END IF;
    IF ratelimit.rl__key_ok(key) AND ratelimit.rl__tokens_ok(burst) AND ratelimit.rl__hot_rate_ok(refill_per_minute)
       AND ratelimit.rl__tokens_ok(cost) AND now IS NOT NULL AND ratelimit.rl__hot_ok() THEN
        -- A row that admits, in one statement: PL/pgSQL sets up each statement, expression
        -- and function it runs once per transaction, which costs more than their
        -- arithmetic. Its SQL helpers are inlined; a level they do not cover is left to
        -- the checked path.
        <<taken>>
        BEGIN
            UPDATE ratelimit.rl_bucket AS t
            SET level = ratelimit.rl__taken_level(t.level, t.refilled_at, burst, refill_per_minute, cost, now),
                refilled_at = greatest(t.refilled_at, now),
                full_at = ratelimit.rl__taken_full_at(t.level, t.refilled_at, burst, refill_per_minute, cost, now)
            WHERE t.key = @FN@.key AND abs(t.level) < 1e16
              AND cost <= ratelimit.rl__refilled_level(t.level, t.refilled_at, burst, refill_per_minute, now)
            RETURNING t.level, t.refilled_at, t.full_at INTO row_level, row_refilled_at, row_full_at;
            IF NOT FOUND THEN
                -- Nothing written: a row the statement left alone, or none.
                SELECT t.level, t.refilled_at INTO row_level, row_refilled_at FROM ratelimit.rl_bucket AS t
                WHERE t.key = @FN@.key;
                IF FOUND THEN
                    -- A row that refuses is answered from this one read, as the checked path
                    -- answers it (a refusal writes nothing); one that admits by now, or whose
                    -- level the statement does not cover, is left to the checked path.
                    IF cost > ratelimit.rl__level_at(true, row_level, row_refilled_at, burst, refill_per_minute, now) THEN
                        RETURN @ANSWER@((ratelimit.rl__take_decision(true, row_level, row_refilled_at, burst, refill_per_minute,
                                                                      cost, now)).answer);
                    END IF;
                    EXIT taken;
                END IF;
                -- No row (a key's first call): a full bucket's row, taken from, in one
                -- statement and with the same estimate of full_at as above, unless the key
                -- has a row by then (left to the checked path).
                INSERT INTO ratelimit.rl_bucket AS t (key, level, refilled_at, full_at)
                SELECT @FN@.key, burst - cost, now,
                       ratelimit.rl__taken_full_at(burst, now, burst, refill_per_minute, cost, now)
                WHERE cost <= burst
                ON CONFLICT ON CONSTRAINT rl_bucket_pkey DO NOTHING
                RETURNING t.level, t.refilled_at, t.full_at INTO row_level, row_refilled_at, row_full_at;
                IF NOT FOUND THEN
                    EXIT taken;
                END IF;
            END IF;
            -- Taken, by the UPDATE or the INSERT: the answer from the row written, where its
            -- full_at is the edge (float rounding may put the estimate off it). Worked out
            -- here, not in the statements' RETURNING, which PostgreSQL would set up in every
            -- call that runs them, writing or not.
            IF ratelimit.rl__full_at_is_edge(row_level, row_refilled_at, row_full_at, burst, refill_per_minute, now) THEN
                RETURN @ANSWER@(ratelimit.rl__taken_answer(row_level, burst, row_full_at - now,
                                                            ratelimit.rl__hot_refill_seconds(burst, refill_per_minute)));
            END IF;
            RETURN @ANSWER@(ratelimit.rl__taken_exact(@FN@.key, burst, refill_per_minute, now,
                                                       ratelimit.rl__hot_refill_seconds(burst, refill_per_minute)));
        END;
    END IF;
    -- A refusal, a row changed since, or an argument to refuse: the checked path of every
    -- bucket change.
    DECLARE
        fn CONSTANT text := '@FN@';
        @ARGUMENTS@
        writable CONSTANT boolean := ratelimit.rl__writable(fn);
    BEGIN
        RETURN @ANSWER@(ratelimit.rl__bucket_change(fn, 'take', k, b, r, c, now));
    END;
END

-- function: rl_peek
DECLARE
    fn CONSTANT text := 'rl_peek';
    @ARGUMENTS@
    row_level double precision;
    row_refilled_at bigint;
BEGIN
    SELECT t.level, t.refilled_at INTO row_level, row_refilled_at FROM ratelimit.rl_bucket AS t WHERE t.key = k;
    RETURN (ratelimit.rl__take_decision(FOUND, row_level, row_refilled_at, b, r, c, now)).answer;
END

-- function: rl_refund
DECLARE
    fn CONSTANT text := 'rl_refund';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__bucket_change(fn, 'refund', k, b, r, a, now);
END

-- function: rl_charge
DECLARE
    fn CONSTANT text := 'rl_charge';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__bucket_change(fn, 'charge', k, b, r, a, now);
END

-- function: rl_spend
DECLARE
    -- The hot path, as rl_take's: arguments the rules' own predicates pass, and a row of
    -- the current period, asked with its own quota, that admits: one UPDATE, whose answer is
    -- the checked path's (budget::spend). The period is not read here: a row keeps its
    -- period's canonical text, checked when the row was written, so a period that finds a
    -- row is a valid one, anchored and zoned ones too (their bounds, for the answer's
    -- period_seconds, the session has kept since it last worked them out); any other text
    -- finds none and goes to the checked path, which reads it or names what is wrong.
    now bigint := CASE WHEN now_ms IS NULL THEN ratelimit.rl__clock_ms() END;
    answer jsonb;
BEGIN
    IF now_ms IS NOT NULL THEN
        now := ratelimit.rl__now_or_null(now_ms);
    END IF;
    IF ratelimit.rl__key_ok(key) AND ratelimit.rl__amount_ok(quota)
       AND ratelimit.rl__amount_ok(cost) AND now IS NOT NULL AND ratelimit.rl__read_write() THEN
        UPDATE ratelimit.rl_budget AS t
        SET used = t.used + ratelimit.rl__round(cost * @MICROS_PER_UNIT@)::bigint
        WHERE t.key = rl_spend.key AND t.period = rl_spend.period AND t.resets_at > now AND t.used >= 0
          AND t.quota = ratelimit.rl__round(rl_spend.quota * @MICROS_PER_UNIT@)::bigint
          AND t.used + ratelimit.rl__round(cost * @MICROS_PER_UNIT@)::bigint <= t.quota
        RETURNING ratelimit.rl__spend_answer(true, t.used, t.resets_at, rl_spend.period, t.quota, 0, now)
        INTO answer;
        IF FOUND THEN
            RETURN answer;
        END IF;
    END IF;
    -- No row, a new period, another quota, a refusal, a zoned or anchored period, or an
    -- argument to refuse: the checked path of every budget change.
    DECLARE
        fn CONSTANT text := 'rl_spend';
        @ARGUMENTS@
    BEGIN
        RETURN ratelimit.rl__budget_change(fn, 'spend', k, p, q, c, now);
    END;
END

-- function: rl_budget
DECLARE
    fn CONSTANT text := 'rl_budget';
    @ARGUMENTS@
    row_used bigint;
    row_resets_at bigint;
BEGIN
    SELECT t.used, t.resets_at INTO row_used, row_resets_at FROM ratelimit.rl_budget AS t
    WHERE t.key = k AND t.period = p;
    RETURN ratelimit.rl__spend_answer(FOUND, row_used, row_resets_at, p, q, c, now);
END

-- function: rl_refund_budget
DECLARE
    fn CONSTANT text := 'rl_refund_budget';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__budget_change(fn, 'refund', k, p, NULL, a, now);
END

-- function: rl_charge_budget
DECLARE
    fn CONSTANT text := 'rl_charge_budget';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__budget_change(fn, 'charge', k, p, NULL, a, now);
END

-- function: rl_sweep
DECLARE
    fn CONSTANT text := 'rl_sweep';
    wall bigint := ratelimit.rl__now(fn, NULL);
    cutoff bigint;
    kept bigint;
    budget bigint;
    removed bigint := 0;
    n bigint;
BEGIN
    -- an explicit clock needs no permission here: the cutoff is never later than real time
    IF now_ms IS NOT NULL AND NOT (now_ms = trunc(now_ms) AND abs(now_ms) < 9e15 AND now_ms >= 0
                                   AND now_ms <= @MAX_NOW_MS@) THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOW_MS_RANGE@, @MAX_NOW_MS@, ratelimit.rl__describe(now_ms)));
    END IF;
    cutoff := least(coalesce(now_ms::bigint, wall), wall);
    IF max_rows IS NOT NULL AND max_rows < 1 THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_MAX_ROWS@, max_rows));
    END IF;
    budget := coalesce(max_rows, 9223372036854775807);
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    DELETE FROM ratelimit.rl_bucket WHERE full_at <= cutoff
        AND key IN (SELECT key FROM ratelimit.rl_bucket WHERE full_at <= cutoff LIMIT budget);
    GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    IF removed < budget THEN
        -- an ended period with something counted is kept for invoicing first
        -- (rows::sweep); only those kept, or with nothing counted, go
        INSERT INTO ratelimit.rl_usage (key, period, starts_at, ends_at, used, quota)
        SELECT t.key, t.period, ratelimit.rl__period_start(t.period, t.resets_at - 1), t.resets_at, t.used, t.quota
        FROM ratelimit.rl_budget AS t WHERE t.resets_at <= cutoff AND t.used <> 0
        ORDER BY t.key, t.period LIMIT budget - removed
        ON CONFLICT (key, period, ends_at) DO NOTHING;
        DELETE FROM ratelimit.rl_budget WHERE resets_at <= cutoff AND (key, period) IN
            (SELECT b.key, b.period FROM ratelimit.rl_budget AS b
             WHERE b.resets_at <= cutoff
               AND (b.used = 0 OR EXISTS (SELECT FROM ratelimit.rl_usage AS u
                                          WHERE u.key = b.key AND u.period = b.period AND u.ends_at = b.resets_at))
             LIMIT budget - removed);
        GET DIAGNOSTICS n = ROW_COUNT;
        removed := removed + n;
    END IF;
    IF removed < budget THEN
        DELETE FROM ratelimit.rl_entries WHERE empty_at <= cutoff AND (key, kind) IN
            (SELECT key, kind FROM ratelimit.rl_entries WHERE empty_at <= cutoff LIMIT budget - removed);
        GET DIAGNOSTICS n = ROW_COUNT;
        removed := removed + n;
    END IF;
    IF removed < budget THEN
        -- kept periods, the retention after they ended (rl_usage_retention; budget::USAGE_KEPT_MS unless set)
        kept := coalesce((SELECT s.value FROM ratelimit.rl_setting AS s WHERE s.name = '@USAGE_RETENTION_SETTING@'),
                         @USAGE_KEPT_MS@);
        DELETE FROM ratelimit.rl_usage WHERE ends_at <= cutoff - kept AND (key, period, ends_at) IN
            (SELECT key, period, ends_at FROM ratelimit.rl_usage WHERE ends_at <= cutoff - kept
             LIMIT budget - removed);
        GET DIAGNOSTICS n = ROW_COUNT;
        removed := removed + n;
    END IF;
    RETURN removed;
END

-- function: rl_reset
DECLARE
    fn CONSTANT text := 'rl_reset';
    @ARGUMENTS@
    removed bigint := 0;
    n bigint;
BEGIN
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    DELETE FROM ratelimit.rl_bucket WHERE ratelimit.rl_bucket.key = k;
    GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM ratelimit.rl_budget WHERE ratelimit.rl_budget.key = k;
    GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM ratelimit.rl_entries WHERE ratelimit.rl_entries.key = k;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN removed + n;
END

-- function: rl_key
BEGIN
    IF parts IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'rl_key: ' || format(@MSG_NULL_PART@, 1);
    ELSIF cardinality(parts) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'rl_key: ' || @MSG_NO_PARTS@;
    END IF;
    FOR i IN 1..cardinality(parts) LOOP
        IF parts[array_lower(parts, 1) + i - 1] IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'rl_key: ' || format(@MSG_NULL_PART@, i);
        END IF;
    END LOOP;
    RETURN array_to_json(parts)::text;
END

-- function: rl_version
BEGIN
    RETURN '@VERSION@-sql';
END

-- function: rl_check_limits
DECLARE
    fn CONSTANT text := 'rl_check_limits';
    n text := ratelimit.rl__name(fn, 'name', name);
    s text := ratelimit.rl__name(fn, 'subject', subject);
    now bigint;
    d jsonb;
BEGIN
    PERFORM ratelimit.rl__json_arg(fn, 'limits', limits, 'a JSON array');
    now := ratelimit.rl__now(fn, now_ms);
    d := ratelimit.rl__take_all(fn, ratelimit.rl__limit_items(fn, limits), now);
    IF (d ->> 'admitted')::boolean THEN
        PERFORM ratelimit.rl__count(n, 'admitted');
    ELSIF d IS NOT NULL THEN
        PERFORM ratelimit.rl__count(n, 'refused');
        PERFORM ratelimit.rl__refuse(n, s, now);
    END IF;
    RETURN d;
END

-- function: rl_window
DECLARE
    fn CONSTANT text := 'rl_window';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__entries_change(fn, k, 'window', 'window',
        jsonb_build_object('limit', lim, 'window_ms', w, 'cost', c), now, '');
END

-- function: rl_window_peek
DECLARE
    fn CONSTANT text := 'rl_window_peek';
    @ARGUMENTS@
    seen text;
BEGIN
    SELECT t.entries INTO seen FROM ratelimit.rl_entries AS t WHERE t.key = k AND t.kind = 'window';
    RETURN (ratelimit.rl__window_decision(fn, seen, lim, w, c, now, false, false)).answer;
END

-- function: rl_fixed_window
DECLARE
    fn CONSTANT text := 'rl_fixed_window';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__entries_change(fn, k, 'fixed_window', 'window',
        jsonb_build_object('limit', lim, 'window_ms', w, 'cost', c, 'fixed', true), now, '');
END

-- function: rl_fixed_window_peek
DECLARE
    fn CONSTANT text := 'rl_fixed_window_peek';
    @ARGUMENTS@
    seen text;
BEGIN
    SELECT t.entries INTO seen FROM ratelimit.rl_entries AS t WHERE t.key = k AND t.kind = 'fixed_window';
    RETURN (ratelimit.rl__window_decision(fn, seen, lim, w, c, now, false, true)).answer;
END

-- function: rl_acquire
DECLARE
    fn CONSTANT text := 'rl_acquire';
    k text := ratelimit.rl__key(fn, key);
    cap bigint := max_in_flight;
    lease_ms bigint;
    now bigint;
BEGIN
    IF cap IS NULL OR cap < 1 OR cap > @MAX_IN_FLIGHT@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_INTEGER_RANGE@, 'max_in_flight', @MAX_IN_FLIGHT@, coalesce(cap::text, 'NULL')));
    END IF;
    lease_ms := ratelimit.rl__duration_ms(fn, 'lease_seconds', lease_seconds);
    now := ratelimit.rl__now(fn, now_ms);
    RETURN ratelimit.rl__entries_change(fn, k, 'lease', 'acquire',
        jsonb_build_object('max', cap, 'lease_ms', lease_ms), now, '1');
END

-- function: rl_release
DECLARE
    fn CONSTANT text := 'rl_release';
    k text := ratelimit.rl__key(fn, key);
    now bigint;
BEGIN
    IF lease IS NULL THEN PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOT_TEXT@, 'lease', 'NULL')); END IF;
    now := ratelimit.rl__now(fn, now_ms);
    RETURN ratelimit.rl__entries_change(fn, k, 'lease', 'release', jsonb_build_object('lease', lease), now, '1')::boolean;
END

-- function: rl_renew
DECLARE
    fn CONSTANT text := 'rl_renew';
    k text := ratelimit.rl__key(fn, key);
    lease_ms bigint;
    now bigint;
BEGIN
    IF lease IS NULL THEN PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOT_TEXT@, 'lease', 'NULL')); END IF;
    lease_ms := ratelimit.rl__duration_ms(fn, 'lease_seconds', lease_seconds);
    now := ratelimit.rl__now(fn, now_ms);
    RETURN ratelimit.rl__entries_change(fn, k, 'lease', 'renew',
        jsonb_build_object('lease', lease, 'lease_ms', lease_ms), now, '1');
END

-- function: rl_in_flight
DECLARE
    fn CONSTANT text := 'rl_in_flight';
    @ARGUMENTS@
    seen text;
BEGIN
    SELECT t.entries INTO seen FROM ratelimit.rl_entries AS t WHERE t.key = k AND t.kind = 'lease';
    RETURN (ratelimit.rl__entries_step('in_flight', fn, seen, NULL, FOUND, '{}', now)).answer::bigint;
END

-- function: rl_penalize
DECLARE
    fn CONSTANT text := 'rl_penalize';
    s text := ratelimit.rl__name(fn, 'subject', subject);
    base_ms bigint;
    max_ms bigint;
    window_ms bigint;
    now bigint;
BEGIN
    IF free_strikes IS NULL OR free_strikes < 0 OR free_strikes > @MAX_FREE_STRIKES@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_FREE_STRIKES@, coalesce(free_strikes::text, 'NULL')));
    END IF;
    base_ms := ratelimit.rl__duration_ms(fn, 'base_seconds', base_seconds);
    max_ms := ratelimit.rl__duration_ms(fn, 'max_seconds', max_seconds);
    window_ms := ratelimit.rl__duration_ms(fn, 'window_seconds', window_seconds);
    now := ratelimit.rl__now(fn, now_ms);
    RETURN ratelimit.rl__entries_change(fn, s, 'block', 'penalize', jsonb_build_object('free', free_strikes,
        'base_ms', base_ms, 'max_ms', max_ms, 'window_ms', window_ms), now, ratelimit.rl__strikes_encode(0, 0, 0, false, NULL));
END

-- function: rl_block
DECLARE
    fn CONSTANT text := 'rl_block';
    s text := ratelimit.rl__name(fn, 'subject', subject);
    length_ms bigint := CASE WHEN seconds IS NOT NULL THEN ratelimit.rl__duration_ms(fn, 'seconds', seconds) END;
    now bigint := ratelimit.rl__now(fn, now_ms);
BEGIN
    RETURN ratelimit.rl__entries_change(fn, s, 'block', 'block', jsonb_build_object('length_ms', length_ms), now,
        ratelimit.rl__strikes_encode(0, 0, 0, false, NULL));
END

-- function: rl_unblock
DECLARE
    fn CONSTANT text := 'rl_unblock';
    @ARGUMENTS@
BEGIN
    RETURN ratelimit.rl__entries_change(fn, s, 'block', 'unblock', '{}', now,
        ratelimit.rl__strikes_encode(0, 0, 0, false, NULL))::boolean;
END

-- function: rl_take_all, rl_take_all_compact
DECLARE
    fn CONSTANT text := '@FN@';
    now bigint;
BEGIN
    PERFORM ratelimit.rl__json_arg(fn, 'limits', limits, 'a JSON array');
    now := ratelimit.rl__now(fn, now_ms);
    RETURN @ANSWER@(ratelimit.rl__take_all(fn, ratelimit.rl__limit_items(fn, limits), now));
END

-- function: rl_refund_all
DECLARE
    fn CONSTANT text := 'rl_refund_all';
    now bigint;
    items jsonb;
BEGIN
    PERFORM ratelimit.rl__json_arg(fn, 'limits', limits, 'a JSON array');
    now := ratelimit.rl__now(fn, now_ms);
    items := ratelimit.rl__limit_items(fn, limits);
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    RETURN jsonb_build_object('items', ratelimit.rl__change_items(fn, 'refund', items, now));
END

-- function: rl_charge_all
DECLARE
    fn CONSTANT text := 'rl_charge_all';
    now bigint;
    items jsonb;
BEGIN
    PERFORM ratelimit.rl__json_arg(fn, 'limits', limits, 'a JSON array');
    now := ratelimit.rl__now(fn, now_ms);
    items := ratelimit.rl__limit_items(fn, limits);
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    RETURN jsonb_build_object('admitted', true, 'retry_after_ms', 0, 'retry_after_seconds', 0,
                              'items', ratelimit.rl__change_items(fn, 'charge', items, now));
END

-- function: rl_policy_set
DECLARE
    fn CONSTANT text := 'rl_policy_set';
    @ARGUMENTS@
    p record;
BEGIN
    PERFORM ratelimit.rl__json_arg(fn, 'definition', definition, 'JSON');
    p := ratelimit.rl__policy_parse(fn, definition);
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    -- a revision drawn anew, as the native library's connections compare it
    INSERT INTO ratelimit.rl_policy (name, definition, revision)
    VALUES (n, p.canonical, ('x' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 16))::bit(64)::bigint)
    ON CONFLICT ON CONSTRAINT rl_policy_pkey DO UPDATE SET definition = EXCLUDED.definition, revision = EXCLUDED.revision;
    RETURN p.canonical::jsonb;
END

-- function: rl_policy_validate
DECLARE
    fn CONSTANT text := 'rl_policy_validate';
BEGIN
    PERFORM ratelimit.rl__json_arg(fn, 'definition', definition, 'JSON');
    RETURN (ratelimit.rl__policy_parse(fn, definition)).canonical::jsonb;
END

-- function: rl_policy_drop
DECLARE
    fn CONSTANT text := 'rl_policy_drop';
    @ARGUMENTS@
BEGIN
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    DELETE FROM ratelimit.rl_policy AS t WHERE t.name = n;
    RETURN FOUND;
END

-- function: rl_check, rl_check_compact
DECLARE
    fn CONSTANT text := '@FN@';
    p text := ratelimit.rl__name(fn, 'policy', policy);
    s text := ratelimit.rl__name(fn, 'subject', subject);
    c double precision := ratelimit.rl__micros_of(fn, 'cost', cost)::float8 / @MICROS_PER_UNIT@;
    t text := CASE WHEN tier IS NOT NULL THEN ratelimit.rl__name(fn, 'tier', tier) END;
    now bigint := ratelimit.rl__now(fn, now_ms);
    pi record;
    entries text;
    st record;
    blocked boolean;
    d jsonb;
    refused boolean;
    answer jsonb;
    one_burst double precision;
    one_rate double precision;
    refill double precision;
    counted boolean;
    row_level double precision;
    row_refilled_at bigint;
    row_full_at bigint;
BEGIN
    IF t IS NULL AND ratelimit.rl__hot_ok() THEN
        -- A policy of one bucket, no tier, a subject never blocked nor penalized, and a row
        -- that admits: rl_take's one statement (there), on the policy's limit and key.
        UPDATE ratelimit.rl_bucket AS b
        SET level = ratelimit.rl__taken_level(b.level, b.refilled_at, l.burst, l.rate, c, now),
            refilled_at = greatest(b.refilled_at, now),
            full_at = ratelimit.rl__taken_full_at(b.level, b.refilled_at, l.burst, l.rate, c, now)
        FROM ratelimit.rl__one_bucket(p) AS l
        WHERE b.key = ratelimit.rl__policy_key(p, s, 0) AND abs(b.level) < 1e16
          AND c <= ratelimit.rl__refilled_level(b.level, b.refilled_at, l.burst, l.rate, now)
          AND NOT EXISTS (SELECT FROM ratelimit.rl_entries AS e WHERE e.key = s AND e.kind = 'block')
        RETURNING b.level, b.refilled_at, b.full_at, l.burst, l.rate, l.refill
        INTO row_level, row_refilled_at, row_full_at, one_burst, one_rate, refill;
        IF NOT FOUND THEN
            -- Nothing written: no row (the subject's first call), a row that refuses, or a
            -- policy or subject the statement leaves alone. The policy's one bucket and the
            -- subject's row, read together:
            SELECT l.burst, l.rate, l.refill, x.level, x.refilled_at
            INTO one_burst, one_rate, refill, row_level, row_refilled_at
            FROM ratelimit.rl__one_bucket(p) AS l
            LEFT JOIN ratelimit.rl_bucket AS x ON x.key = ratelimit.rl__policy_key(p, s, 0)
            WHERE NOT EXISTS (SELECT FROM ratelimit.rl_entries AS e WHERE e.key = s AND e.kind = 'block');
            IF NOT FOUND THEN
                NULL;  -- another policy, or a subject with strikes: the checked path
            ELSIF row_refilled_at IS NOT NULL THEN
                IF c > ratelimit.rl__level_at(true, row_level, row_refilled_at, one_burst, one_rate, now) THEN
                    -- A refusal, answered from the read as the checked path answers it:
                    -- the one bucket's answer, its wait the call's, counted and summarised.
                    answer := (ratelimit.rl__take_decision(true, row_level, row_refilled_at, one_burst, one_rate,
                                                           c, now)).answer;
                    counted := ratelimit.rl__count(p, 'refused');
                    PERFORM ratelimit.rl__refuse(p, s, now);
                    RETURN @ANSWER@(ratelimit.rl__one_bucket_check_answer(answer, p, t, true));
                END IF;
                FOUND := false;  -- a row that admits by now: the checked path
            ELSIF c <= one_burst THEN
                -- no row: the bucket's full row, taken from, unless the key has a row by then
                -- (left to the checked path)
                INSERT INTO ratelimit.rl_bucket AS b (key, level, refilled_at, full_at)
                VALUES (ratelimit.rl__policy_key(p, s, 0), one_burst - c, now,
                        ratelimit.rl__taken_full_at(one_burst, now, one_burst, one_rate, c, now))
                ON CONFLICT ON CONSTRAINT rl_bucket_pkey DO NOTHING
                RETURNING b.level, b.refilled_at, b.full_at INTO row_level, row_refilled_at, row_full_at;
            ELSE
                FOUND := false;  -- a cost above the burst: the checked path answers it
            END IF;
        END IF;
        IF FOUND THEN
            -- taken, by the UPDATE or the INSERT: the answer from the row written, as in
            -- rl_take (there, why not in RETURNING), or the exact wait where the estimate is
            -- off the edge
            IF ratelimit.rl__full_at_is_edge(row_level, row_refilled_at, row_full_at, one_burst, one_rate, now) THEN
                answer := ratelimit.rl__taken_answer(row_level, one_burst, row_full_at - now, refill);
            ELSE
                answer := ratelimit.rl__taken_exact(ratelimit.rl__policy_key(p, s, 0), one_burst, one_rate, now, refill);
            END IF;
            counted := ratelimit.rl__count(p, 'admitted');
            RETURN @ANSWER@(ratelimit.rl__one_bucket_check_answer(answer, p, t, false));
        END IF;
    END IF;
    pi := ratelimit.rl__policy_items(fn, p, s, t, c);
    SELECT r.entries INTO entries FROM ratelimit.rl_entries AS r WHERE r.key = s AND r.kind = 'block';
    st := ratelimit.rl__strikes_decode(fn, entries);
    blocked := st.blocked AND (st.until IS NULL OR st.until > now);
    IF blocked THEN
        -- a blocked subject is refused, charging nothing: every limit as it is now
        pi := ratelimit.rl__policy_items(fn, p, s, t, 0);
    END IF;
    d := ratelimit.rl__take_all(fn, ratelimit.rl__sorted_items(fn, pi.items), now, blocked);
    refused := blocked OR NOT (d ->> 'admitted')::boolean;
    PERFORM ratelimit.rl__count(p, CASE WHEN NOT refused THEN 'admitted' WHEN pi.shadow THEN 'would_refuse'
                                        WHEN blocked THEN 'refused_blocked' ELSE 'refused' END);
    IF refused AND NOT pi.shadow THEN
        PERFORM ratelimit.rl__refuse(p, s, now);
    END IF;
    IF pi.shadow THEN
        d := d || jsonb_build_object('admitted', true, 'retry_after_ms', 0, 'retry_after_seconds', 0);
    ELSIF blocked THEN
        d := d || jsonb_build_object('admitted', false, 'retry_after_ms', st.until - now,
                                     'retry_after_seconds', ratelimit.rl__ceil_seconds(st.until - now));
    END IF;
    RETURN @ANSWER@(d || jsonb_build_object('policy', p, 'tier', t, 'shadow', pi.shadow, 'would_refuse', refused,
                                           'blocked', blocked));
END

-- function: rl_refund_check
DECLARE
    fn CONSTANT text := 'rl_refund_check';
    p text := ratelimit.rl__name(fn, 'policy', policy);
    s text := ratelimit.rl__name(fn, 'subject', subject);
    c double precision := ratelimit.rl__micros_of(fn, 'cost', cost)::float8 / @MICROS_PER_UNIT@;
    t text := CASE WHEN tier IS NOT NULL THEN ratelimit.rl__name(fn, 'tier', tier) END;
    now bigint := ratelimit.rl__now(fn, now_ms);
    pi record;
BEGIN
    pi := ratelimit.rl__policy_items(fn, p, s, t, c);
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    RETURN jsonb_build_object('policy', p, 'tier', t, 'items', ratelimit.rl__change_items(fn, 'refund', pi.items, now));
END

-- function: rl_charge_check
DECLARE
    fn CONSTANT text := 'rl_charge_check';
    p text := ratelimit.rl__name(fn, 'policy', policy);
    s text := ratelimit.rl__name(fn, 'subject', subject);
    c double precision := ratelimit.rl__micros_of(fn, 'amount', amount)::float8 / @MICROS_PER_UNIT@;
    t text := CASE WHEN tier IS NOT NULL THEN ratelimit.rl__name(fn, 'tier', tier) END;
    now bigint := ratelimit.rl__now(fn, now_ms);
    pi record;
BEGIN
    pi := ratelimit.rl__policy_items(fn, p, s, t, c);
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    RETURN jsonb_build_object('admitted', true, 'retry_after_ms', 0, 'retry_after_seconds', 0,
                              'items', ratelimit.rl__change_items(fn, 'charge', pi.items, now), 'policy', p, 'tier', t);
END

-- function: rl_peek_check
DECLARE
    fn CONSTANT text := 'rl_peek_check';
    p text := ratelimit.rl__name(fn, 'policy', policy);
    s text := ratelimit.rl__name(fn, 'subject', subject);
    c double precision := ratelimit.rl__peek_micros(fn, 'cost', cost)::float8 / @MICROS_PER_UNIT@;
    t text := CASE WHEN tier IS NOT NULL THEN ratelimit.rl__name(fn, 'tier', tier) END;
    now bigint := ratelimit.rl__now(fn, now_ms);
    pi record;
    entries text;
    st record;
    blocked boolean;
    d jsonb;
    refused boolean;
BEGIN
    pi := ratelimit.rl__policy_items(fn, p, s, t, c);
    SELECT r.entries INTO entries FROM ratelimit.rl_entries AS r WHERE r.key = s AND r.kind = 'block';
    st := ratelimit.rl__strikes_decode(fn, entries);
    blocked := st.blocked AND (st.until IS NULL OR st.until > now);
    IF blocked THEN
        pi := ratelimit.rl__policy_items(fn, p, s, t, 0);
    END IF;
    -- decided on the rows as they stand, writing and counting nothing
    d := ratelimit.rl__take_all(fn, ratelimit.rl__sorted_items(fn, pi.items), now, true);
    refused := blocked OR NOT (d ->> 'admitted')::boolean;
    IF pi.shadow THEN
        d := d || jsonb_build_object('admitted', true, 'retry_after_ms', 0, 'retry_after_seconds', 0);
    ELSIF blocked THEN
        d := d || jsonb_build_object('admitted', false, 'retry_after_ms', st.until - now,
                                     'retry_after_seconds', ratelimit.rl__ceil_seconds(st.until - now));
    END IF;
    RETURN d || jsonb_build_object('policy', p, 'tier', t, 'shadow', pi.shadow, 'would_refuse', refused, 'blocked', blocked);
END

-- function: rl_policy_stats
DECLARE
    -- the policies the session counted (rl__count), each with its four counts
    names text[] := coalesce(nullif(current_setting('pg_ratelimit_sql.counted', true), ''), '{}');
BEGIN
    RETURN jsonb_build_object('scope', 'session', 'policies', coalesce((
        SELECT jsonb_object_agg(u.name, jsonb_build_object(
            'admitted', coalesce(nullif(current_setting(c.s || '_admitted', true), ''), '0')::bigint,
            'refused', coalesce(nullif(current_setting(c.s || '_refused', true), ''), '0')::bigint,
            'would_refuse', coalesce(nullif(current_setting(c.s || '_would_refuse', true), ''), '0')::bigint,
            'refused_blocked', coalesce(nullif(current_setting(c.s || '_refused_blocked', true), ''), '0')::bigint))
        FROM unnest(names) AS u(name), LATERAL (SELECT ratelimit.rl__counted(u.name) AS s) AS c), '{}'));
END

-- function: rl_stats_reset
DECLARE
    names text[] := coalesce(nullif(current_setting('pg_ratelimit_sql.counted', true), ''), '{}');
    n bigint := coalesce(cardinality(names), 0);
BEGIN
    -- every policy's counts, and its mark: counted again, it is listed again (rl__count)
    PERFORM set_config(c.s || x.part, '', false)
    FROM unnest(names) AS u(name), LATERAL (SELECT ratelimit.rl__counted(u.name) AS s) AS c,
         unnest(ARRAY['', '_admitted', '_refused', '_would_refuse', '_refused_blocked']) AS x(part);
    PERFORM set_config('pg_ratelimit_sql.counted', '{}', false);
    -- every policy's refused subjects: a policy not numbered starts with empty entries (rl__refuse)
    PERFORM set_config('pg_ratelimit_sql.refused_slots', '{}', false);
    RETURN n;
END

-- function: rl_top_refused
DECLARE
    fn CONSTANT text := 'rl_top_refused';
    @ARGUMENTS@
    slot text := coalesce(nullif(current_setting('pg_ratelimit_sql.refused_slots', true), ''), '{}')::jsonb ->> p;
BEGIN
    IF n IS NULL OR n < 1 OR n > @REFUSED_ENTRIES@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_INTEGER_RANGE@, 'n', @REFUSED_ENTRIES@, coalesce(n::text, 'NULL')));
    END IF;
    IF slot IS NULL THEN
        RETURN jsonb_build_object('policy', p, 'scope', 'session', 'subjects', '[]'::jsonb);
    END IF;
    -- the policy's entries (rl__refuse), each subject shown as its first
    -- @REFUSED_SUBJECT_BYTES@ bytes cut at a character (refused::shown), most refused first,
    -- then by those bytes (refused::RefusedSlots::top)
    RETURN jsonb_build_object('policy', p, 'scope', 'session', 'subjects', coalesce((
        SELECT jsonb_agg(jsonb_build_object('subject', x.shown, 'refusals', x.refusals,
                                            'error', x.error, 'last_refused_ms', x.last_at)
                         ORDER BY x.i)
        FROM (SELECT y.shown, y.refusals, y.error, y.last_at,
                     row_number() OVER (ORDER BY y.refusals DESC, y.shown COLLATE "C") AS i
              FROM (SELECT left(u.subject, (SELECT max(c) FROM generate_series(0, @REFUSED_SUBJECT_BYTES@) AS c
                                            WHERE octet_length(left(u.subject, c)) <= @REFUSED_SUBJECT_BYTES@)) AS shown,
                           u.refusals, u.error, u.last_at
                    FROM unnest(current_setting('pg_ratelimit_sql.refused_' || slot || '_k')::text[],
                                current_setting('pg_ratelimit_sql.refused_' || slot || '_n')::bigint[],
                                current_setting('pg_ratelimit_sql.refused_' || slot || '_e')::bigint[],
                                current_setting('pg_ratelimit_sql.refused_' || slot || '_t')::bigint[])
                         AS u(subject, refusals, error, last_at)) AS y) AS x
        WHERE x.i <= n), '[]'::jsonb));
END

-- function: rl_budgets_near
DECLARE
    fn CONSTANT text := 'rl_budgets_near';
    now bigint;
BEGIN
    -- the arguments in their order, as call_args::BudgetsNearArgs checks them
    IF fraction IS NULL OR NOT (fraction >= 0 AND fraction <= @MAX_NEAR_FRACTION@) THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_FRACTION_RANGE@, @MAX_NEAR_FRACTION@, ratelimit.rl__describe(fraction)));
    END IF;
    IF n IS NULL OR n < 1 OR n > @MAX_NEAR@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_INTEGER_RANGE@, 'n', @MAX_NEAR@, coalesce(n::text, 'NULL')));
    END IF;
    now := ratelimit.rl__now(fn, now_ms);
    -- sql/statements/budgets_near.sql: a scan of every budget row, the largest share of the quota first
    RETURN jsonb_build_object('fraction', ratelimit.rl__number(fraction), 'budgets', coalesce((
        SELECT jsonb_agg(jsonb_build_object('key', x.key, 'period', x.period, 'used', ratelimit.rl__micros(x.used),
                                            'quota', ratelimit.rl__micros(x.quota), 'resets_at', x.resets_at / 1000)
                         ORDER BY x.i)
        FROM (SELECT t.key, t.period, t.used, t.quota, t.resets_at,
                     row_number() OVER (ORDER BY t.used::float8 / t.quota::float8 DESC, t.key COLLATE "C", t.period COLLATE "C") AS i
              FROM ratelimit.rl_budget AS t
              WHERE t.resets_at > now AND t.quota > 0 AND t.used::float8 / t.quota::float8 >= fraction) AS x
        WHERE x.i <= n), '[]'::jsonb));
END

-- function: rl_usage
DECLARE
    fn CONSTANT text := 'rl_usage';
    @ARGUMENTS@
    from_at bigint;
    to_at bigint;
    found_n bigint;
BEGIN
    -- the arguments in their order, as call_args::UsageArgs checks them
    SELECT r.from_at, r.to_at INTO from_at, to_at FROM ratelimit.rl__usage_range(fn, from_ms, to_ms) AS r;
    SELECT count(*) INTO found_n FROM (SELECT FROM ratelimit.rl_usage AS u
        WHERE u.key = k AND u.ends_at > from_at AND u.ends_at <= to_at LIMIT @MAX_USAGE_PERIODS@ + 1) AS c;
    IF found_n > @MAX_USAGE_PERIODS@ THEN
        RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = fn || ': ' || format(@MSG_USAGE_TOO_MANY@, @MAX_USAGE_PERIODS@);
    END IF;
    -- sql/statements/usage_read.sql: the key's kept periods by end, then period
    RETURN jsonb_build_object('key', k, 'from_ms', from_at, 'to_ms', to_at, 'periods', coalesce((
        SELECT jsonb_agg(jsonb_build_object('period', u.period, 'starts_at', u.starts_at / 1000, 'ends_at', u.ends_at / 1000,
                                            'used', ratelimit.rl__micros(u.used), 'quota', ratelimit.rl__micros(u.quota))
                         ORDER BY u.ends_at, u.period COLLATE "C")
        FROM ratelimit.rl_usage AS u
        WHERE u.key = k AND u.ends_at > from_at AND u.ends_at <= to_at), '[]'::jsonb));
END

-- function: rl_usage_all
DECLARE
    fn CONSTANT text := 'rl_usage_all';
    from_at bigint;
    to_at bigint;
    after_at bigint;
    after_key text := '';
    after_period text := '';
    cursor_ok boolean;
    page jsonb;
    found_n bigint;
    last_place jsonb;
BEGIN
    -- the arguments in their order, as call_args::UsageAllArgs checks them
    SELECT r.from_at, r.to_at INTO from_at, to_at FROM ratelimit.rl__usage_range(fn, from_ms, to_ms) AS r;
    -- from the start: after (from_at, '', ''), before every period that ended later
    after_at := from_at;
    IF after IS NOT NULL THEN
        -- budget::UsageCursor as rl_usage_all answers it in next: [ends_at_ms, key, period];
        -- what is none named by its JSON type, as call_args::UsageAllArgs names it
        IF jsonb_typeof(after) <> 'array' OR jsonb_array_length(after) <> 3 THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_USAGE_CURSOR@, CASE jsonb_typeof(after)
                WHEN 'array' THEN format('an array of %s values', jsonb_array_length(after))
                WHEN 'null' THEN 'null' WHEN 'boolean' THEN 'a boolean' WHEN 'number' THEN 'a number'
                WHEN 'string' THEN 'a string' ELSE 'an object' END));
        END IF;
        cursor_ok := jsonb_typeof(after -> 0) = 'number' AND jsonb_typeof(after -> 1) = 'string'
            AND jsonb_typeof(after -> 2) = 'string';
        IF cursor_ok THEN
            cursor_ok := (after ->> 0) ~ '^[0-9]{1,16}$' AND (after ->> 0)::bigint <= @MAX_NOW_MS@;
        END IF;
        IF NOT cursor_ok THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_USAGE_CURSOR_PARTS@, @MAX_NOW_MS@));
        END IF;
        after_at := (after ->> 0)::bigint;
        after_key := after ->> 1;
        after_period := after ->> 2;
    END IF;
    IF n IS NULL OR n < 1 OR n > @MAX_USAGE_PERIODS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_INTEGER_RANGE@, 'n', @MAX_USAGE_PERIODS@, coalesce(n::text, 'NULL')));
    END IF;
    -- sql/statements/usage_page.sql: one more than the page, which tells whether more follow
    SELECT coalesce(jsonb_agg(jsonb_build_object('key', u.key, 'period', u.period, 'starts_at', u.starts_at / 1000,
                                                 'ends_at', u.ends_at / 1000, 'used', ratelimit.rl__micros(u.used),
                                                 'quota', ratelimit.rl__micros(u.quota))
                              ORDER BY u.i) FILTER (WHERE u.i <= n), '[]'::jsonb),
           count(*),
           (array_agg(jsonb_build_array(u.ends_at, u.key, u.period) ORDER BY u.i))[n::int]
    INTO page, found_n, last_place
    FROM (SELECT t.key, t.period, t.starts_at, t.ends_at, t.used, t.quota,
                 row_number() OVER (ORDER BY t.ends_at, t.key COLLATE "C", t.period COLLATE "C") AS i
          FROM (SELECT r.key, r.period, r.starts_at, r.ends_at, r.used, r.quota FROM ratelimit.rl_usage AS r
                WHERE r.ends_at > from_at AND r.ends_at <= to_at
                  AND (r.ends_at, r.key COLLATE "C", r.period COLLATE "C") > (after_at, after_key, after_period)
                ORDER BY r.ends_at, r.key COLLATE "C", r.period COLLATE "C" LIMIT n + 1) AS t) AS u;
    RETURN jsonb_build_object('from_ms', from_at, 'to_ms', to_at, 'periods', page,
                              'next', CASE WHEN found_n > n THEN last_place END);
END

-- function: rl_usage_retention
DECLARE
    fn CONSTANT text := 'rl_usage_retention';
BEGIN
    -- as call_args::retention_days and rows::usage_retention
    IF days IS NULL THEN
        RETURN coalesce((SELECT s.value FROM ratelimit.rl_setting AS s WHERE s.name = '@USAGE_RETENTION_SETTING@'),
                        @USAGE_KEPT_MS@) / @MS_PER_DAY@;
    END IF;
    IF days < 1 OR days > @MAX_RETENTION_DAYS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_INTEGER_RANGE@, 'days', @MAX_RETENTION_DAYS@, days));
    END IF;
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    INSERT INTO ratelimit.rl_setting AS s (name, value) VALUES ('@USAGE_RETENTION_SETTING@', days * @MS_PER_DAY@)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
    RETURN days;
END

-- function: rl_headers
BEGIN
    PERFORM ratelimit.rl__json_arg('rl_headers', 'result', result, 'JSON text');
    RETURN ratelimit.rl__headers('rl_headers', result);
END
