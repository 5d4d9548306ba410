//! Cron schedules as upstream's CronJobs read them (robfig/cron's standard parser):
//! five fields — minute, hour, day of month, month (or `JAN`–`DEC`), day of week (`0`–`6`
//! or `SUN`–`SAT`) — each a list of `*`, `?`, `n`, `a-b`, with `/step`; or one of
//! `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`. When
//! both day fields are restricted, a day matching either runs (as cron does). Times are
//! found in the CronJob's time zone, minute by minute of civil time. The apiserver
//! validates schedules with it; the CronJob controller runs them.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A parsed schedule: the allowed values of each field as bit sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minute: u64,
    hour: u64,
    day: u64,
    month: u64,
    weekday: u64,
    /// The day-of-month or day-of-week field was `*` or `?`.
    any_day: bool,
    any_weekday: bool,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// robfig/cron's words for a number it cannot read (Go's `strconv.Atoi` error).
fn not_int(s: &str) -> String {
    format!("failed to parse int from {s}: strconv.Atoi: parsing {s:?}: invalid syntax")
}

/// One field's bits and whether it was a bare `*`/`?`.
fn field(text: &str, min: u32, max: u32, names: &[&str]) -> Result<(u64, bool), String> {
    let value = |s: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(i as u32 + min);
        }
        s.parse::<u32>().map_err(|_| not_int(s))
    };
    let mut bits = 0u64;
    let mut any = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                Some(
                    s.parse::<u32>()
                        .map_err(|_| format!("failed to parse int from {s}"))?,
                ),
            ),
            None => (part, None),
        };
        let (mut start, mut end, star) = if range == "*" || range == "?" {
            (min, max, true)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?, false)
        } else {
            let v = value(range)?;
            (v, v, false)
        };
        if star && step.unwrap_or(1) == 1 {
            any = true;
        }
        if let Some(step) = step {
            if step == 0 {
                return Err(format!("step of range should be a positive number: {part}"));
            }
            // `n/step` runs from n to the end of the range.
            if !star && !range.contains('-') {
                end = max;
            }
        }
        if start < min {
            return Err(format!(
                "beginning of range ({start}) below minimum ({min}): {part}"
            ));
        }
        if end > max {
            return Err(format!(
                "end of range ({end}) above maximum ({max}): {part}"
            ));
        }
        if start > end {
            return Err(format!(
                "beginning of range ({start}) beyond end of range ({end}): {part}"
            ));
        }
        let step = step.unwrap_or(1);
        while start <= end {
            bits |= 1 << start;
            start += step;
        }
    }
    Ok((bits, any))
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        let spec = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(format!("unrecognized descriptor: {other}"));
            }
            other => other,
        };
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: {text}",
                fields.len()
            ));
        }
        let (minute, _) = field(fields[0], 0, 59, &[])?;
        let (hour, _) = field(fields[1], 0, 23, &[])?;
        let (day, any_day) = field(fields[2], 1, 31, &[])?;
        let (month, _) = field(fields[3], 1, 12, &MONTHS)?;
        let (weekday, any_weekday) = field(fields[4], 0, 6, &WEEKDAYS)?;
        Ok(Schedule {
            minute,
            hour,
            day,
            month,
            weekday,
            any_day,
            any_weekday,
        })
    }

    fn day_matches(&self, date: Date) -> bool {
        let day = self.day & (1 << date.day()) != 0;
        let weekday = self.weekday & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.any_day || self.any_weekday {
            day && weekday
        } else {
            day || weekday
        }
    }

    /// The first scheduled time strictly after `after`, in `tz`; `None` when there is
    /// none in the next five years (`0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let local = after.to_zoned(tz.clone()).datetime();
        let mut t = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = t.year() + 5;
        while t.year() <= limit {
            let date = t.date();
            if self.month & (1 << date.month()) == 0 {
                let first = Date::new(date.year(), date.month(), 1).ok()?;
                t = first
                    .checked_add(1.month())
                    .ok()?
                    .to_datetime(Time::midnight());
                continue;
            }
            if !self.day_matches(date) {
                t = date.tomorrow().ok()?.to_datetime(Time::midnight());
                continue;
            }
            if self.hour & (1 << t.hour()) == 0 {
                t = DateTime::from_parts(date, Time::new(t.hour(), 0, 0, 0).ok()?)
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minute & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = t.to_zoned(tz.clone()).ok()?.timestamp();
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(schedule: &str, after: &str) -> String {
        Schedule::parse(schedule)
            .unwrap()
            .next_after(at(after), &TimeZone::UTC)
            .map(|t| t.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn schedules_fire_where_cron_would() {
        assert_eq!(
            next("* * * * *", "2026-12-01T10:00:30Z"),
            "2026-12-01T10:01:00Z"
        );
        assert_eq!(
            next("*/15 * * * *", "2026-12-01T10:01:00Z"),
            "2026-12-01T10:15:00Z"
        );
        assert_eq!(
            next("5 4 * * *", "2026-12-01T10:00:00Z"),
            "2026-12-02T04:05:00Z"
        );
        assert_eq!(
            next("@hourly", "2026-12-01T10:00:00Z"),
            "2026-12-01T11:00:00Z"
        );
        assert_eq!(
            next("@yearly", "2026-12-01T10:00:00Z"),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(
            next("0 0 * * MON", "2026-12-01T10:00:00Z"),
            "2026-12-07T00:00:00Z"
        );
        assert_eq!(
            next("0 9 1-7 * 1-5", "2026-12-01T10:00:00Z"),
            "2026-12-02T09:00:00Z"
        );
        // Both day fields restricted: either matches (the 15th, or a Sunday).
        assert_eq!(
            next("0 0 15 * 0", "2026-12-01T10:00:00Z"),
            "2026-12-06T00:00:00Z"
        );
        assert_eq!(
            next("0 0 29 FEB *", "2026-12-01T00:00:00Z"),
            "2028-02-29T00:00:00Z"
        );
        assert_eq!(next("0 0 30 2 *", "2026-12-01T00:00:00Z"), "");
        assert_eq!(
            next("30 2/6 * * *", "2026-12-01T03:00:00Z"),
            "2026-12-01T08:30:00Z"
        );
    }

    #[test]
    fn time_zones_shift_the_hour() {
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        let s = Schedule::parse("0 9 * * *").unwrap();
        let t = s.next_after(at("2026-12-01T00:00:00Z"), &berlin).unwrap();
        assert_eq!(t.to_string(), "2026-12-01T08:00:00Z");
    }

    #[test]
    fn bad_schedules_are_refused() {
        for bad in [
            "* * * *",
            "60 * * * *",
            "* * * * 8",
            "@every 5m",
            "*/0 * * * *",
            "a * * * *",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
    }
}
