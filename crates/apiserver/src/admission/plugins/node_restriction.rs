//! NodeRestriction: a kubelet (`system:node:<name>`) writes only its own Node, without
//! changing its taints or `node-restriction.kubernetes.io/` labels, and only the pods
//! bound to it — upstream's plugin; the Node authorizer decides what it may reach at all.

use krust_api::status::{ApiError, Target as ErrorTarget};
use serde_json::Value;

use crate::admission::{Attributes, Operation, Plugin};
use crate::auth::User;
use crate::authz::node::node_of;

pub struct NodeRestriction;

#[async_trait::async_trait]
impl Plugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        node_of(&a.call.user).is_some()
            && a.call.kind.info.group.is_empty()
            && a.operation != Operation::Connect
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        // A delete is judged by the object it removes.
        let Some(obj) = obj.map(|o| &*o).or(a.old) else {
            return Ok(());
        };
        restrict(
            &a.call.user,
            a.call.kind.info.plural,
            a.subresource(),
            obj,
            a.old,
        )
    }
}

/// NodeRestriction for a write by `user` of `obj` (`old` for updates and deletes): a
/// node writes only its own Node (without changing its taints or
/// `node-restriction.kubernetes.io/` labels), its own Lease, and pods bound to it.
fn restrict(
    user: &User,
    plural: &str,
    subresource: Option<&str>,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(node) = node_of(user) else {
        return Ok(());
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let forbidden = |why: String| {
        Err(ApiError::forbidden_for(
            ErrorTarget {
                group: "",
                resource: plural,
                name,
            },
            &why,
        ))
    };
    match plural {
        "nodes" => {
            if name != node {
                return forbidden(format!(
                    "node {node:?} is not allowed to modify node {name:?}"
                ));
            }
            let restricted = |v: &Value| -> Vec<(String, Value)> {
                v["metadata"]["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| k.contains("node-restriction.kubernetes.io/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            };
            let old_labels = old.map(restricted).unwrap_or_default();
            if restricted(obj) != old_labels {
                return forbidden(format!(
                    "is not allowed to modify labels: {}",
                    restricted(obj)
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if let Some(old) = old
                && obj["spec"]["taints"] != old["spec"]["taints"]
            {
                return forbidden(format!("node {node:?} is not allowed to modify taints"));
            }
            Ok(())
        }
        "pods" => {
            let bound = old.unwrap_or(obj)["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default();
            if bound != node {
                let what = if subresource == Some("status") {
                    "update status of"
                } else {
                    "modify"
                };
                return forbidden(format!(
                    "node {node:?} can only {what} pods with spec.nodeName set to itself"
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::identity::NODES_GROUP;
    use serde_json::json;

    #[test]
    fn nodes_write_only_themselves_and_their_pods() {
        let kubelet = User {
            name: "system:node:n1".into(),
            groups: vec![NODES_GROUP.into(), "system:authenticated".into()],
        };
        assert_eq!(node_of(&kubelet), Some("n1"));
        let node = |name: &str| json!({"metadata": {"name": name}, "spec": {}});
        assert!(restrict(&kubelet, "nodes", None, &node("n1"), None).is_ok());
        let other = restrict(&kubelet, "nodes", None, &node("n2"), None).unwrap_err();
        assert_eq!(other.code, 403);
        let tainted = json!({"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
        assert!(restrict(&kubelet, "nodes", None, &tainted, Some(&node("n1"))).is_err());
        let pod = |on: &str| json!({"metadata": {"name": "p"}, "spec": {"nodeName": on}});
        assert!(
            restrict(
                &kubelet,
                "pods",
                Some("status"),
                &pod("n1"),
                Some(&pod("n1"))
            )
            .is_ok()
        );
        let err = restrict(
            &kubelet,
            "pods",
            Some("status"),
            &pod("n2"),
            Some(&pod("n2")),
        )
        .unwrap_err();
        assert!(
            err.message.contains("can only update status of pods"),
            "{}",
            err.message
        );
        let admin = User {
            name: "admin".into(),
            groups: vec!["system:masters".into()],
        };
        assert!(restrict(&admin, "nodes", None, &node("n2"), None).is_ok());
    }
}
