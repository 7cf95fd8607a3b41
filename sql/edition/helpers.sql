-- The rules every function of the SQL edition shares, in the schema ratelimit (no
-- privileges for anyone but the owner, so only the rl_* functions, which run as their
-- owner, can call them). Each is the counterpart of a rule of the native library's core
-- (shared/src): the same arithmetic in the same order on the same IEEE doubles, the same
-- error texts and SQLSTATEs, so both editions answer alike (tests/test_sql_edition.py).

-- The helpers hold no state: a newer script drops them all and makes them anew, so one
-- whose arguments or result changed between releases is replaced, not refused.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'ratelimit'::regnamespace AND p.proname LIKE 'rl\_\_%' LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END
$$;

-- An argument error: 22023 with the function's name first, as the core's Error::invalid.
CREATE OR REPLACE FUNCTION ratelimit.rl__invalid(fn text, message text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = fn || ': ' || message;
END
$$;

-- A number as an error message shows it (args::format_real): NaN, Infinity, the exponent
-- form outside [1e-6, 1e16), else the plain shortest decimal.
CREATE OR REPLACE FUNCTION ratelimit.rl__describe(v double precision) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET extra_float_digits = 1 AS $$
BEGIN
    IF v IS NULL THEN RETURN 'NULL'; END IF;
    IF v = 'NaN'::float8 THEN RETURN 'NaN'; END IF;
    IF v = 'Infinity'::float8 THEN RETURN 'Infinity'; END IF;
    IF v = '-Infinity'::float8 THEN RETURN '-Infinity'; END IF;
    IF v <> 0 AND NOT (abs(v) >= 1e-6 AND abs(v) < 1e16) THEN
        -- float8out writes 1e+308 and 5e-07; the core writes 1e308 and 5e-7
        RETURN regexp_replace(v::text, 'e(-?)\+?0*([0-9]+)$', 'e\1\2');
    END IF;
    IF v::text = '-0' THEN RETURN '-0'; END IF;
    RETURN v::text::numeric::text;
END
$$;

-- The range of rl_usage and rl_usage_all (call_args::usage_range): epoch ms, to_ms not
-- before from_ms.
CREATE OR REPLACE FUNCTION ratelimit.rl__usage_range(fn text, from_ms double precision, to_ms double precision,
                                                     OUT from_at bigint, OUT to_at bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT coalesce(from_ms = trunc(from_ms) AND from_ms >= 0 AND from_ms <= @MAX_NOW_MS@, false) THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_EPOCH_MS_RANGE@, 'from_ms', @MAX_NOW_MS@, ratelimit.rl__describe(from_ms)));
    END IF;
    IF NOT coalesce(to_ms = trunc(to_ms) AND to_ms >= 0 AND to_ms <= @MAX_NOW_MS@, false) THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_EPOCH_MS_RANGE@, 'to_ms', @MAX_NOW_MS@, ratelimit.rl__describe(to_ms)));
    END IF;
    from_at := from_ms::bigint;
    to_at := to_ms::bigint;
    IF to_at < from_at THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_USAGE_RANGE@, from_at, to_at));
    END IF;
END
$$;

-- The shortest decimal that reads back as v (float8out's, whatever extra_float_digits the
-- caller set): a function of its own, since its SET costs every call that makes one.
CREATE OR REPLACE FUNCTION ratelimit.rl__shortest(v double precision) RETURNS numeric
LANGUAGE sql IMMUTABLE SET extra_float_digits = 1 AS $$
    SELECT v::text::numeric
$$;

-- A double as the core writes it in an answer (json::number_form): whole numbers below
-- 9e15 as integers, others in their shortest exact form, non-finite ones (and NULL) as
-- NULL, which jsonb_build_object writes as null. As a value of jsonb_build_object it costs
-- less than rl__number's jsonb, which that function would take apart again.
CREATE OR REPLACE FUNCTION ratelimit.rl__number_value(v double precision) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v = trunc(v) AND abs(v) < 9e15 THEN v::bigint::numeric
                WHEN abs(v) < 'Infinity'::float8 THEN ratelimit.rl__shortest(v) END
$$;

-- rl__number_value as a JSON value: null where it is NULL.
CREATE OR REPLACE FUNCTION ratelimit.rl__number(v double precision) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(to_jsonb(ratelimit.rl__number_value(v)), 'null'::jsonb)
$$;


-- An exact amount kept in millionths (json's Json::micros): 1000000 is 1, 300000 is 0.3.
-- (The SQL helpers are STABLE where they call to_jsonb or format, as those are, so that
-- PostgreSQL inlines them into the calling expression instead of running each as a query.)
CREATE OR REPLACE FUNCTION ratelimit.rl__micros(micros bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN micros % @MICROS_PER_UNIT@ = 0 THEN to_jsonb(micros / @MICROS_PER_UNIT@)
                ELSE to_jsonb(trim_scale(micros::numeric / @MICROS_PER_UNIT@)) END
$$;

-- Whole seconds, rounded up (units::ceil_seconds): a wait of 1 ms is 1 s, never 0.
CREATE OR REPLACE FUNCTION ratelimit.rl__ceil_seconds(ms bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ms >= 0 THEN (ms + 999) / 1000 ELSE -((-ms) / 1000) END
$$;

-- A double rounded half away from zero (Rust's f64::round), for the positive amounts here.
CREATE OR REPLACE FUNCTION ratelimit.rl__round(x double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT trunc(x) + CASE WHEN x - trunc(x) >= 0.5 THEN 1 ELSE 0 END
$$;

-- The argument rules (args.rs). Each is an expression PostgreSQL inlines, passing a good
-- value through; a bad one goes to its *_error function, which raises the core's error.
-- The error functions are IMMUTABLE: PL/pgSQL takes a new snapshot for every expression
-- that calls anything less (about 15 us a call), and they are only ever called with a
-- variable among their arguments, so the planner never runs one ahead of its value.

-- A name (args::name): non-empty text of at most 1024 bytes; a key also must not start
-- with U+0001, the mark of policy keys (args::key).
CREATE OR REPLACE FUNCTION ratelimit.rl__name_error(fn text, what text, v text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF v IS NULL THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOT_TEXT@, what, 'NULL'));
    ELSIF v = '' THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_EMPTY@, what));
    ELSIF octet_length(v) > @MAX_KEY_BYTES@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_NAME_TOO_LONG@, what, @MAX_KEY_BYTES@, octet_length(v)));
    ELSIF what = 'key' AND left(v, 1) = chr(1) THEN
        PERFORM ratelimit.rl__invalid(fn, @MSG_POLICY_KEY@);
    END IF;
    RETURN v;
END
$$;

-- Whether rl__name passes v (false or NULL where it raises).
CREATE OR REPLACE FUNCTION ratelimit.rl__name_ok(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT v <> '' AND octet_length(v) <= @MAX_KEY_BYTES@
$$;

CREATE OR REPLACE FUNCTION ratelimit.rl__name(fn text, what text, v text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ratelimit.rl__name_ok(v) THEN v ELSE ratelimit.rl__name_error(fn, what, v) END
$$;

-- Whether rl__key passes key (false or NULL where it raises).
CREATE OR REPLACE FUNCTION ratelimit.rl__key_ok(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT ratelimit.rl__name_ok(key) AND key NOT LIKE E'\x01%'
$$;

CREATE OR REPLACE FUNCTION ratelimit.rl__key(fn text, key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ratelimit.rl__key_ok(key) THEN key ELSE ratelimit.rl__name_error(fn, 'key', key) END
$$;

-- A JSON argument (args::json_size): NULL is "<what> must be <wanted>, got NULL", and it
-- holds at most @MAX_JSON_BYTES@ bytes.
CREATE OR REPLACE FUNCTION ratelimit.rl__json_arg(fn text, what text, v jsonb, wanted text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF v IS NULL THEN
        PERFORM ratelimit.rl__invalid(fn, format('%s must be %s, got NULL', what, wanted));
    ELSIF pg_column_size(v) > @MAX_JSON_BYTES@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_JSON_TOO_LARGE@, what, @MAX_JSON_BYTES@, pg_column_size(v)));
    END IF;
    RETURN v;
END
$$;

-- The error of a number that is no finite number greater than 0 (of at least 0, with
-- zero), above max, below a millionth (amounts) or above a year (durations): the rules
-- of args::positive_number, token_number, cost_number, amount_micros and duration_ms.
CREATE OR REPLACE FUNCTION ratelimit.rl__number_error(fn text, what text, v double precision, max text, zero boolean)
RETURNS double precision LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF v IS NULL OR NOT (v > 0 AND v < 'Infinity'::float8) OR v = 'NaN'::float8 THEN
        PERFORM ratelimit.rl__invalid(fn, format(CASE WHEN zero THEN @MSG_NOT_AT_LEAST_ZERO@ ELSE @MSG_NOT_POSITIVE@ END,
                                                 what, ratelimit.rl__describe(v)));
    END IF;
    IF max = '@MAX_DURATION_SECONDS@' AND v > @MAX_DURATION_SECONDS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_DURATION_TOO_LONG@, what, @MAX_DURATION_SECONDS@, ratelimit.rl__describe(v)));
    END IF;
    IF max <> 'Infinity' AND v > max::float8 THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_AT_MOST@, what, max, ratelimit.rl__describe(v)));
    END IF;
    IF max = '@MAX_AMOUNT@' AND v < 1.0::float8 / @MICROS_PER_UNIT@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_BELOW_A_MILLIONTH@, what, ratelimit.rl__describe(v)));
    END IF;
    RETURN v;
END
$$;

-- A finite number greater than 0 (args::positive_number).
CREATE OR REPLACE FUNCTION ratelimit.rl__positive(fn text, what text, v double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v > 0 AND v < 'Infinity'::float8 THEN v
                ELSE ratelimit.rl__number_error(fn, what, v, 'Infinity', false) END
$$;

-- Whether rl__tokens passes v (false or NULL where it raises).
CREATE OR REPLACE FUNCTION ratelimit.rl__tokens_ok(v double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT v > 0 AND v <= @MAX_TOKENS@::float8
$$;

-- rl__tokens_ok for a rate whose refill seconds rl__hot_refill_seconds may work out: at
-- least 1e-280 (a rate below it takes the checked path).
CREATE OR REPLACE FUNCTION ratelimit.rl__hot_rate_ok(v double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT v >= 1e-280::float8 AND v <= @MAX_TOKENS@::float8
$$;

-- A bucket's burst, refill_per_minute or cost (args::token_number): at most 1e15.
CREATE OR REPLACE FUNCTION ratelimit.rl__tokens(fn text, what text, v double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ratelimit.rl__tokens_ok(v) THEN v
                ELSE ratelimit.rl__number_error(fn, what, v, '@MAX_TOKENS@', false) END
$$;

-- A cost that may also be 0 (the peeks: args::cost_number with zero allowed).
CREATE OR REPLACE FUNCTION ratelimit.rl__peek_tokens(fn text, what text, v double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v = 0 OR (v > 0 AND v <= @MAX_TOKENS@::float8) THEN v
                ELSE ratelimit.rl__number_error(fn, what, v, '@MAX_TOKENS@', true) END
$$;

-- Whether rl__micros_of passes v (false or NULL where it raises).
CREATE OR REPLACE FUNCTION ratelimit.rl__amount_ok(v double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT v >= 1.0::float8 / @MICROS_PER_UNIT@ AND v <= @MAX_AMOUNT@::float8
$$;

-- A budget amount as an exact count of millionths (args::amount_micros): 0.000001 to
-- 1,000,000,000, rounded half away from zero as Rust's f64::round.
CREATE OR REPLACE FUNCTION ratelimit.rl__micros_of(fn text, what text, v double precision) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ratelimit.rl__amount_ok(v) THEN ratelimit.rl__round(v * @MICROS_PER_UNIT@)::bigint
                ELSE ratelimit.rl__number_error(fn, what, v, '@MAX_AMOUNT@', false)::bigint END
$$;

-- A budget cost that may be 0 (rl_budget: args::cost_micros with zero allowed).
CREATE OR REPLACE FUNCTION ratelimit.rl__peek_micros(fn text, what text, v double precision) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v = 0 OR (v >= 1.0::float8 / @MICROS_PER_UNIT@ AND v <= @MAX_AMOUNT@::float8) THEN ratelimit.rl__round(v * @MICROS_PER_UNIT@)::bigint
                ELSE ratelimit.rl__number_error(fn, what, v, '@MAX_AMOUNT@', true)::bigint END
$$;

-- A number of seconds as whole milliseconds (args::duration_ms): above 0, at most a year,
-- rounded half away from zero, at least 1.
CREATE OR REPLACE FUNCTION ratelimit.rl__duration_ms(fn text, what text, seconds double precision) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN seconds > 0 AND seconds <= @MAX_DURATION_SECONDS@ THEN greatest(ratelimit.rl__round(seconds * 1000)::bigint, 1)
                ELSE ratelimit.rl__number_error(fn, what, seconds, '@MAX_DURATION_SECONDS@', false)::bigint END
$$;

-- A budget period that is none (args::period).
CREATE OR REPLACE FUNCTION ratelimit.rl__period_error(fn text, v text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD@,
        CASE WHEN v IS NULL THEN 'NULL' ELSE '''' || replace(left(v, 40), '''', '''''')
             || CASE WHEN length(v) > 40 THEN '...' ELSE '' END || '''' END));
    RETURN v;
END
$$;

-- A budget period's parts (period::Period::parse): its unit; its anchor's month (a year's),
-- day (a month's or year's day, a week's weekday from 0 for Monday) and minutes into the day
-- (the hour); its zone (NULL for UTC); and its canonical text. An error naming fn when v is
-- no period.
CREATE OR REPLACE FUNCTION ratelimit.rl__period_parts(fn text, v text, OUT unit text, OUT mon int, OUT dom int,
                                                      OUT mins int, OUT zone text, OUT canonical text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    w text[] := array_remove(string_to_array(v, ' '), '');
    n int := coalesce(cardinality(w), 0);
    i int := 2;
    a text[] := '{}';
    z text;
    hm text;
    ok boolean := true;
BEGIN
    unit := w[1];
    IF n = 0 OR unit NOT IN (@PERIODS@) THEN
        PERFORM ratelimit.rl__period_error(fn, v);
    END IF;
    IF w[2] = 'from' THEN
        i := 3;
        WHILE i <= n AND w[i] <> 'in' LOOP
            a := a || w[i];
            i := i + 1;
        END LOOP;
        IF cardinality(a) = 0 THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD_FORM@, ratelimit.rl__json_describe(to_jsonb(v))));
        END IF;
    END IF;
    IF w[i] = 'in' THEN
        IF n <> i + 1 THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD_FORM@, ratelimit.rl__json_describe(to_jsonb(v))));
        END IF;
        z := w[i + 1];
        i := i + 2;
    END IF;
    IF i <> n + 1 THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD_FORM@, ratelimit.rl__json_describe(to_jsonb(v))));
    END IF;
    mon := 1;
    dom := CASE WHEN unit IN ('month', 'year') THEN 1 ELSE 0 END;
    mins := 0;
    IF cardinality(a) > 0 THEN
        -- the anchor's time, HH:MM, last for a week, month or year
        IF unit IN ('week', 'month', 'year') AND cardinality(a) = 2 THEN
            hm := a[2];
            ok := hm ~ '^[0-9]{2}:[0-9]{2}$' AND left(hm, 2)::int < 24 AND right(hm, 2)::int < 60;
            mins := CASE WHEN ok THEN left(hm, 2)::int * 60 + right(hm, 2)::int ELSE 0 END;
        ELSIF cardinality(a) <> 1 THEN
            ok := false;
        END IF;
        CASE unit
            WHEN 'hour' THEN
                ok := ok AND a[1] ~ '^:[0-9]{2}$' AND right(a[1], 2)::int < 60;
                mins := CASE WHEN ok THEN right(a[1], 2)::int ELSE 0 END;
            WHEN 'day' THEN
                ok := ok AND a[1] ~ '^[0-9]{2}:[0-9]{2}$' AND left(a[1], 2)::int < 24 AND right(a[1], 2)::int < 60;
                mins := CASE WHEN ok THEN left(a[1], 2)::int * 60 + right(a[1], 2)::int ELSE 0 END;
            WHEN 'week' THEN
                dom := array_position(ARRAY[@WEEKDAYS@], a[1]) - 1;
                ok := ok AND dom IS NOT NULL;
            WHEN 'month' THEN
                ok := ok AND a[1] ~ '^[0-9]{1,2}$' AND a[1]::int BETWEEN 1 AND 31;
                dom := CASE WHEN ok THEN a[1]::int ELSE 1 END;
            ELSE
                ok := ok AND a[1] ~ '^[0-9]{2}-[0-9]{2}$' AND left(a[1], 2)::int BETWEEN 1 AND 12
                      AND right(a[1], 2)::int BETWEEN 1 AND ratelimit.rl__days_in_month(2000, left(a[1], 2)::int);
                mon := CASE WHEN ok THEN left(a[1], 2)::int ELSE 1 END;
                dom := CASE WHEN ok THEN right(a[1], 2)::int ELSE 1 END;
        END CASE;
        IF NOT ok THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD_ANCHOR@, CASE WHEN unit = 'hour' THEN 'an hour' ELSE 'a ' || unit END,
                                                     @PERIOD_ANCHOR_FORMS@::jsonb ->> unit,
                                                     ratelimit.rl__json_describe(to_jsonb(array_to_string(a, ' ')))));
        END IF;
    END IF;
    IF z IS NOT NULL THEN
        -- the zone as the database spells it, found without regard to (ASCII) case
        zone := @ZONES@::jsonb ->> translate(z, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz');
        IF zone IS NULL THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD_ZONE@, ratelimit.rl__json_describe(to_jsonb(z))));
        END IF;
        zone := nullif(zone, 'UTC');
        IF fn IS NOT NULL AND zone IS NOT NULL THEN
            BEGIN
                PERFORM timestamptz 'epoch' AT TIME ZONE zone;
            EXCEPTION WHEN invalid_parameter_value THEN
                -- a zone of the core's database that this server's does not hold (see the
                -- guide's "Time zone data")
                PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD_ZONE@, ratelimit.rl__json_describe(to_jsonb(z))));
            END;
        END IF;
    END IF;
    canonical := unit;
    IF (mon, dom, mins) IS DISTINCT FROM (1, CASE WHEN unit IN ('month', 'year') THEN 1 ELSE 0 END, 0) THEN
        hm := lpad((mins / 60)::text, 2, '0') || ':' || lpad((mins % 60)::text, 2, '0');
        canonical := canonical || ' from ' || CASE unit
            WHEN 'hour' THEN ':' || lpad(mins::text, 2, '0')
            WHEN 'day' THEN hm
            WHEN 'week' THEN (ARRAY[@WEEKDAYS@])[dom + 1]
            WHEN 'month' THEN dom::text
            ELSE lpad(mon::text, 2, '0') || '-' || lpad(dom::text, 2, '0') END
            || CASE WHEN unit IN ('week', 'month', 'year') AND mins <> 0 THEN ' ' || hm ELSE '' END;
    END IF;
    IF zone IS NOT NULL THEN
        canonical := canonical || ' in ' || zone;
    END IF;
