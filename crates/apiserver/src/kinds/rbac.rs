//! Strategy of rbac.authorization.k8s.io: Roles and bindings are named by path segments
//! (`system:node` is a valid name); bindings' checks and columns; and, in their REST
//! storage as upstream's, the refusal of writes that would escalate privileges.

use krust_api::status::{ApiError, Cause};
use serde_json::{Value, json};

use super::Strategy;
use crate::rest::{Call, Storage};
use crate::table::{AGE, Column};
use crate::validation::NameRule;

/// RBAC's storage checks every write of a role or binding, on the object admission
/// made, against what the writer holds (`crate::authz::escalation`).
pub struct EscalationCheck;

#[async_trait::async_trait]
impl Storage for EscalationCheck {
    async fn begin_create(&self, call: &Call<'_>, obj: &mut Value) -> Result<(), ApiError> {
        crate::authz::escalation::check(call.scope, &call.user, call.kind.info.plural, obj)
    }

    async fn begin_update(
        &self,
        call: &Call<'_>,
        new: &mut Value,
        _old: &Value,
    ) -> Result<(), ApiError> {
        crate::authz::escalation::check(call.scope, &call.user, call.kind.info.plural, new)
    }
}

pub struct Role;
pub static ROLE: Role = Role;
impl Strategy for Role {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }
}

pub struct RoleBinding;
pub static ROLE_BINDING: RoleBinding = RoleBinding;
impl Strategy for RoleBinding {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let kind = &obj["roleRef"]["kind"];
        if !["Role", "ClusterRole"].contains(&kind.as_str().unwrap_or_default()) {
            errs.push(Cause::not_supported(
                "roleRef.kind",
                kind,
                &["Role", "ClusterRole"],
            ));
        }
        if obj["roleRef"]["name"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required("roleRef.name"));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        if new["roleRef"] != old["roleRef"] {
            errs.push(Cause::invalid(
                "roleRef",
                &new["roleRef"],
                "cannot change roleRef",
            ));
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Role",
                ty: "string",
                priority: 0,
                description: "Role is the role that this binding refers to.",
                cell: &|o| {
                    json!(format!(
                        "{}/{}",
                        o["roleRef"]["kind"].as_str().unwrap_or_default(),
                        o["roleRef"]["name"].as_str().unwrap_or_default()
                    ))
                },
            },
            AGE,
            Column {
                name: "Users",
                ty: "string",
                priority: 1,
                description: "Users in the binding.",
                cell: &|o| subjects(o, "User"),
            },
            Column {
                name: "Groups",
                ty: "string",
                priority: 1,
                description: "Groups in the binding.",
                cell: &|o| subjects(o, "Group"),
            },
            Column {
                name: "ServiceAccounts",
                ty: "string",
                priority: 1,
                description: "ServiceAccounts in the binding.",
                cell: &|o| subjects(o, "ServiceAccount"),
            },
        ];
        C
    }
}

fn subjects(o: &Value, kind: &str) -> Value {
    let names: Vec<String> = o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .map(|s| match s["namespace"].as_str() {
            Some(ns) if kind == "ServiceAccount" => {
                format!("{ns}/{}", s["name"].as_str().unwrap_or_default())
            }
            _ => s["name"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    json!(names.join(", "))
}
