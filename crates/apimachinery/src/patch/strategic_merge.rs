//! Applies a strategic merge patch (`application/strategic-merge-patch+json`) to a
//! JSON object, with the semantics of upstream's
//! `k8s.io/apimachinery/pkg/util/strategicpatch` as the apiserver runs it
//! (`StrategicMergeMapPatch`: parallel directive lists are applied, nulls that match
//! nothing are ignored).
//!
//! For each field of the patch, by the JSON types of the original and patch values:
//! - object and object: merged key by key, recursively; `null` deletes a key. A field
//!   declared `replace` is replaced instead.
//! - list and list: replaced, unless the field's strategy is `merge`. Lists of objects
//!   then merge item by item on the merge key, new items being added; lists of
//!   primitives are unioned. Items named in the patch come in patch order and the
//!   others keep their original order (see `order` below).
//! - anything else, or a field missing from the original: the patch value is taken.
//!
//! Directives: `$patch: replace | delete` on an object; `{"$patch": "replace"}` and
//! `{<key>: <value>, "$patch": "delete"}` as items of a merging list;
//! `$setElementOrder/<field>`, `$deleteFromPrimitiveList/<field>` and `$retainKeys`
//! beside the fields of an object. `$patch: merge` is refused, as upstream does.
//!
//! Fields without metadata are handled as in a JSON merge patch (RFC 7386), except
//! that directives still apply.
//!
//! Deviations from upstream, all on inputs kubectl does not send: a patch value that
//! has nothing to merge with (a new field, a new list item, a replaced list or object)
//! has its directives resolved and its nulls dropped, where upstream sometimes keeps
//! them verbatim or, for an object marked `$patch: replace`, drops the object; a
//! `$setElementOrder` may end in directive items, and may name an empty list.

use std::fmt;

use serde_json::{Map, Value};
use thiserror::Error;

use super::meta::{FieldMeta, PatchStrategy, Shape, TypeRef};

type Object = Map<String, Value>;

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";

/// Why a patch could not be applied; the message names the offending field.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("the {0} is not a JSON object")]
    NotAnObject(&'static str),
    #[error(
        "unsupported $patch directive {directive} at {path}: expected \"replace\" or \"delete\""
    )]
    UnknownDirective { path: String, directive: String },
    #[error("list item at {path} lacks its merge key {key:?}")]
    MissingMergeKey { path: String, key: String },
    #[error("invalid {directive} at {path}: {reason}")]
    InvalidDirective {
        path: String,
        directive: &'static str,
        reason: String,
    },
    #[error("cannot merge the list at {path}: {reason}")]
    UnmergeableList { path: String, reason: &'static str },
}

/// Applies `patch` to `original`, both JSON objects, `root` being the type of both.
pub fn apply_strategic_merge_patch(
    original: &Value,
    patch: &Value,
    root: TypeRef,
) -> Result<Value, PatchError> {
    let Value::Object(original) = original else {
        return Err(PatchError::NotAnObject("original document"));
    };
    let Value::Object(patch) = patch else {
        return Err(PatchError::NotAnObject("patch"));
    };
    merge_map(original.clone(), patch.clone(), root, &Path::Root).map(Value::Object)
}

/// Where in the document a value is, for error messages.
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    /// A list item, by its merge key and that key's value.
    Item(&'a Path<'a>, &'a str, &'a Value),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("."),
            Path::Field(Path::Root, name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Item(parent, key, value) => write!(f, "{parent}[{key}={value}]"),
        }
    }
}

