//! Path elements: the steps from an object to one of its fields or list items, ordered
//! as upstream orders them, written as managedFields keys (`f:spec`,
//! `k:{"name":"web"}`, `v:"a"`, `i:0`) and as the paths of conflict messages
//! (`.spec.containers[name="web"].image`).

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

use super::value::{compare, go_display, go_json, write_go_string};

/// One step of a path.
#[derive(Clone, Debug)]
pub(super) enum PathElement {
    /// A field of a struct or a key of a map.
    Field(String),
    /// An item of a keyed list, by its key fields, sorted by name.
    Key(Vec<(String, Value)>),
    /// An item of a set, by its value.
    Value(Value),
    /// An item of a list by position; upstream writes none, but may read them.
    Index(usize),
}

pub(super) type Path = Vec<PathElement>;

impl PathElement {
    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }

    /// The managedFields key for this element.
    pub(super) fn serialize(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                let mut out = String::from("k:{");
                for (i, (name, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_go_string(&mut out, name);
                    out.push(':');
                    out.push_str(&go_json(value));
                }
                out.push('}');
                out
            }
            PathElement::Value(value) => format!("v:{}", go_json(value)),
            PathElement::Index(index) => format!("i:{index}"),
        }
    }

    /// Parses a managedFields key; `Ok(None)` for a kind of element this version does
    /// not know, which upstream skips too.
    pub(super) fn parse(key: &str) -> Result<Option<PathElement>, String> {
        let Some((kind, body)) = key.split_at_checked(2) else {
            return Err(format!("key must be 2 characters long: {key:?}"));
        };
        let element = match kind {
            "f:" => PathElement::Field(body.to_owned()),
            "k:" => {
                let fields: serde_json::Map<String, Value> =
                    serde_json::from_str(body).map_err(|e| format!("{key:?}: {e}"))?;
                let mut fields: Vec<(String, Value)> = fields.into_iter().collect();
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                PathElement::Key(fields)
            }
            "v:" => {
                PathElement::Value(serde_json::from_str(body).map_err(|e| format!("{key:?}: {e}"))?)
            }
            "i:" => PathElement::Index(body.parse().map_err(|e| format!("{key:?}: {e}"))?),
            _ if kind.ends_with(':') => return Ok(None),
            _ => return Err(format!("missing colon: {key:?}")),
        };
        Ok(Some(element))
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => {
                for ((a_name, a_value), (b_name, b_value)) in a.iter().zip(b) {
                    let order = a_name.cmp(b_name).then_with(|| compare(a_value, b_value));
                    if order.is_ne() {
                        return order;
                    }
                }
                a.len().cmp(&b.len())
            }
            (PathElement::Value(a), PathElement::Value(b)) => compare(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for PathElement {}

/// Upstream's `PathElement.String`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|(name, value)| format!("{name}={}", go_display(value)))
                    .collect();
                write!(f, "[{}]", fields.join(","))
            }
            PathElement::Value(value) => write!(f, "[={}]", go_display(value)),
            PathElement::Index(index) => write!(f, "[{index}]"),
        }
    }
}

/// Upstream's `Path.String`: the elements run together, e.g. `.spec.replicas`.
pub(super) fn path_string(path: &[PathElement]) -> String {
    path.iter().map(PathElement::to_string).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(fields: &[(&str, Value)]) -> PathElement {
        PathElement::Key(
            fields
                .iter()
                .map(|(name, value)| (name.to_string(), value.clone()))
                .collect(),
        )
    }

    #[test]
    fn serializes_like_upstream() {
        let port = key(&[("containerPort", json!(80)), ("protocol", json!("TCP"))]);
        assert_eq!(
            port.serialize(),
            r#"k:{"containerPort":80,"protocol":"TCP"}"#
        );
        assert_eq!(
            PathElement::Value(json!("a<b")).serialize(),
            r#"v:"a\u003cb""#
        );
        assert_eq!(PathElement::Field("spec".into()).serialize(), "f:spec");
        assert_eq!(PathElement::Index(3).serialize(), "i:3");
        for element in [port, PathElement::Value(json!("x")), PathElement::Index(1)] {
            let parsed = PathElement::parse(&element.serialize()).unwrap().unwrap();
            assert_eq!(parsed, element);
        }
        assert_eq!(PathElement::parse("z:whatever"), Ok(None));
        assert!(PathElement::parse("f").is_err());
        assert!(PathElement::parse("k:{").is_err());
    }

    #[test]
    fn parsed_keys_are_sorted() {
        let parsed = PathElement::parse(r#"k:{"protocol":"TCP","containerPort":80}"#);
        assert_eq!(
            parsed.unwrap().unwrap(),
            key(&[("containerPort", json!(80)), ("protocol", json!("TCP"))])
        );
    }

    #[test]
    fn orders_fields_then_keys_then_values_then_indexes() {
        let ordered = [
            PathElement::Field("a".into()),
            PathElement::Field("b".into()),
            key(&[("port", json!(80))]),
            key(&[("port", json!(8080))]),
            PathElement::Value(json!(2)),
            PathElement::Value(json!("a")),
            PathElement::Index(0),
        ];
        assert!(ordered.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn displays_like_upstream() {
        let path = vec![
            PathElement::Field("spec".into()),
            PathElement::Field("containers".into()),
            key(&[("name", json!("web"))]),
            PathElement::Field("ports".into()),
            key(&[("containerPort", json!(80)), ("protocol", json!("TCP"))]),
        ];
        assert_eq!(
            path_string(&path),
            r#".spec.containers[name="web"].ports[containerPort=80,protocol="TCP"]"#
        );
        let finalizer = [PathElement::Value(json!("example.com/x"))];
        assert_eq!(path_string(&finalizer), r#"[="example.com/x"]"#);
    }
}
