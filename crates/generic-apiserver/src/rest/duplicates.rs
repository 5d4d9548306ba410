//! Duplicate fields in a JSON body (`{"a": 1, "a": 2}`): JSON parsers keep the last one
//! silently, but upstream's strict field validation reports them, so they are found in
//! one extra pass over the body when the client asked for Strict or Warn.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The paths (`spec.replicas`, `spec.containers[0].name`) of fields given twice.
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    // A body that is not JSON is reported by the real parse; nothing to add here.
    let _ = Finder {
        path: String::new(),
        out: &mut out,
    }
    .deserialize(&mut de);
    out
}

struct Finder<'a> {
    path: String,
    out: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Finder<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Finder<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if !seen.insert(key) {
                self.out.push(path.clone());
            }
            map.next_value_seed(Finder {
                path,
                out: self.out,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Finder {
                path: format!("{}[{i}]", self.path),
                out: self.out,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_duplicates() {
        let body = br#"{"kind":"Pod","spec":{"containers":[{"name":"a","name":"b"}],"restartPolicy":"Always"},"kind":"Pod"}"#;
        assert_eq!(duplicate_fields(body), ["spec.containers[0].name", "kind"]);
        assert!(duplicate_fields(br#"{"a":{"b":1},"c":{"b":2}}"#).is_empty());
        assert!(duplicate_fields(b"not json").is_empty());
    }
}
