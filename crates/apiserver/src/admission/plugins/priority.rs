//! Priority: a pod's priority comes from its PriorityClass.

use krust_api::status::ApiError;
use serde_json::Value;

use super::pod_create;
use crate::admission::{Attributes, Plugin};
use crate::rest::Call;

pub struct Priority;

#[async_trait::async_trait]
impl Plugin for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        pod_create(a)
    }

    async fn admit(&self, a: &Attributes<'_>, pod: Option<&mut Value>) -> Result<(), ApiError> {
        match pod {
            Some(pod) => priority(a.call, pod),
            None => Ok(()),
        }
    }
}

/// The PriorityClasses every cluster has: (name, value, description), as upstream.
pub const SYSTEM_PRIORITY_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// The Priority admission step: a new pod's `spec.priority` and `spec.preemptionPolicy`
/// come from its PriorityClass (or the global default class, or 0 when there is none);
/// a pod may not claim values of its own that differ.
fn priority(call: &Call<'_>, pod: &mut Value) -> Result<(), ApiError> {
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let forbidden = |message: String| {
        let mut err = ApiError::forbidden(format!("pods \"{name}\" is forbidden: {message}"));
        err.details = Some(Box::new(krust_api::status::Details {
            name: name.clone(),
            kind: "pods".into(),
            ..Default::default()
        }));
        err
    };
    let classes = call
        .scope
        .cache
        .cache("/registry/priorityclasses/")
        .ok_or_else(|| ApiError::internal("priority class cache missing"))?;
    let requested = pod["spec"]["priorityClassName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let class = if requested.is_empty() {
        // The global default with the lowest value, as upstream picks among several.
        classes
            .list("/registry/priorityclasses/")
            .0
            .iter()
            .map(|c| c.value())
            .filter(|c| c["globalDefault"] == true)
            .min_by_key(|c| c["value"].as_i64().unwrap_or(0))
    } else {
        match classes.get(&format!("/registry/priorityclasses/{requested}")) {
            Some(c) => Some(c.value()),
            None => match SYSTEM_PRIORITY_CLASSES.iter().find(|c| c.0 == requested) {
                Some((_, value, _)) => Some(serde_json::json!({"value": value})),
                None => {
                    return Err(forbidden(format!(
                        "no PriorityClass with name {requested} was found"
                    )));
                }
            },
        }
    };
    let value = class
        .as_ref()
        .and_then(|c| c["value"].as_i64())
        .unwrap_or(0);
    let policy = class
        .as_ref()
        .and_then(|c| c["preemptionPolicy"].as_str())
        .unwrap_or("PreemptLowerPriority")
        .to_string();
    if let Some(given) = pod["spec"]["priority"].as_i64()
        && given != value
    {
        return Err(forbidden(format!(
            "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {value} from the given PriorityClass name"
        )));
    }
    if let Some(given) = pod["spec"]["preemptionPolicy"].as_str()
        && given != policy
    {
        return Err(forbidden(format!(
            "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
        )));
    }
    if requested.is_empty()
        && let Some(class) = &class
    {
        pod["spec"]["priorityClassName"] = class["metadata"]["name"].clone();
    }
    pod["spec"]["priority"] = serde_json::json!(value);
    pod["spec"]["preemptionPolicy"] = serde_json::json!(policy);
    Ok(())
}
