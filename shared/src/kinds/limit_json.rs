//! A limit as a JSON object describes it, read by one parser for rl_take_all's items and a
//! policy's limits: its kind from the fields it has, the fields checked against that kind's,
//! then each field by its rule (the rules and their texts are [`crate::args`]').

use serde_json::{Map, Value};

use crate::args::{self, json_arg, Arg};
use crate::bucket::BucketLimits;
use crate::budget::BudgetLimits;
use crate::error::{Error, Result};
use crate::kind::LimitKind;
use crate::window::WindowLimits;

/// A limit without a key and a cost: what a policy stores, and the body of an rl_take_all
/// item; one variant per kind of [`crate::kind::LimitKind`] (a window's limits say whether
/// it is fixed).
#[derive(Debug, Clone, PartialEq)]
pub enum LimitShape {
    Bucket(BucketLimits),
    Budget(BudgetLimits),
    Window(WindowLimits),
}

impl LimitShape {
    /// Whether the limit times `m` is still a valid limit.
    pub(crate) fn scales_by(&self, m: f64) -> bool {
        crate::each_kind!(LimitShape, self, l => l.scales_by(m))
    }

    /// The limit times `m` (a tier's multiplier, or an rl_take_all item's): a bucket's burst
    /// and refill, a budget's quota or a window's limit (in millionths, rounded, at least
    /// one); a period or a window's length never scales. Valid where [`Self::scales_by`].
    pub(crate) fn scaled(&self, m: f64) -> LimitShape {
        crate::each_kind!(LimitShape => LimitShape, self, l => l.scaled(m))
    }

    /// The limit as a policy stores and returns it.
    pub fn definition(&self) -> crate::json::Json {
        crate::each_kind!(LimitShape, self, l => l.definition())
    }
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
/// edition keeps it under (`kind` of its parsed items) and the order rl_take_all keeps rows
/// in. Everything else a client, an error or the edition knows of a kind apart from its
/// arithmetic is its row of [`KINDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bucket,
    Budget,
    Window,
    FixedWindow,
}

/// What a field's value is, as a client types it (the Node package's `Limit` type is
/// generated from it): a number, or a budget period's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    Number,
    Period,
}

/// One kind of limit as its JSON object shows it.
pub struct KindSpec {
    pub kind: Kind,
    /// As JSON, rows and the edition's constants name it (`fixed_window`).
    pub name: &'static str,
    /// The field whose presence makes an object this kind; None for the kind an object is
    /// when it has none of the others' (the bucket, last in [`KINDS`]).
    pub marker: Option<&'static str>,
    /// Its own fields, in the order errors list them.
    pub fields: &'static [(&'static str, FieldType)],
    /// How the operator's page reads one: each `{field}` replaced by the field's value.
    pub reads: &'static str,
    /// What the Node package's `Limit` type says of it.
    pub doc: &'static str,
}

/// The kinds in the order an object is recognised: the first whose marker it holds.
pub const KINDS: [KindSpec; 4] = [
    KindSpec {
        kind: Kind::Budget,
        name: "budget",
        marker: Some("period"),
        fields: &[("period", FieldType::Period), ("quota", FieldType::Number)],
        reads: "{quota} per {period}",
        doc: "A budget: `quota` units per calendar `period` (\"day\", \"month from 15\", \"day in Europe/Paris\": a unit, an anchor, a zone).",
    },
    KindSpec {
        kind: Kind::FixedWindow,
        name: "fixed_window",
        marker: Some("fixed_window_seconds"),
        fields: &[("limit", FieldType::Number), ("fixed_window_seconds", FieldType::Number)],
        reads: "{limit} per fixed {fixed_window_seconds} s",
        doc: "A fixed window: `limit` per epoch-aligned window, counted anew at each window's start.",
    },
    KindSpec {
        kind: Kind::Window,
        name: "window",
        marker: Some("window_seconds"),
        fields: &[("limit", FieldType::Number), ("window_seconds", FieldType::Number)],
        reads: "{limit} per {window_seconds} s",
        doc: "A sliding window: at most `limit` in any `window_seconds`.",
    },
    KindSpec {
        kind: Kind::Bucket,
        name: "bucket",
        marker: None,
        fields: &[("burst", FieldType::Number), ("refill_per_minute", FieldType::Number)],
        reads: "{burst} burst, {refill_per_minute}/min",
        doc: "A token bucket: `burst` tokens, refilled at `refill_per_minute`.",
    },
];

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Bucket, Kind::Budget, Kind::Window, Kind::FixedWindow];

    /// Its row of [`KINDS`].
    pub fn spec(self) -> &'static KindSpec {
        KINDS.iter().find(|s| s.kind == self).expect("every kind has a row in KINDS")
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Its place in [`Kind::ALL`]: the number the edition keeps it under.
    pub fn number(self) -> usize {
        Kind::ALL.iter().position(|k| *k == self).expect("every kind is in Kind::ALL")
    }

    /// The fields a limit object of this kind may hold, in the order errors list them.
    pub fn allowed(self, extra: &Extra) -> Vec<&'static str> {
        extra.before.iter().copied().chain(self.fields()).chain(extra.after.iter().copied()).collect()
    }

    /// The first kind of [`KINDS`] whose marker the object holds.
    fn of(o: &Map<String, Value>) -> Kind {
        KINDS.iter().find(|s| s.marker.is_none_or(|m| o.contains_key(m))).expect("the last kind has no marker").kind
    }

    fn fields(self) -> impl Iterator<Item = &'static str> {
        self.spec().fields.iter().map(|(name, _)| *name)
    }
}

