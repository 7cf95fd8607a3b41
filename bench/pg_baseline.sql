-- What an application writes without pg_ratelimit: the same token bucket contract as one
-- INSERT ... ON CONFLICT DO UPDATE with a WHERE guard, plus a second read on refusal.
CREATE TABLE hw_bucket (
    key         text             PRIMARY KEY,
    level       double precision NOT NULL,
    refilled_at bigint           NOT NULL
);

CREATE FUNCTION hw_take(p_key text, p_burst float8, p_rate float8, p_cost float8 DEFAULT 1)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    new_level float8;
    cur_level float8;
    cur_at bigint;
BEGIN
    INSERT INTO hw_bucket AS b (key, level, refilled_at)
    VALUES (p_key, p_burst - p_cost, now_ms)
    ON CONFLICT (key) DO UPDATE
        SET level = least(p_burst, b.level + greatest(0, now_ms - b.refilled_at) * p_rate / 60000.0) - p_cost,
            refilled_at = greatest(b.refilled_at, now_ms)
        WHERE least(p_burst, b.level + greatest(0, now_ms - b.refilled_at) * p_rate / 60000.0) >= p_cost
    RETURNING level INTO new_level;
    IF FOUND THEN
        RETURN jsonb_build_object('admitted', true, 'remaining', floor(new_level), 'limit', p_burst,
                                  'retry_after_ms', 0);
    END IF;
    SELECT level, refilled_at INTO cur_level, cur_at FROM hw_bucket WHERE key = p_key;
    cur_level := least(p_burst, cur_level + greatest(0, now_ms - cur_at) * p_rate / 60000.0);
    RETURN jsonb_build_object('admitted', false, 'remaining', floor(cur_level), 'limit', p_burst,
                              'retry_after_ms', ceil((p_cost - cur_level) * 60000.0 / p_rate));
END
$$;

-- The physical floor of a write: one single-row UPDATE.
CREATE TABLE counters (k text PRIMARY KEY, n bigint NOT NULL);
