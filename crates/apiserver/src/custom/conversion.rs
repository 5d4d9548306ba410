//! Conversion of custom resources between versions by their definition's webhook
//! (`spec.conversion.strategy: Webhook`), as upstream's webhook converter: the objects
//! that are not in the wanted version go to the webhook together in one
//! apiextensions.k8s.io ConversionReview over HTTPS; each answer must be in the wanted
//! version, and of its metadata only labels and annotations are taken.
//!
//! Without a webhook (strategy `None`) a version's objects differ only in `apiVersion`,
//! which the kind's strategy rewrites (see `kind.rs`).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use krust_api::status::{ApiError, Cause};
use serde_json::{Value, json};

use super::kind::storage_version;
use crate::outbound;
use crate::rest::strategy::{Caller, Converter};
use crate::validation::{check_annotations, check_labels};

/// Upstream's timeout for a conversion call.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A definition's conversion webhook.
pub struct Webhook {
    /// `url`, or `service` with `caBundle`: where reviews go.
    client_config: Value,
    /// The ConversionReview version the webhook accepts, v1 preferred.
    review_version: Option<&'static str>,
    /// The definition's kind, for errors (`example.com/v2, Kind=Widget`).
    kind: String,
    /// `group/version` of the version objects are stored in.
    storage: String,
    /// Each version's schema (`group/version`, schema): what converted objects are
    /// pruned by, as upstream's converter prunes them.
    schemas: Vec<(String, JSONSchemaProps)>,
}

#[async_trait::async_trait]
impl Converter for Webhook {
    fn storage_version(&self) -> &str {
        &self.storage
    }

    /// `objects` in `desired` (`group/version`), in their order: those already in it as
    /// they are, the others converted by the webhook in one review. A failure is
    /// upstream's: a 500 whose message names the webhook's fault.
    async fn convert(
        &self,
        caller: &Caller,
        mut objects: Vec<Value>,
        desired: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let pending: Vec<usize> = (0..objects.len())
            .filter(|&i| objects[i]["apiVersion"].as_str() != Some(desired))
            .collect();
        let Some(&first) = pending.first() else {
            return Ok(objects);
        };
        // Upstream names the version converted from, as `group/version, Kind=Kind`.
        let from = format!(
            "{}, Kind={}",
            objects[first]["apiVersion"].as_str().unwrap_or_default(),
            self.kind
        );
        let sent: Vec<&Value> = pending.iter().map(|&i| &objects[i]).collect();
        let converted = self
            .review(caller, &sent, desired)
            .await
            .map_err(|why| format!("conversion webhook for {from} failed: {why}"))
            .and_then(|converted| self.check(&sent, converted, desired, &from))
            .map_err(|message| ApiError::new(500, "", message))?;
        for (i, converted) in pending.into_iter().zip(converted) {
            objects[i] = converted;
        }
        Ok(objects)
    }
}

impl Webhook {
    /// The definition's webhook, if it converts by one.
    pub fn of(crd: &CustomResourceDefinition) -> Option<Webhook> {
        let conversion = crd.spec.conversion.as_ref()?;
        if conversion.strategy != "Webhook" {
            return None;
        }
        let webhook = conversion.webhook.as_ref()?;
        let review_version = ["v1", "v1beta1"]
            .into_iter()
            .find(|v| webhook.conversion_review_versions.iter().any(|w| w == v));
        Some(Webhook {
            client_config: serde_json::to_value(&webhook.client_config).unwrap_or(Value::Null),
            review_version,
            kind: crd.spec.names.kind.clone(),
            storage: format!("{}/{}", crd.spec.group, storage_version(crd)),
            schemas: crd
                .spec
                .versions
                .iter()
                .filter_map(|v| {
                    let schema = v.schema.as_ref()?.open_api_v3_schema.clone()?;
                    Some((format!("{}/{}", crd.spec.group, v.name), schema))
                })
                .collect(),
        })
    }

