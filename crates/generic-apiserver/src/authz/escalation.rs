//! RBAC's escalation prevention: a user may write a Role or ClusterRole only with rules
//! they hold themselves (or the `escalate` verb on it), and a binding only to a role whose
//! rules they hold (or the `bind` verb on it) — as upstream's policy-based RBAC storage.

use krust_api::status::{ApiError, Target as ErrorTarget};
use serde_json::Value;

use super::rules::{Rule, uncovered};
use super::{Attributes, MASTERS, ResourceAttributes, Target};
use crate::auth::User;
use crate::rest::Scope;

const GROUP: &str = "rbac.authorization.k8s.io";

/// Checks a Role, ClusterRole, RoleBinding or ClusterRoleBinding about to be written by
/// `user`; other objects pass.
pub fn check(scope: &Scope, user: &User, plural: &str, obj: &Value) -> Result<(), ApiError> {
    if user.groups.iter().any(|g| g == MASTERS) {
        return Ok(());
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = obj["metadata"]["namespace"]
        .as_str()
        .filter(|ns| !ns.is_empty());
    let target = ErrorTarget {
        group: GROUP,
        resource: plural,
        name,
    };
    match plural {
        "roles" | "clusterroles" => {
            if may(scope, user, "escalate", plural, namespace, name) {
                return Ok(());
            }
            if obj.get("aggregationRule").is_some_and(|r| !r.is_null()) {
                return Err(ApiError::forbidden_for(
                    target,
                    "must have cluster-admin privileges to use the aggregationRule",
                ));
            }
            let rules: Vec<Rule> = serde_json::from_value(obj["rules"].clone()).unwrap_or_default();
            confirm_no_escalation(scope, user, namespace, &rules, target)
        }
        "rolebindings" | "clusterrolebindings" => {
            let role_kind = obj["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = obj["roleRef"]["name"].as_str().unwrap_or_default();
            let role_plural = if role_kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            if may(scope, user, "bind", role_plural, namespace, role_name) {
                return Ok(());
            }
            let role_ns = if role_kind == "Role" { namespace } else { None };
            let info = krust_api::registry::find(GROUP, "v1", role_plural)
                .ok_or_else(|| ApiError::internal("RBAC kinds missing from the registry"))?;
            let role = scope
                .cache
                .cache(&info.storage_prefix())
                .and_then(|c| c.get(&info.storage_key(role_ns, role_name)))
                .ok_or_else(|| {
                    ApiError::not_found(ErrorTarget {
                        group: GROUP,
                        resource: role_plural,
                        name: role_name,
                    })
                })?;
            let rules: Vec<Rule> =
                serde_json::from_value(role.value()["rules"].clone()).unwrap_or_default();
            confirm_no_escalation(scope, user, namespace, &rules, target)
        }
        _ => Ok(()),
    }
}

/// Whether `user` holds `verb` on the named role resource.
fn may(
    scope: &Scope,
    user: &User,
    verb: &str,
    plural: &str,
    namespace: Option<&str>,
    name: &str,
) -> bool {
    scope
        .authorizers
        .decide(&Attributes {
            user,
            verb,
            target: Target::Resource(ResourceAttributes {
                group: GROUP,
                resource: plural,
                subresource: None,
                namespace,
                name: Some(name),
            }),
        })
        .allowed()
}

fn confirm_no_escalation(
    scope: &Scope,
    user: &User,
    namespace: Option<&str>,
    wanted: &[Rule],
    target: ErrorTarget<'_>,
) -> Result<(), ApiError> {
    let held = scope.rbac.rules_for(user, namespace);
    let held: Vec<&Rule> = held.iter().collect();
    let missing = uncovered(&held, wanted);
    if missing.is_empty() {
        return Ok(());
    }
    let missing: Vec<String> = missing.iter().map(Rule::compact).collect();
    let groups: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
    Err(ApiError::forbidden_for(
        target,
        &format!(
            "user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
            user.name,
            groups.join(" "),
            missing.join("\n")
        ),
    ))
}
