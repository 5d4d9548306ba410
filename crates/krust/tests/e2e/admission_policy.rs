//! ValidatingAdmissionPolicy through the real kubectl: a policy bound with Deny refuses
//! what its CEL validations reject (message, messageExpression, reason), with
//! parameters from a ConfigMap the binding names and variables; Warn only warns;
//! matchConstraints, the binding's matchResources and matchConditions decide what is
//! checked; a binding whose parameters are missing denies.

use crate::common::Server;
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

#[test]
fn validating_admission_policies_deny_and_warn_with_params_and_variables() {
    let s = Server::apiserver(&[]);
    s.ok(&["create", "namespace", "policed"]);
    s.ok(&["label", "namespace", "policed", "policed=yes"]);
    s.ok(&["create", "namespace", "free"]);
    s.ok(&[
        "create",
        "configmap",
        "replica-limit",
        "-n",
        "default",
        "--from-literal=maxReplicas=3",
    ]);
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
