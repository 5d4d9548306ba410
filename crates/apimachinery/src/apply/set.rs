//! Sets of field paths, the ownership records of server-side apply, with the set
//! algebra of upstream's `fieldpath.Set` and its `FieldsV1` JSON form.
//!
//! A set is a tree: `members` are the paths that end at this node, `children` the
//! non-empty subsets below an element. A path can be both a member and a prefix of
//! other members (a list item owned as a whole and field by field); `FieldsV1` marks
//! such a member with a `".": {}` entry in its child object.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::path::{Path, PathElement};
use super::schema::{MapKind, TypeRef};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Set {
    members: BTreeSet<PathElement>,
    /// Never holds an empty set.
    children: BTreeMap<PathElement, Set>,
}

impl Set {
    pub(super) fn new() -> Set {
        Set::default()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// Adds `path` (not its prefixes); an empty path is ignored, nobody owns "the
    /// whole object".
    pub(super) fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    pub(super) fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|set| set.has(rest)),
        }
    }

    /// The paths below `element`, with `element` taken off.
    pub(super) fn with_prefix(&self, element: &PathElement) -> Option<&Set> {
        self.children.get(element)
    }

    pub(super) fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (element, set) in &other.children {
            let merged = match out.children.get(element) {
                Some(mine) => mine.union(set),
                None => set.clone(),
            };
            out.children.insert(element.clone(), merged);
        }
        out
    }

    pub(super) fn intersection(&self, other: &Set) -> Set {
        Set {
            members: self.members.intersection(&other.members).cloned().collect(),
            children: self
                .children
                .iter()
                .filter_map(|(element, set)| {
                    let common = set.intersection(other.children.get(element)?);
                    (!common.is_empty()).then(|| (element.clone(), common))
                })
                .collect(),
        }
    }

    /// The members of `self` that are not members of `other`, level by level: a
    /// member of `other` does not take the paths below it away.
    pub(super) fn difference(&self, other: &Set) -> Set {
        self.subtract(other, false)
    }

    /// Like [`difference`](Self::difference), but a member of `other` also takes away
    /// every path below it.
    pub(super) fn recursive_difference(&self, other: &Set) -> Set {
        self.subtract(other, true)
    }

    fn subtract(&self, other: &Set, recursive: bool) -> Set {
        Set {
            members: self.members.difference(&other.members).cloned().collect(),
            children: self
                .children
                .iter()
                .filter(|(element, _)| !(recursive && other.members.contains(element)))
                .filter_map(|(element, set)| {
                    let rest = match other.children.get(element) {
                        Some(theirs) => set.subtract(theirs, recursive),
                        None => set.clone(),
                    };
                    (!rest.is_empty()).then(|| (element.clone(), rest))
                })
                .collect(),
        }
    }

    /// Adds, as members, the struct fields that have paths below them: owning a field
    /// of a struct means owning the struct field itself, while owning a key of a map
    /// (or an item of a list) does not mean owning the map.
    pub(super) fn ensure_named_fields_are_members(&self, ty: TypeRef) -> Set {
        let mut members = self.members.clone();
        let mut children = BTreeMap::new();
        for (element, set) in &self.children {
            let child_ty = match element {
                PathElement::Field(name) => {
                    if ty.map_kind() == MapKind::Struct {
                        members.insert(element.clone());
                    }
                    ty.field(name)
                }
                PathElement::Key(_) => ty.element(),
                PathElement::Value(_) | PathElement::Index(_) => TypeRef::Plain,
            };
            children.insert(
                element.clone(),
                set.ensure_named_fields_are_members(child_ty),
            );
        }
        Set { members, children }
    }

    /// Every path of the set: the members of a node before the paths below it.
    pub(super) fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        for member in &self.members {
            let mut path = prefix.clone();
            path.push(member.clone());
            out.push(path);
        }
        for (element, set) in &self.children {
            prefix.push(element.clone());
            set.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// The `fieldsV1` form, entries in upstream's order.
    pub(super) fn to_fields_v1(&self) -> Value {
        Value::Object(self.fields_v1_entries(false))
    }

    fn fields_v1_entries(&self, include_self: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if include_self {
            out.insert(".".to_owned(), Value::Object(Map::new()));
        }
        let elements: BTreeSet<&PathElement> =
            self.members.iter().chain(self.children.keys()).collect();
        for element in elements {
            let entries = match self.children.get(element) {
                Some(set) => set.fields_v1_entries(self.members.contains(element)),
                None => Map::new(),
            };
            out.insert(element.serialize(), Value::Object(entries));
        }
        out
    }

    /// Reads the `fieldsV1` form; keys of unknown kinds are skipped, as upstream does.
    pub(super) fn from_fields_v1(fields: &Value) -> Result<Set, String> {
        let Value::Object(entries) = fields else {
            return Err(format!("expected an object, got {fields}"));
        };
        let mut set = Set::new();
        for (key, value) in entries {
            if key == "." {
                continue;
            }
            let Some(element) = PathElement::parse(key)? else {
                continue;
            };
            let Value::Object(below) = value else {
                return Err(format!("{key}: expected an object, got {value}"));
            };
            let child = Set::from_fields_v1(value)?;
            if below.is_empty() || below.contains_key(".") || child.is_empty() {
                set.members.insert(element.clone());
            }
            if !child.is_empty() {
                set.children.insert(element, child);
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field(name: &str) -> PathElement {
        PathElement::Field(name.to_owned())
    }

    fn set(paths: &[&[&str]]) -> Set {
        let mut set = Set::new();
        for path in paths {
            let path: Path = path.iter().map(|name| field(name)).collect();
            set.insert(&path);
        }
        set
    }

    #[test]
    fn fields_v1_round_trip() {
        let mut owned = set(&[&["spec", "replicas"], &["metadata", "labels", "app"]]);
        let item = [
            field("spec"),
            field("containers"),
            PathElement::Key(vec![("name".into(), json!("web"))]),
        ];
        owned.insert(&item);
        let mut image = item.to_vec();
        image.push(field("image"));
        owned.insert(&image);
        let fields = owned.to_fields_v1();
        assert_eq!(
            serde_json::to_string(&fields).unwrap(),
            r#"{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{}}},"f:replicas":{}}}"#
        );
        assert_eq!(Set::from_fields_v1(&fields).unwrap(), owned);
        assert!(Set::from_fields_v1(&json!({"f:a": 1})).is_err());
        assert_eq!(
            Set::from_fields_v1(&json!({"f:a": {}, "x:y": {}})).unwrap(),
            set(&[&["a"]])
        );
    }

    #[test]
    fn algebra() {
        let a = set(&[&["a", "b"], &["a", "c"], &["d"]]);
        let b = set(&[&["a", "b"], &["a"], &["e"]]);
        assert_eq!(a.intersection(&b), set(&[&["a", "b"]]));
        assert_eq!(a.difference(&b), set(&[&["a", "c"], &["d"]]));
        assert_eq!(a.recursive_difference(&b), set(&[&["d"]]));
        assert_eq!(
            a.union(&b),
            set(&[&["a", "b"], &["a", "c"], &["a"], &["d"], &["e"]])
        );
        assert!(a.has(&[field("a"), field("c")]));
        assert!(!a.has(&[field("a")]));
        assert_eq!(a.paths().len(), 3);
        assert!(a.difference(&a).is_empty());
    }
}
