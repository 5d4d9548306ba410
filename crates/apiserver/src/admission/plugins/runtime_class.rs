//! RuntimeClass: a new pod that names a RuntimeClass gets the class's overhead and its
//! scheduling constraints (node selector, tolerations); a pod may not bring an overhead
//! of its own that the class does not define. Upstream's plugin of that name.

use krust_api::status::{ApiError, Target};
use serde_json::{Map, Value, json};

use super::pod_create;
use crate::admission::{Attributes, Plugin};
use crate::rest::Call;

pub struct RuntimeClass;

#[async_trait::async_trait]
impl Plugin for RuntimeClass {
    fn name(&self) -> &'static str {
        "RuntimeClass"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        pod_create(a)
    }

    async fn admit(&self, a: &Attributes<'_>, pod: Option<&mut Value>) -> Result<(), ApiError> {
        let Some(pod) = pod else {
            return Ok(());
        };
        let Some(class) = class_of(a.call, pod)? else {
            return Ok(());
        };
        set_overhead(pod, &class)?;
        set_scheduling(pod, &class)
    }

    async fn validate(&self, a: &Attributes<'_>, pod: Option<&Value>) -> Result<(), ApiError> {
        let Some(pod) = pod else {
            return Ok(());
        };
        let overhead = &pod["spec"]["overhead"];
        if overhead.as_object().is_none_or(Map::is_empty) {
            return Ok(());
        }
        match class_of(a.call, pod)? {
            Some(class) if class["overhead"].is_object() => {
                if !same_resources(&class["overhead"]["podFixed"], overhead) {
                    return Err(forbidden(
                        pod,
                        "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
                    ));
                }
                Ok(())
            }
            _ => Err(forbidden(
                pod,
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead",
            )),
        }
    }
}

/// The pod's RuntimeClass, if it names one; a name that does not exist is refused.
fn class_of(call: &Call<'_>, pod: &Value) -> Result<Option<Value>, ApiError> {
    let Some(name) = pod["spec"]["runtimeClassName"].as_str() else {
        return Ok(None);
    };
    let classes = call
        .scope
        .cache
        .cache("/registry/runtimeclasses/")
        .ok_or_else(|| ApiError::internal("runtime class cache missing"))?;
    match classes.get(&format!("/registry/runtimeclasses/{name}")) {
        Some(class) => Ok(Some(class.value())),
        None => Err(forbidden(
            pod,
            &format!("pod rejected: RuntimeClass {name:?} not found"),
        )),
    }
}

fn forbidden(pod: &Value, why: &str) -> ApiError {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    ApiError::forbidden_for(
        Target {
            group: "",
            resource: "pods",
            name,
        },
        why,
    )
}

fn set_overhead(pod: &mut Value, class: &Value) -> Result<(), ApiError> {
    if !class["overhead"].is_object() {
        return Ok(());
    }
    let fixed = &class["overhead"]["podFixed"];
    let given = &pod["spec"]["overhead"];
    if given.as_object().is_some_and(|o| !o.is_empty()) && !same_resources(fixed, given) {
        return Err(forbidden(
            pod,
            "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
        ));
    }
    match fixed {
        Value::Object(_) => pod["spec"]["overhead"] = fixed.clone(),
        _ => {
            if let Some(spec) = pod["spec"].as_object_mut() {
                spec.remove("overhead");
            }
        }
    }
    Ok(())
}

/// Upstream's `Semantic.DeepEqual` of two resource lists: the same resources, each
/// the same quantity however written (`1` and `1000m`).
fn same_resources(a: &Value, b: &Value) -> bool {
    let empty = Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    let milli = |q: &Value| {
        q.as_str()
            .and_then(|q| krust_api::quantity::scaled_value(q, 3).ok())
    };
    a.len() == b.len()
        && a.iter().all(|(resource, q)| {
            b.get(resource).is_some_and(|other| {
                other == q || milli(other).is_some_and(|m| Some(m) == milli(q))
            })
        })
}

