//! kubectl's client-side apply record, the `kubectl.kubernetes.io/last-applied-configuration`
//! annotation, as server-side apply honours it for a manager named `kubectl`: fields
//! the annotation describes may be taken over without conflicts (so that
//! `kubectl apply --server-side` can follow client-side applies), and the annotation
//! follows server-side applies (so that a client-side apply can follow them).

use serde_json::Value;

use super::schema::TypeRef;
use super::set::Set;
use super::typed::{Duplicates, compare, to_field_set};
use super::value::go_json;

/// The field manager `kubectl apply --server-side` uses by default.
pub(super) const KUBECTL: &str = "kubectl";
const ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The fields of `live`'s last-applied annotation that still hold the value it
/// records; `None` when there is no usable annotation of this `api_version`.
pub(super) fn allowed_conflicts(ty: TypeRef, live: &Value, api_version: &str) -> Option<Set> {
    let annotation = live
        .get("metadata")?
        .get("annotations")?
        .get(ANNOTATION)?
        .as_str()?;
    let last: Value = serde_json::from_str(annotation).ok()?;
    if last.get("apiVersion").and_then(Value::as_str) != Some(api_version) {
        return None;
    }
    let set = to_field_set(ty, &last, Duplicates::Allow).ok()?;
    let changed = compare(ty, &last, live).ok()?;
    Some(
        set.difference(&changed.modified)
            .difference(&changed.added)
            .difference(&changed.removed),
    )
}

/// Sets `object`'s last-applied annotation, if it has one, to `config` (without that
/// annotation), encoded as kubectl's Go encoder does.
pub(super) fn update_annotation(object: &mut Value, config: &Value) {
    let Some(Value::Object(annotations)) = object.pointer_mut("/metadata/annotations") else {
        return;
    };
    let has_annotation = annotations
        .get(ANNOTATION)
        .and_then(Value::as_str)
        .is_some_and(|value| !value.is_empty());
    if !has_annotation {
        return;
    }
    let mut config = config.clone();
    if let Some(Value::Object(annotations)) = config.pointer_mut("/metadata/annotations") {
        annotations.remove(ANNOTATION);
    }
    annotations.insert(ANNOTATION.into(), Value::String(go_json(&config) + "\n"));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn allows_the_fields_the_annotation_still_describes() {
        let ty = TypeRef::root("", "v1", "ConfigMap");
        let last = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1", "b": "2"}});
        let live = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": last.to_string()}},
            "data": {"a": "1", "b": "changed"},
        });
        let allowed = allowed_conflicts(ty, &live, "v1").unwrap();
        let field = |names: &[&str]| -> Vec<_> {
            names
                .iter()
                .map(|n| super::super::path::PathElement::Field((*n).into()))
                .collect()
        };
        assert!(allowed.has(&field(&["data", "a"])));
        assert!(!allowed.has(&field(&["data", "b"])));
        assert!(allowed_conflicts(ty, &live, "v2").is_none());
        assert!(allowed_conflicts(ty, &json!({}), "v1").is_none());
    }

    #[test]
    fn keeps_the_annotation_in_step() {
        let mut object = json!({"metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "x": "y"}}});
        let config = json!({"kind": "ConfigMap", "apiVersion": "v1", "data": {"a": "<"}});
        update_annotation(&mut object, &config);
        assert_eq!(
            object["metadata"]["annotations"][ANNOTATION],
            "{\"apiVersion\":\"v1\",\"data\":{\"a\":\"\\u003c\"},\"kind\":\"ConfigMap\"}\n"
        );
        let mut without = json!({"metadata": {"annotations": {"x": "y"}}});
        update_annotation(&mut without, &config);
        assert_eq!(without, json!({"metadata": {"annotations": {"x": "y"}}}));
    }
}
