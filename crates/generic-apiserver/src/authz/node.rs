//! The Node authorizer: a kubelet
//! (`system:node:<name>` in `system:nodes`) may read only the Secrets, ConfigMaps and
//! PersistentVolumeClaims of pods bound to its node (and the PersistentVolumes those
//! claims are bound to), request tokens only for their
//! ServiceAccounts, and touch only its own Lease — upstream's rules (what it may write
//! of Nodes and pods is admission's NodeRestriction). Relationships are read from the watch cache's pods of the
//! namespace (their `spec.nodeName` is indexed), so no graph has to be kept.
//!
//! Unlike upstream, a kubelet may only `get` those Secrets and ConfigMaps, not list or
//! watch them by a `metadata.name` field selector (krust's kubelet only gets them), and
//! VolumeAttachments and ResourceClaims are not yet related to nodes.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::rules::Rule;
use super::{Attributes, Authorizer, Decision, Target};
use crate::auth::User;
use crate::watch_cache::WatchCache;

use super::identity::NODES_GROUP;

const NODE_PREFIX: &str = "system:node:";

/// The node a user is the kubelet of, if it is one.
pub fn node_of(user: &User) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_PREFIX)?;
    user.groups
        .iter()
        .any(|g| g == NODES_GROUP)
        .then_some(name)
        .filter(|n| !n.is_empty())
}

/// What a kubelet may do beyond its pods' objects: the `system:node` ClusterRole's rules.
fn node_rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        super::bootstrap_policy::bootstrap()
            .cluster_roles
            .iter()
            .find(|r| r["metadata"]["name"] == "system:node")
            .and_then(|r| serde_json::from_value(r["rules"].clone()).ok())
            .unwrap_or_default()
    })
}

pub struct NodeAuthorizer {
    pub cache: Arc<WatchCache>,
}

/// The kinds of object a pod refers to by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ref {
    Secret,
    ConfigMap,
    Claim,
}

/// The claims of a pod's generic ephemeral volumes (`<pod>-<volume>`).
fn ephemeral_claims(pod: &Value) -> impl Iterator<Item = String> + '_ {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("ephemeral").is_some())
        .filter_map(move |v| Some(format!("{pod_name}-{}", v["name"].as_str()?)))
}

/// Collects the names `pod` refers to as `kind` (volumes, projections, env, envFrom,
/// image pull secrets, in every container list).
fn references(v: &Value, kind: Ref, out: &mut Vec<String>) {
    fn push(out: &mut Vec<String>, x: &Value, field: &str) {
        if let Some(name) = x[field].as_str() {
            out.push(name.to_string());
        }
    }
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                match (kind, key.as_str()) {
                    (Ref::Secret, "secret") => {
                        push(out, value, "secretName");
                        push(out, value, "name");
                    }
                    (Ref::Secret, k)
                        if k == "secretRef" || k == "secretKeyRef" || k.ends_with("SecretRef") =>
                    {
                        push(out, value, "name")
                    }
                    (Ref::Secret, "imagePullSecrets") => {
                        for s in value.as_array().into_iter().flatten() {
                            push(out, s, "name");
                        }
                    }
                    (Ref::ConfigMap, "configMap" | "configMapRef" | "configMapKeyRef") => {
                        push(out, value, "name")
                    }
                    (Ref::Claim, "persistentVolumeClaim") => push(out, value, "claimName"),
                    _ => {}
                }
                references(value, kind, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| references(i, kind, out)),
        _ => {}
    }
}

impl NodeAuthorizer {
    /// Whether some pod in `namespace` bound to `node` satisfies `related`.
    fn some_pod(&self, node: &str, namespace: &str, related: impl Fn(&Value) -> bool) -> bool {
        let Some(info) = krust_api::registry::find("", "v1", "pods") else {
            return false;
        };
        let Some(pods) = self.cache.cache(&info.storage_prefix()) else {
            return false;
        };
        pods.list(&info.storage_prefix_in(Some(namespace)))
            .0
            .iter()
            .filter(|p| p.field("spec.nodeName").as_deref() == Some(node))
            .any(|p| related(&p.value()))
    }