fn set_scheduling(pod: &mut Value, class: &Value) -> Result<(), ApiError> {
    let scheduling = &class["scheduling"];
    if !scheduling.is_object() {
        return Ok(());
    }
    if let Some(selector) = scheduling["nodeSelector"].as_object() {
        for (key, wanted) in selector {
            let held = &pod["spec"]["nodeSelector"][key];
            if !held.is_null() && held != wanted {
                let why = format!(
                    "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {}; pod.spec.nodeSelector[{key}] = {}",
                    wanted.as_str().unwrap_or_default(),
                    held.as_str().unwrap_or_default()
                );
                return Err(forbidden(pod, &why));
            }
            pod["spec"]["nodeSelector"][key] = wanted.clone();
        }
    }
    if let Some(added) = scheduling["tolerations"].as_array() {
        let own = pod["spec"]["tolerations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let merged = merge_tolerations(&[own, added.clone()].concat());
        if !merged.is_empty() {
            pod["spec"]["tolerations"] = json!(merged);
        }
    }
    Ok(())
}

/// Upstream's `MergeTolerations`: every toleration once, leaving out one that another
/// already covers (an equal one earlier, or a wider one anywhere).
fn merge_tolerations(all: &[Value]) -> Vec<Value> {
    let mut merged: Vec<Value> = Vec::new();
    for (i, t) in all.iter().enumerate() {
        let covered = merged.iter().any(|m| covers(m, t))
            || all[i + 1..]
                .iter()
                .any(|later| later != t && covers(later, t));
        if !covered {
            merged.push(t.clone());
        }
    }
    merged
}

/// Whether toleration `wide` tolerates everything `t` does (upstream's `isSuperset`).
fn covers(wide: &Value, t: &Value) -> bool {
    if wide == t {
        return true;
    }
    let field = |v: &Value, f: &str| v[f].as_str().unwrap_or_default().to_string();
    let operator = |v: &Value| match field(v, "operator").as_str() {
        "" => "Equal".to_string(),
        other => other.to_string(),
    };
    // An empty key with Exists tolerates every key.
    if field(t, "key") != field(wide, "key")
        && (!field(wide, "key").is_empty() || operator(wide) != "Exists")
    {
        return false;
    }
    // An empty effect tolerates every effect.
    if field(t, "effect") != field(wide, "effect") && !field(wide, "effect").is_empty() {
        return false;
    }
    if field(wide, "effect") == "NoExecute"
        && let Some(limit) = wide["tolerationSeconds"].as_i64()
        && t["tolerationSeconds"].as_i64().is_none_or(|s| s > limit)
    {
        return false;
    }
    match operator(wide).as_str() {
        "Equal" => operator(t) == "Equal" && field(t, "value") == field(wide, "value"),
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerations_merge_as_upstreams() {
        let a = json!({"key": "runtime", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"});
        let any_runtime = json!({"key": "runtime", "operator": "Exists"});
        let everything = json!({"operator": "Exists"});
        // An equal one is kept once, the first.
        assert_eq!(merge_tolerations(&[a.clone(), a.clone()]), vec![a.clone()]);
        // A wider one covers a narrower one, wherever it stands.
        assert_eq!(
            merge_tolerations(&[a.clone(), any_runtime.clone()]),
            vec![any_runtime.clone()]
        );
        assert_eq!(
            merge_tolerations(&[any_runtime.clone(), everything.clone()]),
            vec![everything]
        );
        // A bounded NoExecute toleration covers shorter ones.
        let short = json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10});
        let long = json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60});
        assert_eq!(
            merge_tolerations(&[short.clone(), long.clone()]),
            vec![long.clone()]
        );
        let other = json!({"key": "other", "operator": "Exists"});
        assert_eq!(
            merge_tolerations(&[a.clone(), other.clone()]),
            vec![a, other]
        );
    }

    #[test]
    fn overheads_compare_by_quantity() {
        assert!(same_resources(
            &json!({"cpu": "1", "memory": "64Mi"}),
            &json!({"memory": "64Mi", "cpu": "1000m"})
        ));
        assert!(!same_resources(&json!({"cpu": "1"}), &json!({"cpu": "2"})));
        assert!(!same_resources(
            &json!({"cpu": "1"}),
            &json!({"cpu": "1", "memory": "1Mi"})
        ));
    }
}
