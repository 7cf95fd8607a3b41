//! The error texts both editions give, written once. Each is a template whose `{}` are
//! filled in order: the library with [`Message::render`], the SQL edition with PostgreSQL's
//! `format()`, whose format string the edition's generator writes where its SQL names
//! `@MSG_<NAME>@` ([`Message::sql_literal`]). A limit of the core is an argument like any
//! other (the edition passes its `@MAX_...@` constant), so this module depends on nothing.
//! Library-only texts (SQLite's blobs, the native clock setting, the memory store) stay
//! where they are raised; tests/test_conformance.py and the differential run compare the
//! rest of what the editions answer.

/// One error text, by the name the edition's SQL uses for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub name: &'static str,
    pub template: &'static str,
}

impl Message {
    /// The text with each `{}` replaced by the next of `args`, in order.
    pub fn render(&self, args: &[&dyn std::fmt::Display]) -> String {
        let mut out = String::with_capacity(self.template.len() + 16);
        let mut parts = self.template.split("{}");
        out.push_str(parts.next().unwrap_or_default());
        for (i, part) in parts.enumerate() {
            match args.get(i) {
                Some(a) => out.push_str(&a.to_string()),
                None => out.push_str("{}"),
            }
            out.push_str(part);
        }
        out
    }

    /// The number of arguments it takes.
    pub fn arity(&self) -> usize {
        self.template.matches("{}").count()
    }

    /// The template as a quoted SQL literal for `format()`: `%s` for each `{}`, a literal `%`
    /// doubled, quotes doubled.
    pub fn sql_literal(&self) -> String {
        let text = self.template.replace('%', "%%").replace("{}", "%s").replace('\'', "''");
        format!("'{text}'")
    }
}

