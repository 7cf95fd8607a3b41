//! A limit as a JSON object describes it, read by one parser for rl_take_all's items and a
//! policy's limits: its kind from the fields it has, the fields checked against that kind's,
//! then each field by its rule (the rules and their texts are [`crate::args`]').

use serde_json::{Map, Value};

use crate::args::{self, json_arg, Arg};
use crate::error::{Error, Result};
use crate::units::Period;

/// A limit without a key and a cost: what a policy stores, and the body of an rl_take_all
/// item.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitShape {
    Bucket {
        burst: f64,
        refill_per_minute: f64,
    },
    /// Millionths.
    Budget {
        period: Period,
        quota: i64,
    },
    /// Millionths; `fixed`: a fixed window (`fixed_window_seconds`), not a sliding one.
    Window {
        limit: i64,
        window_ms: i64,
        fixed: bool,
    },
}

/// The fields a limit object holds beside its kind's own.
pub struct Extra {
    /// Named first in the list of fields an error shows.
    pub before: &'static [&'static str],
    /// Named last.
    pub after: &'static [&'static str],
}

/// rl_take_all's items: a key, the limit, an optional cost and an optional multiplier (the
/// limit scaled as a policy's tier scales it, so a caller passes limits through).
pub const ITEM: Extra = Extra { before: &["key"], after: &["cost", "multiplier"] };
/// A policy's limits: the limit alone (the subject gives the key, each check the cost).
pub const POLICY: Extra = Extra { before: &[], after: &[] };

/// A kind of limit as JSON names it. Its place in [`Kind::ALL`] is the number the SQL
/// edition keeps it under (`kind` of its parsed items).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bucket,
    Budget,
    Window,
    FixedWindow,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Bucket, Kind::Budget, Kind::Window, Kind::FixedWindow];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Bucket => "bucket",
            Kind::Budget => "budget",
            Kind::Window => "window",
            Kind::FixedWindow => "fixed_window",
        }
    }

    /// The fields a limit object of this kind may hold, in the order errors list them.
    pub fn allowed(self, extra: &Extra) -> Vec<&'static str> {
        extra.before.iter().chain(self.fields()).chain(extra.after).copied().collect()
    }

    /// A budget has a period; a fixed window, fixed_window_seconds; a window,
    /// window_seconds; anything else is a bucket.
    fn of(o: &Map<String, Value>) -> Kind {
        if o.contains_key("period") {
            Kind::Budget
        } else if o.contains_key("fixed_window_seconds") {
            Kind::FixedWindow
        } else if o.contains_key("window_seconds") {
            Kind::Window
        } else {
            Kind::Bucket
        }
    }

    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Bucket => &["burst", "refill_per_minute"],
            Kind::Budget => &["period", "quota"],
            Kind::Window => &["limit", "window_seconds"],
            Kind::FixedWindow => &["limit", "fixed_window_seconds"],
        }
    }
}

/// `v` as a limit object that holds no field but its kind's and `extra`'s.
pub fn object<'v>(v: &'v Value, extra: &Extra) -> Result<&'v Map<String, Value>> {
    let o = v.as_object().ok_or_else(|| Error::invalid(crate::messages::NOT_AN_OBJECT.template))?;
    if let Some(unknown) = o.keys().find(|k| !Kind::of(o).allowed(extra).contains(&k.as_str())) {
        let list = |kind: Kind| kind.allowed(extra).join(", ");
        return Err(Error::invalid(crate::messages::UNKNOWN_LIMIT_FIELD.render(&[
            &format!("\"{unknown}\""),
            &list(Kind::Bucket),
            &list(Kind::Budget),
            &list(Kind::Window),
            &list(Kind::FixedWindow),
        ])));
    }
    Ok(o)
}

/// The limit an object (checked by [`object`]) describes.
pub fn shape(o: &Map<String, Value>) -> Result<LimitShape> {
    let field = |name: &str| o.get(name).map_or(Arg::Null, json_arg);
    Ok(match Kind::of(o) {
        Kind::Budget => LimitShape::Budget {
            period: args::period(&field("period"))?,
            quota: args::amount_micros("quota", &field("quota"))?,
        },
        Kind::Window => LimitShape::Window {
            limit: args::amount_micros("limit", &field("limit"))?,
            window_ms: args::duration_ms("window_seconds", &field("window_seconds"))?,
            fixed: false,
        },
        Kind::FixedWindow => LimitShape::Window {
            limit: args::amount_micros("limit", &field("limit"))?,
            window_ms: args::duration_ms("fixed_window_seconds", &field("fixed_window_seconds"))?,
            fixed: true,
        },
        Kind::Bucket => LimitShape::Bucket {
            burst: args::token_number("burst", &field("burst"))?,
            refill_per_minute: args::token_number("refill_per_minute", &field("refill_per_minute"))?,
        },
    })
}
