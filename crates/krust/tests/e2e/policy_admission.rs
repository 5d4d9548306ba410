//! Policy admission through the real kubectl. PodSecurity: a namespace's labels choose
//! the level; `enforce` refuses violating pods with upstream's message, `warn` lets them
//! in with a warning, workloads only ever get warnings, and labelling a namespace warns
//! about the pods already running there. LimitRanger: a namespace's LimitRanges default
//! and bound containers' requests and limits. ResourceQuota: admission charges writes
//! to `status.used` and refuses what would pass `hard`; the quota controller counts
//! usage and gives back what deleted objects held.

use crate::common;
use crate::common::Server;
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
        refused.contains(r#"pods "big" is forbidden: [minimum cpu usage per Container is 100m, but request is 50m, maximum memory usage per Container is 1Gi, but limit is 2Gi]"#),
        "{refused}"
    );
}

fn quota_status(s: &Server, name: &str) -> serde_json::Value {
    s.get_json(&["resourcequota", name])["status"].clone()
}

/// Waits until the quota controller reports `used` for the quota.
fn wait_for_used(s: &Server, name: &str, used: serde_json::Value) {
    common::wait_for(
        &format!("quota {name} used {used}"),
        std::time::Duration::from_secs(20),
        || (quota_status(s, name)["used"] == used).then_some(()),
    );
}

fn pod_asking(name: &str, cpu: Option<&str>) -> String {
    let resources = match cpu {
        Some(cpu) => json!({"requests": {"cpu": cpu}}),
        None => json!({}),
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "busybox", "resources": resources}]}})
    .to_string()
}

#[test]
fn resource_quotas_refuse_what_exceeds_them_and_recount_what_is_freed() {
    let s = Server::start();
    s.ok(&[
        "create",
        "quota",
        "q",
        "--hard=pods=3,requests.cpu=1,services=2,count/deployments.apps=1",
    ]);
    // Until the controller has counted, nothing it limits is admitted. The namespace
    // holds one Service already: `kubernetes`.
    wait_for_used(
        &s,
        "q",
        json!({"count/deployments.apps": "0", "pods": "0", "requests.cpu": "0", "services": "1"}),
    );
    assert_eq!(
        quota_status(&s, "q")["hard"],
        json!({"count/deployments.apps": "1", "pods": "3", "requests.cpu": "1", "services": "2"})
    );
    // A cpu quota needs every container to ask for cpu.
    let refused = s.fails_stdin(&["create", "-f", "-"], &pod_asking("bare", None));
    assert!(
        refused.contains(
            r#"pods "bare" is forbidden: failed quota: q: must specify requests.cpu for: app"#
        ),
        "{refused}"
    );
    for name in ["p1", "p2", "p3"] {
        s.ok_stdin(&["create", "-f", "-"], &pod_asking(name, Some("200m")));
    }
    let status = quota_status(&s, "q");
    assert_eq!(status["used"]["pods"], "3");
    assert_eq!(status["used"]["requests.cpu"], "600m");
    // The fourth pod: upstream's message. A server-side dry run is refused alike and
    // charges nothing.
    let expected = r#"pods "p4" is forbidden: exceeded quota: q, requested: pods=1, used: pods=3, limited: pods=3"#;
    let refused = s.fails_stdin(&["create", "-f", "-"], &pod_asking("p4", Some("100m")));
    assert!(refused.contains(expected), "{refused}");
    let refused = s.fails_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &pod_asking("p4", Some("100m")),
    );
    assert!(refused.contains(expected), "{refused}");
    // Deleting a pod gives its share back once the controller recounts.
    s.ok(&["delete", "pod", "p1", "--wait=false"]);
    common::wait_for("p1 gone", std::time::Duration::from_secs(20), || {
        let out = s.kubectl(&["get", "pod", "p1"]);
        (!out.status.success()).then_some(())
    });
    wait_for_used(
        &s,
        "q",
        json!({"count/deployments.apps": "0", "pods": "2", "requests.cpu": "400m", "services": "1"}),
    );
    // Now the cpu is what runs out.
    let refused = s.fails_stdin(&["create", "-f", "-"], &pod_asking("p4", Some("700m")));
    assert!(
        refused.contains(r#"exceeded quota: q, requested: requests.cpu=700m, used: requests.cpu=400m, limited: requests.cpu=1"#),
        "{refused}"
    );
    s.ok_stdin(&["create", "-f", "-"], &pod_asking("p4", Some("600m")));

    // Object counts: Services, and any resource through count/<resource>.<group>.
    s.ok(&["create", "service", "clusterip", "a", "--tcp=80:80"]);
    let refused = s.fails(&["create", "service", "clusterip", "b", "--tcp=80:80"]);
    assert!(
        refused.contains(r#"services "b" is forbidden: exceeded quota: q, requested: services=1, used: services=2, limited: services=2"#),
        "{refused}"
    );
    s.ok(&[
        "create",
        "deployment",
        "d1",
        "--image=busybox",
        "--replicas=0",
    ]);
    let refused = s.fails(&[
        "create",
        "deployment",
        "d2",
        "--image=busybox",
        "--replicas=0",
    ]);
    assert!(
        refused.contains(r#"deployments.apps "d2" is forbidden: exceeded quota: q, requested: count/deployments.apps=1, used: count/deployments.apps=1, limited: count/deployments.apps=1"#),
        "{refused}"
    );
    // A refused write leaves no object behind and the quota as it was.
    assert!(!s.kubectl(&["get", "deployment", "d2"]).status.success());
    assert_eq!(
        quota_status(&s, "q")["used"],
        json!({"count/deployments.apps": "1", "pods": "3", "requests.cpu": "1", "services": "2"})
    );
    // Raising the limit takes effect once the controller copied it to status.hard.
    s.ok(&[
        "patch",
        "quota",
        "q",
        "-p",
        r#"{"spec":{"hard":{"services":"3"}}}"#,
    ]);
    common::wait_for(
        "services limit raised",
        std::time::Duration::from_secs(20),
        || (quota_status(&s, "q")["hard"]["services"] == "3").then_some(()),
    );
    s.ok(&["create", "service", "clusterip", "b", "--tcp=80:80"]);
}

#[test]
fn concurrent_writes_never_take_a_quota_past_its_limit() {
    // No controller: the quota's status is set by hand, so only admission counts.
    let s = Server::apiserver(&[]);
    s.ok(&["create", "quota", "five", "--hard=configmaps=5"]);
    s.ok(&[
        "patch",
        "quota",
        "five",
        "--subresource=status",
        "-p",
        r#"{"status":{"hard":{"configmaps":"5"},"used":{"configmaps":"0"}}}"#,
    ]);
    let admitted = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..12)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    s.kubectl(&["create", "configmap", &format!("c{i}")])
                        .status
                        .success()
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().expect("writer"))
            .filter(|admitted| *admitted)
            .count()
    });
    assert_eq!(admitted, 5);
    assert_eq!(quota_status(&s, "five")["used"], json!({"configmaps": "5"}));
    let stored = s.get_json(&["configmaps"]);
    assert_eq!(stored["items"].as_array().map(Vec::len), Some(5));
}