macro_rules! messages {
    ($($(#[$doc:meta])* $name:ident = $template:literal;)*) => {
        $($(#[$doc])* pub const $name: Message = Message { name: stringify!($name), template: $template };)*
        /// Every message, for the edition's generator and its tests.
        pub const ALL: &[Message] = &[$($name,)*];
    };
}

messages! {
    /// (argument, what was given)
    NOT_POSITIVE = "{} must be a finite number greater than 0, got {}";
    /// (argument, what was given): a peek's cost, which may be 0.
    NOT_AT_LEAST_ZERO = "{} must be a finite number of at least 0, got {}";
    /// (argument, the most, what was given)
    AT_MOST = "{} must be at most {}, got {}";
    /// (argument, what was given): an amount kept in millionths.
    BELOW_A_MILLIONTH = "{} must be at least 0.000001, got {}";
    /// (argument, the most seconds, what was given)
    DURATION_TOO_LONG = "{} must be at most {} (one year), got {}";
    /// (argument, what was given)
    NOT_TEXT = "{} must be text, got {}";
    /// (argument)
    EMPTY = "{} must not be empty";
    /// (argument, the most bytes, the bytes given)
    NAME_TOO_LONG = "{} must be at most {} bytes, got {} bytes";
    POLICY_KEY = "key must not start with U+0001, which marks the keys of policies";
    /// (the latest now_ms, what was given)
    NOW_MS_RANGE = "now_ms must be an integer number of epoch milliseconds from 0 to {}, got {}";
    /// (what was given)
    MAX_ROWS = "max_rows must be a positive integer, got {}";
    /// (argument, the latest, what was given)
    EPOCH_MS_RANGE = "{} must be an integer number of epoch milliseconds from 0 to {}, got {}";
    /// (from_ms, to_ms)
    USAGE_RANGE = "to_ms must not be before from_ms, got from_ms {} and to_ms {}";
    /// (what was given: a JSON type, as call_args::usage_cursor names it)
    USAGE_CURSOR = "after must be the next of an earlier answer, an array [ends_at_ms, key, period], got {}";
    /// (the latest ends_at_ms)
    USAGE_CURSOR_PARTS = "after must be [ends_at_ms, key, period] as an earlier answer's next: an integer from 0 to {} and two strings";
    /// (the most periods)
    USAGE_TOO_MANY = "more than {} ended periods in this range: ask for a shorter one";
    /// (what was given)
    PERIOD = "period must be 'hour', 'day', 'week', 'month' or 'year', got {}";
    /// (what was given)
    PERIOD_FORM = "period must be a unit, then optionally 'from' and an anchor, then optionally 'in' and a time zone (such as 'month from 15 09:00 in Europe/Paris'), got {}";
    /// (the unit with its article, the anchor's form, the anchor given, quoted)
    PERIOD_ANCHOR = "period: the anchor of {} must be {}, got {}";
    /// (the zone given, quoted)
    PERIOD_ZONE = "period: unknown time zone {} (an IANA name such as 'Europe/Paris' or 'America/New_York')";
    /// (argument, the most bytes, the bytes given)
    JSON_TOO_LARGE = "{} must be at most {} bytes of JSON, got {} bytes";
    /// (argument, the largest, what was given)
    INTEGER_RANGE = "{} must be an integer from 1 to {}, got {}";
    /// (the largest, what was given)
    FRACTION_RANGE = "fraction must be a number from 0 to {}, got {}";
    /// (what was given)
    FREE_STRIKES = "free_strikes must be an integer from 0 to 1000000, got {}";
    LIMITS_NOT_AN_ARRAY = "limits must be a JSON array of limit objects";
    /// (the attempts)
    ROW_KEPT_CHANGING = "the row kept changing under {} attempts; try again";
    /// (the most tokens)
    DEBT_TOO_DEEP = "the bucket's debt would pass {} tokens; nothing was charged";
    /// (the most units)
    USE_TOO_HIGH = "the period's use would pass {} units; nothing was charged";
    /// (the most entries)
    WINDOW_TOO_FULL = "the window would hold more than {} entries (one per millisecond with admissions); nothing was recorded: use a larger cost per call or a bucket for this limit";
    NO_PARTS = "expected at least 1 part, got 0";
    /// (the part's place from 1)
    NULL_PART = "part {} must not be NULL";
    /// Names no list of functions: one would go stale with each new kind (it once left out
    /// rl_check and rl_fixed_window, whose answers rl_headers reads).
    NOT_A_RESULT = "result must be the JSON answer of a limit, budget, window or lease call (such as rl_take, rl_check, rl_spend, rl_fixed_window or rl_acquire)";
    /// (the field, the largest magnitude, what was given)
    RESULT_TOO_LARGE = "result: {} must be at most {} in magnitude, got {}";
    /// (the kind of row)
    DAMAGED = "a stored {} row is damaged; rl_reset its key";
    READ_ONLY = "cannot change rate-limit state in a read-only database or transaction";
    /// (the policy's name)
    NO_POLICY = "there is no policy named '{}'";
    /// A limit of rl_take_all or of a policy definition that is no object.
    NOT_AN_OBJECT = "must be a JSON object";
    /// (the field, quoted as JSON; every kind's fields, limit_json::fields_by_kind)
    UNKNOWN_LIMIT_FIELD = "unknown field {} ({})";
    /// (the list: `limits` or `definition.limits`; the most; how many were given)
    ITEM_COUNT = "{} must hold 1 to {} items, got {}";
    DEFINITION_NOT_AN_OBJECT = "definition must be a JSON object with limits, and optionally tiers and shadow";
    /// (the field, quoted as JSON)
    DEFINITION_UNKNOWN_FIELD = "definition: unknown field {} (a policy has limits, tiers, shadow)";
    DEFINITION_LIMITS_NOT_AN_ARRAY = "definition.limits must be a JSON array of limit objects";
    TIERS_NOT_AN_OBJECT = "definition.tiers must be a JSON object of tier names to multipliers";
    TIER_NAME_EMPTY = "definition.tiers: a tier name must not be empty";
    /// (the tier, its multiplier, the limit's place from 1, the most tokens, the largest amount)
    MULTIPLIER_OUT_OF_RANGE = "definition.tiers.{}: a multiplier of {} takes limits item {} out of range (a bucket's burst and refill must stay above 0 and at most {}, a quota or window limit from 0.000001 to {})";
    /// (the most tokens, the largest amount)
    ITEM_MULTIPLIER_OUT_OF_RANGE = "multiplier takes this limit out of range (a bucket's burst and refill must stay above 0 and at most {}, a quota or window limit from 0.000001 to {})";
    /// (what was given: a scalar as JSON, an array or object by its type)
    SHADOW = "definition.shadow must be true or false, got {}";
    /// (the tier given, the policy's tiers by name)
    UNKNOWN_TIER = "tier '{}' is not one of this policy's tiers ({})";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_in_order_and_quotes_for_sql() {
        assert_eq!(AT_MOST.render(&[&"burst", &5, &"'x'"]), "burst must be at most 5, got 'x'");
        assert_eq!(PERIOD.sql_literal(), "'period must be ''hour'', ''day'', ''week'', ''month'' or ''year'', got %s'");
        assert_eq!(Message { name: "P", template: "100 % of {}" }.sql_literal(), "'100 %% of %s'");
        assert_eq!(NAME_TOO_LONG.arity(), 3);
    }

    #[test]
    fn names_are_unique() {
        for (i, m) in ALL.iter().enumerate() {
            assert!(ALL[i + 1..].iter().all(|o| o.name != m.name && o.template != m.template), "{}", m.name);
        }
    }
}
