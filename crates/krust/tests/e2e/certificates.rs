//! CertificateSigningRequests with the real kubectl: a request is created (its requester
//! recorded from the caller), approved with `kubectl certificate approve`, issued by the
//! cluster CA, and its certificate then authenticates; denial, a signer's refusal
//! (Failed), upstream's validation messages, the approve permission on signers and the
//! `system:masters` restriction. Also `kubectl get componentstatuses`.

use base64::Engine;
use serde_json::{Value, json};

use crate::common::{Server, wait_for};

/// A PEM private key and a base64 PEM certificate request for `cn` in `orgs`.
fn request(cn: &str, orgs: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    for o in orgs {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *o);
    }
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (
        key.serialize_pem(),
        base64::engine::general_purpose::STANDARD.encode(pem),
    )
}

fn csr(name: &str, request: &str, signer: &str, usages: &[&str]) -> String {
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": request, "signerName": signer, "usages": usages,
            "expirationSeconds": 3600}})
    .to_string()
}

const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

fn condition_column(s: &Server, name: &str) -> String {
    let line = s.ok(&["get", "csr", name, "--no-headers"]);
    line.split_whitespace()
        .last()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn certificate_requests_are_approved_issued_denied_and_refused_as_upstream() {
    let s = Server::start();
    let dir = s.dir.path();

    // Created by the admin, approved, issued by the cluster CA.
    let (key, req) = request("jane", &["dev"]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &csr("jane", &req, CLIENT_SIGNER, &["client auth"]),
    );
    let listed = s.ok(&["get", "csr", "jane"]);
    let mut lines = listed.lines();
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        [
            "NAME",
            "AGE",
            "SIGNERNAME",
            "REQUESTOR",
            "REQUESTEDDURATION",
            "CONDITION"
        ]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        (row[0], row[2], row[3], row[4], row[5]),
        ("jane", CLIENT_SIGNER, "admin", "60m", "Pending"),
        "{listed}"
    );
    assert!(
        s.ok(&["certificate", "approve", "jane"])
            .contains("approved"),
        "approve"
    );
    let issued: Value = wait_for(
        "the certificate to be issued",
        std::time::Duration::from_secs(30),
        || {
            let obj = s.get_json(&["csr", "jane"]);
            obj["status"]["certificate"].is_string().then_some(obj)
        },
    );
    assert_eq!(condition_column(&s, "jane"), "Approved,Issued");
    let approved = &issued["status"]["conditions"][0];
    assert_eq!(approved["type"], "Approved");
    assert_eq!(approved["reason"], "KubectlApprove");
    assert!(approved["lastUpdateTime"].is_string(), "{approved}");
    assert_eq!(issued["spec"]["username"], "admin");

    // The certificate authenticates jane, in her organisation.
    let cert = base64::engine::general_purpose::STANDARD
        .decode(issued["status"]["certificate"].as_str().unwrap())
        .unwrap();
    std::fs::write(dir.join("jane.crt"), &cert).unwrap();
    std::fs::write(dir.join("jane.key"), key).unwrap();
    s.ok(&[
        "config",
        "set-credentials",
        "jane",
        &format!("--client-certificate={}", dir.join("jane.crt").display()),
        &format!("--client-key={}", dir.join("jane.key").display()),
    ]);
    let whoami: Value =
        serde_json::from_str(&s.ok(&["auth", "whoami", "--user", "jane", "-o", "json"])).unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "jane");
    assert_eq!(
        whoami["status"]["userInfo"]["groups"],
        json!(["dev", "system:authenticated"])
    );

    // Denied: never issued, and approval is then refused by kubectl.
    let (_, req) = request("bob", &[]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &csr("bob", &req, CLIENT_SIGNER, &["client auth"]),
    );
    s.ok(&["certificate", "deny", "bob"]);
    assert_eq!(condition_column(&s, "bob"), "Denied");
    let err = s.fails(&["certificate", "approve", "bob"]);
    assert!(err.contains("is already Denied"), "{err}");

    // The signer refuses a usage its certificates may not have.
    let (_, req) = request("srv", &[]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &csr("srv", &req, CLIENT_SIGNER, &["client auth", "server auth"]),
    );
    s.ok(&["certificate", "approve", "srv"]);
    let failed = wait_for(
        "the signer to refuse",
        std::time::Duration::from_secs(30),
        || {
            let obj = s.get_json(&["csr", "srv"]);
            let c = obj["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Failed")?
                .clone();
            Some(c)
        },
    );
    assert_eq!(failed["reason"], "SignerValidationFailure");
    assert_eq!(
        failed["message"],
        "invalid usage for client certificate: server auth"
    );
    assert_eq!(condition_column(&s, "srv"), "Approved,Failed");

    // Upstream's validation messages.
    let bad = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "bad"},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode("not a request"),
            "signerName": "example", "usages": ["flying"], "expirationSeconds": 60}});
    let err = s.fails_stdin(&["create", "-f", "-"], &bad.to_string());
    for expected in [
        "PEM block type must be CERTIFICATE REQUEST",
        "spec.usages[0]: Unsupported value: \"flying\"",
        "spec.signerName: Invalid value: \"example\": must be a fully qualified domain and path of the form 'example.com/signer-name'",
        "spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)",
    ] {
        assert!(err.contains(expected), "{expected:?} in {err}");
    }

    // No client certificate for system:masters through the API.
    let (_, req) = request("root", &["system:masters"]);
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &csr("root", &req, CLIENT_SIGNER, &["client auth"]),
    );
    assert!(
        err.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"),
        "{err}"
    );

    // Jane may update approvals but not approve for this signer: admission refuses.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "csr-editor"},
        "rules": [{"apiGroups": ["certificates.k8s.io"],
            "resources": ["certificatesigningrequests", "certificatesigningrequests/approval"],
            "verbs": ["get", "list", "update"]}]});
    s.ok_stdin(&["create", "-f", "-"], &role.to_string());
    s.ok(&[
        "create",
        "clusterrolebinding",
        "jane-csr",
        "--clusterrole=csr-editor",
        "--user=jane",
    ]);
    let (_, req) = request("carol", &[]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &csr("carol", &req, CLIENT_SIGNER, &["client auth"]),
    );
    let err = s.fails(&["certificate", "approve", "carol", "--user", "jane"]);
    assert!(
        err.contains("certificatesigningrequests.certificates.k8s.io \"carol\" is forbidden: user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client\""),
        "{err}"
    );
    assert_eq!(condition_column(&s, "carol"), "Pending");
}