fn merge_map(
    mut original: Object,
    mut patch: Object,
    ty: TypeRef,
    path: &Path,
) -> Result<Object, PatchError> {
    if let Some(directive) = patch.shift_remove(PATCH) {
        return match directive.as_str() {
            Some("replace") => resolve_map(patch, path),
            Some("delete") => Ok(Object::new()),
            _ => Err(unknown_directive(&directive, path)),
        };
    }
    if let Some(keys) = patch.shift_remove(RETAIN_KEYS) {
        retain_keys(&mut original, &patch, &keys, path)?;
    }

    // Orderings go first: each takes its list out of the patch, merges it and orders
    // the result.
    let mut orders = Vec::new();
    let mut fields = Object::new();
    for (key, value) in patch {
        if key.starts_with(SET_ELEMENT_ORDER) {
            orders.push((key, value));
        } else {
            fields.insert(key, value);
        }
    }
    for (key, order) in orders {
        let name = directive_target(&key, SET_ELEMENT_ORDER, path)?;
        let patch_list = fields.shift_remove(name);
        set_element_order(
            &mut original,
            name,
            patch_list,
            order,
            ty.field(name),
            &Path::Field(path, name),
        )?;
    }

    for (key, value) in fields {
        if key.starts_with(DELETE_FROM_PRIMITIVE_LIST) {
            let name = directive_target(&key, DELETE_FROM_PRIMITIVE_LIST, path)?;
            delete_from_primitive_list(&mut original, name, value, &Path::Field(path, name))?;
            continue;
        }
        if value.is_null() {
            original.shift_remove(&key);
            continue;
        }
        let field_path = Path::Field(path, &key);
        let merged = match original.get_mut(&key) {
            Some(current) => merge_field(current.take(), value, ty.field(&key), &field_path)?,
            None => resolve_value(value, &field_path)?,
        };
        match merged {
            Some(merged) => original.insert(key, merged),
            None => original.shift_remove(&key),
        };
    }
    Ok(original)
}

/// Merges the patch value of a field into its original value; `None` removes the field.
fn merge_field(
    original: Value,
    patch: Value,
    field: Option<&FieldMeta>,
    path: &Path,
) -> Result<Option<Value>, PatchError> {
    // Metadata that disagrees with the values' JSON types is ignored.
    let object_field = field.filter(|field| field.shape == Shape::Object);
    let list_field = field.filter(|field| field.shape == Shape::List);
    let replace = object_field.is_some_and(|field| field.strategy == PatchStrategy::Replace);
    match (original, patch) {
        (Value::Object(original), Value::Object(patch)) if !replace => {
            let ty = object_field.map_or(TypeRef::UNTYPED, FieldMeta::value_type);
            Ok(Some(Value::Object(merge_map(original, patch, ty, path)?)))
        }
        (Value::Array(original), Value::Array(patch)) => Ok(Some(Value::Array(
            merge_or_replace_list(original, patch, list_field, path)?,
        ))),
        (_, patch) => resolve_value(patch, path),
    }
}

fn merge_or_replace_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    field: Option<&FieldMeta>,
    path: &Path,
) -> Result<Vec<Value>, PatchError> {
    match field {
        Some(field) if field.strategy.merges_lists() => {
            merge_list(original, patch, field.merge_key, field.value_type(), path)
        }
        _ => resolve_list(patch, path),
    }
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: Option<&str>,
    item_type: TypeRef,
    path: &Path,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    if !holds_objects(&original, &patch, path)? {
        return Ok(merge_primitives(original, patch));
    }
    let Some(key) = merge_key else {
        return Err(PatchError::UnmergeableList {
            path: path.to_string(),
            reason: "it holds objects but has no merge key",
        });
    };
    merge_objects(original, patch, key, item_type, path)
}

/// Unions two lists of primitives, without duplicates.
fn merge_primitives(original: Vec<Value>, patch: Vec<Value>) -> Vec<Value> {
    let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
    for value in original.iter().chain(&patch) {
        if position(&merged, value).is_none() {
            merged.push(value.clone());
        }
    }
    let items = merged.into_iter().map(|value| (value.clone(), value));
    order(items, &patch, &original)
}

fn merge_objects(
    original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
    item_type: TypeRef,
    path: &Path,
) -> Result<Vec<Value>, PatchError> {
    let (mut merged, patch_items) = apply_item_directives(original, patch, key, path)?;
    let server_order = merged
        .iter()
        .map(|item| require_key(item.get(key), key, path))
        .collect::<Result<Vec<_>, _>>()?;

    let mut patch_order = Vec::with_capacity(patch_items.len());
    for item in patch_items {
        let id = require_key(item.get(key), key, path)?;
        let item_path = Path::Item(path, key, &id);
        match merged
            .iter()
            .position(|m| m.get(key).is_some_and(|v| json_eq(v, &id)))
        {
            Some(index) => {
                let current = std::mem::take(&mut merged[index]);
                merged[index] = merge_map(current, item, item_type, &item_path)?;
            }
            None => merged.push(resolve_map(item, &item_path)?),
        }
        patch_order.push(id);
    }

    let items = merged
        .into_iter()
        .map(|item| Ok((require_key(item.get(key), key, path)?, Value::Object(item))))
        .collect::<Result<Vec<_>, PatchError>>()?;
    Ok(order(items, &patch_order, &server_order))
}

