//! Policy admission through the real kubectl. PodSecurity: a namespace's labels choose
//! the level; `enforce` refuses violating pods with upstream's message, `warn` lets them
//! in with a warning, workloads only ever get warnings, and labelling a namespace warns
//! about the pods already running there. LimitRanger: a namespace's LimitRanges default
//! and bound containers' requests and limits.

mod common;

use common::Server;
use serde_json::json;

fn pod(name: &str, security_context: serde_json::Value) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "busybox", "securityContext": security_context}]}})
    .to_string()
}

const RESTRICTED_VIOLATIONS: &str = r#"privileged (container "app" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (container "app" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "app" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "app" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "app" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#;

#[test]
fn namespace_labels_enforce_and_warn_pod_security_levels() {
    let s = Server::apiserver(&[]);
    s.ok(&["create", "namespace", "locked"]);
    // A pod that exists before the label: labelling warns about it.
    s.ok_stdin(
        &["create", "-n", "locked", "-f", "-"],
        &pod("before", json!({"privileged": true})),
    );
    let out = s.kubectl(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    assert!(out.status.success());
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(
        warned.contains(r#"existing pods in namespace "locked" violate the new PodSecurity enforce level "restricted:latest""#)
            && warned.contains("before: privileged, allowPrivilegeEscalation != false"),
        "{warned}"
    );

    // Enforced: refused with upstream's message.
    let refused = s.fails_stdin(
        &["create", "-n", "locked", "-f", "-"],
        &pod("root", json!({"privileged": true})),
    );
    assert!(
        refused.contains(&format!(
            r#"pods "root" is forbidden: violates PodSecurity "restricted:latest": {RESTRICTED_VIOLATIONS}"#
        )),
        "{refused}"
    );
    // A compliant pod is admitted.
    s.ok_stdin(
        &["create", "-n", "locked", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ok"},
            "spec": {"automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "app", "image": "busybox", "securityContext": {
                    "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}})
        .to_string(),
    );
    // Workloads are never refused; warn mode says what their pods would violate.
    s.ok(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/warn=baseline",
        "pod-security.kubernetes.io/warn-version=v1.33",
    ]);
    let out = s.kubectl_with(
        common::KUBECTL,
        &["create", "-n", "locked", "-f", "-"],
        Some(
            &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"hostNetwork": true, "containers": [{"name": "app", "image": "busybox"}]}}}})
            .to_string(),
        ),
    );
    assert!(out.status.success());
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(
        warned.contains(r#"Warning: would violate PodSecurity "baseline:v1.33": host namespaces (hostNetwork=true)"#),
        "{warned}"
    );

    // Label values are checked.
    let invalid = s.fails(&[
        "label",
        "--overwrite",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=strict",
    ]);
    assert!(
        invalid.contains(r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of privileged, baseline, restricted"#),
        "{invalid}"
    );
}

#[test]
fn limit_ranges_default_and_bound_container_resources() {
    let s = Server::apiserver(&[]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "limits"},
            "spec": {"limits": [{"type": "Container", "default": {"memory": "256Mi"},
                "min": {"cpu": "100m"}, "max": {"memory": "1Gi"}}]}})
        .to_string(),
    );
    // The LimitRange's own defaults, as upstream: request from the min and the limit.
    let range = s.get_json(&["limitrange", "limits"]);
    assert_eq!(
        range["spec"]["limits"][0]["defaultRequest"],
        json!({"cpu": "100m", "memory": "256Mi"})
    );
    s.ok(&["run", "defaulted", "--image=busybox", "--restart=Never"]);
    let pod = s.get_json(&["pod", "defaulted"]);
    let resources = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(
        resources["requests"],
        json!({"cpu": "100m", "memory": "256Mi"})
    );
    assert_eq!(resources["limits"], json!({"memory": "256Mi"}));
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu, memory request for container defaulted; memory limit for container defaulted"
    );
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    let refused = s.fails_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big"},
            "spec": {"containers": [{"name": "app", "image": "busybox",
                "resources": {"requests": {"cpu": "50m"}, "limits": {"memory": "2Gi"}}}]}})
        .to_string(),
    );
    assert!(
        refused.contains(r#"pods "big" is forbidden: [minimum cpu usage per Container is 100m, but request is 50m, maximum memory usage per Container is 1Gi, but limit is 2Gi, maximum memory usage per Container is 1Gi, but request is 2Gi]"#),
        "{refused}"
    );
}