#[test]
fn component_statuses_report_each_component_by_its_lease() {
    let s = Server::start_with(&["--disable-scheduler"]);
    let rows = wait_for(
        "the controller manager's lease",
        std::time::Duration::from_secs(30),
        || {
            let out = s.ok(&["get", "componentstatuses"]);
            out.contains("controller-manager   Healthy").then_some(out)
        },
    );
    let lines: Vec<Vec<&str>> = rows
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "STATUS", "MESSAGE", "ERROR"]);
    assert_eq!(lines[1][..2], ["scheduler", "Unhealthy"], "{rows}");
    assert!(
        rows.contains("no Lease kube-system/kube-scheduler"),
        "{rows}"
    );
    assert_eq!(lines[2], ["controller-manager", "Healthy", "ok"]);
    assert_eq!(lines[3], ["etcd-0", "Healthy", "ok"]);
    let out = s.kubectl(&["get", "cs", "etcd-0", "-o", "json"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("v1 ComponentStatus is deprecated in v1.19+"),
        "the deprecation warning"
    );
    let one: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        one["conditions"],
        json!([{"type": "Healthy", "status": "True", "message": "ok"}])
    );
    let err = s.fails(&["delete", "cs", "etcd-0"]);
    assert!(
        err.contains("MethodNotAllowed") || err.contains("not allowed"),
        "{err}"
    );
}

/// The `Approved` condition's reason and message, once there.
fn approval(s: &Server, name: &str) -> (String, String) {
    wait_for(
        &format!("{name} to be approved"),
        std::time::Duration::from_secs(30),
        || {
            let obj = s.get_json(&["csr", name]);
            let c = obj["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Approved")?
                .clone();
            Some((
                c["reason"].as_str()?.to_string(),
                c["message"].as_str()?.to_string(),
            ))
        },
    )
}

#[test]
fn kubelet_client_requests_are_approved_after_a_subject_access_review() {
    let s = Server::start();
    let kubelet = |name: &str| {
        let (_, req) = request(&format!("system:node:{name}"), &["system:nodes"]);
        csr(
            name,
            &req,
            "kubernetes.io/kube-apiserver-client-kubelet",
            &["digital signature", "client auth"],
        )
    };
    // A node renewing its own certificate: selfnodeclient, granted to system:nodes.
    s.ok_stdin(
        &[
            "create",
            "-f",
            "-",
            "--as=system:node:n1",
            "--as-group=system:nodes",
        ],
        &kubelet("n1"),
    );
    assert_eq!(
        approval(&s, "n1"),
        (
            "AutoApproved".into(),
            "Auto approving self kubelet client certificate after SubjectAccessReview.".into()
        )
    );
    // Someone allowed to create nodeclient requests (the admin) asking for a node.
    s.ok_stdin(&["create", "-f", "-"], &kubelet("n2"));
    assert_eq!(
        approval(&s, "n2").1,
        "Auto approving kubelet client certificate after SubjectAccessReview."
    );
    wait_for(
        "n2's certificate",
        std::time::Duration::from_secs(30),
        || (condition_column(&s, "n2") == "Approved,Issued").then_some(()),
    );

    // A user who may create requests but neither nodeclient nor selfnodeclient, and a
    // request that breaks the signer's rules, stay Pending.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "csr-creator"},
        "rules": [{"apiGroups": ["certificates.k8s.io"],
            "resources": ["certificatesigningrequests"], "verbs": ["create", "get"]}]});
    s.ok_stdin(&["create", "-f", "-"], &role.to_string());
    s.ok(&[
        "create",
        "clusterrolebinding",
        "mallory",
        "--clusterrole=csr-creator",
        "--user=mallory",
    ]);
    s.ok_stdin(&["create", "-f", "-", "--as=mallory"], &kubelet("n3"));
    let (_, req) = request("system:node:n4", &["system:nodes"]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &csr(
            "n4",
            &req,
            "kubernetes.io/kube-apiserver-client-kubelet",
            &["client auth"],
        ),
    );
    // The controller decides within milliseconds; three seconds without a decision is
    // the sign that it made none.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(condition_column(&s, "n3"), "Pending");
    assert_eq!(condition_column(&s, "n4"), "Pending");
}