/// Applies the `$patch` items of a merging list: deletions remove original items, and
/// a replace marker makes the other patch items the whole list. Returns the original
/// items left and the patch items still to merge.
fn apply_item_directives(
    original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
    path: &Path,
) -> Result<(Vec<Object>, Vec<Object>), PatchError> {
    let mut original = into_objects(original, path)?;
    let mut items = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in into_objects(patch, path)? {
        let Some(directive) = item.get(PATCH) else {
            items.push(item);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let id = require_key(item.get(key), key, path)?;
                original.retain(|o| !o.get(key).is_some_and(|v| json_eq(v, &id)));
            }
            Some("replace") => replace = true,
            _ => return Err(unknown_directive(directive, path)),
        }
    }
    if !replace {
        return Ok((original, items));
    }
    let replacement = items
        .into_iter()
        .map(|item| resolve_map(item, path))
        .collect::<Result<_, _>>()?;
    Ok((replacement, Vec::new()))
}

/// Orders merged list items as upstream does. `items` pairs each item with its
/// identity (merge key value, or the primitive itself). Items named in the patch
/// (`patch_order`) are sorted by it, the others by `server_order` (the original
/// list); then the two runs are interleaved, a server-only item going first only when
/// it preceded the next patch item in the original list. So a new item named alone in
/// a patch lands before the original items.
fn order<T>(
    items: impl IntoIterator<Item = (Value, T)>,
    patch_order: &[Value],
    server_order: &[Value],
) -> Vec<T> {
    let (mut from_patch, mut server_only): (Vec<_>, Vec<_>) = items
        .into_iter()
        .partition(|(id, _)| position(patch_order, id).is_some());
    from_patch.sort_by_key(|(id, _)| position(patch_order, id));
    server_only.sort_by_key(|(id, _)| position(server_order, id).unwrap_or(usize::MAX));

    let mut ordered = Vec::with_capacity(from_patch.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = from_patch.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some((l, _)), Some((r, _))) => matches!(
                (position(server_order, l), position(server_order, r)),
                (Some(l), Some(r)) if l < r
            ),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { left.next() } else { right.next() };
        ordered.extend(next.map(|(_, item)| item));
    }
    ordered
}

/// `$setElementOrder/<name>`: merges the field's patch list (if any) and orders the
/// result as `order` says, keeping items it does not name where they were.
fn set_element_order(
    original: &mut Object,
    name: &str,
    patch_list: Option<Value>,
    order_list: Value,
    field: Option<&FieldMeta>,
    path: &Path,
) -> Result<(), PatchError> {
    let invalid = |reason: &str| PatchError::InvalidDirective {
        path: path.to_string(),
        directive: SET_ELEMENT_ORDER,
        reason: reason.to_string(),
    };
    let Value::Array(order_list) = order_list else {
        return Err(invalid("it is not a list"));
    };
    let original_list = match original.get_mut(name).map(Value::take) {
        None => None,
        Some(Value::Array(list)) => Some(list),
        Some(_) => return Err(invalid("the field is not a list")),
    };
    let patch_list = match patch_list {
        None => None,
        Some(Value::Array(list)) => Some(list),
        Some(_) => return Err(invalid("the field's patch value is not a list")),
    };
    let field = field.filter(|field| field.shape == Shape::List);
    let key = field.and_then(|field| field.merge_key);
    if let Some(patch_list) = &patch_list {
        validate_order(patch_list, &order_list, key, path)?;
    }

    let identity = |item: &Value| -> Result<Value, PatchError> {
        match key {
            Some(key) => require_key(item.get(key), key, path),
            None if item.is_object() || item.is_array() => Err(PatchError::UnmergeableList {
                path: path.to_string(),
                reason: "it holds objects but has no merge key to order them by",
            }),
            None => Ok(item.clone()),
        }
    };
    let server_order: Vec<Value> = original_list
        .iter()
        .flatten()
        .filter_map(|item| identity(item).ok())
        .collect();
    let merged = match (original_list, patch_list) {
        (None, None) => return Ok(()),
        (Some(original_list), None) => original_list,
        (None, Some(patch_list)) => resolve_list(patch_list, path)?,
        (Some(original_list), Some(patch_list)) => {
            merge_or_replace_list(original_list, patch_list, field, path)?
        }
    };
    let order_ids = order_list
        .iter()
        .map(identity)
        .collect::<Result<Vec<_>, _>>()?;
    let items = merged
        .into_iter()
        .map(|item| Ok((identity(&item)?, item)))
        .collect::<Result<Vec<_>, PatchError>>()?;
    original.insert(
        name.to_string(),
        Value::Array(order(items, &order_ids, &server_order)),
    );
    Ok(())
}