/// What an unknown field's error lists: every kind's fields, in [`Kind::ALL`]'s order ("a
/// bucket has burst, refill_per_minute; a budget period, quota; ...").
pub fn fields_by_kind(extra: &Extra) -> String {
    Kind::ALL
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let has = if i == 0 { " has" } else { "" };
            format!("a {}{has} {}", k.name().replace('_', " "), k.allowed(extra).join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `v` as a limit object that holds no field but its kind's and `extra`'s.
pub fn object<'v>(v: &'v Value, extra: &Extra) -> Result<&'v Map<String, Value>> {
    let o = v.as_object().ok_or_else(|| Error::invalid(crate::messages::NOT_AN_OBJECT.template))?;
    if let Some(unknown) = o.keys().find(|k| !Kind::of(o).allowed(extra).contains(&k.as_str())) {
        return Err(Error::invalid(
            crate::messages::UNKNOWN_LIMIT_FIELD.render(&[&format!("\"{unknown}\""), &fields_by_kind(extra)]),
        ));
    }
    Ok(o)
}

/// The limit an object (checked by [`object`]) describes.
pub fn shape(o: &Map<String, Value>) -> Result<LimitShape> {
    let field = |name: &str| o.get(name).map_or(Arg::Null, json_arg);
    let window = |length: &str, fixed: bool| -> Result<LimitShape> {
        Ok(LimitShape::Window(WindowLimits {
            limit: args::amount_micros("limit", &field("limit"))?,
            window_ms: args::duration_ms(length, &field(length))?,
            fixed,
        }))
    };
    match Kind::of(o) {
        Kind::Budget => Ok(LimitShape::Budget(BudgetLimits {
            period: args::period(&field("period"))?,
            quota: args::amount_micros("quota", &field("quota"))?,
        })),
        Kind::Window => window("window_seconds", false),
        Kind::FixedWindow => window("fixed_window_seconds", true),
        Kind::Bucket => Ok(LimitShape::Bucket(BucketLimits {
            burst: args::token_number("burst", &field("burst"))?,
            refill_per_minute: args::token_number("refill_per_minute", &field("refill_per_minute"))?,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Json;

    /// Every row of the table of kinds agrees with the parser and with its kind's trait: an
    /// object of its fields is recognised as it, parses, and shows the same fields in a
    /// policy (so the generated edition, schema, type and page describe what the core takes).
    #[test]
    fn each_row_of_kinds_is_what_its_kind_parses_and_shows() {
        for spec in &KINDS {
            let object: Map<String, Value> = spec
                .fields
                .iter()
                .map(|(name, ty)| {
                    let value = match ty {
                        FieldType::Number => Value::from(2),
                        FieldType::Period => Value::from("day"),
                    };
                    (name.to_string(), value)
                })
                .collect();
            assert_eq!(Kind::of(&object), spec.kind, "{}", spec.name);
            let value = Value::Object(object);
            let parsed = shape(object_of(&value)).unwrap_or_else(|e| panic!("{}: {e:?}", spec.name));
            let Json::Object(shown) = parsed.definition() else { panic!("{}: not an object", spec.name) };
            let shown: Vec<&str> = shown.iter().map(|(k, _)| *k).collect();
            let fields: Vec<&str> = spec.fields.iter().map(|(k, _)| *k).collect();
            assert_eq!(shown, fields, "{}", spec.name);
            assert!(parsed.scales_by(2.0) && parsed.scaled(1.0) == parsed, "{}", spec.name);
        }
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["bucket", "budget", "window", "fixed_window"]);
        assert!(KINDS.last().is_some_and(|s| s.marker.is_none()), "the kind without a marker is recognised last");
    }

    fn object_of(v: &Value) -> &Map<String, Value> {
        object(v, &POLICY).expect("a limit object")
    }
}