    /// One ConversionReview; the objects of its answer.
    async fn review(
        &self,
        caller: &Caller,
        objects: &[&Value],
        desired: &str,
    ) -> Result<Vec<Value>, String> {
        let version = self
            .review_version
            .ok_or("no supported conversion review versions")?;
        let uid = uuid::Uuid::new_v4().to_string();
        let body = json!({
            "kind": "ConversionReview",
            "apiVersion": format!("apiextensions.k8s.io/{version}"),
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects},
        });
        let target = outbound::target(&self.client_config, TIMEOUT, &caller.cache)?;
        let answer = caller
            .client
            .post_review(&self.client_config, &target, &body, TIMEOUT)
            .await
            .map_err(|e| format!("Post \"{}\": {e}", target.url))?;
        if version == "v1" {
            let got = format!(
                "{}, Kind={}",
                answer["apiVersion"].as_str().unwrap_or_default(),
                answer["kind"].as_str().unwrap_or_default()
            );
            if got != "apiextensions.k8s.io/v1, Kind=ConversionReview" {
                return Err(format!(
                    "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {got}"
                ));
            }
        }
        let response = &answer["response"];
        if !response.is_object() {
            return Err("no response provided".into());
        }
        let got_uid = response["uid"].as_str().unwrap_or_default();
        if version == "v1" && got_uid != uid {
            return Err(format!("expected response.uid={uid:?}, got {got_uid:?}"));
        }
        let result = &response["result"];
        let status = result["status"].as_str().unwrap_or_default();
        if status != "Success" {
            return Err(match result["message"].as_str() {
                Some(m) if !m.is_empty() => m.to_string(),
                _ => format!("response.result.status was '{status}', not 'Success'"),
            });
        }
        Ok(response["convertedObjects"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The converted objects, checked against those sent as upstream checks them, with
    /// the originals' metadata but for labels and annotations.
    fn check(
        &self,
        sent: &[&Value],
        converted: Vec<Value>,
        desired: &str,
        from: &str,
    ) -> Result<Vec<Value>, String> {
        let by = format!("conversion webhook for {from}");
        if converted.len() != sent.len() {
            return Err(format!(
                "{by} returned {} objects, expected {}",
                converted.len(),
                sent.len()
            ));
        }
        // Upstream words a single object's faults and a list's differently.
        let (invalid, metadata) = if sent.len() == 1 {
            ("invalid object at index 0".to_string(), "invalid metadata")
        } else {
            (String::new(), "invalid metadata in object at index")
        };
        let mut out = Vec::with_capacity(converted.len());
        for (i, (original, obj)) in sent.iter().zip(converted).enumerate() {
            let at = if sent.len() == 1 {
                invalid.clone()
            } else {
                format!("invalid converted object at index {i}")
            };
            let api_version = obj["apiVersion"].as_str().unwrap_or_default();
            if api_version != desired {
                return Err(format!(
                    "{by} returned {at}: invalid groupVersion (expected {desired}, received {api_version})"
                ));
            }
            let kind = obj["kind"].as_str().unwrap_or_default();
            if kind != self.kind {
                return Err(format!(
                    "{by} returned {at}: invalid kind (expected {}, received {kind})",
                    self.kind
                ));
            }
            for field in ["name", "namespace", "uid"] {
                let (was, now) = (
                    original["metadata"][field].as_str().unwrap_or_default(),
                    obj["metadata"][field].as_str().unwrap_or_default(),
                );
                if was != now {
                    let label = if field == "uid" { "UID" } else { field };
                    return Err(format!(
                        "{by} returned invalid object: must have the same {label}: {was} != {now}"
                    ));
                }
            }
            let mut restored = restore_metadata(original, obj).map_err(|why| {
                if sent.len() == 1 {
                    format!("{by} returned {metadata}: {why}")
                } else {
                    format!("{by} returned {metadata} {i}: {why}")
                }
            })?;
            // Fields the desired version does not know are dropped.
            if let Some((_, schema)) = self.schemas.iter().find(|(v, _)| v == desired) {
                super::schema::prune(schema, &mut restored, "", &mut Vec::new());
            }
            out.push(restored);
        }
        Ok(out)
    }
}

/// The converted object with the original's metadata but for labels and annotations,
/// which a webhook may change (upstream's `restoreObjectMeta`), checked as upstream
/// checks them.
fn restore_metadata(original: &Value, mut converted: Value) -> Result<Value, String> {
    let converted_meta = match &converted["metadata"] {
        Value::Null => return Err("missing metadata in converted object".into()),
        Value::Object(m) => m.clone(),
        other => {
            return Err(format!(
                "invalid metadata of type {} in converted object",
                go_type(other)
            ));
        }
    };
    let mut meta = original["metadata"].clone();
    let mut errs = Vec::new();
    for field in ["labels", "annotations"] {
        match converted_meta.get(field) {
            None | Some(Value::Null) => {
                if let Some(m) = meta.as_object_mut() {
                    m.remove(field);
                }
            }
            Some(Value::Object(map)) => {
                if let Some((key, v)) = map.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "metadata.{field}[{key}] must be a string, but is {} in converted object",
                        go_type(v)
                    ));
                }
                if meta[field] != Value::Object(map.clone()) {
                    let path = if field == "labels" {
                        "metadata.labels"
                    } else {
                        // sic: upstream's path for annotations.
                        "metadata.annotation"
                    };
                    let mut causes = Vec::new();
                    let value = Value::Object(map.clone());
                    if field == "labels" {
                        check_labels(path, &value, &mut causes);
                    } else {
                        check_annotations(path, &value, &mut causes);
                    }
                    errs.extend(causes.iter().map(Cause::summary));
                }
                meta[field] = Value::Object(map.clone());
            }
            Some(other) => {
                return Err(format!(
                    "invalid metadata.{field} of type {} in converted object",
                    go_type(other)
                ));
            }
        }
    }
    match errs.len() {
        0 => {}
        1 => return Err(errs.remove(0)),
        _ => return Err(format!("[{}]", errs.join(", "))),
    }
    converted["metadata"] = meta;
    Ok(converted)
}

