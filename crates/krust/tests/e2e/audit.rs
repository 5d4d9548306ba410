//! The audit log through a real krust and kubectl: the policy's first matching rule
//! picks each request's level (None, Metadata, Request, RequestResponse); events are
//! upstream's audit.k8s.io/v1 JSON lines, one per stage, with who asked (and whom they
//! impersonated), what, the authorizer's decision, PodSecurity's audit annotations and
//! the outcome.

use crate::common;
use std::time::Duration;

use crate::common::Server;
use serde_json::Value;

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*"]
  - level: RequestResponse
    nonResourceURLs: ["/version"]
  - level: None
    resources:
      - group: coordination.k8s.io
  - level: Metadata
    resources:
      - group: ""
        resources: [secrets]
  - level: RequestResponse
    resources:
      - group: ""
        resources: [configmaps]
  - level: Request
    verbs: [create]
  - level: Metadata
"#;

fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON event"))
        .collect()
}

/// Waits for an event matching `pred`.
fn find(path: &std::path::Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    common::wait_for(what, Duration::from_secs(10), || {
        events(path).into_iter().find(|e| pred(e))
    })
}

fn is(e: &Value, verb: &str, resource: &str, name: &str, stage: &str) -> bool {
    e["verb"] == verb
        && e["objectRef"]["resource"] == resource
        && e["objectRef"]["name"] == name
        && e["stage"] == stage
}

#[test]
fn requests_are_audited_at_the_level_their_first_matching_rule_gives() {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("writing the policy");
    let log = dir.path().join("logs/audit.log");
    let s = Server::apiserver(&[
        &format!("--audit-policy-file={}", policy.display()),
        &format!("--audit-log-path={}", log.display()),
    ]);

    // Metadata: who, what, the decision and the outcome; never the Secret's data.
    s.ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=password=hunter2",
    ]);
    let secret = find(&log, "secret create", |e| {
        is(e, "create", "secrets", "s", "ResponseComplete")
    });
    assert_eq!(secret["kind"], "Event");
    assert_eq!(secret["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(secret["level"], "Metadata");
    assert_eq!(secret["objectRef"]["namespace"], "default");
    assert_eq!(secret["objectRef"]["apiVersion"], "v1");
    assert_eq!(secret["responseStatus"]["code"], 201);
    assert!(
        secret["user"]["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == "system:masters")),
        "{secret}"
    );
    assert_eq!(
        secret["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    assert!(secret["sourceIPs"][0] == "127.0.0.1", "{secret}");
    assert!(
        secret["userAgent"]
            .as_str()
            .unwrap_or_default()
            .starts_with("kubectl")
    );
    assert!(secret.get("requestObject").is_none());
    assert!(
        !serde_json::to_string(&secret)
            .unwrap()
            .contains("aHVudGVyMg")
    );
    let stamp = secret["stageTimestamp"].as_str().unwrap_or_default();
    assert!(stamp.ends_with('Z') && stamp.contains('.'), "{stamp}");
    // omitStages: no RequestReceived events at all.
    assert!(events(&log).iter().all(|e| e["stage"] != "RequestReceived"));

    // RequestResponse: both bodies.
    s.ok(&["create", "configmap", "c", "--from-literal=k=v"]);
    let cm = find(&log, "configmap create", |e| {
        is(e, "create", "configmaps", "c", "ResponseComplete")
    });
    assert_eq!(cm["level"], "RequestResponse");
    assert_eq!(cm["requestObject"]["data"]["k"], "v");
    assert!(cm["responseObject"]["metadata"]["uid"].is_string(), "{cm}");

    // Request: the request body, not the response.
    s.ok(&["create", "serviceaccount", "robot"]);
    let sa = find(&log, "serviceaccount create", |e| {
        is(e, "create", "serviceaccounts", "robot", "ResponseComplete")
    });
    assert_eq!(sa["level"], "Request");
    assert_eq!(sa["requestObject"]["metadata"]["name"], "robot");
    assert!(sa.get("responseObject").is_none());

    // PodSecurity's audit mode annotates the events of pods that violate the level.
    s.ok(&[
        "label",
        "namespace",
        "default",
        "pod-security.kubernetes.io/audit=restricted",
    ]);
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "app", "image": "busybox",
            "securityContext": {"privileged": true}}]}});
    s.ok_stdin(&["create", "-f", "-"], &pod.to_string());
    let created = find(&log, "pod create", |e| {
        is(e, "create", "pods", "root", "ResponseComplete")
    });
    let annotations = &created["annotations"];
    assert_eq!(
        annotations["pod-security.kubernetes.io/enforce-policy"],
        "privileged:latest"
    );
    let violations = annotations["pod-security.kubernetes.io/audit-violations"]
        .as_str()
        .unwrap_or_default();
    assert!(
        violations.starts_with(
            r#"would violate PodSecurity "restricted:latest": privileged (container "app" must not set securityContext.privileged=true)"#
        ),
        "{created}"
    );

    // A refusal while impersonating: both users, the decision, upstream's Status.
    let refused = s.fails(&["get", "pods", "--as=alice"]);
    assert!(refused.contains("forbidden"), "{refused}");
    let denied = find(&log, "forbidden list", |e| {
        e["verb"] == "list" && e["impersonatedUser"]["username"] == "alice"
    });
    assert_eq!(denied["responseStatus"]["code"], 403);
    assert_eq!(denied["responseStatus"]["reason"], "Forbidden");
    assert_eq!(denied["responseStatus"]["status"], "Failure");
    assert_eq!(
        denied["annotations"]["authorization.k8s.io/decision"],
        "forbid"
    );
    assert_ne!(denied["user"]["username"], "alice");

    // A watch: ResponseStarted when it begins, ResponseComplete when it ends, one ID.
    let _ = s.kubectl(&["get", "configmaps", "--watch", "--request-timeout=1s"]);
    let started = find(&log, "watch started", |e| {
        e["verb"] == "watch" && e["stage"] == "ResponseStarted"
    });
    let id = started["auditID"]
        .as_str()
        .expect("an audit ID")
        .to_string();
    assert_eq!(id.len(), 36, "{id}");
    let completed = find(&log, "watch complete", |e| {
        e["auditID"] == id.as_str() && e["stage"] == "ResponseComplete"
    });
    assert!(completed.get("responseObject").is_none());

    // A non-resource answer is no object: logged without it, at any level.
    s.ok(&["get", "--raw", "/version"]);
    let version = find(&log, "/version", |e| {
        e["requestURI"] == "/version" && e["stage"] == "ResponseComplete"
    });
    assert_eq!(version["level"], "RequestResponse");
    assert!(version.get("responseObject").is_none(), "{version}");

    // Level None: health checks and leases leave no trace.
    s.ok(&["get", "--raw", "/healthz"]);
    s.ok(&["get", "leases", "-A"]);
    std::thread::sleep(Duration::from_millis(300));
    let all = events(&log);
    assert!(all.iter().all(|e| {
        !e["requestURI"]
            .as_str()
            .unwrap_or_default()
            .starts_with("/healthz")
            && e["objectRef"]["apiGroup"] != "coordination.k8s.io"
    }));
}
