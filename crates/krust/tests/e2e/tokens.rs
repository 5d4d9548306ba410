//! Service-account tokens: `kubectl create token` (serviceaccounts/token) issues a JWT
//! the apiserver accepts as the service account while the account (and a bound pod)
//! exists; a pod's projected serviceAccountToken volume holds one the kubelet fetched,
//! and pods get that volume (`kube-api-access-*`) by themselves unless they opt out.

use std::time::Duration;

use crate::common::{Server, wait_for};
use serde_json::{Value, json};

/// GET `path` with only a bearer token (no client certificate): the status code.
fn with_token(s: &Server, token: &str, path: &str) -> (u16, Value) {
    s.curl_as(
        false,
        "GET",
        path,
        &[format!("Authorization: Bearer {}", token.trim())],
        None,
    )
}

/// Whom the apiserver takes a token for (a SelfSubjectReview, `kubectl auth whoami`):
/// the status code and user name.
fn whoami(s: &Server, token: &str) -> (u16, String) {
    let (code, review) = s.curl_as(
        false,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &[
            format!("Authorization: Bearer {}", token.trim()),
            "Content-Type: application/json".into(),
        ],
        Some(br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#),
    );
    let name = review["status"]["userInfo"]["username"]
        .as_str()
        .unwrap_or_default();
    (code, name.to_string())
}

#[test]
fn token_requests_issue_tokens_the_apiserver_accepts_while_their_account_exists() {
    let s = Server::apiserver(&[]);
    s.ok(&["create", "serviceaccount", "robot"]);
    let token = s.ok(&["create", "token", "robot"]);
    assert_eq!(token.trim().split('.').count(), 3, "a JWT: {token}");
    assert_eq!(
        whoami(&s, &token),
        (201, "system:serviceaccount:default:robot".to_string())
    );
    // The account may do only what it is bound to.
    let (code, denied) = with_token(&s, &token, "/api/v1/namespaces/default/pods");
    assert_eq!(code, 403, "{denied}");
    assert_eq!(
        denied["message"],
        "pods is forbidden: User \"system:serviceaccount:default:robot\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    s.ok(&[
        "create",
        "role",
        "pod-reader",
        "--verb=list",
        "--resource=pods",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "robot-reads-pods",
        "--role=pod-reader",
        "--serviceaccount=default:robot",
    ]);
    let (code, pods) = with_token(&s, &token, "/api/v1/namespaces/default/pods");
    assert_eq!(code, 200, "{pods}");
    assert_eq!(pods["kind"], "PodList");

    // The request object as upstream answers it.
    let (code, answer) = s.curl(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/robot/token",
        Some("application/json"),
        Some(br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":7200}}"#),
    );
    assert_eq!(code, 201, "{answer}");
    assert_eq!(answer["kind"], "TokenRequest");
    assert_eq!(answer["spec"]["expirationSeconds"], 7200);
    assert_eq!(
        answer["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert!(answer["status"]["expirationTimestamp"].is_string());

    // Too short a lifetime, an unknown account, another audience, a forged token.
    let short = s.fails(&["create", "token", "robot", "--duration=5m"]);
    assert!(
        short.contains("may not specify a duration less than 10 minutes"),
        "{short}"
    );
    let missing = s.fails(&["create", "token", "nobody"]);
    assert!(
        missing.contains("serviceaccounts \"nobody\" not found"),
        "{missing}"
    );
    let vault = s.ok(&["create", "token", "robot", "--audience=vault"]);
    assert_eq!(with_token(&s, &vault, "/api/v1/namespaces").0, 401);
    assert_eq!(with_token(&s, "not.a.token", "/api/v1/namespaces").0, 401);

    // Bound to a pod: valid while the pod exists.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder"},
            "spec": {"serviceAccountName": "robot", "containers": [{"name": "c", "image": "busybox"}]}})
        .to_string(),
    );
    let bound = s.ok(&[
        "create",
        "token",
        "robot",
        "--bound-object-kind=Pod",
        "--bound-object-name=holder",
    ]);
    assert_eq!(whoami(&s, &bound).0, 201);
    s.ok(&["delete", "pod", "holder", "--grace-period=0", "--force"]);
    assert_eq!(with_token(&s, &bound, "/api/v1/namespaces").0, 401);

    // Deleting the account ends its tokens.
    s.ok(&["delete", "serviceaccount", "robot"]);
    assert_eq!(with_token(&s, &token, "/api/v1/namespaces").0, 401);
}

#[test]
fn projected_service_account_tokens_reach_containers() {
    let s = Server::with_agent(&["--cluster-cidr=10.73.0.0/16"]);
    wait_for(
        "the default service account",
        Duration::from_secs(30),
        || {
            s.kubectl(&["get", "serviceaccount", "default"])
                .status
                .success()
                .then_some(())
        },
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
            "spec": {"terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "api", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}],
                "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}]}})
        .to_string(),
    );
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=60s",
    ]);
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let token = s.ok(&["exec", "client", "--", "cat", &format!("{dir}/token")]);
    assert_eq!(
        s.ok(&["exec", "client", "--", "cat", &format!("{dir}/namespace")]),
        "default"
    );
    let ca = s.ok(&["exec", "client", "--", "cat", &format!("{dir}/ca.crt")]);
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    // The apiserver takes it as the pod's service account, bound to the pod; an account
    // bound to nothing may read nothing.
    assert_eq!(
        whoami(&s, &token),
        (201, "system:serviceaccount:default:default".to_string())
    );
    let (code, me) = with_token(&s, &token, "/api/v1/namespaces/default/pods/client");
    assert_eq!(code, 403, "{me}");
    s.ok(&["delete", "pod", "client", "--timeout=60s"]);
    assert_eq!(with_token(&s, &token, "/api/v1/namespaces").0, 401);

    // Without a volume of its own, a pod gets upstream's kube-api-access volume.
    s.ok(&[
        "run",
        "auto",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sleep",
        "3600",
    ]);
    let spec = s.get_json(&["pod", "auto"])["spec"].clone();
    assert_eq!(spec["serviceAccountName"], "default");
    let volume = spec["volumes"][0]["name"].as_str().unwrap().to_string();
    assert!(volume.starts_with("kube-api-access-"), "{spec}");
    assert_eq!(
        spec["containers"][0]["volumeMounts"][0],
        json!({"name": volume, "readOnly": true, "mountPath": dir})
    );
    s.ok(&["wait", "--for=condition=Ready", "pod/auto", "--timeout=60s"]);
    let token = s.ok(&["exec", "auto", "--", "cat", &format!("{dir}/token")]);
    assert_eq!(whoami(&s, &token).0, 201);
    // Opting out leaves the pod alone.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "optout"},
            "spec": {"automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}})
        .to_string(),
    );
    let spec = s.get_json(&["pod", "optout"])["spec"].clone();
    assert!(spec.get("volumes").is_none(), "{spec}");
    assert!(
        spec["containers"][0].get("volumeMounts").is_none(),
        "{spec}"
    );
}
