//! Service-account tokens: `kubectl create token` (serviceaccounts/token) issues a JWT
//! the apiserver accepts as the service account while the account (and a bound pod)
//! exists; a pod's projected serviceAccountToken volume holds one the kubelet fetched,
//! and pods get that volume (`kube-api-access-*`) by themselves unless they opt out.
//! Static tokens (`--token-auth-file`) and client certificates of another CA
//! (`--client-ca-file`) authenticate as upstream's flags make them.

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
    let (code, user) = user_info(s, token);
    (
        code,
        user["username"].as_str().unwrap_or_default().to_string(),
    )
}

/// The status code and the `userInfo` a SelfSubjectReview answers for a bearer token.
fn user_info(s: &Server, token: &str) -> (u16, Value) {
    let (code, review) = s.curl_as(
        false,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &[
            format!("Authorization: Bearer {}", token.trim()),
            "Content-Type: application/json".into(),
        ],
        Some(SELF_SUBJECT_REVIEW),
    );
    (code, review["status"]["userInfo"].clone())
}

const SELF_SUBJECT_REVIEW: &[u8] =
    br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;

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

/// Runs openssl with these (space-separated) arguments; panics with its output if it
/// fails.
fn openssl(dir: &std::path::Path, args: &str) {
    let out = std::process::Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_token_file_and_a_second_client_ca_authenticate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "static-secret,alice,1001,\"team-a,team-b\"\nplain-secret,bob,1002\n",
    )
    .expect("writing the token file");
    // A CA of the user's own and a client certificate it signed for carol in team-c.
    let p = dir.path();
    openssl(
        p,
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -subj /CN=other-ca -days 1",
    );
    openssl(
        p,
        "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout carol.key -out carol.csr -subj /CN=carol/O=team-c",
    );
    std::fs::write(
        p.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("writing the extensions");
    openssl(
        p,
        "x509 -req -in carol.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out carol.crt -days 1 -extfile client.ext",
    );

    let s = Server::apiserver(&[
        "--token-auth-file",
        tokens.to_str().unwrap(),
        "--client-ca-file",
        p.join("ca.crt").to_str().unwrap(),
    ]);
    let (code, alice) = user_info(&s, "static-secret");
    assert_eq!(code, 201, "{alice}");
    assert_eq!(alice["username"], "alice");
    assert_eq!(
        alice["groups"],
        json!(["team-a", "team-b", "system:authenticated"])
    );
    assert_eq!(whoami(&s, "plain-secret"), (201, "bob".to_string()));
    assert_eq!(whoami(&s, "no-such-secret").0, 401);

    let out = std::process::Command::new("curl")
        .args(["-sS", "-X", "POST", "-H", "Content-Type: application/json"])
        .arg("--cacert")
        .arg(s.tls().join("ca.crt"))
        .arg("--cert")
        .arg(p.join("carol.crt"))
        .arg("--key")
        .arg(p.join("carol.key"))
        .arg("--data-binary")
        .arg(std::str::from_utf8(SELF_SUBJECT_REVIEW).unwrap())
        .arg(format!(
            "https://127.0.0.1:{}/apis/authentication.k8s.io/v1/selfsubjectreviews",
            s.port
        ))
        .output()
        .expect("running curl");
    let review: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let carol = &review["status"]["userInfo"];
    assert_eq!(carol["username"], "carol", "{review}");
    assert_eq!(carol["groups"], json!(["team-c", "system:authenticated"]));
}
