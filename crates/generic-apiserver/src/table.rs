//! Server-side `Table` output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`):
//! the column definitions of each kind and the helpers their cells are built from, so
//! that `kubectl get` prints what it prints against Kubernetes.

use serde_json::{Value, json};

/// One table column after NAME. `cell` computes the column's value for an object.
pub struct Column {
    pub name: &'static str,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub ty: &'static str,
    /// 0: always shown; 1: only with `-o wide`.
    pub priority: i32,
    pub description: &'static str,
    pub cell: &'static (dyn Fn(&Value) -> Value + Send + Sync),
}

/// The columns of kinds without a printer upstream: NAME, CREATED AT.
pub static CREATED_AT: &[Column] = &[Column {
    name: "Created At",
    ty: "date",
    priority: 0,
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    cell: &|o| o["metadata"]["creationTimestamp"].clone(),
}];

/// The columns of custom resources whose definition names none: AGE.
pub static AGE_ONLY: &[Column] = &[AGE];

/// The AGE column that ends most printers.
pub const AGE: Column = Column {
    name: "Age",
    ty: "string",
    priority: 0,
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    cell: &|o| json!(age(&o["metadata"]["creationTimestamp"])),
};

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition.";

/// The `columnDefinitions` of a table for these columns (NAME first).
pub fn definitions(columns: &[Column]) -> Value {
    let mut defs = vec![json!({
        "name": "Name", "type": "string", "format": "name",
        "description": NAME_DESCRIPTION, "priority": 0
    })];
    defs.extend(columns.iter().map(|c| {
        json!({"name": c.name, "type": c.ty, "format": "", "description": c.description, "priority": c.priority})
    }));
    Value::Array(defs)
}

/// One table row: the cells (the NAME cell is `name`), and the object as
/// PartialObjectMetadata (what kubectl asks for with `includeObject=Metadata`, its
/// default) or in full (`includeObject=Object`).
pub fn row(columns: &[Column], name: Value, obj: &Value, include: IncludeObject) -> Value {
    let mut cells = vec![name];
    cells.extend(columns.iter().map(|c| (c.cell)(obj)));
    let object = match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }),
        IncludeObject::Object => obj.clone(),
    };
    let mut row = json!({"cells": cells});
    if !object.is_null() {
        row["object"] = object;
    }
    row
}

/// The `includeObject` query parameter of table requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// Human-readable time since an RFC 3339 timestamp, as kubectl's AGE (`5m`, `3h2m`, `4d`).
pub fn age(ts: &Value) -> String {
    let Some(ts) = ts.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = jiff::Timestamp::now().as_second() - ts.as_second();
    human_duration(secs)
}

/// upstream's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    let y = d / 365;
    match () {
        _ if secs < 120 => format!("{secs}s"),
        _ if m < 10 => match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        },
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        },
        _ if h < 48 => format!("{h}h"),
        _ if h < 192 => match h % 24 {
            0 => format!("{d}d"),
            hh => format!("{d}d{hh}h"),
        },
        _ if y < 2 => format!("{d}d"),
        _ if y < 8 => match d % 365 {
            0 => format!("{y}y"),
            dd => format!("{y}y{dd}d"),
        },
        _ => format!("{y}y"),
    }
}

/// A string at a JSON pointer, or `<none>` as kubectl prints missing values.
pub fn str_or_none(obj: &Value, pointer: &str) -> Value {
    match obj.pointer(pointer) {
        Some(Value::String(s)) if !s.is_empty() => json!(s),
        _ => json!("<none>"),
    }
}

/// An integer at a JSON pointer, 0 when absent.
pub fn int_at(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// Comma-joined container names and images of a pod template spec at `pointer`.
pub fn containers(obj: &Value, pointer: &str) -> Value {
    join_containers(obj, pointer, "name")
}

pub fn images(obj: &Value, pointer: &str) -> Value {
    join_containers(obj, pointer, "image")
}

fn join_containers(obj: &Value, pointer: &str, field: &str) -> Value {
    let names: Vec<&str> = obj
        .pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c[field].as_str())
        .collect();
    json!(names.join(","))
}

/// A label selector (metav1.LabelSelector) printed as kubectl does: `app=web,tier in (a)`;
/// a ReplicationController's selector, a plain label map, as `app=web`.
pub fn selector(sel: &Value) -> Value {
    let structured = sel.get("matchLabels").is_some() || sel.get("matchExpressions").is_some();
    if !structured && sel.as_object().is_some_and(|m| !m.is_empty()) {
        return map(sel);
    }
    let mut parts = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        parts.extend(
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())),
        );
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            op => format!("{key} {op}"),
        });
    }
    if parts.is_empty() {
        json!("<none>")
    } else {
        json!(parts.join(","))
    }
}

/// A string map printed as `k=v,k2=v2` (sorted), `<none>` when empty.
pub fn map(m: &Value) -> Value {
    match m.as_object() {
        Some(m) if !m.is_empty() => {
            let mut parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            parts.sort();
            json!(parts.join(","))
        }
        _ => json!("<none>"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(10 * 3600), "10h");
        assert_eq!(human_duration(50 * 3600), "2d2h");
        assert_eq!(human_duration(30 * 86400), "30d");
        assert_eq!(human_duration(3 * 365 * 86400), "3y");
    }

    #[test]
    fn selectors_print_like_kubectl() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "t", "operator": "In", "values": ["a", "b"]}]});
        assert_eq!(selector(&sel), json!("app=web,t in (a,b)"));
        assert_eq!(selector(&json!({})), json!("<none>"));
        assert_eq!(
            selector(&json!({"app": "web", "a": "b"})),
            json!("a=b,app=web")
        );
    }
}