END
$$;

-- A budget period in its canonical text (args::period).
CREATE OR REPLACE FUNCTION ratelimit.rl__period(fn text, v text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IN (@PERIODS@) THEN v ELSE (ratelimit.rl__period_parts(fn, v)).canonical END
$$;

-- The role calling a rl_* function (inside it current_user is the owner): the role SET
-- ROLE chose, else the session's. Only a member can SET ROLE to a role, so neither can be
-- claimed by one that is not.
CREATE OR REPLACE FUNCTION ratelimit.rl__caller() RETURNS name
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END
$$;

-- An explicit now_ms (args::now_ms), which this edition honours for the owner of its
-- functions and members of rl_admin only: a setting cannot be guarded without a library,
-- so pg_ratelimit.allow_explicit_clock has no say here.
-- Whether now_ms is an integer number of epoch milliseconds in range (args::now_ms).
CREATE OR REPLACE FUNCTION ratelimit.rl__now_ms_ok(now_ms double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT now_ms = trunc(now_ms) AND abs(now_ms) < 9e15 AND now_ms >= 0 AND now_ms <= @MAX_NOW_MS@
$$;

-- Whether the calling role may give an explicit now_ms: the owner and rl_admin's members
-- (rl_admin may not exist: an installing role without CREATEROLE administers alone).
CREATE OR REPLACE FUNCTION ratelimit.rl__may_set_clock() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    caller CONSTANT name := ratelimit.rl__caller();
BEGIN
    RETURN caller = current_user OR (EXISTS (SELECT FROM pg_roles WHERE rolname = 'rl_admin')
                                     AND pg_has_role(caller, 'rl_admin', 'MEMBER'));
END
$$;

CREATE OR REPLACE FUNCTION ratelimit.rl__explicit_now(fn text, now_ms double precision) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT ratelimit.rl__now_ms_ok(now_ms) THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOW_MS_RANGE@, @MAX_NOW_MS@, ratelimit.rl__describe(now_ms)));
    END IF;
    IF NOT ratelimit.rl__may_set_clock() THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = fn
            || ': an explicit now_ms is allowed only for the owner of pg_ratelimit_sql and members of rl_admin';
    END IF;
    RETURN now_ms::bigint;
END
$$;

-- The real time in epoch milliseconds (clock_timestamp), capped as every time is.
CREATE OR REPLACE FUNCTION ratelimit.rl__clock_ms() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT least(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, @MAX_NOW_MS@)
$$;

-- The clock reading of a call: the real time, or an explicit now_ms.
CREATE OR REPLACE FUNCTION ratelimit.rl__now(fn text, now_ms double precision) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN now_ms IS NULL THEN ratelimit.rl__clock_ms() ELSE ratelimit.rl__explicit_now(fn, now_ms) END
$$;

