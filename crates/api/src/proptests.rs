//! What clients type, read by this crate, over random and hostile input: label and
//! field selectors, quantities, cron schedules and CIDRs never panic; what they accept
//! means what upstream's syntax says. `PROPTEST_CASES` makes a longer campaign
//! (docs/benchmarks.md); CI runs the default.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::cidr::Ipv4Cidr;
use crate::cron::Schedule;
use crate::quantity::scaled_value;
use crate::selector::{FieldSelector, LabelRequirement, LabelSelector};

/// Strings near the grammars: their operators and delimiters, over any characters.
fn grammar_soup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("=".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just("!".to_string()),
        Just(",".to_string()),
        Just(" in (".to_string()),
        Just(" notin (".to_string()),
        Just(")".to_string()),
        Just("(".to_string()),
        Just("*/".to_string()),
        Just("-".to_string()),
        Just("e".to_string()),
        Just(".".to_string()),
        Just("Ki".to_string()),
        Just("/".to_string()),
        "[a-z0-9.]{0,6}",
        "\\PC{0,3}",
    ];
    prop::collection::vec(piece, 0..12).prop_map(|p| p.concat())
}

fn label_key() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9.-]{0,6}[a-z0-9])?(/[a-z]{1,4})?"
}

fn label_value() -> impl Strategy<Value = String> {
    "([a-z0-9]([a-z0-9._-]{0,6}[a-z0-9])?)?"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn selectors_quantities_schedules_and_cidrs_never_panic(text in grammar_soup()) {
        let _ = LabelSelector::parse(&text);
        let _ = FieldSelector::parse(&text);
        for scale in [-3, 0, 3, 9] {
            let _ = scaled_value(&text, scale);
        }
        if let Ok(schedule) = Schedule::parse(&text) {
            let _ = schedule.next_after(jiff::Timestamp::UNIX_EPOCH, &jiff::tz::TimeZone::UTC);
        }
        let _ = text.parse::<Ipv4Cidr>();
    }

    #[test]
    fn any_unicode_never_panics(text in "\\PC{0,40}") {
        let _ = LabelSelector::parse(&text);
        let _ = FieldSelector::parse(&text);
        let _ = scaled_value(&text, 3);
        let _ = Schedule::parse(&text);
        let _ = text.parse::<Ipv4Cidr>();
    }

    #[test]
    fn equality_selectors_mean_what_they_say(
        key in label_key(),
        value in label_value(),
        other in label_value(),
    ) {
        for op in ["=", "=="] {
            let sel = LabelSelector::parse(&format!("{key}{op}{value}")).unwrap();
            prop_assert_eq!(&sel.0, &vec![LabelRequirement::Equals(key.clone(), value.clone())]);
            let labels = BTreeMap::from([(key.clone(), other.clone())]);
            prop_assert_eq!(sel.matches(&labels), value == other);
        }
        let sel = LabelSelector::parse(&format!("{key}!={value}")).unwrap();
        prop_assert!(sel.matches(&BTreeMap::new()), "a missing label is not equal");
        let sel = LabelSelector::parse(&format!("{key} in ({value},{other})")).unwrap();
        prop_assert!(sel.matches(&BTreeMap::from([(key.clone(), other.clone())])));
        prop_assert!(!sel.matches(&BTreeMap::new()));
    }

    #[test]
    fn whole_quantities_scale_exactly(n in 0i64..1_000_000_000, suffix in 0usize..6) {
        let (text, factor) = [
            (format!("{n}"), 1i64),
            (format!("{n}k"), 1_000),
            (format!("{n}Ki"), 1_024),
            (format!("{n}M"), 1_000_000),
            (format!("{n}Mi"), 1_048_576),
            (format!("{n}000m"), 1),
        ][suffix].clone();
        prop_assert_eq!(scaled_value(&text, 0).unwrap(), n * factor);
        prop_assert_eq!(scaled_value(&text, 3).unwrap(), n.saturating_mul(factor).saturating_mul(1000));
        prop_assert_eq!(scaled_value(&format!("-{text}"), 0).unwrap(), -(n * factor));
    }

    #[test]
    fn schedules_that_parse_find_their_next_minute(
        minute in 0u8..60, hour in 0u8..24, day in 1u8..29, month in 1u8..13,
    ) {
        let schedule = Schedule::parse(&format!("{minute} {hour} {day} {month} *")).unwrap();
        let next = schedule
            .next_after(jiff::Timestamp::UNIX_EPOCH, &jiff::tz::TimeZone::UTC)
            .expect("a date that exists every year");
        let at = next.to_zoned(jiff::tz::TimeZone::UTC);
        prop_assert_eq!(
            (at.minute(), at.hour(), at.day(), at.month()),
            (minute as i8, hour as i8, day as i8, month as i8)
        );
    }
}
