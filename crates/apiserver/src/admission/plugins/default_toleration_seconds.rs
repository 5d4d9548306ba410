//! DefaultTolerationSeconds: pods ride out a node's short outage before being evicted.

use krust_api::status::ApiError;
use serde_json::{Value, json};

use super::pod_create;
use crate::admission::{Attributes, Plugin};

pub struct DefaultTolerationSeconds;

#[async_trait::async_trait]
impl Plugin for DefaultTolerationSeconds {
    fn name(&self) -> &'static str {
        "DefaultTolerationSeconds"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        pod_create(a)
    }

    async fn admit(&self, _a: &Attributes<'_>, pod: Option<&mut Value>) -> Result<(), ApiError> {
        if let Some(pod) = pod {
            default_toleration_seconds(pod);
        }
        Ok(())
    }
}

/// The DefaultTolerationSeconds step: a pod that does not say otherwise tolerates a
/// not-ready or unreachable node for 300 s before it is evicted from it.
fn default_toleration_seconds(pod: &mut Value) {
    const DEFAULT_SECONDS: i64 = 300;
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let existing: Vec<Value> = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut added = Vec::new();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = existing.iter().any(|t| {
            let effect = t["effect"].as_str().unwrap_or_default();
            let t_key = t["key"].as_str().unwrap_or_default();
            (effect.is_empty() || effect == "NoExecute")
                && (t_key == key || (t_key.is_empty() && t["operator"] == "Exists"))
        });
        if !tolerated {
            added.push(
                json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_SECONDS}),
            );
        }
    }
    if !added.is_empty() {
        let mut all = existing;
        all.extend(added);
        spec.insert("tolerations".into(), Value::Array(all));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_tolerate_not_ready_and_unreachable_nodes_for_five_minutes() {
        let mut pod = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]}});
        default_toleration_seconds(&mut pod);
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ])
        );
        let mut everything = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_toleration_seconds(&mut everything);
        assert_eq!(
            everything["spec"]["tolerations"],
            json!([{"operator": "Exists"}])
        );
        let mut bare = json!({"spec": {}});
        default_toleration_seconds(&mut bare);
        assert_eq!(bare["spec"]["tolerations"].as_array().unwrap().len(), 2);
    }
}
