//! Objects as upstream writes them. Go's encoding/json writes a struct's fields in the
//! order the struct declares them — `kind` and `apiVersion` first (the inline
//! `TypeMeta`), then `metadata`, `spec`, `status`, and so on down every nested struct —
//! and writes every field without `omitempty` even at its zero value (`"status":{}`,
//! `"creationTimestamp":null`); clients that compare bodies as text, hash them or read
//! them positionally see both. The descriptor table knows each field's position in its
//! Go struct ([`Field::order`]) and its presence rule; [`go_order`] rearranges an
//! object's keys by the one and adds the zero values by the other. Keys the table does
//! not know (custom resources, fields newer than the table) keep their order, after the
//! known ones.

use serde_json::{Map, Value};

use super::descriptor::{Field, Kind, Message, Obj, Shape, message_for_kind};
use super::message::absent;

/// Rearranges a built-in kind's object (by its `apiVersion` and `kind`) into Go's field
/// order, with the zero values Go writes; objects of other kinds are left as they are.
pub fn go_order(object: &mut Value) {
    let message = match (object["apiVersion"].as_str(), object["kind"].as_str()) {
        (Some(api_version), Some(kind)) => message_for_kind(api_version, kind),
        _ => None,
    };
    let (Some(message), Value::Object(map)) = (message, object) else {
        return;
    };
    let mut rest = std::mem::take(map);
    // TypeMeta, inline and first in every Go object, kind before apiVersion.
    for key in ["kind", "apiVersion"] {
        if let Some(value) = rest.shift_remove(key) {
            map.insert(key.to_string(), value);
        }
    }
    map.extend(ordered(message, rest));
}

/// Where keys the table does not know go: after every known one, in their own order.
const UNKNOWN: u32 = 1 << 24;

/// `map`'s entries in `message`'s Go order, each value ordered in turn.
fn ordered(message: &'static Message, map: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<(u32, String, Value)> = Vec::with_capacity(map.len());
    for (index, (key, mut value)) in map.into_iter().enumerate() {
        let rank = match locate(message, &key) {
            Some((rank, field)) => {
                nested(field, &mut value);
                rank
            }
            None => UNKNOWN + index as u32,
        };
        entries.push((rank, key, value));
    }
    zeros(message, None, &mut entries);
    entries.sort_unstable_by_key(|e| e.0);
    entries.into_iter().map(|(_, k, v)| (k, v)).collect()
}

/// Adds the fields of `message` (of an inline struct ranked `inline`) that `entries`
/// lacks and Go writes anyway, at their zero values, ranked as [`locate`] ranks them.
fn zeros(message: &'static Message, inline: Option<u32>, entries: &mut Vec<(u32, String, Value)>) {
    for field in message.fields {
        let rank = match inline {
            None => u32::from(field.order) << 8,
            Some(outer) => outer | u32::from(field.order),
        };
        if field.name.is_empty() {
            if let Kind::Obj(Obj::Msg(struct_fields)) = field.kind {
                zeros(struct_fields, Some(rank), entries);
            }
        } else if !entries.iter().any(|(_, key, _)| key == field.name)
            && let Some(zero) = absent(field)
        {
            entries.push((rank, field.name.to_string(), zero));
        }
    }
}

/// The field of `message` named `key` and its rank: its Go position, shifted so that
/// the fields of an inline struct fall between the field before it and the one after.
fn locate(message: &'static Message, key: &str) -> Option<(u32, &'static Field)> {
    for field in message.fields {
        let rank = u32::from(field.order) << 8;
        if field.name == key {
            return Some((rank, field));
        }
        if field.name.is_empty()
            && let Kind::Obj(Obj::Msg(inline)) = field.kind
            && let Some((inner, found)) = locate(inline, key)
        {
            return Some((rank | (inner >> 8), found));
        }
    }
    None
}

/// Orders what a field holds: a map's keys sorted (encoding/json sorts Go maps), and the
/// structs inside — one, each of a list, each of a map's values.
fn nested(field: &Field, value: &mut Value) {
    if let (Shape::Map, Value::Object(map)) = (field.shape, &mut *value) {
        map.sort_keys();
    }
    let Kind::Obj(Obj::Msg(message)) = field.kind else {
        return;
    };
    match (field.shape, value) {
        (Shape::One, value) => object(message, value),
        (Shape::List, Value::Array(items)) => items.iter_mut().for_each(|i| object(message, i)),
        (Shape::Map, Value::Object(map)) => map.values_mut().for_each(|v| object(message, v)),
        _ => {}
    }
}

fn object(message: &'static Message, value: &mut Value) {
    if let Value::Object(map) = value {
        *map = ordered(message, std::mem::take(map));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_comes_out_as_go_writes_it() {
        // Keys as k8s-openapi's serde writes them: alphabetical.
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"labels": {"b": "2", "a": "1"}, "name": "web", "namespace": "default",
                "resourceVersion": "7", "uid": "u"},
            "spec": {"containers": [{"image": "busybox", "name": "c",
                "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
                "resources": {"limits": {"memory": "1Gi", "cpu": "1"}}}],
                "volumes": [{"configMap": {"name": "cfg"}, "name": "cfg"}]},
            "status": {"phase": "Running"},
            "x-unknown": true});
        go_order(&mut pod);
        assert_eq!(
            pod.to_string(),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web","namespace":"default","uid":"u","resourceVersion":"7","creationTimestamp":null,"labels":{"a":"1","b":"2"}},"spec":{"volumes":[{"name":"cfg","configMap":{"name":"cfg"}}],"containers":[{"name":"c","image":"busybox","ports":[{"name":"http","containerPort":80,"protocol":"TCP"}],"resources":{"limits":{"cpu":"1","memory":"1Gi"}}}]},"status":{"phase":"Running"},"x-unknown":true}"#
        );
    }

    #[test]
    fn custom_resources_keep_their_order() {
        let mut widget = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "spec": {"b": 1, "a": 2}, "metadata": {"name": "w"}});
        let before = widget.to_string();
        go_order(&mut widget);
        assert_eq!(widget.to_string(), before);
    }
}
