//! PodSecurity: the Pod Security Standards a namespace asks for with its
//! `pod-security.kubernetes.io/` labels, applied to its pods (and, as warnings, to
//! workloads' pod templates); the levels' checks are in `checks`.

mod checks;

use krust_api::status::{ApiError, Cause, Target};
use serde_json::{Value, json};

use crate::admission::{Attributes, Operation, Plugin};
use crate::rest::Call;

pub struct PodSecurity;

#[async_trait::async_trait]
impl Plugin for PodSecurity {
    fn name(&self) -> &'static str {
        "PodSecurity"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        let group = a.call.kind.info.group;
        match a.operation {
            Operation::Create => a.is("", "namespaces") || ["", "apps", "batch"].contains(&group),
            // Pods' specs hardly change after creation; workloads' templates do.
            Operation::Update => {
                a.is("", "namespaces")
                    || (!a.is("", "pods")
                        && a.subresource().is_none()
                        && ["", "apps", "batch"].contains(&group))
            }
            Operation::Delete | Operation::Connect => false,
        }
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        if a.is("", "namespaces") {
            namespace_pod_security(a.call, obj, a.old)
        } else {
            pod_security(a.call, obj)
        }
    }
}

/// PodSecurity for a pod or a workload's pod template: a pod violating its namespace's
/// `enforce` level is refused; violating the `audit` level annotates the request's audit
/// events; violating the `warn` level adds a warning.
fn pod_security(call: &Call<'_>, obj: &Value) -> Result<(), ApiError> {
    use checks::{Policy, pod_spec, violations};
    let info = call.kind.info;
    let Some(spec) = pod_spec(info.kind, obj) else {
        return Ok(());
    };
    let Some(namespace) = call
        .namespace()
        .and_then(|ns| call.scope.cache.core_object("namespaces", None, ns))
    else {
        return Ok(());
    };
    if info.kind == "Pod"
        && let Some(policy) = Policy::of(&namespace, "audit")
    {
        let found = violations(spec, policy.level);
        if !found.is_empty() {
            call.audit.add(
                "pod-security.kubernetes.io/audit-violations",
                format!(
                    "would violate PodSecurity {:?}: {}",
                    policy.describe(),
                    found.join(", ")
                ),
            );
        }
    }
    let enforce = Policy::of(&namespace, "enforce");
    if info.kind == "Pod" {
        // Unlabelled namespaces enforce privileged:latest, which allows everything.
        let described = enforce.as_ref().map(Policy::describe);
        call.audit.add(
            "pod-security.kubernetes.io/enforce-policy",
            described.unwrap_or_else(|| "privileged:latest".into()),
        );
    }
    if info.kind == "Pod"
        && let Some(policy) = enforce
    {
        let found = violations(spec, policy.level);
        if !found.is_empty() {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::forbidden_for(
                Target {
                    group: "",
                    resource: "pods",
                    name,
                },
                &format!(
                    "violates PodSecurity {:?}: {}",
                    policy.describe(),
                    found.join(", ")
                ),
            ));
        }
    }
    if let Some(policy) = Policy::of(&namespace, "warn") {
        let found = violations(spec, policy.level);
        if !found.is_empty() {
            call.warnings.add(format!(
                "would violate PodSecurity {:?}: {}",
                policy.describe(),
                found.join(", ")
            ));
        }
    }
    Ok(())
}

/// A namespace's PodSecurity labels must name levels and versions; a new `enforce`
/// level warns about the namespace's pods that violate it, as upstream.
fn namespace_pod_security(
    call: &Call<'_>,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    use checks::{Policy, invalid_labels, violations};
    let name = new["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = invalid_labels(&new["metadata"]["labels"]);
    if !invalid.is_empty() {
        let causes = invalid
            .iter()
            .map(|(label, value, allowed)| {
                Cause::invalid(
                    format!("metadata.labels[{label}]"),
                    &json!(value),
                    format!("must be one of {allowed}"),
                )
            })
            .collect();
        return Err(ApiError::invalid("Namespace", "", name, causes));
    }
    let Some(policy) = Policy::of(new, "enforce") else {
        return Ok(());
    };
    if old.and_then(|old| Policy::of(old, "enforce")).as_ref() == Some(&policy) {
        return Ok(());
    }
    let Some(pods) = call.scope.cache.cache("/registry/pods/") else {
        return Ok(());
    };
    let mut offenders = Vec::new();
    for pod in pods.list(&format!("/registry/pods/{name}/")).0 {
        let pod = pod.value();
        let reasons: Vec<String> = violations(&pod["spec"], policy.level)
            .iter()
            .map(|v| v.split(" (").next().unwrap_or_default().to_string())
            .collect();
        if !reasons.is_empty() {
            let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
            offenders.push(format!("{pod_name}: {}", reasons.join(", ")));
        }
    }
    if !offenders.is_empty() {
        call.warnings.add(format!(
            "existing pods in namespace {name:?} violate the new PodSecurity enforce level {:?}",
            policy.describe()
        ));
        offenders.into_iter().for_each(|o| call.warnings.add(o));
    }
    Ok(())
}
