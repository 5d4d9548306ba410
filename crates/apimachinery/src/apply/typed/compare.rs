//! Comparing two versions of an object (upstream's `TypedValue.Compare`): which fields
//! the new version added, modified or removed. A node walked into (an object, a set or
//! keyed list) counts as added or removed only when it appears or disappears as a
//! whole; its contents are compared one by one.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::super::path::{Path, PathElement};
use super::super::schema::{ListKind, TypeRef};
use super::super::set::Set;
use super::super::value::equals;
use super::{Walk, is_empty, item_elements, items, walk};

#[derive(Clone, Debug, Default)]
pub(in super::super) struct Comparison {
    pub removed: Set,
    pub modified: Set,
    pub added: Set,
}

impl Comparison {
    /// The fields whose new value is not the old one: modified or added.
    pub(in super::super) fn changed(&self) -> Set {
        self.modified.union(&self.added)
    }

    /// Leaves out `ignored` and everything below it.
    pub(in super::super) fn without(self, ignored: &Set) -> Comparison {
        Comparison {
            removed: self.removed.recursive_difference(ignored),
            modified: self.modified.recursive_difference(ignored),
            added: self.added.recursive_difference(ignored),
        }
    }
}

pub(in super::super) fn compare(
    ty: TypeRef,
    lhs: &Value,
    rhs: &Value,
) -> Result<Comparison, String> {
    let mut comparison = Comparison::default();
    visit(ty, Some(lhs), Some(rhs), &mut Vec::new(), &mut comparison)?;
    Ok(comparison)
}

fn visit(
    ty: TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Path,
    out: &mut Comparison,
) -> Result<(), String> {
    let walk = if is_empty(lhs) && is_empty(rhs) {
        Walk::Leaf
    } else {
        walk(ty, [lhs, rhs])
    };
    match walk {
        Walk::Leaf => {
            match (lhs, rhs) {
                (None, _) => out.added.insert(path),
                (_, None) => out.removed.insert(path),
                (Some(l), Some(r)) if !equals(l, r) => out.modified.insert(path),
                _ => {}
            }
            return Ok(());
        }
        Walk::Map(_) => {
            let empty = Map::new();
            let l = lhs.and_then(Value::as_object).unwrap_or(&empty);
            let r = rhs.and_then(Value::as_object).unwrap_or(&empty);
            for name in l
                .keys()
                .chain(r.keys().filter(|name| !l.contains_key(*name)))
            {
                path.push(PathElement::Field(name.clone()));
                visit(ty.field(name), l.get(name), r.get(name), path, out)?;
                path.pop();
            }
        }
        Walk::List(kind) => compare_lists(ty, kind, items(lhs), items(rhs), path, out)?,
    }
    if lhs.is_none() {
        out.added.insert(path);
    } else if rhs.is_none() {
        out.removed.insert(path);
    }
    Ok(())
}

/// Compares sets or keyed lists item by item. Items that appear more than once are
/// compared as a whole, like an atomic list.
fn compare_lists(
    ty: TypeRef,
    kind: ListKind,
    lhs: &[Value],
    rhs: &[Value],
    path: &mut Path,
    out: &mut Comparison,
) -> Result<(), String> {
    let mut by_element: BTreeMap<PathElement, [Vec<&Value>; 2]> = BTreeMap::new();
    for (side, list) in [lhs, rhs].into_iter().enumerate() {
        for (element, item) in item_elements(kind, list, path)?.into_iter().zip(list) {
            by_element.entry(element).or_default()[side].push(item);
        }
    }
    let element_ty = ty.element();
    for (element, [l, r]) in by_element {
        path.push(element);
        match (l.len(), r.len()) {
            (0..=1, 0..=1) => visit(
                element_ty,
                l.first().copied(),
                r.first().copied(),
                path,
                out,
            )?,
            (2.., 2..) => {
                let same = l.len() == r.len() && l.iter().zip(&r).all(|(l, r)| equals(l, r));
                if !same {
                    out.modified.insert(path);
                }
            }
            (2.., _) => {
                if let Some(r) = r.first() {
                    visit(element_ty, None, Some(r), path, out)?;
                }
                out.removed.insert(path);
            }
            (_, _) => {
                if let Some(l) = l.first() {
                    visit(element_ty, Some(l), None, path, out)?;
                }
                out.added.insert(path);
            }
        }
        path.pop();
    }
    Ok(())
}
