//! ValidatingAdmissionPolicy through the real kubectl: a policy bound with Deny refuses
//! what its CEL validations reject (message, messageExpression, reason), with
//! parameters from a ConfigMap the binding names and variables; Warn only warns;
//! matchConstraints, the binding's matchResources and matchConditions decide what is
//! checked; a binding whose parameters are missing denies.

use crate::common::{AuditLog, Server};
use serde_json::{Value, json};

fn policy(name: &str, validations: Value) -> String {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
            "matchConditions": [{"name": "not-exempt",
                "expression": "!has(object.metadata.labels) || !('exempt' in object.metadata.labels)"}],
            "variables": [{"name": "limit", "expression": "int(params.data.maxReplicas)"}],
            "validations": validations
        }
    })
    .to_string()
}

fn binding(name: &str, policy: &str, actions: &[&str], params: &str) -> String {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": actions,
            "paramRef": {"name": params, "namespace": "default", "parameterNotFoundAction": "Deny"},
            "matchResources": {"namespaceSelector": {"matchLabels": {"policed": "yes"}}}}
    })
    .to_string()
}

fn deployment(namespace: &str, name: &str, replicas: i64, labels: Value) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    .to_string()
}

/// The namespace `policed` (labelled for the bindings) and the parameters: at most 3
/// replicas.
fn policed_namespace_and_limit(s: &Server) {
    s.ok(&["create", "namespace", "policed"]);
    s.ok(&["label", "namespace", "policed", "policed=yes"]);
    s.ok(&[
        "create",
        "configmap",
        "replica-limit",
        "-n",
        "default",
        "--from-literal=maxReplicas=3",
    ]);
}

#[test]
fn validating_admission_policies_deny_and_warn_with_params_and_variables() {
    let s = Server::apiserver(&[]);
    policed_namespace_and_limit(&s);
    s.ok(&["create", "namespace", "free"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &policy(
            "replica-limit",
            json!([
                {"expression": "object.spec.replicas <= variables.limit",
                 "messageExpression": "'replicas must be at most ' + string(variables.limit)",
                 "reason": "Forbidden"},
                {"expression": "object.metadata.name.size() <= 8"}
            ]),
        ),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &binding("replica-limit", "replica-limit", &["Deny"], "replica-limit"),
    );

    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &deployment("policed", "web", 5, json!({})),
    );
    assert!(
        err.contains("Error from server (Forbidden)")
            && err.contains("ValidatingAdmissionPolicy 'replica-limit' with binding 'replica-limit' denied request: replicas must be at most 3"),
        "{err}"
    );
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &deployment("policed", "much-too-long", 1, json!({})),
    );
    assert!(
        err.contains("The request is invalid")
            && err.contains("denied request: failed expression: object.metadata.name.size() <= 8"),
        "{err}"
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &deployment("policed", "web", 3, json!({})),
    );
    // Outside the binding's namespaces, and for objects the conditions exempt: unchecked.
    s.ok_stdin(
        &["create", "-f", "-"],
        &deployment("free", "web", 9, json!({})),
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &deployment("policed", "big", 9, json!({"exempt": "yes"})),
    );
    // Warn: the write goes through with the message as a warning.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &binding("replica-limit", "replica-limit", &["Warn"], "replica-limit"),
    );
    let out = s.kubectl_with(
        "kubectl",
        &["create", "-f", "-"],
        Some(&deployment("policed", "warned", 7, json!({}))),
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'replica-limit' with binding 'replica-limit': replicas must be at most 3"),
        "{stderr}"
    );
    // Parameters that are not there deny (parameterNotFoundAction Deny).
    s.ok_stdin(
        &["apply", "-f", "-"],
        &binding("replica-limit", "replica-limit", &["Deny"], "missing"),
    );
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &deployment("policed", "lost", 1, json!({})),
    );
    assert!(err.contains("no params found for policy binding"), "{err}");

    // Bad policies and bindings are refused.
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &policy("broken", json!([{"expression": "object.spec.replicas <"}])),
    );
    assert!(
        err.contains("spec.validations[0].expression: Invalid value: \"object.spec.replicas <\": compilation failed"),
        "{err}"
    );
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &binding("both", "replica-limit", &["Deny", "Warn"], "replica-limit"),
    );
    assert!(err.contains("must not contain both Deny and Warn"), "{err}");
    let listed = s.ok(&[
        "get",
        "validatingadmissionpolicies,validatingadmissionpolicybindings",
    ]);
    assert!(listed.contains("replica-limit"), "{listed}");
}

