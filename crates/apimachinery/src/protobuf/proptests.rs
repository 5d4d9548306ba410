//! [`decode`] over random and damaged input: it returns an error or a value and never
//! panics, and string maps survive a round trip whatever their keys. Whatever decodes
//! encodes, and decodes again to the same object.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::fixture::{Enc, body, hex};
use super::table::KINDS;
use super::{decode, encode};

/// Request bodies kubectl sent, to damage.
const CAPTURED: &[&str] = &[
    include_str!("testdata/deployment.hex"),
    include_str!("testdata/configmap.hex"),
    include_str!("testdata/cronjob.hex"),
    include_str!("testdata/service.hex"),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bodies_do_not_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
        let _ = decode(&[b"k8s\0".as_slice(), &bytes].concat());
    }

    #[test]
    fn random_objects_of_every_kind_do_not_panic(
        kind in 0..KINDS.len(),
        raw in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let (api_version, kind, _) = KINDS[kind];
        let body = body(api_version, kind, Enc::raw(&raw));
        if let Ok(object) = decode(&body) {
            prop_assert_eq!(&object["kind"], &json!(kind));
            let again = decode(&encode(&object).unwrap()).unwrap();
            prop_assert_eq!(again.to_string(), object.to_string());
        }
    }

    #[test]
    fn damaged_captured_bodies_do_not_panic(
        which in 0..CAPTURED.len(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = hex(CAPTURED[which]);
        for (at, byte) in edits {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        let _ = decode(&bytes);
        bytes.truncate(cut.index(bytes.len()));
        let _ = decode(&bytes);
    }

    #[test]
    fn string_maps_round_trip_sorted(
        data in prop::collection::vec(("\\PC{0,8}", "\\PC{0,8}"), 0..8),
    ) {
        let raw = data
            .iter()
            .fold(Enc::new().msg(1, Enc::new()), |e, (k, v)| e.entry(2, k, v));
        let object = decode(&body("v1", "ConfigMap", raw)).unwrap();
        // A repeated key keeps its last value, as a Go map does.
        let expected: BTreeMap<&str, &str> =
            data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        match object.get("data") {
            None => prop_assert!(expected.is_empty()),
            Some(Value::Object(map)) => {
                let got: Vec<(&str, &str)> = map
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
                    .collect();
                prop_assert_eq!(got, expected.into_iter().collect::<Vec<_>>());
            }
            Some(other) => prop_assert!(false, "data is {}", other),
        }
    }
}