/// Checks that the patch list names its items in the order `$setElementOrder` gives.
fn validate_order(
    patch_list: &[Value],
    order_list: &[Value],
    key: Option<&str>,
    path: &Path,
) -> Result<(), PatchError> {
    let same = |item: &Value, ordered: &Value| -> Result<bool, PatchError> {
        Ok(match key {
            Some(key) => json_eq(
                &require_key(item.get(key), key, path)?,
                &require_key(ordered.get(key), key, path)?,
            ),
            None => json_eq(item, ordered),
        })
    };
    let mut items = patch_list
        .iter()
        .filter(|item| !has_directive(item))
        .peekable();
    for ordered in order_list {
        match items.peek() {
            Some(item) if same(item, ordered)? => {
                items.next();
            }
            Some(_) => {}
            None => return Ok(()),
        }
    }
    match items.next() {
        None => Ok(()),
        Some(_) => Err(PatchError::InvalidDirective {
            path: path.to_string(),
            directive: SET_ELEMENT_ORDER,
            reason: "the patch list has items it does not name, or names them in another order"
                .to_string(),
        }),
    }
}

/// `$deleteFromPrimitiveList/<name>`: removes every occurrence of the given values.
fn delete_from_primitive_list(
    original: &mut Object,
    name: &str,
    values: Value,
    path: &Path,
) -> Result<(), PatchError> {
    let Value::Array(values) = values else {
        return Err(PatchError::InvalidDirective {
            path: path.to_string(),
            directive: DELETE_FROM_PRIMITIVE_LIST,
            reason: "it is not a list".to_string(),
        });
    };
    // Like upstream, there is nothing to do when the field is missing or not a list.
    let Some(Value::Array(list)) = original.get_mut(name) else {
        return Ok(());
    };
    if holds_objects(list, &values, path)? {
        return Err(PatchError::InvalidDirective {
            path: path.to_string(),
            directive: DELETE_FROM_PRIMITIVE_LIST,
            reason: "the list holds objects (delete them with \"$patch\": \"delete\")".to_string(),
        });
    }
    list.retain(|item| position(&values, item).is_none());
    Ok(())
}

/// `$retainKeys`: drops the original keys not in the list, which must name every key
/// the patch sets.
fn retain_keys(
    original: &mut Object,
    patch: &Object,
    keys: &Value,
    path: &Path,
) -> Result<(), PatchError> {
    let invalid = |reason: String| PatchError::InvalidDirective {
        path: path.to_string(),
        directive: RETAIN_KEYS,
        reason,
    };
    let Value::Array(keys) = keys else {
        return Err(invalid("it is not a list of field names".to_string()));
    };
    let retained = |name: &str| keys.iter().any(|key| key.as_str() == Some(name));
    for (name, value) in patch {
        let is_directive =
            name.starts_with(SET_ELEMENT_ORDER) || name.starts_with(DELETE_FROM_PRIMITIVE_LIST);
        if !value.is_null() && !is_directive && !retained(name) {
            return Err(invalid(format!(
                "the patch sets {name:?}, which it does not retain"
            )));
        }
    }
    original.retain(|name, _| retained(name));
    Ok(())
}