/// Upstream's documented example: the parameters are objects of a custom kind made
/// for them; Kubernetes' CEL libraries (regex, quantity) are there to use.
#[test]
fn a_policy_takes_its_parameters_from_a_custom_kind() {
    let s = Server::apiserver(&[]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "replicalimits.rules.example.com"},
            "spec": {"group": "rules.example.com", "scope": "Namespaced",
                "names": {"plural": "replicalimits", "singular": "replicalimit", "kind": "ReplicaLimit"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "maxReplicas": {"type": "integer"}, "maxMemory": {"type": "string"}}}}}]}
        })
        .to_string(),
    );
    s.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/replicalimits.rules.example.com",
        "--timeout=30s",
    ]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "rules.example.com/v1", "kind": "ReplicaLimit",
            "metadata": {"name": "limit", "namespace": "default"},
            "maxReplicas": 2, "maxMemory": "1Gi"})
        .to_string(),
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "limits"},
            "spec": {
                "paramKind": {"apiVersion": "rules.example.com/v1", "kind": "ReplicaLimit"},
                "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["deployments"]}]},
                "validations": [
                    {"expression": "object.spec.replicas <= params.maxReplicas",
                     "messageExpression": "'at most ' + string(params.maxReplicas) + ' replicas'"},
                    {"expression": "object.metadata.name.findAll('[0-9]').size() == 0",
                     "message": "no digits in names"},
                    {"expression": "object.spec.template.spec.containers.all(c, !has(c.resources.limits) || quantity(c.resources.limits.memory).compareTo(quantity(params.maxMemory)) <= 0)",
                     "message": "too much memory"}
                ]
            }
        })
        .to_string(),
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "limits"},
            "spec": {"policyName": "limits", "validationActions": ["Deny"],
                "paramRef": {"name": "limit", "namespace": "default", "parameterNotFoundAction": "Deny"}}
        })
        .to_string(),
    );
    let denied = |name: &str, replicas: i64, memory: &str| {
        let mut d: Value =
            serde_json::from_str(&deployment("default", name, replicas, json!({}))).unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"limits": {"memory": memory}});
        s.fails_stdin(&["create", "-f", "-"], &d.to_string())
    };
    let prefix = "ValidatingAdmissionPolicy 'limits' with binding 'limits' denied request:";
    let err = denied("web", 3, "64Mi");
    assert!(
        err.contains(&format!("{prefix} at most 2 replicas")),
        "{err}"
    );
    let err = denied("web1", 1, "64Mi");
    assert!(
        err.contains(&format!("{prefix} no digits in names")),
        "{err}"
    );
    let err = denied("web", 1, "2Gi");
    assert!(err.contains(&format!("{prefix} too much memory")), "{err}");
    s.ok_stdin(
        &["create", "-f", "-"],
        &deployment("default", "web", 2, json!({})),
    );
}

#[test]
fn audit_actions_and_audit_annotations_go_on_the_audit_events() {
    let audit = AuditLog::new();
    let [policy_flag, log_flag] = audit.flags();
    let s = Server::apiserver(&[&policy_flag, &log_flag]);
    policed_namespace_and_limit(&s);
    let mut audited: Value = serde_json::from_str(&policy(
        "audited",
        json!([{"expression": "object.spec.replicas <= variables.limit",
                "message": "too many replicas"}]),
    ))
    .unwrap();
    audited["spec"]["auditAnnotations"] = json!([
        {"key": "replicas", "valueExpression": "string(object.spec.replicas)"},
        {"key": "skipped", "valueExpression": "null"}
    ]);
    s.ok_stdin(&["apply", "-f", "-"], &audited.to_string());
    s.ok_stdin(
        &["apply", "-f", "-"],
        &binding("audited", "audited", &["Audit"], "replica-limit"),
    );
    // Audit alone lets the request through and says why on its audit events.
    s.ok_stdin(
        &["create", "-f", "-"],
        &deployment("policed", "big", 5, json!({})),
    );
    let event = audit.completed("create", "big");
    let annotations = &event["annotations"];
    assert_eq!(annotations["audited/replicas"], "5", "{event}");
    assert!(annotations["audited/skipped"].is_null(), "{event}");
    let failures: Value = serde_json::from_str(
        annotations["validation.policy.admission.k8s.io/validation_failure"]
            .as_str()
            .expect("the failure annotation"),
    )
    .unwrap();
    assert_eq!(
        failures,
        json!([{"message": "too many replicas", "policy": "audited", "binding": "audited",
                "expressionIndex": 0, "validationActions": ["Audit"]}])
    );
}

#[test]
fn a_policy_sees_the_request_in_the_version_its_rules_name() {
    let s = Server::apiserver(&[]);
    // Rules for autoscaling/v1 only; the validation reads a field only v1 has.
    let policy = |name: &str, match_policy: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"matchPolicy": match_policy,
                    "resourceRules": [{"apiGroups": ["autoscaling"], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["horizontalpodautoscalers"]}]},
                "validations": [{
                    "expression": "!has(object.spec.targetCPUUtilizationPercentage) || object.spec.targetCPUUtilizationPercentage <= 80",
                    "messageExpression": "'at most 80% in ' + request.kind.version + ', asked in ' + request.requestKind.version"
                }]
            }
        })
        .to_string()
    };
    let bind = |name: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}
        })
        .to_string()
    };
    let hpa = |name: &str| {
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "maxReplicas": 4,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": 90}}}]}})
        .to_string()
    };
    // Exact: a v2 request is not what the rules name.
    s.ok_stdin(&["apply", "-f", "-"], &policy("cpu-cap", "Exact"));
    s.ok_stdin(&["apply", "-f", "-"], &bind("cpu-cap"));
    s.ok_stdin(&["create", "-f", "-"], &hpa("exact"));
    // Equivalent (the default): the policy sees the v2 HPA as v1 and refuses it.
    s.ok_stdin(&["apply", "-f", "-"], &policy("cpu-cap", "Equivalent"));
    let err = s.fails_stdin(&["create", "-f", "-"], &hpa("equivalent"));
    assert!(
        err.contains(
            "ValidatingAdmissionPolicy 'cpu-cap' with binding 'cpu-cap' denied request: at most 80% in v1, asked in v2"
        ),
        "{err}"
    );
}