    /// Whether a pod bound to `node` (in any namespace) uses a claim bound to volume
    /// `name`.
    fn uses_volume(&self, node: &str, name: &str) -> bool {
        let Some(info) = krust_api::registry::find("", "v1", "pods") else {
            return false;
        };
        let Some(pods) = self.cache.cache(&info.storage_prefix()) else {
            return false;
        };
        pods.list(&info.storage_prefix())
            .0
            .iter()
            .filter(|p| p.field("spec.nodeName").as_deref() == Some(node))
            .any(|p| {
                let pod = p.value();
                let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
                let mut claims = Vec::new();
                references(&pod["spec"], Ref::Claim, &mut claims);
                claims.extend(ephemeral_claims(&pod));
                claims.iter().any(|claim| {
                    self.cache
                        .core_object("persistentvolumeclaims", Some(namespace), claim)
                        .is_some_and(|c| c["spec"]["volumeName"] == name)
                })
            })
    }

    fn referenced(&self, node: &str, namespace: &str, kind: Ref, name: &str) -> bool {
        self.some_pod(node, namespace, |pod| {
            let mut names = Vec::new();
            references(&pod["spec"], kind, &mut names);
            if kind == Ref::Claim {
                names.extend(ephemeral_claims(pod));
            }
            names.iter().any(|n| n == name)
        })
    }
}

impl Authorizer for NodeAuthorizer {
    fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let Some(node) = node_of(attrs.user) else {
            return Decision::NoOpinion(String::new());
        };
        let no_relationship = || {
            Decision::NoOpinion(format!(
                "no relationship found between node '{node}' and this object"
            ))
        };
        if let Target::Resource(r) = attrs.target {
            let ns = r.namespace.unwrap_or_default();
            let name = r.name.unwrap_or_default();
            let kind = match (r.group, r.resource, r.subresource) {
                ("", "secrets", None) => Some(Ref::Secret),
                ("", "configmaps", None) => Some(Ref::ConfigMap),
                ("", "persistentvolumeclaims", None) => Some(Ref::Claim),
                _ => None,
            };
            if let Some(kind) = kind {
                if attrs.verb != "get" || name.is_empty() {
                    return Decision::NoOpinion(
                        "can only get individual resources of this type".to_string(),
                    );
                }
                return if self.referenced(node, ns, kind, name) {
                    Decision::Allow(String::new())
                } else {
                    no_relationship()
                };
            }
            match (r.group, r.resource, r.subresource) {
                ("", "persistentvolumes", None) => {
                    return if attrs.verb == "get" && self.uses_volume(node, name) {
                        Decision::Allow(String::new())
                    } else {
                        no_relationship()
                    };
                }
                ("", "serviceaccounts", Some("token")) => {
                    return if attrs.verb == "create"
                        && self.some_pod(node, ns, |pod| {
                            pod["spec"]["serviceAccountName"]
                                .as_str()
                                .unwrap_or("default")
                                == name
                        }) {
                        Decision::Allow(String::new())
                    } else {
                        no_relationship()
                    };
                }
                ("coordination.k8s.io", "leases", None) => {
                    let own = ns == "kube-node-lease"
                        && (name == node || (name.is_empty() && attrs.verb == "create"));
                    return if own {
                        Decision::Allow(String::new())
                    } else {
                        Decision::NoOpinion(
                            "can only access node lease with the same name as the requesting node"
                                .to_string(),
                        )
                    };
                }
                _ => {}
            }
        }
        if node_rules().iter().any(|rule| rule.allows(attrs)) {
            Decision::Allow(String::new())
        } else {
            Decision::NoOpinion(String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pods_refer_to_secrets_configmaps_and_claims_everywhere_upstream_looks() {
        let spec = json!({
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [
                {"name": "a", "secret": {"secretName": "vol"}},
                {"name": "b", "configMap": {"name": "cm-vol"}},
                {"name": "c", "projected": {"sources": [{"secret": {"name": "proj"}}, {"configMap": {"name": "cm-proj"}}]}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "e", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi"}}},
            ],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
            "containers": [{"name": "c", "env": [
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "env", "key": "k"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
            ]}],
        });
        let names = |kind| {
            let mut out = Vec::new();
            references(&spec, kind, &mut out);
            out.sort();
            out
        };
        assert_eq!(
            names(Ref::Secret),
            ["csi", "env", "init-env", "proj", "pull", "vol"]
        );
        assert_eq!(names(Ref::ConfigMap), ["cm-env", "cm-proj", "cm-vol"]);
        assert_eq!(names(Ref::Claim), ["data"]);
    }
}
