//! The bootstrap policy: upstream's default ClusterRoles, Roles and bindings
//! (`bootstrap_policy.yaml`), reconciled at every start as upstream's RBAC post-start
//! hook does — missing objects are created, missing rules, subjects, labels and
//! aggregation selectors added, nothing removed, and objects annotated
//! `rbac.authorization.kubernetes.io/autoupdate: "false"` left alone.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use krust_api::status::ApiError;
use serde::Deserialize;
use serde_json::{Value, json};

use super::rules::{Rule, uncovered};
use crate::loopback::{Loopback, Resource};
use crate::rest::Scope;

const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
const GROUP: &str = "rbac.authorization.k8s.io";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyFile {
    cluster_roles: Vec<RoleSpec>,
    cluster_role_bindings: Vec<BindingSpec>,
    roles: Vec<RoleSpec>,
    role_bindings: Vec<BindingSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleSpec {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Label keys of the aggregation rule's selectors (each `{key: "true"}`).
    #[serde(default)]
    aggregate: Vec<String>,
    #[serde(default)]
    rules: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingSpec {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    role: String,
    /// `Group:<name>`, `User:<name>` or `ServiceAccount:<namespace>:<name>`.
    subjects: Vec<String>,
}

/// The policy as API objects, in creation order.
pub struct Policy {
    pub cluster_roles: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
    pub roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
}

fn metadata(name: &str, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> Value {
    let mut labels = labels.clone();
    labels.insert("kubernetes.io/bootstrapping".into(), "rbac-defaults".into());
    let mut meta = json!({"name": name, "labels": labels, "annotations": {AUTOUPDATE: "true"}});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    meta
}

fn role(spec: &RoleSpec) -> Result<Value, String> {
    let rules = spec
        .rules
        .iter()
        .map(|line| Rule::parse_line(line))
        .collect::<Result<Vec<_>, _>>()?;
    let mut obj = json!({
        "metadata": metadata(&spec.name, spec.namespace.as_deref(), &spec.labels),
        "rules": rules,
    });
    if !spec.aggregate.is_empty() {
        let selectors: Vec<Value> = spec
            .aggregate
            .iter()
            .map(|key| json!({"matchLabels": {key: "true"}}))
            .collect();
        obj["aggregationRule"] = json!({"clusterRoleSelectors": selectors});
    }
    Ok(obj)
}

fn binding(spec: &BindingSpec, role_kind: &str) -> Result<Value, String> {
    let subjects = spec
        .subjects
        .iter()
        .map(|s| match s.split_once(':') {
            Some(("ServiceAccount", rest)) => {
                let (ns, name) = rest
                    .split_once(':')
                    .ok_or_else(|| format!("malformed subject {s:?}"))?;
                Ok(json!({"kind": "ServiceAccount", "name": name, "namespace": ns}))
            }
            Some((kind @ ("User" | "Group"), name)) => {
                Ok(json!({"kind": kind, "apiGroup": GROUP, "name": name}))
            }
            _ => Err(format!("malformed subject {s:?}")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(json!({
        "metadata": metadata(&spec.name, spec.namespace.as_deref(), &BTreeMap::new()),
        "roleRef": {"apiGroup": GROUP, "kind": role_kind, "name": spec.role},
        "subjects": subjects,
    }))
}

/// The bootstrap policy, parsed once. The file is part of the binary, so a parse error is
/// a bug caught by the tests.
pub fn bootstrap() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let file: PolicyFile = serde_saphyr::from_str(include_str!("bootstrap_policy.yaml"))
            .unwrap_or_else(|e| panic!("bootstrap_policy.yaml: {e}"));
        let all = |specs: &[RoleSpec]| -> Vec<Value> {
            specs
                .iter()
                .map(|s| role(s).unwrap_or_else(|e| panic!("role {}: {e}", s.name)))
                .collect()
        };
        let bindings = |specs: &[BindingSpec], kind: &str| -> Vec<Value> {
            specs
                .iter()
                .map(|s| binding(s, kind).unwrap_or_else(|e| panic!("binding {}: {e}", s.name)))
                .collect()
        };
        Policy {
            cluster_roles: all(&file.cluster_roles),
            cluster_role_bindings: bindings(&file.cluster_role_bindings, "ClusterRole"),
            roles: all(&file.roles),
            role_bindings: bindings(&file.role_bindings, "Role"),
        }
    })
}

fn resource<'a>(plural: &'a str, namespace: Option<&'a str>) -> Resource<'a> {
    Resource {
        group: GROUP,
        version: "v1",
        plural,
        namespace,
    }
}

/// Creates or completes every bootstrap object: roles first, then the bindings, each set
/// at once (the writes share the store's group commits).
pub async fn reconcile(scope: &Scope) -> anyhow::Result<()> {
    let client = &Loopback { scope };
    let policy = bootstrap();
    let stages: [&[(&str, &Vec<Value>)]; 2] = [
        &[
            ("clusterroles", &policy.cluster_roles),
            ("roles", &policy.roles),
        ],
        &[
            ("clusterrolebindings", &policy.cluster_role_bindings),
            ("rolebindings", &policy.role_bindings),
        ],
    ];
    for stage in stages {
        let writes = stage.iter().flat_map(|&(plural, objects)| {
            objects.iter().map(move |expected| async move {
                let ns = expected["metadata"]["namespace"].as_str();
                reconcile_one(client, resource(plural, ns), expected)
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "reconciling {plural} {}: {e}",
                            expected["metadata"]["name"].as_str().unwrap_or_default()
                        )
                    })
            })
        });
        futures::future::try_join_all(writes).await?;
    }
    Ok(())
}