/// A JSON value's type as Go's `%T` prints the decoded value.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_labels_and_annotations_of_a_converted_object_are_taken() {
        let original = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "a", "uid": "u", "labels": {"x": "1"}, "annotations": {"a": "b"}},
            "spec": {"hostPort": "h:1"}
        });
        let converted = json!({
            "apiVersion": "example.com/v2", "kind": "Widget",
            "metadata": {"name": "renamed", "uid": "other", "labels": {"y": "2"}},
            "spec": {"host": "h", "port": "1"}
        });
        let restored = restore_metadata(&original, converted).unwrap();
        assert_eq!(restored["metadata"]["name"], "a");
        assert_eq!(restored["metadata"]["uid"], "u");
        assert_eq!(restored["metadata"]["labels"], json!({"y": "2"}));
        assert!(restored["metadata"].get("annotations").is_none());
        assert_eq!(restored["spec"]["host"], "h");
        let bad = json!({"metadata": {"labels": {"x": 1}}});
        assert_eq!(
            restore_metadata(&original, bad).unwrap_err(),
            "metadata.labels[x] must be a string, but is int64 in converted object"
        );
        let bad = json!({"metadata": {"labels": {"-x-": "1"}}});
        assert!(
            restore_metadata(&original, bad)
                .unwrap_err()
                .starts_with("metadata.labels: Invalid value: \"-x-\""),
        );
    }

    #[test]
    fn answers_are_checked_as_upstream_checks_them() {
        let webhook = Webhook {
            client_config: Value::Null,
            review_version: Some("v1"),
            kind: "Widget".into(),
            storage: "example.com/v1".into(),
            schemas: vec![(
                "example.com/v2".into(),
                serde_json::from_value(json!({"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}))
                .unwrap(),
            )],
        };
        let sent =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}});
        let from = "example.com/v1, Kind=Widget";
        let check = |converted: Vec<Value>| {
            webhook
                .check(&[&sent], converted, "example.com/v2", from)
                .unwrap_err()
        };
        assert_eq!(
            check(vec![]),
            "conversion webhook for example.com/v1, Kind=Widget returned 0 objects, expected 1"
        );
        assert_eq!(
            check(vec![
                json!({"apiVersion": "example.com/v1", "kind": "Widget"})
            ]),
            "conversion webhook for example.com/v1, Kind=Widget returned invalid object at index 0: invalid groupVersion (expected example.com/v2, received example.com/v1)"
        );
        assert_eq!(
            check(vec![
                json!({"apiVersion": "example.com/v2", "kind": "Gadget"})
            ]),
            "conversion webhook for example.com/v1, Kind=Widget returned invalid object at index 0: invalid kind (expected Widget, received Gadget)"
        );
        assert_eq!(
            check(vec![
                json!({"apiVersion": "example.com/v2", "kind": "Widget", "metadata": {"name": "b"}})
            ]),
            "conversion webhook for example.com/v1, Kind=Widget returned invalid object: must have the same name: a != b"
        );
        let fine = json!({"apiVersion": "example.com/v2", "kind": "Widget",
            "metadata": {"name": "a", "labels": {"k": "v"}}, "spec": {"size": 1, "stray": 2}});
        let out = webhook
            .check(&[&sent], vec![fine], "example.com/v2", from)
            .unwrap();
        assert_eq!(
            out[0]["metadata"],
            json!({"name": "a", "labels": {"k": "v"}})
        );
        // Pruned by the desired version's schema.
        assert_eq!(out[0]["spec"], json!({"size": 1}));
    }
}
