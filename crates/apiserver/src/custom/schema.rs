//! A definition's structural schema applied to objects, in upstream's order: prune
//! unknown fields (decode), apply defaults, validate. Field paths and messages follow
//! upstream's (`spec.replicas in body must be of type integer: "x"`), which clients and
//! people match on.

use std::collections::HashSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrBool,
};
use krust_api::status::Cause;
use serde_json::{Map, Value};

use crate::schema::{additional, child, items};

/// Fields every object keeps whatever its schema says.
const OBJECT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

fn preserves_unknown(s: &JSONSchemaProps) -> bool {
    s.x_kubernetes_preserve_unknown_fields == Some(true)
        || matches!(
            s.additional_properties,
            Some(JSONSchemaPropsOrBool::Bool(true))
        )
}

/// Drops the fields the schema does not know, collecting their paths (for
/// `fieldValidation`). `root` is the whole object, whose apiVersion/kind/metadata stay.
pub fn prune(s: &JSONSchemaProps, v: &mut Value, path: &str, unknown: &mut Vec<String>) {
    let root = path.is_empty();
    match v {
        Value::Object(map) => {
            if let Some(props) = &s.properties {
                let keep_object_fields = root || s.x_kubernetes_embedded_resource == Some(true);
                if !preserves_unknown(s) && additional(s).is_none() {
                    map.retain(|k, _| {
                        let known = props.contains_key(k)
                            || (keep_object_fields && OBJECT_FIELDS.contains(&k.as_str()));
                        if !known {
                            unknown.push(child(path, k));
                        }
                        known
                    });
                }
                for (k, value) in map.iter_mut() {
                    if let Some(p) = props.get(k)
                        && !(root && k == "metadata")
                    {
                        prune(p, value, &child(path, k), unknown);
                    }
                }
            } else if let Some(values) = additional(s) {
                for (k, value) in map.iter_mut() {
                    prune(values, value, &child(path, k), unknown);
                }
            } else if !preserves_unknown(s) && s.x_kubernetes_embedded_resource != Some(true) {
                // An object without properties keeps nothing, as upstream.
                let keep_object_fields = root;
                map.retain(|k, _| {
                    let keep = keep_object_fields && OBJECT_FIELDS.contains(&k.as_str());
                    if !keep {
                        unknown.push(child(path, k));
                    }
                    keep
                });
            }
        }
        Value::Array(list) => {
            if let Some(item) = items(s) {
                for (i, value) in list.iter_mut().enumerate() {
                    prune(item, value, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// Applies the schema's `default`s, top-down: a missing field (or a null one that may
/// not be null) takes its default, then defaults inside it apply.
pub fn default(s: &JSONSchemaProps, v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(props) = &s.properties {
                for (k, p) in props {
                    if map.get(k).is_some_and(Value::is_null) && p.nullable != Some(true) {
                        map.remove(k);
                    }
                    if !map.contains_key(k)
                        && let Some(d) = &p.default
                    {
                        map.insert(k.clone(), d.0.clone());
                    }
                }
                for (k, value) in map.iter_mut() {
                    if let Some(p) = props.get(k) {
                        default(p, value);
                    }
                }
            } else if let Some(values) = additional(s) {
                for value in map.values_mut() {
                    default(values, value);
                }
            }
        }
        Value::Array(list) => {
            if let Some(item) = items(s) {
                list.iter_mut().for_each(|value| default(item, value));
            }
        }
        _ => {}
    }
}

/// Checks `v` against the schema, adding one cause per problem.
pub fn validate(s: &JSONSchemaProps, v: &Value, path: &str, errs: &mut Vec<Cause>) {
    if v.is_null() {
        if s.nullable != Some(true) && s.type_.is_some() {
            errs.push(type_error(s, v, path));
        }
        return;
    }
    if !type_matches(s, v) {
        errs.push(type_error(s, v, path));
        return;
    }
    if let Some(allowed) = &s.enum_
        && !allowed.iter().any(|a| a.0 == *v)
    {
        let names: Vec<String> = allowed
            .iter()
            .map(|a| match &a.0 {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        errs.push(Cause::not_supported(path, v, &names));
    }
    match v {
        Value::String(text) => validate_string(s, text, v, path, errs),
        Value::Number(n) => validate_number(s, n.as_f64().unwrap_or(0.0), v, path, errs),
        Value::Array(list) => validate_list(s, list, v, path, errs),
        Value::Object(map) => validate_object(s, map, v, path, errs),
        _ => {}
    }
}

fn type_matches(s: &JSONSchemaProps, v: &Value) -> bool {
    if s.x_kubernetes_int_or_string == Some(true) {
        return v.is_string() || v.as_f64().is_some_and(|f| f.fract() == 0.0);
    }
    match s.type_.as_deref() {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        _ => true,
    }
}

/// Go's rendering of a JSON value's kind, as go-openapi prints it after a type error.
fn type_error(s: &JSONSchemaProps, v: &Value, path: &str) -> Cause {
    let want = if s.x_kubernetes_int_or_string == Some(true) {
        "integer,string"
    } else {
        s.type_.as_deref().unwrap_or("object")
    };
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    Cause {
        reason: "FieldValueTypeInvalid",
        message: format!(
            "Invalid value: \"{got}\": {} in body must be of type {want}: \"{got}\"",
            body_path(path)
        ),
        field: path.to_string(),
    }
}

/// How go-openapi names a field in its messages (the root is `body`).
fn body_path(path: &str) -> &str {
    if path.is_empty() { "body" } else { path }
}

fn invalid(path: &str, v: &Value, detail: String) -> Cause {
    Cause::invalid(path, v, format!("{} in body {detail}", body_path(path)))
}

/// Upstream's TooMany, for items and properties alike.
fn too_many(path: &str, count: i64, max: i64) -> Cause {
    Cause {
        reason: "FieldValueTooMany",
        message: format!("Too many: {count}: must have at most {max} items"),
        field: path.to_string(),
    }
}

fn validate_string(s: &JSONSchemaProps, text: &str, v: &Value, path: &str, errs: &mut Vec<Cause>) {
    let len = text.chars().count() as i64;
    if let Some(max) = s.max_length.filter(|m| len > *m) {
        errs.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {max} bytes"),
            field: path.to_string(),
        });
    }
    if let Some(min) = s.min_length.filter(|m| len < *m) {
        errs.push(invalid(
            path,
            v,
            format!("should be at least {min} chars long"),
        ));
    }
    if let Some(pattern) = &s.pattern {
        match regex::Regex::new(pattern) {
            Ok(re) if !re.is_match(text) => {
                errs.push(invalid(path, v, format!("should match '{pattern}'")));
            }
            Ok(_) => {}
            Err(_) => errs.push(invalid(
                path,
                v,
                format!("has an invalid pattern '{pattern}'"),
            )),
        }
    }
    if let Some(format) = s.format.as_deref()
        && !format_matches(format, text)
    {
        errs.push(invalid(
            path,
            v,
            format!("must be of type {format}: \"{text}\""),
        ));
    }
}

/// The string formats upstream checks; others are accepted as they are.
fn format_matches(format: &str, text: &str) -> bool {
    use base64::Engine;
    match format {
        "date-time" | "datetime" => text.parse::<jiff::Timestamp>().is_ok(),
        "date" => text.parse::<jiff::civil::Date>().is_ok(),
        "uuid" => uuid::Uuid::parse_str(text).is_ok(),
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
        "byte" => base64::engine::general_purpose::STANDARD
            .decode(text)
            .is_ok(),
        _ => true,
    }
}

fn validate_number(s: &JSONSchemaProps, n: f64, v: &Value, path: &str, errs: &mut Vec<Cause>) {
    let show = |f: f64| {
        if f.fract() == 0.0 {
            format!("{}", f as i64)
        } else {
            f.to_string()
        }
    };
    if let Some(max) = s.maximum {
        if s.exclusive_maximum == Some(true) && n >= max {
            errs.push(invalid(
                path,
                v,
                format!("should be less than {}", show(max)),
            ));
        } else if n > max {
            errs.push(invalid(
                path,
                v,
                format!("should be less than or equal to {}", show(max)),
            ));
        }
    }
    if let Some(min) = s.minimum {
        if s.exclusive_minimum == Some(true) && n <= min {
            errs.push(invalid(
                path,
                v,
                format!("should be greater than {}", show(min)),
            ));
        } else if n < min {
            errs.push(invalid(
                path,
                v,
                format!("should be greater than or equal to {}", show(min)),
            ));
        }
    }
    if let Some(m) = s.multiple_of.filter(|m| *m != 0.0)
        && (n / m).fract() != 0.0
    {
        errs.push(invalid(
            path,
            v,
            format!("should be a multiple of {}", show(m)),
        ));
    }
    if let Some(format) = s.format.as_deref() {
        let fits = match format {
            "int32" => n.fract() == 0.0 && n >= f64::from(i32::MIN) && n <= f64::from(i32::MAX),
            "int64" => n.fract() == 0.0,
            _ => true,
        };
        if !fits {
            errs.push(invalid(
                path,
                v,
                format!("must be of type {format}: \"{v}\""),
            ));
        }
    }
}

fn validate_list(
    s: &JSONSchemaProps,
    list: &[Value],
    v: &Value,
    path: &str,
    errs: &mut Vec<Cause>,
) {
    let len = list.len() as i64;
    if let Some(max) = s.max_items.filter(|m| len > *m) {
        errs.push(too_many(path, len, max));
    }
    if let Some(min) = s.min_items.filter(|m| len < *m) {
        errs.push(invalid(
            path,
            v,
            format!("should have at least {min} items"),
        ));
    }
    if let Some(item) = items(s) {
        for (i, value) in list.iter().enumerate() {
            validate(item, value, &format!("{path}[{i}]"), errs);
        }
    }
    // Duplicates are found with a set of each item's (or key's) JSON text, in one pass:
    // a list of 200,000 items must not cost 2x10^10 comparisons. Upstream skips the
    // check when the list is too long anyway.
    if s.max_items.is_some_and(|m| len > m) {
        return;
    }
    let unique = s.unique_items == Some(true) || s.x_kubernetes_list_type.as_deref() == Some("set");
    if unique {
        let mut seen = HashSet::new();
        for (i, value) in list.iter().enumerate() {
            if !seen.insert(value.to_string()) {
                errs.push(Cause::duplicate(format!("{path}[{i}]"), value));
            }
        }
    }
    if s.x_kubernetes_list_type.as_deref() == Some("map") {
        let keys = s.x_kubernetes_list_map_keys.clone().unwrap_or_default();
        let mut seen = HashSet::new();
        for (i, value) in list.iter().enumerate() {
            let key: Map<String, Value> = keys
                .iter()
                .filter_map(|k| Some((k.clone(), value.get(k)?.clone())))
                .collect();
            let key = Value::Object(key);
            if !seen.insert(key.to_string()) {
                // Upstream prints the key as Go prints a map.
                let shown = format!("map[string]interface {{}}{key}");
                errs.push(Cause {
                    message: format!("Duplicate value: {shown}"),
                    ..Cause::duplicate(format!("{path}[{i}]"), &Value::Null)
                });
            }
        }
    }
}

fn validate_object(
    s: &JSONSchemaProps,
    map: &Map<String, Value>,
    v: &Value,
    path: &str,
    errs: &mut Vec<Cause>,
) {
    let root = path.is_empty();
    for required in s.required.iter().flatten() {
        if !map.contains_key(required) {
            errs.push(Cause::required(child(path, required)));
        }
    }
    let count = map.len() as i64;
    if let Some(max) = s.max_properties.filter(|m| count > *m) {
        errs.push(too_many(path, count, max));
    }
    if let Some(min) = s.min_properties.filter(|m| count < *m) {
        errs.push(invalid(
            path,
            v,
            format!("should have at least {min} properties"),
        ));
    }
    for (k, value) in map {
        // Object metadata is checked as every object's is, not by the schema.
        if (root || s.x_kubernetes_embedded_resource == Some(true)) && k == "metadata" {
            continue;
        }
        let p = s
            .properties
            .as_ref()
            .and_then(|props| props.get(k))
            .or_else(|| additional(s));
        if let Some(p) = p {
            validate(p, value, &child(path, k), errs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> JSONSchemaProps {
        serde_json::from_value(v).unwrap()
    }

    fn messages(s: &JSONSchemaProps, v: Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate(s, &v, "", &mut errs);
        let mut out: Vec<String> = errs.iter().map(Cause::summary).collect();
        out.sort();
        out
    }

    fn widget() -> JSONSchemaProps {
        schema(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
                        "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                        "port": {"x-kubernetes-int-or-string": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                        "ports": {
                            "type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "when": {"type": "string", "format": "date-time"},
                        "note": {"type": "string", "nullable": true}
                    }
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
            }
        }))
    }

    #[test]
    fn pruning_keeps_declared_and_preserved_fields_only() {
        let s = widget();
        let mut obj = json!({
            "apiVersion": "x.io/v1", "kind": "Widget", "metadata": {"name": "a"},
            "spec": {"size": 2, "bogus": 1, "labels": {"a": "b"}, "free": {"any": {"thing": 1}},
                     "ports": [{"name": "http", "port": 80, "extra": true}]},
            "top": 1
        });
        let mut unknown = Vec::new();
        prune(&s, &mut obj, "", &mut unknown);
        assert_eq!(unknown, ["top", "spec.bogus", "spec.ports[0].extra"]);
        assert_eq!(obj["spec"]["free"]["any"]["thing"], 1);
        assert_eq!(obj["spec"]["labels"]["a"], "b");
        assert_eq!(obj["metadata"]["name"], "a");
        assert!(obj.get("top").is_none());
    }

    #[test]
    fn long_sets_are_checked_in_one_pass() {
        let s = schema(
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}}),
        );
        let mut list: Vec<Value> = (0..50_000).map(|i| json!(i)).collect();
        let mut errs = Vec::new();
        validate(&s, &Value::Array(list.clone()), "tags", &mut errs);
        assert!(errs.is_empty());
        list.push(json!(7));
        validate(&s, &Value::Array(list), "tags", &mut errs);
        assert_eq!(
            errs.iter().map(Cause::summary).collect::<Vec<_>>(),
            ["tags[50000]: Duplicate value: 7"]
        );
    }

    #[test]
    fn defaults_fill_missing_and_non_nullable_null_fields() {
        let s = widget();
        let mut obj = json!({"spec": {"color": null, "note": null}});
        default(&s, &mut obj);
        assert_eq!(obj["spec"]["size"], 3);
        assert_eq!(obj["spec"]["color"], "red");
        assert!(obj["spec"]["note"].is_null() && obj["spec"].get("note").is_some());
    }

    #[test]
    fn validation_speaks_upstream() {
        let s = widget();
        assert_eq!(
            messages(&s, json!({"spec": {"size": "big"}})),
            [
                r#"spec.size: Invalid value: "string": spec.size in body must be of type integer: "string""#
            ]
        );
        assert_eq!(
            messages(&s, json!({"spec": {}})),
            ["spec.size: Required value"]
        );
        assert_eq!(
            messages(
                &s,
                json!({"spec": {"size": 11, "color": "green", "name": "ABC"}})
            ),
            [
                "spec.color: Unsupported value: \"green\": supported values: \"red\", \"blue\"",
                "spec.name: Invalid value: \"ABC\": spec.name in body should match '^[a-z]+$'",
                "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
            ]
        );
        assert_eq!(
            messages(
                &s,
                json!({"spec": {"size": 1, "tags": ["a", "a"], "ports": [{"name": "x"}, {"name": "x"}]}})
            ),
            [
                "spec.ports[1]: Duplicate value: map[string]interface {}{\"name\":\"x\"}",
                "spec.tags[1]: Duplicate value: \"a\"",
            ]
        );
        assert!(
            messages(
                &s,
                json!({"spec": {"size": 1, "port": "http", "note": null}})
            )
            .is_empty()
        );
        assert_eq!(
            messages(&s, json!({"spec": {"size": 1, "port": 1.5}})).len(),
            1
        );
        assert_eq!(
            messages(
                &s,
                json!({"spec": {"size": 1, "when": "yesterday", "name": "abcdef"}})
            ),
            [
                "spec.name: Too long: may not be more than 5 bytes",
                "spec.when: Invalid value: \"yesterday\": spec.when in body must be of type date-time: \"yesterday\"",
            ]
        );
    }
}