-- rl__now where it would not raise, else NULL (a hot path's clock: a call it leaves to the
-- checked path gets rl__now's error there, after the arguments before it).
CREATE OR REPLACE FUNCTION ratelimit.rl__now_or_null(now_ms double precision) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN now_ms IS NULL THEN ratelimit.rl__clock_ms()
                WHEN ratelimit.rl__now_ms_ok(now_ms) AND ratelimit.rl__may_set_clock() THEN now_ms::bigint END
$$;

-- The first day of the UTC month containing d.
CREATE OR REPLACE FUNCTION ratelimit.rl__month_start(d date) RETURNS date
LANGUAGE sql IMMUTABLE AS $$
    SELECT make_date(extract(year FROM d)::int, extract(month FROM d)::int, 1)
$$;

-- Days in a month of a year (period::days_in_month).
CREATE OR REPLACE FUNCTION ratelimit.rl__days_in_month(y int, m int) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT extract(day FROM make_date(y, m, 1) + interval '1 month' - interval '1 day')::int
$$;

-- a / b rounded down (div_euclid for a positive b).
CREATE OR REPLACE FUNCTION ratelimit.rl__floor_div(a bigint, b bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN a >= 0 THEN a / b ELSE -((b - 1 - a) / b) END
$$;

-- The instant of epoch ms t, exactly: whole seconds through to_timestamp, then the ms.
-- STABLE, as adding an interval to a timestamptz is, so PostgreSQL inlines it.
CREATE OR REPLACE FUNCTION ratelimit.rl__instant(t bigint) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT to_timestamp(ratelimit.rl__floor_div(t, 1000)::float8)
           + (t - ratelimit.rl__floor_div(t, 1000) * 1000) * interval '1 millisecond'
$$;

-- The local start of unit k of a period (period::Period::local_start): local times as epoch
-- ms of the same wall-clock reading in UTC; units counted from 1970 in local time.
CREATE OR REPLACE FUNCTION ratelimit.rl__local_start(unit text, mon int, dom int, mins int, k bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT mins::bigint * @MS_PER_MINUTE@ + CASE unit
        WHEN 'hour' THEN k * @MS_PER_HOUR@
        WHEN 'day' THEN k * @MS_PER_DAY@
        WHEN 'week' THEN (k * 7 + (dom + 4) % 7) * @MS_PER_DAY@
        WHEN 'month' THEN (make_date(ratelimit.rl__floor_div(k, 12)::int, (k - ratelimit.rl__floor_div(k, 12) * 12)::int + 1,
                                     least(dom, ratelimit.rl__days_in_month(ratelimit.rl__floor_div(k, 12)::int,
                                                                            (k - ratelimit.rl__floor_div(k, 12) * 12)::int + 1)))
                           - date '1970-01-01')::bigint * @MS_PER_DAY@
        ELSE (make_date(k::int, mon, least(dom, ratelimit.rl__days_in_month(k::int, mon))) - date '1970-01-01')::bigint * @MS_PER_DAY@ END
$$;

-- The instant a local time names in a zone (period::instant): PostgreSQL reads one that a
-- change skips with the offset before it, and one that happens twice as the later.
CREATE OR REPLACE FUNCTION ratelimit.rl__zoned_instant(zone text, local bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN zone IS NULL THEN local
                ELSE round(extract(epoch FROM (ratelimit.rl__instant(local) AT TIME ZONE 'UTC') AT TIME ZONE zone) * 1000)::bigint END
$$;

-- The start and end of the period containing now (period::Period::bounds): local starts are
-- numbered; the period is from the last that falls at or before now, read in the zone, to the
-- next one after it. The session keeps the last bounds worked out (the setting
-- pg_ratelimit_sql.period_bounds: starts, ends and the period's text), which hold for every
-- now from starts to before ends, so a call whose period a call before it used reads them
-- back instead of parsing the period and converting times in its zone again.
CREATE OR REPLACE FUNCTION ratelimit.rl__period_bounds(period text, now bigint, OUT starts bigint, OUT ends bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    memo CONSTANT text := current_setting('pg_ratelimit_sql.period_bounds', true);
    p record;
    loc bigint;
    d date;
    k bigint;
BEGIN
    IF memo IS NOT NULL AND substr(memo, strpos(memo, ' ') + 1) = period THEN
        starts := split_part(memo, ':', 1)::bigint;
        ends := split_part(split_part(memo, ' ', 1), ':', 2)::bigint;
        IF starts <= now AND now < ends THEN
            RETURN;
        END IF;
    END IF;
    p := ratelimit.rl__period_parts(NULL, period);
    loc := CASE WHEN p.zone IS NULL THEN now
                ELSE round(extract(epoch FROM ratelimit.rl__instant(now) AT TIME ZONE p.zone) * 1000)::bigint END;
    d := date '1970-01-01' + ratelimit.rl__floor_div(loc, @MS_PER_DAY@)::int;
    k := CASE p.unit
        WHEN 'hour' THEN ratelimit.rl__floor_div(loc - p.mins * @MS_PER_MINUTE@, @MS_PER_HOUR@)
        WHEN 'day' THEN ratelimit.rl__floor_div(loc - p.mins * @MS_PER_MINUTE@, @MS_PER_DAY@)
        WHEN 'week' THEN ratelimit.rl__floor_div(loc - p.mins * @MS_PER_MINUTE@ - ((p.dom + 4) % 7) * @MS_PER_DAY@, 7 * @MS_PER_DAY@)
        WHEN 'month' THEN extract(year FROM d)::bigint * 12 + extract(month FROM d)::bigint - 1
        ELSE extract(year FROM d)::bigint END;
    IF ratelimit.rl__local_start(p.unit, p.mon, p.dom, p.mins, k) > loc THEN
        k := k - 1;
    END IF;
    starts := ratelimit.rl__zoned_instant(p.zone, ratelimit.rl__local_start(p.unit, p.mon, p.dom, p.mins, k));
    WHILE starts > now LOOP
        k := k - 1;
        starts := ratelimit.rl__zoned_instant(p.zone, ratelimit.rl__local_start(p.unit, p.mon, p.dom, p.mins, k));
    END LOOP;
    k := k + 1;
    ends := ratelimit.rl__zoned_instant(p.zone, ratelimit.rl__local_start(p.unit, p.mon, p.dom, p.mins, k));
    WHILE ends <= now LOOP
        k := k + 1;
        ends := ratelimit.rl__zoned_instant(p.zone, ratelimit.rl__local_start(p.unit, p.mon, p.dom, p.mins, k));
    END LOOP;
    PERFORM set_config('pg_ratelimit_sql.period_bounds', starts || ':' || ends || ' ' || period, false);
END
$$;

-- The start of the period containing now, epoch ms (period::Period::start_ms): UTC units
-- from their start here (an ISO week starts on Monday; 1970-01-01 was a Thursday, three days
-- after one), anchored or zoned ones by rl__period_bounds.
CREATE OR REPLACE FUNCTION ratelimit.rl__period_start(period text, now bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE period
        WHEN 'day' THEN (now / @MS_PER_DAY@) * @MS_PER_DAY@
        WHEN 'hour' THEN (now / @MS_PER_HOUR@) * @MS_PER_HOUR@
        WHEN 'week' THEN (now / @MS_PER_DAY@ - (now / @MS_PER_DAY@ + 3) % 7) * @MS_PER_DAY@
        WHEN 'year' THEN (make_date(extract(year FROM date '1970-01-01' + (now / @MS_PER_DAY@)::int)::int, 1, 1)
                          - date '1970-01-01')::bigint * @MS_PER_DAY@
        WHEN 'month' THEN (ratelimit.rl__month_start(date '1970-01-01' + (now / @MS_PER_DAY@)::int) - date '1970-01-01')::bigint * @MS_PER_DAY@
        ELSE (ratelimit.rl__period_bounds(period, now)).starts END
$$;

-- The end (exclusive) of the period containing now, epoch ms (period::Period::end_ms): a
-- UTC month's end is the first of the month 32 days after its start. STABLE, as
-- rl__period_bounds is (a zone's rules are the server's data), and so PostgreSQL inlines
-- this one and rl__period_start into their callers' expressions: declared IMMUTABLE, each
-- ran as a SQL function of its own, about ten times as long.
CREATE OR REPLACE FUNCTION ratelimit.rl__period_end(period text, now bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE period
        WHEN 'day' THEN (now / @MS_PER_DAY@ + 1) * @MS_PER_DAY@
        WHEN 'hour' THEN (now / @MS_PER_HOUR@ + 1) * @MS_PER_HOUR@
        WHEN 'week' THEN (now / @MS_PER_DAY@ - (now / @MS_PER_DAY@ + 3) % 7 + 7) * @MS_PER_DAY@
        WHEN 'year' THEN (make_date(extract(year FROM date '1970-01-01' + (now / @MS_PER_DAY@)::int)::int + 1, 1, 1)
                          - date '1970-01-01')::bigint * @MS_PER_DAY@
        WHEN 'month' THEN (ratelimit.rl__month_start(ratelimit.rl__month_start(date '1970-01-01' + (now / @MS_PER_DAY@)::int) + 32)
              - date '1970-01-01')::bigint * @MS_PER_DAY@
        ELSE (ratelimit.rl__period_bounds(period, now)).ends END
$$;

-- a / b and a * b as IEEE doubles give them, infinite past the largest double (PostgreSQL
-- raises an error there instead).
CREATE OR REPLACE FUNCTION ratelimit.rl__div(a double precision, b double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN abs(b) < 1 AND abs(a) > abs(b) * 1.7976931348623157e308
                THEN CASE WHEN (a < 0) = (b < 0) THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END
                ELSE a / b END
$$;

CREATE OR REPLACE FUNCTION ratelimit.rl__mul(a double precision, b double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN abs(a) > 1 AND abs(b) > 1.7976931348623157e308 / abs(a)
                THEN CASE WHEN (a < 0) = (b < 0) THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END
                ELSE a * b END
$$;

-- Tokens in a bucket at t (bucket::level_at); has_row false: no row, a full bucket.
CREATE OR REPLACE FUNCTION ratelimit.rl__level_at(has_row boolean, level double precision, refilled_at bigint,
                                                  burst double precision, rate double precision, t bigint)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN NOT has_row THEN burst
        ELSE least(CASE WHEN level IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) THEN 0 ELSE level END
                   + greatest(t - refilled_at, 0)::float8 * rate / @MS_PER_MINUTE@::float8, burst) END
$$;

-- Milliseconds from now until the bucket holds target tokens (bucket::wait_for), capped
-- at 2^53 - 1, found against level_at itself so waiting exactly that long admits.
CREATE OR REPLACE FUNCTION ratelimit.rl__wait_for(has_row boolean, level double precision, refilled_at bigint,
                                                  burst double precision, rate double precision, now bigint,
                                                  target double precision)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    max_wait CONSTANT bigint := @MAX_WAIT_MS@;
    start bigint;
    deficit double precision;
    estimate double precision;
    wait bigint;
BEGIN
    IF ratelimit.rl__level_at(has_row, level, refilled_at, burst, rate, now) >= target THEN RETURN 0; END IF;
    IF NOT has_row OR target > burst THEN RETURN max_wait; END IF;
    start := greatest(refilled_at, now);
    deficit := target - ratelimit.rl__level_at(has_row, level, refilled_at, burst, rate, start);
    estimate := (start - now)::float8 + ceil(ratelimit.rl__div(deficit * @MS_PER_MINUTE@::float8, rate));
    IF estimate = 'NaN'::float8 OR estimate >= max_wait::float8 THEN RETURN max_wait; END IF;
    wait := greatest(trunc(estimate)::bigint, 1);
    FOR i IN 1..64 LOOP
        EXIT WHEN ratelimit.rl__level_at(has_row, level, refilled_at, burst, rate, now + wait) >= target;
        wait := wait + 1;
    END LOOP;
    FOR i IN 1..64 LOOP
        EXIT WHEN wait <= 1 OR ratelimit.rl__level_at(has_row, level, refilled_at, burst, rate, now + wait - 1) < target;
        wait := wait - 1;
    END LOOP;
    RETURN least(wait, max_wait);
END
$$;

-- The level of a row whose level is finite at now: rl__level_at(true, ...) without the
-- check for a stored NaN or infinity (the hot paths, which leave those rows to the general
-- one).
CREATE OR REPLACE FUNCTION ratelimit.rl__refilled_level(level double precision, refilled_at bigint,
                                                        burst double precision, rate double precision, now bigint)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(level + greatest(now - refilled_at, 0)::float8 * rate / @MS_PER_MINUTE@::float8, burst)
$$;

-- The level a take of cost leaves in a row whose level is finite.
CREATE OR REPLACE FUNCTION ratelimit.rl__taken_level(level double precision, refilled_at bigint, burst double precision,
                                                     rate double precision, cost double precision, now bigint)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT ratelimit.rl__refilled_level(level, refilled_at, burst, rate, now) - cost
$$;

-- The full_at a take of cost leaves as bucket::wait_for first estimates it (rl_take's hot
-- path, for |level| below 1e16): the new refilled_at, greatest(refilled_at, now), plus
-- ceil((burst - new level) * 60000 / rate) ms, capped. rl__full_at_is_edge says whether
-- that is the exact wait. A rate below 1e-280 divides as 1e-280, which keeps the quotient
-- finite; rl__full_at_is_edge tests with the rate itself, so it accepts only the edge.
CREATE OR REPLACE FUNCTION ratelimit.rl__taken_full_at(level double precision, refilled_at bigint,
                                                       burst double precision, rate double precision,
                                                       cost double precision, now bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(refilled_at, now) + least(ceil((burst - ratelimit.rl__taken_level(level, refilled_at, burst, rate,
        cost, now)) * @MS_PER_MINUTE@::float8 / greatest(rate, 1e-280::float8)), @MAX_WAIT_MS@::float8)::bigint
$$;

-- Whether a row written at now (refilled_at not before it) holds full_at = now +
-- rl__wait_for(true, level, refilled_at, burst, rate, now, burst): bucket::wait_for's test
-- of its estimate, which mostly is the edge itself. Below the burst, waiting d = full_at -
-- refilled_at ms must fill the bucket and d - 1 not, within the cap. (The cap's test is
-- wait_for's float sum (refilled_at - now) + d in integers: both terms are below 2^53, so
-- the sum is exact up to 2^53 and at least 2^53, over the cap, above it.)
CREATE OR REPLACE FUNCTION ratelimit.rl__full_at_is_edge(level double precision, refilled_at bigint, full_at bigint,
                                                         burst double precision, rate double precision, now bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT level < burst AND full_at - now < @MAX_WAIT_MS@
        AND level + (full_at - refilled_at)::float8 * rate / @MS_PER_MINUTE@::float8 >= burst
        AND level + (full_at - refilled_at - 1)::float8 * rate / @MS_PER_MINUTE@::float8 < burst
$$;

-- Seconds an empty bucket takes to fill, capped as every wait is (BucketLimits::refill_seconds).
CREATE OR REPLACE FUNCTION ratelimit.rl__refill_seconds(burst double precision, rate double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(ratelimit.rl__div(burst * 60::float8, rate), 9007199254740::float8)
$$;

-- rl__refill_seconds where the quotient cannot overflow, so without rl__div's guard: burst
-- at most @MAX_TOKENS@ and rate at least 1e-280 (rl_take's hot path, rl__hot_rate_ok).
CREATE OR REPLACE FUNCTION ratelimit.rl__hot_refill_seconds(burst double precision, rate double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(burst * 60::float8 / rate, 9007199254740::float8)
$$;

-- A bucket answer in rl_take's shape (TakeDecision's JSON); refill is
-- rl__refill_seconds(burst, rate). A SQL function PostgreSQL inlines, so each argument is
-- a variable, a column or one operator: a costlier one would keep rl__number_value and
-- rl__ceil_seconds, which use theirs more than once, from being inlined.
CREATE OR REPLACE FUNCTION ratelimit.rl__take_answer(admitted boolean, remaining bigint, burst double precision,
                                                     retry_ms bigint, reset_ms bigint, exceeds boolean,
                                                     refill double precision)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('admitted', admitted, 'remaining', remaining, 'limit', ratelimit.rl__number_value(burst),
        'retry_after_ms', retry_ms, 'retry_after_seconds', ratelimit.rl__ceil_seconds(retry_ms),
        'reset_after_seconds', ratelimit.rl__ceil_seconds(reset_ms), 'exceeds_limit', exceeds,
        'refill_seconds', ratelimit.rl__number_value(refill))
$$;

-- rl__take_answer of a take admitted (retry 0, within the limit), from its constant part
-- and the four values that vary: a quarter of the jsonb_build_object arguments, whose types
-- PostgreSQL looks up on every call (the hot paths' answer). Only where rl__hot_ok holds:
-- burst and refill (finite) go to jsonb as doubles, which it writes as float8out does, and
-- with extra_float_digits above 0 that is rl__number_value's form (an integer below 9e15
-- has no shorter form; 1e+15 reads as the integer). level is the row's new level, finite
-- and not negative: 'remaining', its floor, is a whole double, which float8out writes as
-- the integer it is. reset_ms is not negative (a take leaves full_at at now or later), so
-- its seconds are a plain ceiling.
CREATE OR REPLACE FUNCTION ratelimit.rl__taken_answer(level double precision, burst double precision, reset_ms bigint,
                                                      refill double precision)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT '{"admitted": true, "retry_after_ms": 0, "retry_after_seconds": 0, "exceeds_limit": false}'::jsonb
        || jsonb_build_object('remaining', floor(level), 'limit', burst, 'reset_after_seconds', (reset_ms + 999) / 1000,
                              'refill_seconds', refill)
$$;

-- The answer of a take whose one statement (rl_take's, rl_check's) wrote a full_at that
-- rl__full_at_is_edge did not accept: the row this call holds gets rl__wait_for's exact
-- wait. refill is rl__refill_seconds(burst, rate).
CREATE OR REPLACE FUNCTION ratelimit.rl__taken_exact(k text, burst double precision, rate double precision,
                                                     now bigint, refill double precision)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    answer jsonb;
BEGIN
    UPDATE ratelimit.rl_bucket AS t
    SET full_at = now + ratelimit.rl__wait_for(true, t.level, t.refilled_at, burst, rate, now, burst)
    WHERE t.key = k
    RETURNING ratelimit.rl__taken_answer(t.level, burst, t.full_at - now, refill) INTO answer;
    RETURN answer;
END
$$;

-- What rl_take decides on a row (bucket::take), as its answer; the row to store is the
-- answer's level when admitted (bucket::taken).
CREATE OR REPLACE FUNCTION ratelimit.rl__take_decision(has_row boolean, level double precision, refilled_at bigint,
                                                       burst double precision, rate double precision,
                                                       cost double precision, now bigint,
                                                       OUT admitted boolean, OUT answer jsonb,
                                                       OUT new_level double precision, OUT new_refilled_at bigint,
                                                       OUT new_full_at bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    max_wait CONSTANT bigint := @MAX_WAIT_MS@;
    cur double precision := ratelimit.rl__level_at(has_row, level, refilled_at, burst, rate, now);
    refill CONSTANT double precision := ratelimit.rl__refill_seconds(burst, rate);
    retry bigint;
    reset bigint;
    full_ms double precision;
BEGIN
    IF cost <= cur THEN
        admitted := true;
        new_refilled_at := CASE WHEN has_row THEN greatest(refilled_at, now) ELSE now END;
        new_level := cur - cost;
        new_full_at := now + ratelimit.rl__wait_for(true, new_level, new_refilled_at, burst, rate, now, burst);
        answer := ratelimit.rl__take_answer(true, floor(new_level)::bigint, burst, 0, new_full_at - now, false, refill);
        RETURN;
    END IF;
    admitted := false;
    IF cost > burst THEN
        full_ms := ceil(ratelimit.rl__div(burst * @MS_PER_MINUTE@::float8, rate));
        retry := CASE WHEN full_ms < max_wait::float8 THEN greatest(full_ms::bigint, 1) ELSE max_wait END;
    ELSE
        retry := ratelimit.rl__wait_for(has_row, level, refilled_at, burst, rate, now, cost);
    END IF;
    reset := ratelimit.rl__wait_for(has_row, level, refilled_at, burst, rate, now, burst);
    answer := ratelimit.rl__take_answer(false, floor(cur)::bigint, burst, retry, reset, cost > burst, refill);
END
$$;

-- Fails (25006) in a read-only transaction or on a standby (Error::read_only). IMMUTABLE
-- as the error functions above are (it is called with the function's name, a variable).
CREATE OR REPLACE FUNCTION ratelimit.rl__read_only(fn text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '25006', MESSAGE = fn || ': ' || @MSG_READ_ONLY@;
END
$$;

-- Whether this transaction may write (not read-only, not on a standby).
CREATE OR REPLACE FUNCTION ratelimit.rl__read_write() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT current_setting('transaction_read_only') <> 'on'
$$;

-- Whether a hot path (rl_take's, rl_check's) may run: the transaction may write, and
-- float8out writes a double in its shortest exact form, as rl__taken_answer needs
-- (extra_float_digits above 0; its default is 1). A caller who set it lower gets the
-- checked path, whose rl__number_value does not depend on it.
CREATE OR REPLACE FUNCTION ratelimit.rl__hot_ok() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT ratelimit.rl__read_write() AND current_setting('extra_float_digits') IN ('1', '2', '3')
$$;

-- True, or fails as rl__read_only: a SQL function PostgreSQL inlines into its caller's
-- expression, which saves a PL/pgSQL call per change.
CREATE OR REPLACE FUNCTION ratelimit.rl__writable(fn text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT ratelimit.rl__read_write() OR ratelimit.rl__read_only(fn)
$$;

-- The one path of every bucket change (protocol::change_row over bucket::take, charge and
-- refund): a guarded UPDATE whose condition is the decision itself, so PostgreSQL
-- re-decides on the newest row version under concurrent takes; without a row, decide on
-- none and insert. op is 'take', 'charge' or 'refund'. (Its statements keep one generic
-- plan: a custom plan looks cheaper, its constants folded, but would be made, and the SQL
-- helpers inlined, again on every call.)
CREATE OR REPLACE FUNCTION ratelimit.rl__bucket_change(fn text, op text, k text, b double precision,
                                                       r double precision, amount double precision, now bigint)
RETURNS jsonb LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    new_level double precision;
    new_full_at bigint;
    row_level double precision;
    row_refilled_at bigint;
    d record;
    cur double precision;
    refill double precision;  -- a take's or a charge's answer only: set just before it
BEGIN
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    FOR attempt IN 1..@MAX_ATTEMPTS@ LOOP
        IF op = 'refund' THEN
            UPDATE ratelimit.rl_bucket AS t
            SET level = least(ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now) + amount, b),
                refilled_at = greatest(t.refilled_at, now),
                full_at = now + ratelimit.rl__wait_for(true,
                    least(ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now) + amount, b),
                    greatest(t.refilled_at, now), b, r, now, b)
            WHERE t.key = k AND ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now) < b
            RETURNING t.level, t.refilled_at, t.full_at INTO new_level, row_refilled_at, new_full_at;
        ELSE
            UPDATE ratelimit.rl_bucket AS t
            SET level = ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now) - amount,
                refilled_at = greatest(t.refilled_at, now),
                full_at = now + ratelimit.rl__wait_for(true,
                    ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now) - amount,
                    greatest(t.refilled_at, now), b, r, now, b)
            WHERE t.key = k AND CASE op
                WHEN 'take' THEN amount <= ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now)
                ELSE NOT (ratelimit.rl__level_at(true, t.level, t.refilled_at, b, r, now) - amount < -@MAX_TOKENS@::float8) END
            RETURNING t.level, t.refilled_at, t.full_at INTO new_level, row_refilled_at, new_full_at;
        END IF;
        IF FOUND THEN
            IF op = 'refund' THEN
                RETURN jsonb_build_object('remaining',
                    floor(ratelimit.rl__level_at(true, new_level, row_refilled_at, b, r, now))::bigint,
                    'limit', ratelimit.rl__number(b), 'reset_after_seconds', ratelimit.rl__ceil_seconds(
                    ratelimit.rl__wait_for(true, new_level, row_refilled_at, b, r, now, b)));
            END IF;
            refill := ratelimit.rl__refill_seconds(b, r);
            RETURN ratelimit.rl__take_answer(true, floor(new_level)::bigint, b, 0, new_full_at - now, false, refill);
        END IF;
        -- Nothing written: no row, or a row the decision leaves alone.
        SELECT t.level, t.refilled_at INTO row_level, row_refilled_at FROM ratelimit.rl_bucket AS t WHERE t.key = k;
        IF FOUND THEN
            cur := ratelimit.rl__level_at(true, row_level, row_refilled_at, b, r, now);
            IF op = 'refund' THEN
                CONTINUE WHEN cur < b;  -- the row changed since the UPDATE: decide again
                RETURN jsonb_build_object('remaining', floor(cur)::bigint, 'limit', ratelimit.rl__number(b),
                    'reset_after_seconds', ratelimit.rl__ceil_seconds(
                    ratelimit.rl__wait_for(true, row_level, row_refilled_at, b, r, now, b)));
            END IF;
            IF op = 'charge' THEN
                CONTINUE WHEN NOT (cur - amount < -@MAX_TOKENS@::float8);
                RAISE EXCEPTION USING ERRCODE = '22003',
                    MESSAGE = fn || ': ' || format(@MSG_DEBT_TOO_DEEP@, @MAX_TOKENS@);
            END IF;
            CONTINUE WHEN amount <= cur;
            RETURN (ratelimit.rl__take_decision(true, row_level, row_refilled_at, b, r, amount, now)).answer;
        END IF;
        IF op = 'refund' THEN
            -- a bucket nobody took from is full: nothing to give back
            RETURN jsonb_build_object('remaining', floor(b)::bigint, 'limit', ratelimit.rl__number(b),
                                      'reset_after_seconds', 0);
        END IF;
        IF op = 'take' AND amount > b THEN
            RETURN (ratelimit.rl__take_decision(false, 0, 0, b, r, amount, now)).answer;
        END IF;
        new_level := b - amount;
        new_full_at := now + ratelimit.rl__wait_for(true, new_level, now, b, r, now, b);
        INSERT INTO ratelimit.rl_bucket (key, level, refilled_at, full_at) VALUES (k, new_level, now, new_full_at)
        ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            refill := ratelimit.rl__refill_seconds(b, r);
            RETURN ratelimit.rl__take_answer(true, floor(new_level)::bigint, b, 0, new_full_at - now, false, refill);
        END IF;
        -- another call inserted the row first: decide on that row
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = 'XX000', MESSAGE = fn || ': ' || format(@MSG_ROW_KEPT_CHANGING@, @MAX_ATTEMPTS@);
END
$$;

-- What rl_spend decides on a row (budget::spend), as its answer.
CREATE OR REPLACE FUNCTION ratelimit.rl__spend_answer(has_row boolean, used bigint, resets_at bigint, period text,
                                                      quota bigint, cost bigint, now bigint)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    cur boolean := has_row AND resets_at > now;
    u bigint := CASE WHEN cur THEN greatest(used, 0) ELSE 0 END;
    resets bigint := CASE WHEN cur THEN resets_at ELSE ratelimit.rl__period_end(period, now) END;
    total bigint := u + cost;
    admitted boolean := total <= quota;
BEGIN
    IF admitted THEN u := total; END IF;
    RETURN jsonb_build_object('admitted', admitted, 'used', ratelimit.rl__micros(u), 'limit', ratelimit.rl__micros(quota),
        'remaining', ratelimit.rl__micros(quota - u), 'resets_at', resets / 1000,
        'retry_after_seconds', CASE WHEN admitted THEN 0 ELSE ratelimit.rl__ceil_seconds(resets - now) END,
        'reset_after_seconds', greatest(ratelimit.rl__ceil_seconds(resets - now), 0),
        'exceeds_limit', NOT admitted AND cost > quota,
        'period_seconds', (resets - ratelimit.rl__period_start(period, resets - 1)) / 1000);
END
$$;

-- What a charge against a known quota answers (budget::charge_against): an admitted spend,
-- remaining below 0 past the quota.
CREATE OR REPLACE FUNCTION ratelimit.rl__charged_answer(used bigint, resets_at bigint, period text, quota bigint,
                                                        now bigint)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('admitted', true, 'used', ratelimit.rl__micros(used), 'limit', ratelimit.rl__micros(quota),
        'remaining', ratelimit.rl__micros(quota - used), 'resets_at', resets_at / 1000, 'retry_after_seconds', 0,
        'reset_after_seconds', greatest(ratelimit.rl__ceil_seconds(resets_at - now), 0), 'exceeds_limit', false, 'period_seconds', (resets_at - ratelimit.rl__period_start(period, resets_at - 1)) / 1000)
$$;

-- What rl_refund_budget and rl_charge_budget answer (BudgetRefund, BudgetCharge): used and
-- resets_at, with admitted for a charge (IMMUTABLE: see the error functions).
CREATE OR REPLACE FUNCTION ratelimit.rl__budget_answer(admitted boolean, used bigint, resets_at bigint) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF admitted IS NULL THEN
        RETURN jsonb_build_object('used', ratelimit.rl__micros(used), 'resets_at', resets_at / 1000);
    END IF;
    RETURN jsonb_build_object('admitted', admitted, 'used', ratelimit.rl__micros(used), 'resets_at', resets_at / 1000);
END
$$;

-- The one path of every budget change (protocol::change_row over budget::spend, refund
-- and charge): a guarded UPDATE deciding on the newest row; without a row, insert.
-- op is 'spend', 'refund', 'charge' or 'charge_against' (budget::charge_against, a charge
-- that knows the quota, answered as an admitted spend); quota is used by 'spend' and
-- 'charge_against', which write it (the others keep the row's: budget::BudgetState's quota).
-- Keeps the period a budget write ended for invoicing (protocol::keep_ended): the row as it
-- stood (used, ends_at, quota) when the write moved it to a later period with something
-- counted in it (budget::ends_counted_period), once.
CREATE OR REPLACE FUNCTION ratelimit.rl__keep_ended(k text, p text, old_used bigint, old_resets_at bigint,
                                                    old_quota bigint, new_resets_at bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF new_resets_at > old_resets_at AND old_used <> 0 THEN
        INSERT INTO ratelimit.rl_usage (key, period, starts_at, ends_at, used, quota)
        VALUES (k, p, ratelimit.rl__period_start(p, old_resets_at - 1), old_resets_at, old_used, old_quota)
        ON CONFLICT (key, period, ends_at) DO NOTHING;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION ratelimit.rl__budget_change(fn text, op text, k text, p text, quota bigint,
                                                       amount bigint, now bigint)
RETURNS jsonb LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    max_used CONSTANT bigint := @MAX_WAIT_MS@;
    new_used bigint;
    new_resets_at bigint;
    row_used bigint;
    row_resets_at bigint;
    row_quota bigint;
    cur bigint;
    period_end bigint;  -- the end of the period now is in, worked out where a call needs it
    old bigint[];
BEGIN
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    FOR attempt IN 1..@MAX_ATTEMPTS@ LOOP
        UPDATE ratelimit.rl_budget AS t
        SET used = CASE op WHEN 'refund'
                THEN greatest(CASE WHEN t.resets_at > now THEN greatest(t.used, 0) ELSE 0 END - amount, 0)
                ELSE CASE WHEN t.resets_at > now THEN greatest(t.used, 0) ELSE 0 END + amount END,
            resets_at = CASE WHEN t.resets_at > now THEN t.resets_at ELSE ratelimit.rl__period_end(p, now) END,
            quota = CASE WHEN op IN ('spend', 'charge_against') THEN rl__budget_change.quota ELSE t.quota END
        WHERE t.key = k AND t.period = p AND CASE op
            WHEN 'spend' THEN CASE WHEN t.resets_at > now THEN greatest(t.used, 0) ELSE 0 END + amount <= rl__budget_change.quota
            WHEN 'refund' THEN greatest(CASE WHEN t.resets_at > now THEN greatest(t.used, 0) ELSE 0 END - amount, 0)
                 <> CASE WHEN t.resets_at > now THEN greatest(t.used, 0) ELSE 0 END
            ELSE CASE WHEN t.resets_at > now THEN greatest(t.used, 0) ELSE 0 END + amount <= max_used END
        -- a subquery of RETURNING reads the statement's snapshot: the row as the write found
        -- it (a newer version a concurrent write made is one that write kept). Only a write
        -- that may have started a new period reads it: one that leaves used at the amount
        -- (at 0 for a refund), as every write into a new period does.
        RETURNING t.used, t.resets_at,
                  CASE WHEN t.used = CASE op WHEN 'refund' THEN 0 ELSE amount END
                       THEN (SELECT ARRAY[o.used, o.resets_at, o.quota] FROM ratelimit.rl_budget AS o
                             WHERE o.key = k AND o.period = p) END
        INTO new_used, new_resets_at, old;
        IF FOUND THEN
            IF old IS NOT NULL THEN
                PERFORM ratelimit.rl__keep_ended(k, p, old[1], old[2], old[3], new_resets_at);
            END IF;
            IF op = 'spend' THEN
                RETURN ratelimit.rl__spend_answer(true, new_used, new_resets_at, p, quota, 0, now);
            ELSIF op = 'charge' THEN
                RETURN ratelimit.rl__budget_answer(true, new_used, new_resets_at);
            ELSIF op = 'charge_against' THEN
                RETURN ratelimit.rl__charged_answer(new_used, new_resets_at, p, quota, now);
            END IF;
            RETURN ratelimit.rl__budget_answer(NULL, new_used, new_resets_at);
        END IF;
        period_end := ratelimit.rl__period_end(p, now);
        SELECT t.used, t.resets_at, t.quota INTO row_used, row_resets_at, row_quota FROM ratelimit.rl_budget AS t
        WHERE t.key = k AND t.period = p;
        IF FOUND THEN
            cur := CASE WHEN row_resets_at > now THEN greatest(row_used, 0) ELSE 0 END;
            IF op = 'spend' THEN
                CONTINUE WHEN cur + amount <= quota;  -- the row changed since: decide again
                IF row_resets_at > now AND row_quota <> quota THEN
                    -- a refusal records the quota it was asked with, keeping the count (budget::spend)
                    UPDATE ratelimit.rl_budget AS t SET quota = rl__budget_change.quota
                    WHERE t.key = k AND t.period = p AND t.used = row_used AND t.resets_at = row_resets_at
                      AND t.quota = row_quota;
                    CONTINUE WHEN NOT FOUND;
                END IF;
                RETURN ratelimit.rl__spend_answer(true, row_used, row_resets_at, p, quota, amount, now);
            ELSIF op IN ('charge', 'charge_against') THEN
                CONTINUE WHEN cur + amount <= max_used;
                RAISE EXCEPTION USING ERRCODE = '22003',
                    MESSAGE = fn || ': ' || format(@MSG_USE_TOO_HIGH@, @MAX_USED_UNITS@);
            END IF;
            CONTINUE WHEN greatest(cur - amount, 0) <> cur;
            RETURN ratelimit.rl__budget_answer(NULL, cur, CASE WHEN row_resets_at > now THEN row_resets_at ELSE period_end END);
        END IF;
        IF op = 'refund' THEN
            RETURN ratelimit.rl__budget_answer(NULL, 0, period_end);
        ELSIF op = 'spend' AND amount > quota THEN
            RETURN ratelimit.rl__spend_answer(false, 0, 0, p, quota, amount, now);
        END IF;
        INSERT INTO ratelimit.rl_budget (key, period, used, resets_at, quota)
        VALUES (k, p, amount, period_end, CASE WHEN op IN ('spend', 'charge_against') THEN rl__budget_change.quota ELSE 0 END)
        ON CONFLICT (key, period) DO NOTHING;
        IF FOUND THEN
            IF op = 'charge' THEN
                RETURN ratelimit.rl__budget_answer(true, amount, period_end);
            ELSIF op = 'charge_against' THEN
                RETURN ratelimit.rl__charged_answer(amount, period_end, p, quota, now);
            END IF;
            RETURN ratelimit.rl__spend_answer(true, amount, period_end, p, quota, 0, now);
        END IF;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = 'XX000', MESSAGE = fn || ': ' || format(@MSG_ROW_KEPT_CHANGING@, @MAX_ATTEMPTS@);
END
$$;


-- The error of a stored row no rule can read (protocol::damaged).
CREATE OR REPLACE FUNCTION ratelimit.rl__damaged(fn text, kind text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'XX000', MESSAGE = fn || ': ' || format(@MSG_DAMAGED@, kind);
END
$$;

-- A whole number as Rust's i64 parser reads it (an optional sign, digits), else NULL. No
-- exception block (each would be a subtransaction): the range is checked as a numeric.
CREATE OR REPLACE FUNCTION ratelimit.rl__int(t text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN t ~ '^[+-]?[0-9]{1,19}$' AND t::numeric BETWEEN -9223372036854775808 AND 9223372036854775807
                THEN t::numeric::bigint END
$$;

-- A window's stored entries (window::decode): times in order and their millionths; each
-- item is a delta from the one before (the first from 0), optionally `:micros`.
CREATE OR REPLACE FUNCTION ratelimit.rl__window_decode(fn text, entries text, OUT ats bigint[], OUT micros bigint[])
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    damaged boolean;
BEGIN
    ats := '{}';
    micros := '{}';
    IF entries IS NULL OR entries = '' THEN RETURN; END IF;
    -- as written: numbers that fit, every delta after the first above 0 (checked below)
    IF entries ~ '^[0-9]{1,15}(:[0-9]{1,15})?(,[0-9]{1,15}(:[0-9]{1,15})?)*$' THEN
        SELECT bool_or(u <= 0 OR NOT (d > 0 OR (n = 1 AND d = 0))), array_agg(s ORDER BY n), array_agg(u ORDER BY n)
        INTO damaged, ats, micros
        FROM (SELECT n, d, u, sum(d) OVER (ORDER BY n) AS s
              FROM (SELECT n, split_part(item, ':', 1)::bigint AS d,
                           CASE WHEN position(':' IN item) > 0 THEN split_part(item, ':', 2)::bigint ELSE @MICROS_PER_UNIT@ END AS u
                    FROM unnest(string_to_array(entries, ',')) WITH ORDINALITY AS t(item, n)) AS parsed) AS summed;
        IF damaged THEN PERFORM ratelimit.rl__damaged(fn, 'window'); END IF;
        RETURN;
    END IF;
    SELECT bool_or(d IS NULL OR u IS NULL OR u <= 0 OR NOT (d > 0 OR (n = 1 AND d = 0))),
           array_agg(s ORDER BY n), array_agg(u ORDER BY n)
    INTO damaged, ats, micros
    FROM (SELECT n, d, u, sum(d) OVER (ORDER BY n) AS s
          FROM (SELECT n, ratelimit.rl__int(split_part(item, ':', 1)) AS d,
                       CASE WHEN position(':' IN item) > 0 THEN ratelimit.rl__int(substr(item, position(':' IN item) + 1))
                            ELSE @MICROS_PER_UNIT@ END AS u
                FROM unnest(string_to_array(entries, ',')) WITH ORDINALITY AS t(item, n)) AS parsed) AS summed;
    IF damaged THEN PERFORM ratelimit.rl__damaged(fn, 'window'); END IF;
END
$$;

-- What rl_window decides (window::take) on the stored entries, and the row an admission
-- stores (protocol::window_row): new_entries NULL when nothing is written. A fixed window
-- records an admission at the start of the window holding now (WindowLimits::recorded_at).
CREATE OR REPLACE FUNCTION ratelimit.rl__window_decision(fn text, entries text, lim bigint, window_ms bigint,
                                                         cost bigint, now bigint, charge boolean, fixed boolean,
                                                         OUT admitted boolean, OUT answer jsonb,
                                                         OUT new_entries text, OUT new_empty_at bigint,
                                                         OUT too_many boolean)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    d record := ratelimit.rl__window_decode(fn, entries);
    ats bigint[] := '{}';
    units bigint[] := '{}';
    used bigint := 0;
    used_after bigint;
    reset_ms bigint := 0;
    retry bigint;
    need bigint;
    freed bigint := 0;
    placed boolean := false;
    out_ats bigint[] := '{}';
    out_units bigint[] := '{}';
    previous bigint := 0;
    text_out text := '';
    at bigint := CASE WHEN fixed THEN now - ((now % window_ms) + window_ms) % window_ms ELSE now END;
BEGIN
    -- the entries that count at now: made less than window_ms ago (or ahead of now)
    FOR i IN 1..coalesce(array_length(d.ats, 1), 0) LOOP
        IF d.ats[i] + window_ms > now THEN
            ats := ats || d.ats[i];
            units := units || d.micros[i];
            used := used + d.micros[i];
        END IF;
    END LOOP;
    -- a charge (window::charge) records the cost whatever the window holds
    admitted := charge OR used + cost <= lim;
    used_after := CASE WHEN admitted THEN used + cost ELSE used END;
    -- the entries after the call, in time order, the admission merged into its millisecond
    IF admitted AND cost > 0 THEN
        FOR i IN 1..coalesce(array_length(ats, 1), 0) LOOP
            IF NOT placed AND ats[i] >= at THEN
                IF ats[i] = at THEN
                    units[i] := units[i] + cost;
                ELSE
                    out_ats := out_ats || at;
                    out_units := out_units || cost;
                END IF;
                placed := true;
            END IF;
            out_ats := out_ats || ats[i];
            out_units := out_units || units[i];
        END LOOP;
        IF NOT placed THEN
            out_ats := out_ats || at;
            out_units := out_units || cost;
        END IF;
    ELSE
        out_ats := ats;
        out_units := units;
    END IF;
    FOR i IN 1..coalesce(array_length(out_ats, 1), 0) LOOP
        reset_ms := greatest(reset_ms, out_ats[i] + window_ms - now);
    END LOOP;
    IF admitted THEN
        retry := 0;
    ELSIF cost > lim THEN
        retry := greatest(reset_ms, 1);
    ELSE
        need := used + cost - lim;
        retry := 1;
        FOR i IN 1..coalesce(array_length(ats, 1), 0) LOOP
            freed := freed + units[i];
            IF freed >= need THEN
                retry := ats[i] + window_ms - now;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    answer := jsonb_build_object('admitted', admitted,
        'remaining', CASE WHEN charge THEN floor((lim - used_after)::numeric / @MICROS_PER_UNIT@)::bigint
                          ELSE greatest((lim - used_after) / @MICROS_PER_UNIT@, 0) END,
        'limit', ratelimit.rl__micros(lim), 'retry_after_ms', retry,
        'retry_after_seconds', ratelimit.rl__ceil_seconds(retry),
        'reset_after_seconds', ratelimit.rl__ceil_seconds(reset_ms),
        'exceeds_limit', NOT admitted AND cost > lim,
        'window_seconds', ratelimit.rl__number(window_ms::float8 / 1000));
    IF NOT admitted THEN RETURN; END IF;
    -- past the bound the row is not written: the caller raises rl__window_too_full
    too_many := coalesce(array_length(out_ats, 1), 0) > @MAX_WINDOW_ENTRIES@;
    FOR i IN 1..coalesce(array_length(out_ats, 1), 0) LOOP
        IF i > 1 THEN text_out := text_out || ','; END IF;
        text_out := text_out || (out_ats[i] - previous)::text
            || CASE WHEN out_units[i] <> @MICROS_PER_UNIT@ THEN ':' || out_units[i]::text ELSE '' END;
        previous := out_ats[i];
    END LOOP;
    new_entries := text_out;
    new_empty_at := CASE WHEN array_length(out_ats, 1) IS NULL THEN 0
                         ELSE out_ats[array_length(out_ats, 1)] + window_ms END;
END
$$;

-- The error of an admission that would keep more entries than a window may (protocol::window_row).
CREATE OR REPLACE FUNCTION ratelimit.rl__window_too_full(fn text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = fn || ': ' || format(@MSG_WINDOW_TOO_FULL@, @MAX_WINDOW_ENTRIES@);
END
$$;

-- A key's leases (lease::Leases::decode): the next number, then each lease's number,
-- issue time, expiry and secret (0 for one stored without a secret).
CREATE OR REPLACE FUNCTION ratelimit.rl__leases_decode(fn text, entries text, OUT next_seq bigint, OUT seqs bigint[],
                                                       OUT issued bigint[], OUT expires bigint[], OUT secrets text[])
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    damaged boolean;
BEGIN
    seqs := '{}'; issued := '{}'; expires := '{}'; secrets := '{}';
    IF entries IS NULL THEN next_seq := 1; RETURN; END IF;
    next_seq := ratelimit.rl__int(split_part(entries, ';', 1));
    IF next_seq IS NULL THEN PERFORM ratelimit.rl__damaged(fn, 'lease'); END IF;
    IF position(';' IN entries) = 0 THEN RETURN; END IF;
    -- as this edition and the native library write it: every number fits, no field to check
    IF entries ~ '^[0-9]{1,18}(;[0-9]{1,18}:[0-9]{1,18}:[0-9]{1,18}(:[0-9a-f]{1,16})?)+$' THEN
        SELECT array_agg(split_part(item, ':', 1)::bigint ORDER BY n), array_agg(split_part(item, ':', 2)::bigint ORDER BY n),
               array_agg(split_part(item, ':', 3)::bigint ORDER BY n),
               array_agg(CASE WHEN split_part(item, ':', 4) NOT IN ('', '0') THEN lpad(split_part(item, ':', 4), 16, '0') END
                         ORDER BY n)
        INTO seqs, issued, expires, secrets
        FROM unnest((string_to_array(entries, ';'))[2:]) WITH ORDINALITY AS t(item, n);
        RETURN;
    END IF;
    SELECT bool_or(cardinality(f) NOT IN (3, 4) OR ratelimit.rl__int(f[1]) IS NULL OR ratelimit.rl__int(f[2]) IS NULL
                   OR ratelimit.rl__int(f[3]) IS NULL OR (cardinality(f) = 4 AND f[4] !~ '^[0-9a-fA-F]{1,16}$')),
           array_agg(ratelimit.rl__int(f[1]) ORDER BY n), array_agg(ratelimit.rl__int(f[2]) ORDER BY n),
           array_agg(ratelimit.rl__int(f[3]) ORDER BY n),
           -- the secret as the id writes it: 16 hex digits (none for a lease stored without one)
           array_agg(CASE WHEN cardinality(f) = 4 AND ltrim(f[4], '0') <> '' THEN lpad(lower(ltrim(f[4], '0')), 16, '0') END
                     ORDER BY n)
    INTO damaged, seqs, issued, expires, secrets
    FROM (SELECT n, string_to_array(item, ':') AS f
          FROM unnest((string_to_array(entries, ';'))[2:]) WITH ORDINALITY AS t(item, n)) AS items;
    IF damaged THEN PERFORM ratelimit.rl__damaged(fn, 'lease'); END IF;
END
$$;

-- The id callers hold (lease::Lease::id).
CREATE OR REPLACE FUNCTION ratelimit.rl__lease_id(issued bigint, seq bigint, secret text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT issued::text || '-' || seq::text || CASE WHEN secret IS NULL THEN '' ELSE '-' || secret END
$$;

-- Leases as stored (Leases::encode), the unexpired ones at now only (pruned) unless now is NULL.
CREATE OR REPLACE FUNCTION ratelimit.rl__leases_encode(next_seq bigint, seqs bigint[], issued bigint[],
                                                       expires bigint[], secrets text[], now bigint)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT next_seq::text || coalesce((
        SELECT string_agg(';' || s || ':' || i || ':' || e || ':' || coalesce(ltrim(x, '0'), '0'), '' ORDER BY n)
        FROM unnest(seqs, issued, expires, secrets) WITH ORDINALITY AS t(s, i, e, x, n)
        WHERE now IS NULL OR e > now), '')
$$;

-- When the last lease expires (Leases::empty_at), of the unexpired ones at now.
CREATE OR REPLACE FUNCTION ratelimit.rl__leases_empty_at(expires bigint[], now bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(max(e), 0) FROM unnest(expires) AS e WHERE now IS NULL OR e > now
$$;

-- The change of one rl_entries row (protocol::change_entries): decide on the row as read;
-- if that writes, lock it (inserting the empty row first, so that there is one to lock)
-- and decide again on the locked row. step names the decision (ratelimit.rl__entries_step).
CREATE OR REPLACE FUNCTION ratelimit.rl__entries_change(fn text, k text, entry_kind text, step text, args jsonb,
                                                        now bigint, empty text)
RETURNS jsonb LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    seen text;
    seen_empty_at bigint;
    held text;
    held_empty_at bigint;
    found_row boolean;
    d record;
BEGIN
    IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF;
    SELECT t.entries, t.empty_at INTO seen, seen_empty_at FROM ratelimit.rl_entries AS t
    WHERE t.key = k AND t.kind = entry_kind;
    found_row := FOUND;
    d := ratelimit.rl__entries_step(step, fn, seen, seen_empty_at, found_row, args, now);
    -- a refund of a window without a row, with nothing left to count, leaves it without one
    IF d.new_entries IS NULL OR (step = 'window_refund' AND NOT found_row AND d.new_entries = empty) THEN
        RETURN d.answer;
    END IF;
    IF NOT found_row THEN
        INSERT INTO ratelimit.rl_entries (key, kind, entries, empty_at) VALUES (k, entry_kind, empty, 0)
        ON CONFLICT (key, kind) DO NOTHING;
    END IF;
    SELECT t.entries, t.empty_at INTO held, held_empty_at FROM ratelimit.rl_entries AS t
    WHERE t.key = k AND t.kind = entry_kind FOR UPDATE;
    -- decided again on the row as held, unless it is the row already decided on (the
    -- decision is a function of the row: the same row, the same decision)
    IF NOT found_row OR held IS DISTINCT FROM seen OR held_empty_at IS DISTINCT FROM seen_empty_at THEN
        d := ratelimit.rl__entries_step(step, fn, held, held_empty_at, true, args, now);
    END IF;
    IF d.new_entries IS NOT NULL THEN
        UPDATE ratelimit.rl_entries AS t SET entries = d.new_entries, empty_at = d.new_empty_at
        WHERE t.key = k AND t.kind = entry_kind;
    END IF;
    RETURN d.answer;
END
$$;

-- Strikes as stored (penalty::Strikes::encode); until is NULL for a block until unblocked,
-- blocked false for none.
CREATE OR REPLACE FUNCTION ratelimit.rl__strikes_encode(strikes bigint, last_strike_at bigint, forgotten_at bigint,
                                                        blocked boolean, until bigint)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT format('{"strikes":%s,"last_strike_at":%s,"forgotten_at":%s,"blocked_until":%s}', strikes, last_strike_at,
                  forgotten_at, CASE WHEN NOT blocked THEN 'false' WHEN until IS NULL THEN 'null' ELSE until::text END)
$$;

-- A subject's stored strikes (penalty::Strikes::decode); blocked false: no block; until
-- NULL with blocked: until unblocked.
CREATE OR REPLACE FUNCTION ratelimit.rl__strikes_decode(fn text, entries text, OUT strikes bigint,
                                                        OUT last_strike_at bigint, OUT forgotten_at bigint,
                                                        OUT blocked boolean, OUT until bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb;
BEGIN
    strikes := 0; last_strike_at := 0; forgotten_at := 0; blocked := false;
    IF entries IS NULL THEN RETURN; END IF;
    BEGIN
        v := entries::jsonb;
    EXCEPTION WHEN others THEN
        PERFORM ratelimit.rl__damaged(fn, 'block');
    END;
    IF jsonb_typeof(v) <> 'object' OR jsonb_typeof(v -> 'strikes') IS DISTINCT FROM 'number'
       OR jsonb_typeof(v -> 'last_strike_at') IS DISTINCT FROM 'number' OR NOT v ? 'blocked_until'
       OR (v ? 'forgotten_at' AND jsonb_typeof(v -> 'forgotten_at') <> 'number')
       OR (jsonb_typeof(v -> 'blocked_until') NOT IN ('null', 'number')
           AND v -> 'blocked_until' IS DISTINCT FROM 'false'::jsonb) THEN
        PERFORM ratelimit.rl__damaged(fn, 'block');
    END IF;
    strikes := ratelimit.rl__int(v ->> 'strikes');
    last_strike_at := ratelimit.rl__int(v ->> 'last_strike_at');
    forgotten_at := CASE WHEN v ? 'forgotten_at' THEN ratelimit.rl__int(v ->> 'forgotten_at') ELSE last_strike_at END;
    blocked := v -> 'blocked_until' IS DISTINCT FROM 'false'::jsonb;
    until := CASE WHEN jsonb_typeof(v -> 'blocked_until') = 'number' THEN ratelimit.rl__int(v ->> 'blocked_until') END;
    IF strikes IS NULL OR last_strike_at IS NULL OR forgotten_at IS NULL
       OR (jsonb_typeof(v -> 'blocked_until') = 'number' AND until IS NULL) THEN
        PERFORM ratelimit.rl__damaged(fn, 'block');
    END IF;
END
$$;

-- What rl_penalize and rl_block answer (penalty::BlockAnswer::fields).
CREATE OR REPLACE FUNCTION ratelimit.rl__block_answer(strikes bigint, blocked boolean, until bigint, now bigint)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object('strikes', strikes, 'blocked', blocked,
        'blocked_until', CASE WHEN blocked AND until IS NOT NULL THEN ratelimit.rl__ceil_seconds(until) END,
        'retry_after_seconds', CASE WHEN NOT blocked THEN 0 WHEN until IS NOT NULL
                                    THEN ratelimit.rl__ceil_seconds(until - now) END);
END
$$;

-- One decision on an rl_entries row for rl__entries_change: the answer, and the row to
-- write (new_entries NULL: nothing). args holds the call's parsed arguments.
CREATE OR REPLACE FUNCTION ratelimit.rl__entries_step(step text, fn text, entries text, row_empty_at bigint,
                                                      found boolean, args jsonb, now bigint,
                                                      OUT answer jsonb, OUT new_entries text, OUT new_empty_at bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    max_wait CONSTANT bigint := @MAX_WAIT_MS@;
    w record;
    l record;
    s record;
    held int[] := '{}';
    hit int;
    lease_ms bigint;
    lim bigint;
    secret text;
    expiries bigint[];
    strikes bigint;
    strikes_end bigint;
    remembered boolean;
    forgotten bigint;
    own_end bigint;
    blocked boolean;
    until bigint;
    length_ms bigint;
    doublings int;
BEGIN
    IF step = 'window_refund' THEN
        -- rl_refund_check: the newest admissions forgotten first (window::refund), then the
        -- window as a peek answers it, keeping the entries that still count
        w := ratelimit.rl__window_decode(fn, entries);
        lim := (args ->> 'cost')::bigint;
        FOR i IN REVERSE coalesce(array_length(w.ats, 1), 0)..1 LOOP
            EXIT WHEN lim <= 0;
            IF w.micros[i] <= lim THEN
                lim := lim - w.micros[i];
                w.ats := w.ats[:i - 1];
                w.micros := w.micros[:i - 1];
            ELSE
                w.micros[i] := w.micros[i] - lim;
                lim := 0;
            END IF;
        END LOOP;
        entries := (SELECT coalesce(string_agg((w.ats[i] - coalesce(w.ats[i - 1], 0))::text
                                               || CASE WHEN w.micros[i] <> @MICROS_PER_UNIT@ THEN ':' || w.micros[i] ELSE '' END, ','
                                               ORDER BY i), '')
                    FROM generate_series(1, coalesce(array_length(w.ats, 1), 0)) AS i);
        args := jsonb_set(args, '{cost}', '0');
        step := 'window';
    END IF;
    IF step IN ('window', 'window_charge') THEN
        w := ratelimit.rl__window_decision(fn, entries, (args ->> 'limit')::bigint, (args ->> 'window_ms')::bigint,
                                           (args ->> 'cost')::bigint, now, step = 'window_charge',
                                           coalesce((args ->> 'fixed')::boolean, false));
        IF w.too_many THEN PERFORM ratelimit.rl__window_too_full(fn); END IF;
        answer := w.answer; new_entries := w.new_entries; new_empty_at := w.new_empty_at;
        RETURN;
    END IF;
    IF step IN ('acquire', 'release', 'renew', 'in_flight') THEN
        l := ratelimit.rl__leases_decode(fn, entries);
        -- the leases held at now, and the one named (one query: a loop over the record's
        -- arrays would copy them at every step)
        SELECT coalesce(array_agg(n ORDER BY n) FILTER (WHERE e > now), '{}'),
               CASE WHEN args ? 'lease' THEN max(n) FILTER (WHERE e > now AND ratelimit.rl__lease_id(i, q, x) = args ->> 'lease') END
        INTO held, hit
        FROM unnest(l.seqs, l.issued, l.expires, l.secrets) WITH ORDINALITY AS t(q, i, e, x, n);
        IF step = 'in_flight' THEN
            answer := to_jsonb(coalesce(array_length(held, 1), 0));
            RETURN;
        END IF;
        IF step = 'acquire' THEN
            lim := (args ->> 'max')::bigint;
            lease_ms := (args ->> 'lease_ms')::bigint;
            IF coalesce(array_length(held, 1), 0) < lim THEN
                -- 64 random bits: the random hex digits of two version-4 UUIDs
                secret := substr(replace(gen_random_uuid()::text, '-', ''), 1, 12)
                       || substr(replace(gen_random_uuid()::text, '-', ''), 1, 4);
                IF ltrim(secret, '0') = '' THEN secret := '0000000000000001'; END IF;
                answer := jsonb_build_object('admitted', true,
                    'lease', ratelimit.rl__lease_id(now, l.next_seq, secret),
                    'in_flight', coalesce(array_length(held, 1), 0) + 1, 'limit', lim, 'expires_at', now + lease_ms,
                    'retry_after_ms', 0, 'retry_after_seconds', 0);
                new_entries := ratelimit.rl__leases_encode(l.next_seq + 1, l.seqs || l.next_seq, l.issued || now,
                                                           l.expires || (now + lease_ms), l.secrets || secret, now);
                new_empty_at := ratelimit.rl__leases_empty_at(l.expires || (now + lease_ms), now);
                RETURN;
            END IF;
            SELECT array_agg(e ORDER BY e) INTO expiries FROM unnest(l.expires) AS e WHERE e > now;
            lease_ms := least(greatest(expiries[array_length(held, 1) - lim + 1] - now, 1), max_wait);
            answer := jsonb_build_object('admitted', false, 'lease', NULL, 'in_flight', array_length(held, 1),
                'limit', lim, 'expires_at', NULL, 'retry_after_ms', lease_ms,
                'retry_after_seconds', ratelimit.rl__ceil_seconds(lease_ms));
            RETURN;
        END IF;
        IF hit IS NULL THEN
            answer := CASE step WHEN 'release' THEN 'false'::jsonb
                                ELSE jsonb_build_object('renewed', false, 'expires_at', NULL) END;
            RETURN;
        END IF;
        IF step = 'release' THEN
            answer := 'true';
            new_entries := ratelimit.rl__leases_encode(l.next_seq, l.seqs[:hit - 1] || l.seqs[hit + 1:],
                l.issued[:hit - 1] || l.issued[hit + 1:], l.expires[:hit - 1] || l.expires[hit + 1:],
                l.secrets[:hit - 1] || l.secrets[hit + 1:], now);
            new_empty_at := ratelimit.rl__leases_empty_at(l.expires[:hit - 1] || l.expires[hit + 1:], now);
            RETURN;
        END IF;
        l.expires[hit] := now + (args ->> 'lease_ms')::bigint;
        answer := jsonb_build_object('renewed', true, 'expires_at', l.expires[hit]);
        new_entries := ratelimit.rl__leases_encode(l.next_seq, l.seqs, l.issued, l.expires, l.secrets, now);
        new_empty_at := ratelimit.rl__leases_empty_at(l.expires, now);
        RETURN;
    END IF;
    -- strikes and blocks (penalty.rs)
    s := ratelimit.rl__strikes_decode(fn, entries);
    -- a block in force at now (Strikes::block_at)
    blocked := s.blocked AND (s.until IS NULL OR s.until > now);
    until := CASE WHEN blocked THEN s.until END;
    IF step = 'unblock' THEN
        IF entries IS NULL THEN answer := 'false'; RETURN; END IF;
        answer := to_jsonb(blocked);
        new_entries := ratelimit.rl__strikes_encode(0, 0, 0, false, NULL);
        new_empty_at := 0;
        RETURN;
    END IF;
    IF step = 'penalize' THEN
        strikes_end := greatest(s.forgotten_at, least(s.last_strike_at::numeric + (args ->> 'window_ms')::bigint,
                                                        9223372036854775807)::bigint);
        remembered := s.strikes > 0 AND now < strikes_end;
        strikes := CASE WHEN remembered THEN s.strikes + 1 ELSE 1 END;
        own_end := least(now + (args ->> 'window_ms')::bigint, max_wait);
        forgotten := CASE WHEN remembered THEN greatest(s.forgotten_at, own_end) ELSE own_end END;
        IF strikes > (args ->> 'free')::bigint THEN
            doublings := least(strikes - (args ->> 'free')::bigint, 62);
            length_ms := trunc(least((args ->> 'base_ms')::bigint::float8 * power(2::float8, doublings),
                                     (args ->> 'max_ms')::bigint::float8))::bigint;
            IF NOT blocked THEN
                blocked := true; until := least(now + length_ms, max_wait);
            ELSIF until IS NOT NULL THEN
                until := greatest(until, least(now + length_ms, max_wait));
            END IF;
        END IF;
        answer := ratelimit.rl__block_answer(strikes, blocked, until, now);
        new_entries := ratelimit.rl__strikes_encode(strikes, greatest(now, s.last_strike_at), forgotten, blocked, until);
        -- when the row stops mattering (Strikes::empty_at)
        new_empty_at := CASE WHEN blocked AND until IS NULL THEN 9223372036854775807
                             WHEN blocked THEN greatest(until, forgotten) ELSE forgotten END;
        RETURN;
    END IF;
    -- block: never shortening a block in force
    length_ms := (args ->> 'length_ms')::bigint;
    IF length_ms IS NULL OR (blocked AND until IS NULL) THEN
        until := NULL;
    ELSIF blocked THEN
        until := greatest(until, least(now + length_ms, max_wait));
    ELSE
        until := least(now + length_ms, max_wait);
    END IF;
    answer := ratelimit.rl__block_answer(s.strikes, true, until, now);
    new_entries := ratelimit.rl__strikes_encode(s.strikes, s.last_strike_at, s.forgotten_at, true, until);
    strikes_end := CASE WHEN s.strikes > 0 THEN s.forgotten_at ELSE 0 END;
    new_empty_at := greatest(CASE WHEN until IS NULL THEN 9223372036854775807 ELSE greatest(until, strikes_end) END,
                             coalesce(row_empty_at, 0));
END
$$;

-- JSON values as arguments (args::json_arg): a number is an integer when it is one
-- (as_i64), else a double (infinite beyond a double's range); a string is text, read as a
-- number where a number is wanted when it is a plain decimal; booleans, arrays and objects
-- are no argument of any kind.

-- A JSON value as an error message shows it (Arg::describe of its json_arg).
CREATE OR REPLACE FUNCTION ratelimit.rl__json_describe(v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t text;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN RETURN 'NULL'; END IF;
    CASE jsonb_typeof(v)
        WHEN 'number' THEN
            IF ratelimit.rl__int(v::text) IS NOT NULL AND v::text !~ '^\+' THEN RETURN v::text; END IF;
            RETURN ratelimit.rl__describe(ratelimit.rl__json_double(v));
        WHEN 'string' THEN
            t := v #>> '{}';
            RETURN '''' || replace(left(t, 40), '''', '''''') || CASE WHEN length(t) > 40 THEN '...' ELSE '' END || '''';
        WHEN 'boolean' THEN RETURN v::text;
        WHEN 'array' THEN RETURN 'a JSON array';
        ELSE RETURN 'a JSON object';
    END CASE;
END
$$;

-- A JSON number as a double (args::number_f64): beyond a double's range, infinite (or 0
-- below its smallest).
CREATE OR REPLACE FUNCTION ratelimit.rl__json_double(v jsonb) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n numeric := (v #>> '{}')::numeric;
BEGIN
    RETURN n::float8;
EXCEPTION WHEN numeric_value_out_of_range THEN
    IF abs(n) < 1 THEN RETURN 0; END IF;
    RETURN CASE WHEN n > 0 THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END;
END
$$;

-- The number a JSON value stands for (args::as_number), or NULL.
CREATE OR REPLACE FUNCTION ratelimit.rl__json_number(v jsonb) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t text;
BEGIN
    IF v IS NULL THEN RETURN NULL; END IF;
    IF jsonb_typeof(v) = 'number' THEN RETURN ratelimit.rl__json_double(v); END IF;
    IF jsonb_typeof(v) <> 'string' THEN RETURN NULL; END IF;
    t := btrim(v #>> '{}');
    IF t = '' OR t !~ '^[0-9+.eE-]+$' OR t !~ '[0-9]' THEN RETURN NULL; END IF;
    BEGIN
        RETURN t::float8;
    EXCEPTION WHEN others THEN
        -- float8in refuses what Rust reads as infinite or 0; both are refused alike below
        IF t ~ '^[+-]?[0-9.]+[eE][+-]?[0-9]+$' THEN
            RETURN CASE WHEN t ~ '[eE]-' THEN 0 WHEN t ~ '^-' THEN '-Infinity'::float8 ELSE 'Infinity'::float8 END;
        END IF;
        RETURN NULL;
    END;
END
$$;

-- A finite number greater than 0, from JSON (args::positive_number of a json_arg).
CREATE OR REPLACE FUNCTION ratelimit.rl__json_positive(fn text, what text, v jsonb) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n double precision := ratelimit.rl__json_number(v);
BEGIN
    IF n IS NULL OR NOT (n > 0 AND n < 'Infinity'::float8) OR n = 'NaN'::float8 THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOT_POSITIVE@, what, ratelimit.rl__json_describe(v)));
    END IF;
    RETURN n;
END
$$;

-- A bucket number from JSON (args::token_number).
CREATE OR REPLACE FUNCTION ratelimit.rl__json_tokens(fn text, what text, v jsonb) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n double precision := ratelimit.rl__json_positive(fn, what, v);
BEGIN
    IF n > @MAX_TOKENS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_AT_MOST@, what, @MAX_TOKENS@, ratelimit.rl__json_describe(v)));
    END IF;
    RETURN n;
END
$$;

-- A budget amount from JSON as exact millionths (args::amount_micros): integers exactly,
-- text with up to 6 decimals exactly, others rounded.
CREATE OR REPLACE FUNCTION ratelimit.rl__json_micros(fn text, what text, v jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n double precision := ratelimit.rl__json_positive(fn, what, v);
    t text;
BEGIN
    IF n > @MAX_AMOUNT@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_AT_MOST@, what, @MAX_AMOUNT@, ratelimit.rl__json_describe(v)));
    END IF;
    IF n < 1.0::float8 / @MICROS_PER_UNIT@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_BELOW_A_MILLIONTH@, what, ratelimit.rl__json_describe(v)));
    END IF;
    IF jsonb_typeof(v) = 'number' AND ratelimit.rl__int(v::text) IS NOT NULL THEN
        RETURN ratelimit.rl__int(v::text) * @MICROS_PER_UNIT@;
    END IF;
    IF jsonb_typeof(v) = 'string' THEN
        t := regexp_replace(btrim(v #>> '{}'), '^\+', '');
        IF t ~ '^[0-9]*(\.[0-9]{0,6})?$' THEN
            RETURN coalesce(nullif(split_part(t, '.', 1), '')::bigint, 0) * @MICROS_PER_UNIT@
                 + coalesce(nullif(rpad(split_part(t, '.', 2), 6, '0'), '000000')::bigint, 0);
        END IF;
    END IF;
    RETURN ratelimit.rl__round(n * @MICROS_PER_UNIT@)::bigint;
END
$$;

-- A window's length from JSON (args::duration_ms).
CREATE OR REPLACE FUNCTION ratelimit.rl__json_duration_ms(fn text, what text, v jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n double precision := ratelimit.rl__json_positive(fn, what, v);
BEGIN
    IF n > @MAX_DURATION_SECONDS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_DURATION_TOO_LONG@, what, @MAX_DURATION_SECONDS@, ratelimit.rl__json_describe(v)));
    END IF;
    RETURN greatest(ratelimit.rl__round(n * 1000)::bigint, 1);
END
$$;

-- A key or name from JSON (args::key, args::name).
CREATE OR REPLACE FUNCTION ratelimit.rl__json_key(fn text, v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(v) IS DISTINCT FROM 'string' THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_NOT_TEXT@, 'key', ratelimit.rl__json_describe(v)));
    END IF;
    RETURN ratelimit.rl__key(fn, v #>> '{}');
END
$$;

-- A period from JSON (args::period), in its canonical text.
CREATE OR REPLACE FUNCTION ratelimit.rl__json_period(fn text, v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(v) IS DISTINCT FROM 'string' THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_PERIOD@, ratelimit.rl__json_describe(v)));
    END IF;
    RETURN ratelimit.rl__period(fn, v #>> '{}');
END
$$;
-- What rl_spend decides on a row (budget::spend): the answer and the row to store.
CREATE OR REPLACE FUNCTION ratelimit.rl__spend_decision(has_row boolean, used bigint, resets_at bigint, period text,
                                                        quota bigint, cost bigint, now bigint,
                                                        OUT admitted boolean, OUT answer jsonb,
                                                        OUT new_used bigint, OUT new_resets_at bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    cur boolean := has_row AND resets_at > now;
BEGIN
    new_used := CASE WHEN cur THEN greatest(used, 0) ELSE 0 END + cost;
    new_resets_at := CASE WHEN cur THEN resets_at ELSE ratelimit.rl__period_end(period, now) END;
    admitted := new_used <= quota;
    answer := ratelimit.rl__spend_answer(has_row, used, resets_at, period, quota, cost, now);
END
$$;

-- A limit object's kind from the fields it has (limit_json::Kind::of, generated from
-- limit_json::KINDS): the first kind whose marker field it holds, else a bucket.
CREATE OR REPLACE FUNCTION ratelimit.rl__limit_kind(v jsonb) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT @KIND_OF_V@
$$;

-- The kind column of the rl_entries row a window of this kind keeps its entries in
-- (rows::window_kind): a sliding and a fixed window on one key are apart.
CREATE OR REPLACE FUNCTION ratelimit.rl__window_rows(kind int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE kind WHEN @KIND_FIXED_WINDOW@ THEN 'fixed_window' ELSE 'window' END
$$;

-- The limits of rl_take_all or of a policy, parsed one item at a time (limit_json::shape): the
-- kind (0 bucket, 1 budget, 2 window, 3 fixed window, the order rows are kept in), key,
-- period and numbers.
-- prefix leads each error ('rl_take_all: item 3').
CREATE OR REPLACE FUNCTION ratelimit.rl__limit_item(prefix text, v jsonb, OUT kind int, OUT key text, OUT period text,
                                                    OUT burst double precision, OUT rate double precision,
                                                    OUT cost double precision, OUT quota bigint, OUT micros bigint,
                                                    OUT window_ms bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    allowed text[];
    extra text;
    m double precision;
    scaled double precision;
    in_range boolean;
BEGIN
    IF jsonb_typeof(v) <> 'object' THEN PERFORM ratelimit.rl__invalid(prefix, @MSG_NOT_AN_OBJECT@); END IF;
    kind := ratelimit.rl__limit_kind(v);
    allowed := @ITEM_ALLOWED@;
    SELECT k INTO extra FROM jsonb_each(v) WITH ORDINALITY AS e(k, x, n) WHERE NOT k = ANY (allowed) ORDER BY n LIMIT 1;
    IF extra IS NOT NULL THEN
        PERFORM ratelimit.rl__invalid(prefix, format(@MSG_UNKNOWN_LIMIT_FIELD@, to_jsonb(extra)::text, @ITEM_FIELDS_BY_KIND@));
    END IF;
    key := ratelimit.rl__json_key(prefix, v -> 'key');
    IF kind IN (@KIND_WINDOW@, @KIND_FIXED_WINDOW@) THEN
        quota := ratelimit.rl__json_micros(prefix, 'limit', v -> 'limit');
        window_ms := CASE kind WHEN @KIND_WINDOW@ THEN ratelimit.rl__json_duration_ms(prefix, 'window_seconds', v -> 'window_seconds')
                     ELSE ratelimit.rl__json_duration_ms(prefix, 'fixed_window_seconds', v -> 'fixed_window_seconds') END;
        micros := CASE WHEN v ? 'cost' THEN ratelimit.rl__json_micros(prefix, 'cost', v -> 'cost') ELSE @MICROS_PER_UNIT@ END;
    ELSIF kind = @KIND_BUDGET@ THEN
        period := ratelimit.rl__json_period(prefix, v -> 'period');
        quota := ratelimit.rl__json_micros(prefix, 'quota', v -> 'quota');
        micros := CASE WHEN v ? 'cost' THEN ratelimit.rl__json_micros(prefix, 'cost', v -> 'cost') ELSE @MICROS_PER_UNIT@ END;
    ELSE
        burst := ratelimit.rl__json_tokens(prefix, 'burst', v -> 'burst');
        rate := ratelimit.rl__json_tokens(prefix, 'refill_per_minute', v -> 'refill_per_minute');
        cost := CASE WHEN v ? 'cost' THEN ratelimit.rl__json_tokens(prefix, 'cost', v -> 'cost') ELSE 1 END;
    END IF;
    IF v ? 'multiplier' THEN
        -- the limit scaled as a policy's tier scales it (LimitShape::scales_by, ::scaled)
        m := ratelimit.rl__json_positive(prefix, 'multiplier', v -> 'multiplier');
        IF kind = @KIND_BUCKET@ THEN
            scaled := ratelimit.rl__mul(burst, m);
            rate := ratelimit.rl__mul(rate, m);
            burst := scaled;
            in_range := burst > 0 AND burst <= @MAX_TOKENS@ AND rate > 0 AND rate <= @MAX_TOKENS@;
        ELSE
            scaled := ratelimit.rl__round(ratelimit.rl__mul(quota::float8, m));
            in_range := scaled >= 1 AND scaled <= @MAX_TOKENS@;
            quota := CASE WHEN in_range THEN scaled::bigint END;
        END IF;
        IF NOT in_range THEN
            PERFORM ratelimit.rl__invalid(prefix, format(@MSG_ITEM_MULTIPLIER_OUT_OF_RANGE@, @MAX_TOKENS@, @MAX_AMOUNT@));
        END IF;
    END IF;
END
$$;

-- rl_take_all over parsed limits (protocol::take_all and take_all::decide): decide on the rows
-- as read; a refusal answers there, writing nothing. Otherwise hold every row (budgets,
-- then windows, then buckets, each in key order, the same for every call, so concurrent
-- calls never wait in a cycle), decide again on the held rows, and write them when all
-- admit. items are the limits in row order with their given positions (pos, 1-based).
CREATE OR REPLACE FUNCTION ratelimit.rl__take_all(fn text, items jsonb, now bigint, decide_only boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    n int := jsonb_array_length(items);
    it jsonb;
    held boolean := false;
    answers jsonb[];
    admitted_all boolean;
    retry bigint;
    wait bigint;
    d record;
    b record;
    w record;
    u record;
    r_level double precision[];
    r_refilled bigint[];
    r_used bigint[];
    r_resets bigint[];
    r_quota bigint[];
    r_entries text[];
    r_found boolean[];
    new_level double precision[];
    new_refilled bigint[];
    new_full bigint[];
    new_used bigint[];
    new_resets bigint[];
    new_entries text[];
    new_empty bigint[];
    too_many boolean[];
    x record;
BEGIN
    IF NOT decide_only THEN IF NOT ratelimit.rl__writable(fn) THEN RETURN NULL; END IF; END IF;
    LOOP
        -- the rows: as they stand, or held
        FOR i IN 1..n LOOP
            it := items -> (i - 1);
            IF held THEN
                CASE (it ->> 'kind')::int
                    WHEN @KIND_BUDGET@ THEN
                        INSERT INTO ratelimit.rl_budget (key, period, used, resets_at)
                        VALUES (it ->> 'key', it ->> 'period', 0, ratelimit.rl__period_end(it ->> 'period', now))
                        ON CONFLICT (key, period) DO NOTHING;
                    WHEN @KIND_WINDOW@, @KIND_FIXED_WINDOW@ THEN
                        INSERT INTO ratelimit.rl_entries (key, kind, entries, empty_at)
                        VALUES (it ->> 'key', ratelimit.rl__window_rows((it ->> 'kind')::int), '', 0)
                        ON CONFLICT (key, kind) DO NOTHING;
                    ELSE NULL;
                END CASE;
            END IF;
        END LOOP;
        FOR pass IN 1..3 LOOP
            -- held rows are locked budgets first, then windows, then buckets
            FOR i IN 1..n LOOP
                it := items -> (i - 1);
                CONTINUE WHEN (CASE (it ->> 'kind')::int WHEN @KIND_BUDGET@ THEN 1 WHEN @KIND_WINDOW@ THEN 2
                                                         WHEN @KIND_FIXED_WINDOW@ THEN 2 ELSE 3 END) <> pass;
                IF (it ->> 'kind')::int = @KIND_BUDGET@ THEN
                    IF held THEN
                        SELECT t.used, t.resets_at, t.quota INTO x FROM ratelimit.rl_budget AS t
                        WHERE t.key = it ->> 'key' AND t.period = it ->> 'period' FOR UPDATE;
                    ELSE
                        SELECT t.used, t.resets_at, t.quota INTO x FROM ratelimit.rl_budget AS t
                        WHERE t.key = it ->> 'key' AND t.period = it ->> 'period';
                    END IF;
                    r_found[i] := FOUND; r_used[i] := x.used; r_resets[i] := x.resets_at; r_quota[i] := x.quota;
                ELSIF (it ->> 'kind')::int IN (@KIND_WINDOW@, @KIND_FIXED_WINDOW@) THEN
                    IF held THEN
                        SELECT t.entries INTO x FROM ratelimit.rl_entries AS t
                        WHERE t.key = it ->> 'key' AND t.kind = ratelimit.rl__window_rows((it ->> 'kind')::int) FOR UPDATE;
                    ELSE
                        SELECT t.entries INTO x FROM ratelimit.rl_entries AS t
                        WHERE t.key = it ->> 'key' AND t.kind = ratelimit.rl__window_rows((it ->> 'kind')::int);
                    END IF;
                    r_found[i] := FOUND; r_entries[i] := CASE WHEN FOUND THEN x.entries END;
                ELSE
                    IF held THEN
                        INSERT INTO ratelimit.rl_bucket (key, level, refilled_at, full_at)
                        VALUES (it ->> 'key', (it ->> 'burst')::float8, 0, 0) ON CONFLICT (key) DO NOTHING;
                        SELECT t.level, t.refilled_at INTO x FROM ratelimit.rl_bucket AS t WHERE t.key = it ->> 'key' FOR UPDATE;
                    ELSE
                        SELECT t.level, t.refilled_at INTO x FROM ratelimit.rl_bucket AS t WHERE t.key = it ->> 'key';
                    END IF;
                    r_found[i] := FOUND; r_level[i] := x.level; r_refilled[i] := x.refilled_at;
                END IF;
            END LOOP;
        END LOOP;
        -- every item decided on its row
        admitted_all := true;
        retry := 0;
        FOR i IN 1..n LOOP
            it := items -> (i - 1);
            IF (it ->> 'kind')::int = @KIND_BUDGET@ THEN
                d := ratelimit.rl__spend_decision(r_found[i], r_used[i], r_resets[i], it ->> 'period',
                    (it ->> 'quota')::bigint, (it ->> 'micros')::bigint, now);
                new_used[i] := d.new_used; new_resets[i] := d.new_resets_at;
                wait := CASE WHEN d.admitted THEN 0 ELSE d.new_resets_at - now END;
            ELSIF (it ->> 'kind')::int IN (@KIND_WINDOW@, @KIND_FIXED_WINDOW@) THEN
                d := ratelimit.rl__window_decision(fn, r_entries[i], (it ->> 'quota')::bigint, (it ->> 'window_ms')::bigint,
                    (it ->> 'micros')::bigint, now, false, (it ->> 'kind')::int = @KIND_FIXED_WINDOW@);
                new_entries[i] := d.new_entries; new_empty[i] := d.new_empty_at; too_many[i] := d.too_many;
                wait := (d.answer ->> 'retry_after_ms')::bigint;
            ELSE
                d := ratelimit.rl__take_decision(r_found[i], r_level[i], r_refilled[i], (it ->> 'burst')::float8,
                    (it ->> 'rate')::float8, (it ->> 'cost')::float8, now);
                new_level[i] := d.new_level; new_refilled[i] := d.new_refilled_at; new_full[i] := d.new_full_at;
                wait := (d.answer ->> 'retry_after_ms')::bigint;
            END IF;
            answers[i] := d.answer;
            admitted_all := admitted_all AND d.admitted;
            retry := greatest(retry, wait);
        END LOOP;
        EXIT WHEN held OR NOT admitted_all OR decide_only;
        held := true;
    END LOOP;
    IF admitted_all AND NOT decide_only THEN
        FOR i IN 1..n LOOP
            it := items -> (i - 1);
            IF (it ->> 'kind')::int = @KIND_BUDGET@ THEN
                UPDATE ratelimit.rl_budget AS t SET used = new_used[i], resets_at = new_resets[i],
                    quota = (it ->> 'quota')::bigint
                WHERE t.key = it ->> 'key' AND t.period = it ->> 'period';
                IF r_found[i] THEN
                    PERFORM ratelimit.rl__keep_ended(it ->> 'key', it ->> 'period', r_used[i], r_resets[i], r_quota[i],
                                                     new_resets[i]);
                END IF;
            ELSIF (it ->> 'kind')::int IN (@KIND_WINDOW@, @KIND_FIXED_WINDOW@) THEN
                IF too_many[i] THEN PERFORM ratelimit.rl__window_too_full(fn); END IF;
                UPDATE ratelimit.rl_entries AS t SET entries = new_entries[i], empty_at = new_empty[i]
                WHERE t.key = it ->> 'key' AND t.kind = ratelimit.rl__window_rows((it ->> 'kind')::int);
            ELSE
                UPDATE ratelimit.rl_bucket AS t SET level = new_level[i], refilled_at = new_refilled[i], full_at = new_full[i]
                WHERE t.key = it ->> 'key';
            END IF;
        END LOOP;
        retry := 0;
    ELSIF NOT admitted_all THEN
        -- nothing is charged: the items that would admit say what they have left now
        FOR i IN 1..n LOOP
            CONTINUE WHEN NOT (answers[i] ->> 'admitted')::boolean;
            it := items -> (i - 1);
            answers[i] := CASE (it ->> 'kind')::int
                WHEN @KIND_BUDGET@ THEN ratelimit.rl__spend_answer(r_found[i], r_used[i], r_resets[i], it ->> 'period',
                                                       (it ->> 'quota')::bigint, 0, now)
                WHEN @KIND_WINDOW@ THEN (ratelimit.rl__window_decision(fn, r_entries[i], (it ->> 'quota')::bigint,
                                                           (it ->> 'window_ms')::bigint, 0, now, false, false)).answer
                WHEN @KIND_FIXED_WINDOW@ THEN (ratelimit.rl__window_decision(fn, r_entries[i], (it ->> 'quota')::bigint,
                                                           (it ->> 'window_ms')::bigint, 0, now, false, true)).answer
                ELSE (ratelimit.rl__take_decision(r_found[i], r_level[i], r_refilled[i], (it ->> 'burst')::float8,
                                                  (it ->> 'rate')::float8, 0, now)).answer END;
        END LOOP;
    END IF;
    -- the items in the order given
    SELECT jsonb_agg(answers[i] ORDER BY (items -> (i - 1) ->> 'pos')::int) INTO x FROM generate_series(1, n) AS i;
    RETURN jsonb_build_object('admitted', admitted_all, 'retry_after_ms', retry,
        'retry_after_seconds', ratelimit.rl__ceil_seconds(retry), 'items', x.jsonb_agg);
END
$$;

-- The limits of rl_take_all or a policy's items as rl__take_all takes them: sorted into
-- row order, and refused when two name one row (call_args::TakeAllArgs::parse).
CREATE OR REPLACE FUNCTION ratelimit.rl__sorted_items(fn text, items jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    sorted jsonb;
    dup record;
BEGIN
    SELECT jsonb_agg(i ORDER BY (i ->> 'kind')::int, (i ->> 'key') COLLATE "C", (i ->> 'period') COLLATE "C", (i ->> 'pos')::int)
    INTO sorted FROM jsonb_array_elements(items) AS i;
    SELECT least(a.p, b.p) AS first, greatest(a.p, b.p) AS second INTO dup
    FROM (SELECT (e ->> 'pos')::int AS p, e ->> 'kind' AS kind, e ->> 'key' AS key, e ->> 'period' AS period, n
          FROM jsonb_array_elements(sorted) WITH ORDINALITY AS s(e, n)) AS a
    JOIN (SELECT (e ->> 'pos')::int AS p, e ->> 'kind' AS kind, e ->> 'key' AS key, e ->> 'period' AS period, n
          FROM jsonb_array_elements(sorted) WITH ORDINALITY AS s(e, n)) AS b
      ON b.n = a.n + 1 AND a.kind = b.kind AND a.key = b.key AND a.period IS NOT DISTINCT FROM b.period
    ORDER BY a.n LIMIT 1;
    IF FOUND THEN
        PERFORM ratelimit.rl__invalid(fn, format(
            'items %s and %s are the same limit (one key may appear once per kind and period)', dup.first, dup.second));
    END IF;
    RETURN sorted;
END
$$;

-- rl_take_all's limits (call_args::TakeAllArgs::parse): an array of 1 to @MAX_ITEMS@ limit
-- objects, each read by rl__limit_item, as items {pos, kind, key, period, burst, rate, cost,
-- quota, micros, window_ms} in the order their rows are locked (rl__sorted_items), no limit twice.
CREATE OR REPLACE FUNCTION ratelimit.rl__limit_items(fn text, limits jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    items jsonb := '[]';
    item record;
BEGIN
    IF jsonb_typeof(limits) <> 'array' THEN
        PERFORM ratelimit.rl__invalid(fn, @MSG_LIMITS_NOT_AN_ARRAY@);
    END IF;
    IF jsonb_array_length(limits) NOT BETWEEN 1 AND @MAX_ITEMS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_ITEM_COUNT@, 'limits', @MAX_ITEMS@, jsonb_array_length(limits)));
    END IF;
    FOR i IN 1..jsonb_array_length(limits) LOOP
        item := ratelimit.rl__limit_item(fn || ': item ' || i, limits -> (i - 1));
        items := items || jsonb_build_object('pos', i, 'kind', item.kind, 'key', item.key, 'period', item.period,
            'burst', item.burst, 'rate', item.rate, 'cost', item.cost, 'quota', item.quota, 'micros', item.micros,
            'window_ms', item.window_ms);
    END LOOP;
    RETURN ratelimit.rl__sorted_items(fn, items);
END
$$;

-- Gives each item its cost back (op 'refund', protocol::take_all::refund_limits, a bucket as
-- rl_refund, a budget as rl_refund_budget, a window by forgetting its newest admissions,
-- answered as rl_window_peek), or charges it whatever it holds (op 'charge',
-- protocol::take_all::charge_limits, a bucket as rl_charge, a budget as a charge against its
-- quota, an admitted spend; a window past its limit, window::charge). Rows are changed in the
-- order rl__take_all holds them (budgets, windows, buckets, each by key); the answers are in
-- the items' own order (pos).
CREATE OR REPLACE FUNCTION ratelimit.rl__change_items(fn text, op text, items jsonb, now bigint) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    it jsonb;
    answers jsonb := '{}';
    charge CONSTANT boolean := op = 'charge';
BEGIN
    FOR it IN SELECT i FROM jsonb_array_elements(items) AS i
              ORDER BY CASE (i ->> 'kind')::int WHEN @KIND_BUDGET@ THEN 0 WHEN @KIND_WINDOW@ THEN 1
                                                WHEN @KIND_FIXED_WINDOW@ THEN 1 ELSE 2 END,
                       (i ->> 'kind')::int, (i ->> 'key') COLLATE "C", (i ->> 'period') COLLATE "C" LOOP
        answers := answers || jsonb_build_object(it ->> 'pos', CASE (it ->> 'kind')::int
            WHEN @KIND_BUCKET@ THEN ratelimit.rl__bucket_change(fn, op, it ->> 'key', (it ->> 'burst')::float8,
                                                    (it ->> 'rate')::float8, (it ->> 'cost')::float8, now)
            WHEN @KIND_BUDGET@ THEN ratelimit.rl__budget_change(fn, CASE WHEN charge THEN 'charge_against' ELSE 'refund' END,
                                                    it ->> 'key', it ->> 'period',
                                                    CASE WHEN charge THEN (it ->> 'quota')::bigint END,
                                                    (it ->> 'micros')::bigint, now)
            ELSE ratelimit.rl__entries_change(fn, it ->> 'key', ratelimit.rl__window_rows((it ->> 'kind')::int),
                CASE WHEN charge THEN 'window_charge' ELSE 'window_refund' END,
                jsonb_build_object('limit', (it ->> 'quota')::bigint, 'window_ms', (it ->> 'window_ms')::bigint,
                                   'cost', (it ->> 'micros')::bigint, 'fixed', (it ->> 'kind')::int = @KIND_FIXED_WINDOW@),
                now, '') END);
    END LOOP;
    RETURN (SELECT jsonb_agg(a.value ORDER BY a.key::int) FROM jsonb_each(answers) AS a);
END
$$;

-- A policy definition parsed and validated whole (policy::Policy::parse): its limits as
-- normalized items [{kind, burst, rate, period, quota, window_ms}] (quota: millionths of a
-- budget's quota or a window's limit), tiers {name: multiplier}, shadow, and the canonical
-- text stored and returned (Policy::to_json, written as the native library writes it).
CREATE OR REPLACE FUNCTION ratelimit.rl__policy_parse(fn text, definition jsonb, OUT limits jsonb, OUT tiers jsonb,
                                                      OUT shadow boolean, OUT canonical text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    extra text;
    item jsonb;
    prefix text;
    field text;
    kind int;
    allowed text[];
    t record;
    m double precision;
    v double precision;
    scaled double precision;
    texts text[] := '{}';
    tier_texts text[] := '{}';
BEGIN
    IF jsonb_typeof(definition) IS DISTINCT FROM 'object' THEN
        PERFORM ratelimit.rl__invalid(fn, @MSG_DEFINITION_NOT_AN_OBJECT@);
    END IF;
    SELECT k INTO extra FROM jsonb_object_keys(definition) WITH ORDINALITY AS e(k, n)
    WHERE k NOT IN ('limits', 'tiers', 'shadow') ORDER BY n LIMIT 1;
    IF extra IS NOT NULL THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_DEFINITION_UNKNOWN_FIELD@, to_jsonb(extra)::text));
    END IF;
    IF jsonb_typeof(definition -> 'limits') IS DISTINCT FROM 'array' THEN
        PERFORM ratelimit.rl__invalid(fn, @MSG_DEFINITION_LIMITS_NOT_AN_ARRAY@);
    END IF;
    IF jsonb_array_length(definition -> 'limits') NOT BETWEEN 1 AND @MAX_LIMITS@ THEN
        PERFORM ratelimit.rl__invalid(fn, format(@MSG_ITEM_COUNT@, 'definition.limits', @MAX_LIMITS@,
                                                 jsonb_array_length(definition -> 'limits')));
    END IF;
    limits := '[]';
    FOR i IN 1..jsonb_array_length(definition -> 'limits') LOOP
        item := definition -> 'limits' -> (i - 1);
        prefix := fn || ': definition.limits item ' || i;
        IF jsonb_typeof(item) <> 'object' THEN PERFORM ratelimit.rl__invalid(prefix, @MSG_NOT_AN_OBJECT@); END IF;
        kind := ratelimit.rl__limit_kind(item);
        allowed := @POLICY_ALLOWED@;
        SELECT k INTO extra FROM jsonb_object_keys(item) WITH ORDINALITY AS e(k, n) WHERE NOT k = ANY (allowed)
        ORDER BY n LIMIT 1;
        IF extra IS NOT NULL THEN
            PERFORM ratelimit.rl__invalid(prefix, format(@MSG_UNKNOWN_LIMIT_FIELD@, to_jsonb(extra)::text, @POLICY_FIELDS_BY_KIND@));
        END IF;
        IF kind = @KIND_BUDGET@ THEN
            limits := limits || jsonb_build_object('kind', @KIND_BUDGET@, 'period', ratelimit.rl__json_period(prefix, item -> 'period'),
                'quota', ratelimit.rl__json_micros(prefix, 'quota', item -> 'quota'));
            texts := texts || format('{"period":%s,"quota":%s}', to_jsonb(limits -> -1 ->> 'period')::text,
                                     ratelimit.rl__micros((limits -> -1 ->> 'quota')::bigint)::text);
        ELSIF kind IN (@KIND_WINDOW@, @KIND_FIXED_WINDOW@) THEN
            field := CASE kind WHEN @KIND_WINDOW@ THEN 'window_seconds' ELSE 'fixed_window_seconds' END;
            limits := limits || jsonb_build_object('kind', kind, 'quota', ratelimit.rl__json_micros(prefix, 'limit', item -> 'limit'),
                'window_ms', ratelimit.rl__json_duration_ms(prefix, field, item -> field));
            texts := texts || format('{"limit":%s,%s:%s}', ratelimit.rl__micros((limits -> -1 ->> 'quota')::bigint)::text,
                                     to_jsonb(field)::text, ratelimit.rl__number((limits -> -1 ->> 'window_ms')::float8 / 1000)::text);
        ELSE
            limits := limits || jsonb_build_object('kind', @KIND_BUCKET@, 'burst', ratelimit.rl__json_tokens(prefix, 'burst', item -> 'burst'),
                'rate', ratelimit.rl__json_tokens(prefix, 'refill_per_minute', item -> 'refill_per_minute'));
            texts := texts || format('{"burst":%s,"refill_per_minute":%s}',
                                     ratelimit.rl__number((limits -> -1 ->> 'burst')::float8)::text,
                                     ratelimit.rl__number((limits -> -1 ->> 'rate')::float8)::text);
        END IF;
    END LOOP;
    tiers := '{}';
    IF definition -> 'tiers' IS NOT NULL AND jsonb_typeof(definition -> 'tiers') <> 'null' THEN
        IF jsonb_typeof(definition -> 'tiers') <> 'object' THEN
            PERFORM ratelimit.rl__invalid(fn, @MSG_TIERS_NOT_AN_OBJECT@);
        END IF;
        FOR t IN SELECT e.key, e.value FROM jsonb_each(definition -> 'tiers') WITH ORDINALITY AS e(key, value, n) ORDER BY n LOOP
            IF t.key = '' THEN PERFORM ratelimit.rl__invalid(fn, @MSG_TIER_NAME_EMPTY@); END IF;
            tiers := tiers || jsonb_build_object(t.key, ratelimit.rl__json_positive(fn, 'definition.tiers.' || t.key, t.value));
        END LOOP;
        -- every multiplier keeps every limit valid (PolicyLimit::scales_by), in name order
        FOR t IN SELECT e.key, e.value FROM jsonb_each(tiers) AS e ORDER BY e.key COLLATE "C" LOOP
            m := (t.value #>> '{}')::float8;
            FOR i IN 1..jsonb_array_length(limits) LOOP
                item := limits -> (i - 1);
                IF (item ->> 'kind')::int = @KIND_BUCKET@ THEN
                    v := ratelimit.rl__mul((item ->> 'burst')::float8, m);
                    scaled := ratelimit.rl__mul((item ->> 'rate')::float8, m);
                    CONTINUE WHEN v > 0 AND v <= @MAX_TOKENS@ AND scaled > 0 AND scaled <= @MAX_TOKENS@;
                ELSE
                    scaled := ratelimit.rl__mul((item ->> 'quota')::bigint::float8, m);
                    scaled := ratelimit.rl__round(scaled);
                    CONTINUE WHEN scaled >= 1 AND scaled <= @MAX_TOKENS@;
                END IF;
                PERFORM ratelimit.rl__invalid(fn, format(@MSG_MULTIPLIER_OUT_OF_RANGE@, t.key, ratelimit.rl__number(m)::text, i,
                                                         @MAX_TOKENS@, @MAX_AMOUNT@));
            END LOOP;
            tier_texts := tier_texts || (to_jsonb(t.key)::text || ':' || ratelimit.rl__number(m)::text);
        END LOOP;
    END IF;
    shadow := false;
    IF definition -> 'shadow' IS NOT NULL AND jsonb_typeof(definition -> 'shadow') <> 'null' THEN
        IF jsonb_typeof(definition -> 'shadow') <> 'boolean' THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_SHADOW@, CASE jsonb_typeof(definition -> 'shadow')
                WHEN 'array' THEN format('an array of %s values', jsonb_array_length(definition -> 'shadow'))
                WHEN 'object' THEN 'an object' ELSE (definition -> 'shadow')::text END));
        END IF;
        shadow := (definition -> 'shadow')::boolean;
    END IF;
    canonical := format('{"limits":[%s],"tiers":{%s},"shadow":%s}', array_to_string(texts, ','),
                        array_to_string(tier_texts, ','), CASE WHEN shadow THEN 'true' ELSE 'false' END);
END
$$;

-- The key of limit i (0-based) of a policy for a subject (Policy::key): U+0001, then
-- <bytes of policy>:<policy>:<i>:<subject>.
CREATE OR REPLACE FUNCTION ratelimit.rl__policy_key(policy text, subject text, i int) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT chr(1) || octet_length(policy)::text || ':' || policy || ':' || i::text || ':' || subject
$$;

-- The one bucket of a policy that holds nothing else and is no shadow (rl_check's hot paths,
-- as checks::check_one_bucket takes them): its burst, refill per minute and refill seconds;
-- no row for any other policy. A SQL function PostgreSQL inlines into the statement that
-- reads it (not STRICT, STABLE, one SELECT), the OFFSET 0s keeping the definition parsed
-- once per statement.
CREATE OR REPLACE FUNCTION ratelimit.rl__one_bucket(policy text)
RETURNS TABLE (burst double precision, rate double precision, refill double precision)
LANGUAGE sql STABLE AS $$
    SELECT j.burst, j.rate, ratelimit.rl__refill_seconds(j.burst, j.rate)
    FROM (SELECT (def.v -> 'limits' -> 0 ->> 'burst')::float8 AS burst,
                 (def.v -> 'limits' -> 0 ->> 'refill_per_minute')::float8 AS rate
          FROM (SELECT r.definition::jsonb AS v FROM ratelimit.rl_policy AS r WHERE r.name = policy OFFSET 0) AS def
          WHERE jsonb_array_length(def.v -> 'limits') = 1 AND def.v -> 'limits' -> 0 ? 'burst'
            AND def.v -> 'shadow' = 'false' OFFSET 0) AS j
    OFFSET 0
$$;

-- rl_check's answer (policy::CheckDecision) for a policy of one bucket, no shadow, and a
-- subject not blocked (its hot paths): answer is the bucket's, and refused says whether it
-- refused; the call's wait is the bucket's. One jsonb_build_object, in a SQL function
-- PostgreSQL inlines (STABLE as jsonb_build_object is, each argument a variable), so the
-- admitted path pays nothing for it; the checked path builds the same keys from
-- rl__take_all's answer.
CREATE OR REPLACE FUNCTION ratelimit.rl__one_bucket_check_answer(answer jsonb, policy text, tier text, refused boolean)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('admitted', NOT refused, 'retry_after_ms', answer -> 'retry_after_ms',
        'retry_after_seconds', answer -> 'retry_after_seconds', 'items', jsonb_build_array(answer),
        'policy', policy, 'tier', tier, 'shadow', false, 'would_refuse', refused, 'blocked', false)
$$;

-- A stored policy parsed, and its limits for a subject at a tier as rl__take_all items in
-- the policy's order (Policy::items; cost in units, charged to budgets and windows in
-- millionths). The multiplier of an unknown tier is an error (Policy::multiplier).
CREATE OR REPLACE FUNCTION ratelimit.rl__policy_items(fn text, policy text, subject text, tier text, cost double precision,
                                                      OUT items jsonb, OUT shadow boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    stored text;
    p record;
    m double precision := 1;
    l jsonb;
    q double precision;
    cost_micros double precision := cost * @MICROS_PER_UNIT@;
BEGIN
    SELECT t.definition INTO stored FROM ratelimit.rl_policy AS t WHERE t.name = policy;
    IF NOT FOUND THEN
        -- its own SQLSTATE (undefined_object), as the core's ErrorKind::UnknownPolicy
        RAISE EXCEPTION USING ERRCODE = '42704', MESSAGE = fn || ': ' || format(@MSG_NO_POLICY@, policy);
    END IF;
    p := ratelimit.rl__policy_parse(fn, stored::jsonb);
    shadow := p.shadow;
    IF tier IS NOT NULL THEN
        IF NOT p.tiers ? tier THEN
            PERFORM ratelimit.rl__invalid(fn, format(@MSG_UNKNOWN_TIER@, tier,
                (SELECT coalesce(string_agg(k, ', ' ORDER BY k COLLATE "C"), '') FROM jsonb_object_keys(p.tiers) AS k)));
        END IF;
        m := (p.tiers ->> tier)::float8;
    END IF;
    cost_micros := ratelimit.rl__round(cost_micros);
    items := '[]';
    FOR i IN 1..jsonb_array_length(p.limits) LOOP
        l := p.limits -> (i - 1);
        IF (l ->> 'kind')::int = @KIND_BUCKET@ THEN
            items := items || jsonb_build_object('pos', i, 'kind', @KIND_BUCKET@, 'key', ratelimit.rl__policy_key(policy, subject, i - 1),
                'burst', (l ->> 'burst')::float8 * m, 'rate', (l ->> 'rate')::float8 * m, 'cost', cost);
        ELSE
            q := (l ->> 'quota')::bigint::float8 * m;
            q := greatest(ratelimit.rl__round(q), 1);
            items := items || jsonb_build_object('pos', i, 'kind', (l ->> 'kind')::int,
                'key', ratelimit.rl__policy_key(policy, subject, i - 1), 'period', l ->> 'period',
                'quota', q::bigint, 'window_ms', (l ->> 'window_ms')::bigint, 'micros', cost_micros::bigint);
        END IF;
    END LOOP;
END
$$;

-- The setting under which the session's counts of policy live (rl__count): its bytes in
-- hexadecimal, as a setting's name takes letters and digits only, so every policy has its own.
CREATE OR REPLACE FUNCTION ratelimit.rl__counted(policy text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT 'pg_ratelimit_sql.counted_' || encode(convert_to(policy, 'UTF8'), 'hex')
$$;

-- One more in the count kept in setting s (empty or missing: none yet). True.
CREATE OR REPLACE FUNCTION ratelimit.rl__bump(s text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT set_config(s, (coalesce(nullif(current_setting(s, true), ''), '0')::bigint + 1)::text, false) IS NOT NULL
$$;

-- Marks policy counted under s, listed in pg_ratelimit_sql.counted for rl_policy_stats. True.
CREATE OR REPLACE FUNCTION ratelimit.rl__count_new(s text, policy text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT set_config(s, '1', false) IS NOT NULL
       AND set_config('pg_ratelimit_sql.counted',
                      (coalesce(nullif(current_setting('pg_ratelimit_sql.counted', true), ''), '{}')::text[] || policy)::text,
                      false) IS NOT NULL
$$;

-- rl__count's body: s is the policy's own setting.
CREATE OR REPLACE FUNCTION ratelimit.rl__count_under(s text, policy text, outcome text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT (nullif(current_setting(s, true), '') IS NOT NULL OR ratelimit.rl__count_new(s, policy))
       AND ratelimit.rl__bump(s || '_' || outcome)
       AND (outcome <> 'would_refuse' OR ratelimit.rl__bump(s || '_admitted'))
$$;

-- Counts an outcome of rl_check for this session (stats::CounterSink; a shadow policy's
-- refusal also admits, stats::PolicyCounts::add): the edition has no shared memory, so the
-- counts live in session settings, each a number: <s>_admitted, <s>_refused,
-- <s>_would_refuse and <s>_refused_blocked, where s is the policy's own setting
-- (rl__counted), which marks it counted. A check reads and writes its own numbers alone, in
-- SQL functions PostgreSQL inlines into the caller's expression (no PL/pgSQL of its own,
-- no document of every policy parsed). True.
CREATE OR REPLACE FUNCTION ratelimit.rl__count(policy text, outcome text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT ratelimit.rl__count_under(ratelimit.rl__counted(policy), policy, outcome)
$$;

-- Notes that rl_check refused subject under policy, for this session (refused::RefusedSlots::record):
-- the same space-saving summary as the native library's, in session settings. The setting
-- pg_ratelimit_sql.refused_slots numbers each policy met (at most @REFUSED_POLICIES@); the
-- policy numbered i keeps its at most @REFUSED_ENTRIES@ entries in four arrays, the settings
-- pg_ratelimit_sql.refused_<i>_k, _n, _e and _t, in the order the native slots fill: the
-- subject (k), refusals (n), error (e) and the last refusal (t); rl_top_refused shows a
-- subject's first @REFUSED_SUBJECT_BYTES@ bytes, cut at a character. A new subject takes a
-- free entry, else the first with the least n. Arrays, not one JSON document, so a refusal
-- reads and writes its own policy's entries only and finds its subject with
-- array_position; a subject refused again rewrites n and t alone.
CREATE OR REPLACE FUNCTION ratelimit.rl__refuse(policy text, subject text, now bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    slots jsonb := coalesce(nullif(current_setting('pg_ratelimit_sql.refused_slots', true), ''), '{}')::jsonb;
    slot text := slots ->> policy;
    prefix text;
    k text[];
    n bigint[];
    e bigint[];
    t bigint[];
    i int;
    m bigint;
BEGIN
    IF slot IS NULL THEN
        -- a policy not met yet in this session, or since rl_stats_reset: empty entries
        slot := (SELECT count(*) FROM jsonb_object_keys(slots))::text;
        IF slot::int >= @REFUSED_POLICIES@ THEN
            RETURN;
        END IF;
        PERFORM set_config('pg_ratelimit_sql.refused_slots', (slots || jsonb_build_object(policy, slot::int))::text, false);
        prefix := 'pg_ratelimit_sql.refused_' || slot || '_';
        k := '{}';
    ELSE
        prefix := 'pg_ratelimit_sql.refused_' || slot || '_';
        k := current_setting(prefix || 'k')::text[];
        n := current_setting(prefix || 'n')::bigint[];
        t := current_setting(prefix || 't')::bigint[];
        i := array_position(k, subject);
        IF i IS NOT NULL THEN
            n[i] := n[i] + 1;
            t[i] := now;
            PERFORM set_config(prefix || 'n', n::text, false), set_config(prefix || 't', t::text, false);
            RETURN;
        END IF;
        e := current_setting(prefix || 'e')::bigint[];
    END IF;
    i := cardinality(k) + 1;
    IF i <= @REFUSED_ENTRIES@ THEN
        m := 0;
    ELSE
        i := 1;
        m := n[1];
        FOR j IN 2 .. @REFUSED_ENTRIES@ LOOP
            IF n[j] < m THEN
                i := j;
                m := n[j];
            END IF;
        END LOOP;
    END IF;
    k[i] := subject;
    n[i] := m + 1;
    e[i] := m;
    t[i] := now;
    PERFORM set_config(prefix || 'k', k::text, false), set_config(prefix || 'n', n::text, false),
            set_config(prefix || 'e', e::text, false), set_config(prefix || 't', t::text, false);
END
$$;

-- A double as the native library writes it in text (json::number_text): whole numbers
-- below 9e15 as integers, others as ryu writes them (the shortest digits; an exponent
-- below 1e-5 and from 1e16, as 1.5e16 and 1e-7; a whole number as 9500000000000000.0).
CREATE OR REPLACE FUNCTION ratelimit.rl__number_text(v double precision) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n numeric;
    digits text;
    kk int;
    sign text := '';
BEGIN
    IF v IS NULL OR v IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) THEN RETURN 'null'; END IF;
    IF v = trunc(v) AND abs(v) < 9e15 THEN RETURN v::bigint::text; END IF;
    n := ratelimit.rl__shortest(v);
    IF n < 0 THEN sign := '-'; n := -n; END IF;
    -- the significant digits, and kk with 10^(kk-1) <= n < 10^kk
    digits := trim(leading '0' FROM replace(trim_scale(n)::text, '.', ''));
    kk := CASE WHEN n >= 1 THEN length(split_part(trim_scale(n)::text, '.', 1))
               ELSE -(length(split_part(trim_scale(n)::text, '.', 2)) - length(ltrim(split_part(trim_scale(n)::text, '.', 2), '0'))) END;
    digits := rtrim(digits, '0');
    IF kk > 0 AND kk <= 16 THEN
        IF length(digits) <= kk THEN RETURN sign || rpad(digits, kk, '0') || '.0'; END IF;
        RETURN sign || substr(digits, 1, kk) || '.' || substr(digits, kk + 1);
    ELSIF kk <= 0 AND kk > -5 THEN
        RETURN sign || '0.' || repeat('0', -kk) || digits;
    ELSIF length(digits) = 1 THEN
        RETURN sign || digits || 'e' || (kk - 1);
    END IF;
    RETURN sign || substr(digits, 1, 1) || '.' || substr(digits, 2) || 'e' || (kk - 1);
END
$$;

-- One limit of a result as the headers see it (headers::limit_of): NULL when the object
-- is no result. Its fields: name, limit, remaining, reset (seconds), x_reset, retry, unit,
-- window (seconds), exceeds.
CREATE OR REPLACE FUNCTION ratelimit.rl__header_limit(name text, o jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    lim double precision := ratelimit.rl__header_num(o -> 'limit');
    refused boolean := coalesce(o -> 'admitted' = 'false'::jsonb, false);
    exceeds boolean := coalesce(o -> 'exceeds_limit' = 'true'::jsonb, false);
    retry bigint;
    w double precision;
    remaining double precision;
    reset bigint;
BEGIN
    IF lim IS NULL THEN RETURN NULL; END IF;
    retry := CASE WHEN refused AND NOT exceeds THEN ratelimit.rl__header_int(o -> 'retry_after_seconds') END;
    w := coalesce(ratelimit.rl__header_num(o -> 'refill_seconds'), ratelimit.rl__header_num(o -> 'period_seconds'),
                  ratelimit.rl__header_num(o -> 'window_seconds'));
    IF ratelimit.rl__header_num(o -> 'in_flight') IS NOT NULL THEN
        RETURN jsonb_build_object('name', name, 'limit', lim, 'remaining', lim - ratelimit.rl__header_num(o -> 'in_flight'),
            'reset', retry, 'x_reset', NULL, 'retry', retry, 'unit', 'concurrent-requests', 'window', NULL, 'exceeds', exceeds);
    END IF;
    remaining := ratelimit.rl__header_num(o -> 'remaining');
    IF remaining IS NULL THEN RETURN NULL; END IF;
    reset := ratelimit.rl__header_int(o -> 'reset_after_seconds');
    IF reset IS NULL AND ratelimit.rl__header_int(o -> 'resets_at') IS NULL THEN RETURN NULL; END IF;
    RETURN jsonb_build_object('name', name, 'limit', lim, 'remaining', remaining,
        'reset', coalesce(reset, retry), 'x_reset', coalesce(reset, ratelimit.rl__header_int(o -> 'resets_at')),
        'retry', retry, 'unit', NULL, 'window', CASE WHEN w IS NOT NULL THEN greatest(ceil(w)::bigint, 1) END,
        'exceeds', exceeds);
END
$$;

-- A JSON number as a finite double (serde's as_f64), else NULL.
CREATE OR REPLACE FUNCTION ratelimit.rl__header_num(v jsonb) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(v) = 'number' AND abs(ratelimit.rl__json_double(v)) < 'Infinity'::float8
                THEN ratelimit.rl__json_double(v) END
$$;

-- A JSON number that is an integer (serde's as_i64), else NULL.
CREATE OR REPLACE FUNCTION ratelimit.rl__header_int(v jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(v) = 'number' THEN ratelimit.rl__int(v::text) END
$$;

-- The kind a result's limit is named by (headers::kind).
CREATE OR REPLACE FUNCTION ratelimit.rl__header_kind(o jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN o ? 'resets_at' THEN 'budget' WHEN o ? 'window_seconds' THEN 'window'
                WHEN o ? 'in_flight' THEN 'concurrency' ELSE 'bucket' END
$$;

-- The draft's name of item i of a call on several limits (headers::item_names): for a
-- policy's check, the policy and the kind ("login-bucket", "login-bucket-2" for a kind that
-- recurs), the policy as a structured field's string holds it; else the kind and the place.
CREATE OR REPLACE FUNCTION ratelimit.rl__header_item_name(o jsonb, i int) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text := ratelimit.rl__header_kind(o -> 'items' -> (i - 1));
    seen int := 0;
    total int := 0;
BEGIN
    IF jsonb_typeof(o -> 'policy') IS DISTINCT FROM 'string' THEN RETURN k || '-' || i; END IF;
    FOR j IN 1..jsonb_array_length(o -> 'items') LOOP
        CONTINUE WHEN ratelimit.rl__header_kind(o -> 'items' -> (j - 1)) <> k;
        total := total + 1;
        IF j < i THEN seen := seen + 1; END IF;
    END LOOP;
    RETURN regexp_replace(replace(replace(o ->> 'policy', '\', '\\'), '"', '\"'), '[^ -~]', '_', 'g')
        || '-' || k || CASE WHEN total = 1 THEN '' ELSE '-' || (seen + 1) END;
END
$$;

-- The headers of an answer (headers::header_pairs), for rl_headers and the compact answers;
-- fn names the function in its errors.
CREATE OR REPLACE FUNCTION ratelimit.rl__headers(fn text, result jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bad CONSTANT text := @MSG_NOT_A_RESULT@;
    o jsonb := result;
    v double precision;
    limits jsonb[] := '{}';
    l jsonb;
    retry bigint;
    best int;
    cmp int;
    a double precision;
    b double precision;
    out jsonb;
BEGIN
    IF jsonb_typeof(o) <> 'object' THEN PERFORM ratelimit.rl__invalid(fn, bad); END IF;
    -- counts no header can show exactly (headers::exact)
    FOR l IN SELECT x FROM (SELECT o AS x UNION ALL SELECT e FROM jsonb_array_elements(
                 CASE WHEN jsonb_typeof(o -> 'items') = 'array' THEN o -> 'items' ELSE '[]' END) AS e
             WHERE jsonb_typeof(e) = 'object') AS objects LOOP
        FOR f IN 1..3 LOOP
            CONTINUE WHEN jsonb_typeof(l -> (ARRAY['limit', 'remaining', 'in_flight'])[f]) IS DISTINCT FROM 'number';
            v := ratelimit.rl__json_double(l -> (ARRAY['limit', 'remaining', 'in_flight'])[f]);
            IF abs(v) > @MAX_WAIT_MS@ THEN
                RAISE EXCEPTION USING ERRCODE = '22003', MESSAGE = fn || ': ' || format(@MSG_RESULT_TOO_LARGE@,
                    (ARRAY['limit', 'remaining', 'in_flight'])[f], @MAX_WAIT_MS@, ratelimit.rl__describe(v));
            END IF;
        END LOOP;
    END LOOP;
    IF jsonb_typeof(o -> 'items') = 'array' THEN
        FOR i IN 1..coalesce(jsonb_array_length(o -> 'items'), 0) LOOP
            l := CASE WHEN jsonb_typeof(o -> 'items' -> (i - 1)) = 'object' THEN ratelimit.rl__header_limit(
                ratelimit.rl__header_item_name(o, i), o -> 'items' -> (i - 1)) END;
            IF l IS NULL THEN PERFORM ratelimit.rl__invalid(fn, bad); END IF;
            limits := limits || l;
        END LOOP;
        IF cardinality(limits) = 0 THEN PERFORM ratelimit.rl__invalid(fn, bad); END IF;
        -- a call that one limit can never admit gets no Retry-After: waiting does not help
        IF coalesce(o -> 'admitted' = 'false'::jsonb, false) AND NOT EXISTS (
               SELECT FROM unnest(limits) AS x WHERE (x ->> 'exceeds')::boolean) THEN
            retry := ratelimit.rl__header_int(o -> 'retry_after_seconds');
        END IF;
    ELSE
        l := ratelimit.rl__header_limit(ratelimit.rl__header_kind(o), o);
        IF l IS NULL THEN PERFORM ratelimit.rl__invalid(fn, bad); END IF;
        limits := ARRAY[l];
        retry := (l ->> 'retry')::bigint;
    END IF;
    -- the limit that binds: the refusing one that waits longest, else the one with the
    -- smallest share left (the last of equals, as Rust's max_by)
    best := 1;
    FOR i IN 2..cardinality(limits) LOOP
        cmp := sign(coalesce((limits[i] ->> 'retry')::bigint, -1) - coalesce((limits[best] ->> 'retry')::bigint, -1));
        IF cmp = 0 THEN
            a := -((limits[i] ->> 'remaining')::float8 / nullif((limits[i] ->> 'limit')::float8, 0));
            b := -((limits[best] ->> 'remaining')::float8 / nullif((limits[best] ->> 'limit')::float8, 0));
            cmp := CASE WHEN a IS NULL OR b IS NULL OR a = 'NaN'::float8 OR b = 'NaN'::float8 THEN 0
                        WHEN a > b THEN 1 WHEN a < b THEN -1 ELSE 0 END;
        END IF;
        IF cmp >= 0 THEN best := i; END IF;
    END LOOP;
    out := jsonb_build_object(
        'RateLimit-Policy', (SELECT string_agg(format('"%s";q=%s', x ->> 'name',
                floor(greatest((x ->> 'limit')::float8, 0))::bigint)
                || CASE WHEN x ->> 'unit' IS NOT NULL THEN format(';qu="%s"', x ->> 'unit') ELSE '' END
                || CASE WHEN x ->> 'window' IS NOT NULL THEN ';w=' || (x ->> 'window') ELSE '' END, ', ' ORDER BY n)
            FROM unnest(limits) WITH ORDINALITY AS u(x, n)),
        'RateLimit', (SELECT string_agg(format('"%s";r=%s', x ->> 'name', floor(greatest((x ->> 'remaining')::float8, 0))::bigint)
                || CASE WHEN x ->> 'reset' IS NOT NULL THEN ';t=' || (x ->> 'reset') ELSE '' END, ', ' ORDER BY n)
            FROM unnest(limits) WITH ORDINALITY AS u(x, n)),
        'X-RateLimit-Limit', ratelimit.rl__number_text(greatest((limits[best] ->> 'limit')::float8, 0)),
        'X-RateLimit-Remaining', ratelimit.rl__number_text(greatest((limits[best] ->> 'remaining')::float8, 0)));
    IF limits[best] ->> 'x_reset' IS NOT NULL THEN
        out := out || jsonb_build_object('X-RateLimit-Reset', limits[best] ->> 'x_reset');
    END IF;
    IF retry IS NOT NULL THEN
        out := out || jsonb_build_object('Retry-After', greatest(retry, 1)::text);
    END IF;
    RETURN out;
END
$$;

-- The compact answer of an rl_take, rl_check or rl_take_all answer (headers::compact):
-- admitted as 1 or 0, then the X-RateLimit-Limit, X-RateLimit-Remaining,
-- X-RateLimit-Reset and Retry-After values of its headers, 0 where there is none.
CREATE OR REPLACE FUNCTION ratelimit.rl__compact(fn text, answer jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    h jsonb;
BEGIN
    IF answer IS NULL THEN
        RETURN NULL;
    END IF;
    h := ratelimit.rl__headers(fn, answer);
    RETURN CASE WHEN answer -> 'admitted' = 'true'::jsonb THEN '1' ELSE '0' END
        || ' ' || (h ->> 'X-RateLimit-Limit') || ' ' || (h ->> 'X-RateLimit-Remaining')
        || ' ' || coalesce(h ->> 'X-RateLimit-Reset', '0') || ' ' || coalesce(h ->> 'Retry-After', '0');
END
$$;
