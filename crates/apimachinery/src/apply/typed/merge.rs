//! Merging an applied configuration onto an object (upstream's `TypedValue.Merge`):
//! leaves and atomic values are taken from the configuration, objects merge key by key,
//! sets and keyed lists item by item.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::super::path::{Path, PathElement};
use super::super::schema::{ListKind, TypeRef};
use super::{Walk, error_at, is_empty, item_elements, items, walk};

/// Merges `rhs` (the configuration) onto `lhs` (the object); `None` when both are
/// absent.
pub(in super::super) fn merge(
    ty: TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
) -> Result<Option<Value>, String> {
    merge_at(ty, lhs, rhs, &mut Vec::new())
}

fn merge_at(
    ty: TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Path,
) -> Result<Option<Value>, String> {
    let (Some(l), Some(r)) = (lhs, rhs) else {
        // What one side alone holds is taken as it is.
        return Ok(rhs.or(lhs).cloned());
    };
    if is_empty(lhs) && is_empty(rhs) {
        return Ok(Some(r.clone()));
    }
    match walk(ty, [lhs, rhs]) {
        Walk::Leaf => Ok(Some(r.clone())),
        Walk::Map(_) => {
            let empty = Map::new();
            let (l, r) = (
                l.as_object().unwrap_or(&empty),
                r.as_object().unwrap_or(&empty),
            );
            let mut out = Map::new();
            let names = l
                .keys()
                .chain(r.keys().filter(|name| !l.contains_key(*name)));
            for name in names {
                path.push(PathElement::Field(name.clone()));
                if let Some(v) = merge_at(ty.field(name), l.get(name), r.get(name), path)? {
                    out.insert(name.clone(), v);
                }
                path.pop();
            }
            Ok(Some(Value::Object(out)))
        }
        Walk::List(kind) => merge_lists(ty, kind, items(lhs), items(rhs), path).map(Some),
    }
}

/// Merges the items of two sets or keyed lists. Items of `rhs` come in its order;
/// items only `lhs` has keep their place relative to the items around them, as far as
/// the two orders agree.
fn merge_lists(
    ty: TypeRef,
    kind: ListKind,
    lhs: &[Value],
    rhs: &[Value],
    path: &mut Path,
) -> Result<Value, String> {
    let r_elements = item_elements(kind, rhs, path)?;
    let mut observed_r = BTreeMap::new();
    for (element, item) in r_elements.iter().zip(rhs) {
        if observed_r.insert(element, item).is_some() {
            return Err(error_at(
                path,
                &format!("duplicate entries for key {element}"),
            ));
        }
    }
    let l_elements = item_elements(kind, lhs, path)?;
    // An item the object holds more than once merges as if it were not there: the
    // configuration's item replaces all of them.
    let mut observed_l: BTreeMap<&PathElement, Option<&Value>> = BTreeMap::new();
    for (element, item) in l_elements.iter().zip(lhs) {
        observed_l
            .entry(element)
            .and_modify(|seen| *seen = None)
            .or_insert(Some(item));
    }
    let mut shared = r_elements
        .iter()
        .filter(|element| observed_l.contains_key(element));
    let mut next_shared = shared.next();
    let mut merged_r = BTreeSet::new();
    let element_ty = ty.element();
    let mut out = Vec::with_capacity(lhs.len().max(rhs.len()));
    let mut merge_item = |element: &PathElement, l: Option<&Value>, r: Option<&Value>| {
        path.push(element.clone());
        let merged = merge_at(element_ty, l, r, path);
        path.pop();
        if let Some(item) = merged? {
            out.push(item);
        }
        Ok::<_, String>(())
    };
    let (mut li, mut ri) = (0, 0);
    while li < l_elements.len() || ri < r_elements.len() {
        if li < l_elements.len() && ri < r_elements.len() {
            let element = &l_elements[li];
            if *element == r_elements[ri] {
                merged_r.insert(element);
                merge_item(element, observed_l[element], Some(observed_r[element]))?;
                li += 1;
                ri += 1;
                next_shared = shared.next();
                continue;
            }
            if observed_r.contains_key(element) && next_shared.is_some_and(|next| next != element) {
                // Shared with rhs, but rhs wants another shared item first.
                li += 1;
                continue;
            }
        }
        if li < l_elements.len() {
            let element = &l_elements[li];
            if !observed_r.contains_key(element) {
                merge_item(element, Some(&lhs[li]), None)?;
                li += 1;
                continue;
            }
            if merged_r.contains(element) {
                li += 1;
            }
        }
        if ri < r_elements.len() {
            let element = &r_elements[ri];
            merged_r.insert(element);
            let l = observed_l.get(element).copied().flatten();
            merge_item(element, l, Some(observed_r[element]))?;
            ri += 1;
            if next_shared == Some(element) {
                next_shared = shared.next();
            }
        }
    }
    Ok(Value::Array(out))
}