/// Creates `expected` or completes the stored object; a write that races another
/// apiserver starting at the same time is retried on what that one wrote.
async fn reconcile_one(
    client: &Loopback<'_>,
    r: Resource<'_>,
    expected: &Value,
) -> Result<(), ApiError> {
    let mut attempts = 0;
    loop {
        match reconcile_attempt(client, r, expected).await {
            Err(e) if e.code == 409 && attempts < 5 => attempts += 1,
            done => return done,
        }
    }
}

async fn reconcile_attempt(
    client: &Loopback<'_>,
    r: Resource<'_>,
    expected: &Value,
) -> Result<(), ApiError> {
    let name = expected["metadata"]["name"].as_str().unwrap_or_default();
    let existing = match client.get(r, name).await {
        Ok(existing) => existing,
        Err(e) if e.code == 404 => return client.create(r, expected).await.map(|_| ()),
        Err(e) => return Err(e),
    };
    if existing["metadata"]["annotations"][AUTOUPDATE] == "false" {
        return Ok(());
    }
    let mut updated = existing.clone();
    completed(&mut updated, expected);
    if updated != existing {
        tracing::info!(
            resource = r.plural,
            name,
            "completing bootstrap RBAC object"
        );
        client.update(r, &updated).await?;
    }
    Ok(())
}

/// Adds to `existing` what `expected` has and it lacks: labels and annotations, rules
/// not covered, aggregation selectors, subjects.
fn completed(existing: &mut Value, expected: &Value) {
    for field in ["labels", "annotations"] {
        for (k, v) in expected["metadata"][field]
            .as_object()
            .into_iter()
            .flatten()
        {
            if existing["metadata"][field].get(k).is_none() {
                existing["metadata"][field][k] = v.clone();
            }
        }
    }
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let add_missing = |existing: &mut Value, items: Vec<Value>| {
        let mut current = list(existing);
        for item in items {
            if !current.contains(&item) {
                current.push(item);
            }
        }
        if !current.is_empty() || existing.is_array() {
            *existing = Value::Array(current);
        }
    };
    if let Some(selectors) = expected["aggregationRule"]["clusterRoleSelectors"].as_array() {
        add_missing(
            &mut existing["aggregationRule"]["clusterRoleSelectors"],
            selectors.clone(),
        );
    } else if expected.get("rules").is_some() {
        let held: Vec<Rule> = serde_json::from_value(existing["rules"].clone()).unwrap_or_default();
        let wanted: Vec<Rule> =
            serde_json::from_value(expected["rules"].clone()).unwrap_or_default();
        let held_refs: Vec<&Rule> = held.iter().collect();
        let missing: Vec<Value> = wanted
            .iter()
            .filter(|w| !uncovered(&held_refs, std::slice::from_ref(*w)).is_empty())
            .filter_map(|w| serde_json::to_value(w).ok())
            .collect();
        add_missing(&mut existing["rules"], missing);
    }
    if let Some(subjects) = expected["subjects"].as_array() {
        add_missing(&mut existing["subjects"], subjects.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_policy_parses_and_binds_only_roles_it_defines() {
        let policy = bootstrap();
        let names = |objs: &[Value]| -> Vec<String> {
            objs.iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        let cluster_roles = names(&policy.cluster_roles);
        for expected in [
            "cluster-admin",
            "admin",
            "edit",
            "view",
            "system:discovery",
            "system:node",
        ] {
            assert!(cluster_roles.iter().any(|n| n == expected), "{expected}");
        }
        for b in &policy.cluster_role_bindings {
            let role = b["roleRef"]["name"].as_str().unwrap();
            assert!(cluster_roles.iter().any(|n| n == role), "{b}");
        }
        let admin = &policy.cluster_role_bindings[0];
        assert_eq!(admin["metadata"]["name"], "cluster-admin");
        assert_eq!(
            admin["subjects"],
            json!([{"kind": "Group", "apiGroup": GROUP, "name": "system:masters"}])
        );
        assert_eq!(
            admin["metadata"]["annotations"][AUTOUPDATE], "true",
            "every object is annotated"
        );
    }

    #[test]
    fn reconciling_adds_what_is_missing_and_removes_nothing() {
        let expected = json!({
            "metadata": {"name": "r", "labels": {"a": "1"}},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
                      {"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}],
        });
        let mut existing = json!({
            "metadata": {"name": "r", "labels": {"a": "mine"}},
            "rules": [{"verbs": ["get", "watch"], "apiGroups": [""], "resources": ["pods"]}],
        });
        completed(&mut existing, &expected);
        assert_eq!(existing["metadata"]["labels"]["a"], "mine");
        assert_eq!(
            existing["rules"],
            json!([{"verbs": ["get", "watch"], "apiGroups": [""], "resources": ["pods"]},
                   {"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}])
        );
        let expected =
            json!({"metadata": {"name": "b"}, "subjects": [{"kind": "Group", "name": "g"}]});
        let mut existing =
            json!({"metadata": {"name": "b"}, "subjects": [{"kind": "User", "name": "u"}]});
        completed(&mut existing, &expected);
        assert_eq!(existing["subjects"].as_array().unwrap().len(), 2);
    }
}
