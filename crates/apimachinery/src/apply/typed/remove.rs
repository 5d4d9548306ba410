//! Removing fields from an object (upstream's `TypedValue.RemoveItems`): a removed field
//! takes what is below it along, a removed set or keyed-list item is dropped from its
//! list.

use serde_json::{Map, Value};

use super::super::path::PathElement;
use super::super::schema::{MapKind, TypeRef};
use super::super::set::Set;
use super::item_element;

/// What becomes of a list (or a value walked into that cannot be walked) that removal
/// leaves empty. An object left empty stays, as `{}`, either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in super::super) enum Emptied {
    /// It stays, as null: upstream computes ownership on such values, where a field
    /// that is present (even null) is neither added nor removed.
    Null,
    /// It goes, as upstream's typed objects drop a nil slice.
    Dropped,
}

/// `value` without the fields of `to_remove`; `None` when `value` itself goes.
pub(in super::super) fn remove_items(
    ty: TypeRef,
    value: &Value,
    to_remove: &Set,
    emptied: Emptied,
) -> Option<Value> {
    let empty = || match emptied {
        Emptied::Null => Some(Value::Null),
        Emptied::Dropped => None,
    };
    match value {
        Value::Object(fields) => {
            if ty.map_kind() == MapKind::Atomic {
                return empty();
            }
            let mut out = Map::new();
            for (name, child) in fields {
                let element = PathElement::Field(name.clone());
                if to_remove.has(std::slice::from_ref(&element)) {
                    continue;
                }
                let kept = match to_remove.with_prefix(&element) {
                    Some(below) => remove_items(ty.field(name), child, below, emptied),
                    None => Some(child.clone()),
                };
                if let Some(kept) = kept {
                    out.insert(name.clone(), kept);
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(items) => {
            let Some(kind) = ty.list_kind() else {
                return empty();
            };
            let element_ty = ty.element();
            let out: Vec<Value> = items
                .iter()
                .filter_map(|item| {
                    // An item without a key cannot be named by a path: it stays.
                    let Ok(element) = item_element(kind, item) else {
                        return Some(item.clone());
                    };
                    if to_remove.has(std::slice::from_ref(&element)) {
                        return None;
                    }
                    match to_remove.with_prefix(&element) {
                        // An item is an object, which stays: only what is below it
                        // can go.
                        Some(below) => remove_items(element_ty, item, below, emptied)
                            .filter(|item| !item.is_null()),
                        None => Some(item.clone()),
                    }
                })
                .collect();
            if out.is_empty() {
                empty()
            } else {
                Some(Value::Array(out))
            }
        }
        Value::Null => empty(),
        scalar => Some(scalar.clone()),
    }
}
