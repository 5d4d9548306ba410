//! The set of fields a value sets (upstream's `TypedValue.ToFieldSet`): every leaf, every
//! set or keyed-list item (owned as a whole as well as field by field), every key of a
//! map, and every struct field holding null or `{}`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::super::path::{Path, PathElement};
use super::super::schema::{MapKind, TypeRef};
use super::super::set::Set;
use super::{Walk, error_at, item_elements, walk};

/// What to do with list items that share a key (or a set value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in super::super) enum Duplicates {
    /// Refuse them: an applied configuration may not have any.
    Reject,
    /// Own such an item as a whole only, as upstream tolerates in stored objects.
    Allow,
}

pub(in super::super) fn to_field_set(
    ty: TypeRef,
    value: &Value,
    duplicates: Duplicates,
) -> Result<Set, String> {
    let mut set = Set::new();
    visit(ty, value, &mut Vec::new(), &mut set, duplicates)?;
    Ok(set)
}

fn visit(
    ty: TypeRef,
    value: &Value,
    path: &mut Path,
    set: &mut Set,
    duplicates: Duplicates,
) -> Result<(), String> {
    match (walk(ty, [Some(value), None]), value) {
        (Walk::Map(kind), Value::Object(fields)) => {
            for (name, child) in fields {
                path.push(PathElement::Field(name.clone()));
                visit(ty.field(name), child, path, set, duplicates)?;
                let empty = child.is_null() || child.as_object().is_some_and(|m| m.is_empty());
                if empty || kind == MapKind::Map {
                    set.insert(path);
                }
                path.pop();
            }
        }
        (Walk::List(kind), Value::Array(items)) => {
            let elements = item_elements(kind, items, path)?;
            let mut counts: BTreeMap<&PathElement, usize> = BTreeMap::new();
            for element in &elements {
                *counts.entry(element).or_default() += 1;
            }
            let element_ty = ty.element();
            for (element, item) in elements.iter().zip(items) {
                let duplicated = counts[element] > 1;
                path.push(element.clone());
                if !duplicated {
                    visit(element_ty, item, path, set, duplicates)?;
                } else if duplicates == Duplicates::Reject {
                    let message = format!("duplicate entries for key {element}");
                    path.pop();
                    return Err(error_at(path, &message));
                }
                set.insert(path);
                path.pop();
            }
        }
        _ => set.insert(path),
    }
    Ok(())
}
