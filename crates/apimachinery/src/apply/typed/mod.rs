//! Operations on JSON values guided by their schema type, after structured-merge-diff's
//! `typed` package: the set of fields a value sets, merging an applied configuration
//! onto an object, comparing two versions of an object, and removing fields.
//!
//! Every operation walks the value(s) and the type together. At each node the type and
//! the kinds of the values decide the [`Walk`]: objects are walked key by key unless
//! atomic, lists item by item when they are sets or keyed, and anything else (scalars,
//! nulls, atomic values, values whose kinds disagree) is a leaf, compared and replaced
//! whole.

mod compare;
mod merge;
mod remove;
mod to_set;

use serde_json::Value;

use super::path::{PathElement, path_string};
use super::schema::{KeyDefault, ListKind, MapKind, TypeRef};

pub(super) use compare::{Comparison, compare};
pub(super) use merge::merge;
pub(super) use remove::{Emptied, remove_items};
pub(super) use to_set::{Duplicates, to_field_set};

/// How a node is walked.
#[derive(Clone, Copy, Debug)]
enum Walk {
    Leaf,
    /// An object walked key by key: [`MapKind::Struct`] or [`MapKind::Map`].
    Map(MapKind),
    /// A set or a keyed list walked item by item.
    List(ListKind),
}

/// The walk for the values at a node (absent on one side in a merge or comparison).
/// A null goes along with the other side, as an empty object or list would.
fn walk(ty: TypeRef, values: [Option<&Value>; 2]) -> Walk {
    let mut values = values.into_iter().flatten().filter(|v| !v.is_null());
    let Some(first) = values.next() else {
        return Walk::Leaf;
    };
    let same_kind = values.all(|other| {
        (first.is_object() && other.is_object()) || (first.is_array() && other.is_array())
    });
    if !same_kind {
        return Walk::Leaf;
    }
    match first {
        Value::Object(_) => match ty.map_kind() {
            MapKind::Atomic => Walk::Leaf,
            kind => Walk::Map(kind),
        },
        Value::Array(_) => ty.list_kind().map_or(Walk::Leaf, Walk::List),
        _ => Walk::Leaf,
    }
}

/// Whether a value is null, `{}` or `[]`: two such values are compared and merged as
/// leaves, which keeps the difference between them.
fn is_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Object(map)) => map.is_empty(),
        Some(Value::Array(items)) => items.is_empty(),
        Some(_) => false,
    }
}

/// The items of a list value; null is an empty list.
fn items(value: Option<&Value>) -> &[Value] {
    match value {
        Some(Value::Array(items)) => items,
        _ => &[],
    }
}

/// The path element that identifies `item` in a set or keyed list.
fn item_element(kind: ListKind, item: &Value) -> Result<PathElement, String> {
    match kind {
        ListKind::Keyed(keys) => {
            let fields = match item {
                Value::Object(fields) => fields,
                Value::Null => {
                    return Err("associative list with keys may not have a null element".into());
                }
                _ => return Err("associative list with keys may not have non-map elements".into()),
            };
            let mut key: Vec<(String, Value)> = keys
                .iter()
                .filter_map(|key| {
                    // The item's own value, else the key's default (if it has one).
                    let value = fields.get(key.name).cloned().or_else(|| {
                        key.default.map(|default| match default {
                            KeyDefault::Str(s) => Value::from(s),
                            KeyDefault::Int(i) => Value::from(i),
                        })
                    })?;
                    Some((key.name.to_owned(), value))
                })
                .collect();
            if key.is_empty() {
                let names: Vec<String> = keys.iter().map(|key| format!("{:?}", key.name)).collect();
                return Err(format!(
                    "associative list with keys has an element that omits all key fields [{}] \
                     (and doesn't have default values for any key fields)",
                    names.join(" ")
                ));
            }
            key.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(PathElement::Key(key))
        }
        ListKind::Set => match item {
            Value::Object(_) => {
                Err("associative list without keys has an element that's a map type".into())
            }
            Value::Array(_) => Err("not supported: associative list with lists as elements".into()),
            Value::Null => {
                Err("associative list without keys has an element that's an explicit null".into())
            }
            scalar => Ok(PathElement::Value(scalar.clone())),
        },
    }
}

/// The path elements of a list's items, or the error of the first item that has none,
/// prefixed with the list's path as upstream reports it.
fn item_elements(
    kind: ListKind,
    items: &[Value],
    path: &[PathElement],
) -> Result<Vec<PathElement>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item_element(kind, item).map_err(|e| error_at(path, &format!("element {i}: {e}")))
        })
        .collect()
}

/// An error message about the value at `path`.
fn error_at(path: &[PathElement], message: &str) -> String {
    if path.is_empty() {
        message.to_owned()
    } else {
        format!("{}: {message}", path_string(path))
    }
}