/// Resolves a patch value that has nothing to merge with: `$patch: delete` yields
/// `None`, other directives and nulls are dropped.
fn resolve_value(value: Value, path: &Path) -> Result<Option<Value>, PatchError> {
    match value {
        Value::Object(mut object) => match object.shift_remove(PATCH) {
            None => Ok(Some(Value::Object(resolve_map(object, path)?))),
            Some(directive) => match directive.as_str() {
                Some("replace") => Ok(Some(Value::Object(resolve_map(object, path)?))),
                Some("delete") => Ok(None),
                _ => Err(unknown_directive(&directive, path)),
            },
        },
        Value::Array(list) => Ok(Some(Value::Array(resolve_list(list, path)?))),
        scalar => Ok(Some(scalar)),
    }
}

fn resolve_map(object: Object, path: &Path) -> Result<Object, PatchError> {
    let mut resolved = Object::new();
    for (key, value) in object {
        let is_directive = key == RETAIN_KEYS
            || key.starts_with(SET_ELEMENT_ORDER)
            || key.starts_with(DELETE_FROM_PRIMITIVE_LIST);
        if is_directive || value.is_null() {
            continue;
        }
        if let Some(value) = resolve_value(value, &Path::Field(path, &key))? {
            resolved.insert(key, value);
        }
    }
    Ok(resolved)
}

/// Items carrying `$patch` are directives about the list, not items: with nothing to
/// merge with, they have nothing left to do.
fn resolve_list(list: Vec<Value>, path: &Path) -> Result<Vec<Value>, PatchError> {
    let mut resolved = Vec::with_capacity(list.len());
    for item in list {
        match item.get(PATCH) {
            None => resolved.extend(resolve_value(item, path)?),
            Some(directive) if matches!(directive.as_str(), Some("replace" | "delete")) => {}
            Some(directive) => return Err(unknown_directive(directive, path)),
        }
    }
    Ok(resolved)
}

/// Whether the items of two lists to merge are objects (rather than primitives); they
/// must all be of one JSON type.
fn holds_objects(original: &[Value], patch: &[Value], path: &Path) -> Result<bool, PatchError> {
    let unmergeable = |reason| PatchError::UnmergeableList {
        path: path.to_string(),
        reason,
    };
    let kind = |value: &Value| std::mem::discriminant(value);
    let mut items = original.iter().chain(patch);
    let Some(first) = items.next() else {
        return Ok(false);
    };
    if first.is_array() {
        return Err(unmergeable("lists of lists are not supported"));
    }
    if items.any(|item| kind(item) != kind(first)) {
        return Err(unmergeable("its items are not all of the same JSON type"));
    }
    Ok(first.is_object())
}

fn into_objects(list: Vec<Value>, path: &Path) -> Result<Vec<Object>, PatchError> {
    list.into_iter()
        .map(|item| match item {
            Value::Object(object) => Ok(object),
            _ => Err(PatchError::UnmergeableList {
                path: path.to_string(),
                reason: "its items are not all objects",
            }),
        })
        .collect()
}

/// The merge key value `item.get(key)` found, or the error for a missing one.
fn require_key(found: Option<&Value>, key: &str, path: &Path) -> Result<Value, PatchError> {
    found.cloned().ok_or_else(|| PatchError::MissingMergeKey {
        path: path.to_string(),
        key: key.to_string(),
    })
}

fn has_directive(item: &Value) -> bool {
    item.get(PATCH).is_some()
}

/// The field name in `<prefix>/<field>`.
fn directive_target<'k>(
    key: &'k str,
    prefix: &'static str,
    path: &Path,
) -> Result<&'k str, PatchError> {
    key.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| PatchError::InvalidDirective {
            path: path.to_string(),
            directive: prefix,
            reason: format!("{key:?} is not of the form {prefix}/<field>"),
        })
}

fn unknown_directive(directive: &Value, path: &Path) -> PatchError {
    PatchError::UnknownDirective {
        path: path.to_string(),
        directive: directive.to_string(),
    }
}

/// JSON equality where numbers compare by value (`80` equals `80.0`, as they do once
/// upstream has decoded them).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn position(list: &[Value], value: &Value) -> Option<usize> {
    list.iter().position(|item| json_eq(item, value))
}
