//! `krust agent` on its own, as on a second machine: it joins a `krust server` that runs
//! no node of its own with nothing but the server's join token (its client certificate
//! comes through a CertificateSigningRequest), gets a pod range from node IPAM, runs
//! the pods the scheduler gives it, and serves their logs and exec through the
//! apiserver with its self-signed kubelet certificate. Wrong tokens are refused.

use crate::common;
use std::process::Command;
use std::time::Duration;

use crate::common::{Component, Server, reap_node, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn a_standalone_agent_joins_runs_pods_and_serves_their_logs_and_exec() {
    let s = Server::start_with(&["--allocate-node-cidrs=true", "--cluster-cidr=10.75.0.0/16"]);
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap().to_string();
    let token = server_token(&s);
    let url = format!("https://127.0.0.1:{}", s.port);
    let mut agent = Component::spawn(
        &s,
        "agent",
        "agent",
        &[
            "--server",
            &url,
            "--token",
            &token,
            "--data-dir",
            &data_dir,
            "--node-name",
            "edge",
            "--kubelet-port",
            "0",
            "--eviction-hard",
            common::TEST_EVICTION_HARD,
            // Services are not under test: no nftables table left behind.
            "--disable-kube-proxy",
        ],
    );
    let cidr = wait_for("node edge Ready with a pod range", DEADLINE, || {
        let node = s.get_json(&["nodes"])["items"]
            .as_array()?
            .iter()
            .find(|n| n["metadata"]["name"] == "edge")?
            .clone();
        let ready = node["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let cidr = node["spec"]["podCIDR"].as_str()?.to_string();
        ready.then_some(cidr)
    });
    assert_eq!(cidr, "10.75.0.0/24");
    // The node's identity came from a request the controllers approved and signed.
    let csrs = s.get_json(&["csr"]);
    let csr = &csrs["items"][0];
    assert_eq!(csr["spec"]["username"], "system:bootstrap:server");
    assert_eq!(
        csr["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(csr["status"]["conditions"][0]["reason"], "AutoApproved");
    assert!(data.path().join("agent/client-kubelet.crt").exists());

    s.ok(&[
        "run",
        "web",
        "--image=busybox",
        "--",
        "sh",
        "-c",
        "echo from-agent; exec sleep 3600",
    ]);
    s.ok(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    let pod = s.get_json(&["pod", "web"]);
    assert_eq!(pod["spec"]["nodeName"], "edge");
    assert!(
        pod["status"]["podIP"]
            .as_str()
            .unwrap()
            .starts_with("10.75.0.")
    );
    assert_eq!(s.ok(&["logs", "web"]), "from-agent\n");
    assert_eq!(s.ok(&["exec", "web", "--", "hostname"]), "web\n");
    s.ok(&["delete", "pod", "web", "--timeout=60s"]);

    // A clean stop (SIGTERM) stops the agent's containerd; then nothing may be left.
    agent.terminate();
    reap_node(data.path());
    let bridge = krust_net::bridge_name(cidr.parse().unwrap());
    let _ = Command::new("ip").args(["link", "del", &bridge]).status();
}

/// The server's join token, as `<data-dir>/server/token` keeps it.
fn server_token(s: &Server) -> String {
    std::fs::read_to_string(s.data_dir().join("server/token"))
        .expect("the server writes its token")
        .trim()
        .to_string()
}

/// `krust agent --server --token` that must fail before it starts anything: its error.
fn refused_join(s: &Server, token: &str) -> String {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_krust"))
        .args([
            "agent",
            "--server",
            &format!("https://127.0.0.1:{}", s.port),
        ])
        .args(["--token", token, "--data-dir"])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the agent joined with {token}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn join_tokens_pin_the_ca_and_bootstrap_tokens_authenticate_until_deleted() {
    let s = Server::start_with(&["--token", "s3cret"]);
    let token = server_token(&s);
    assert!(
        token.starts_with("K10") && token.ends_with("::server:s3cret"),
        "{token}"
    );
    let sha256sum = Command::new("sha256sum")
        .arg(s.data_dir().join("server/tls/ca.crt"))
        .output()
        .unwrap();
    let (hash, _) = token[3..].split_once("::").unwrap();
    assert!(String::from_utf8_lossy(&sha256sum.stdout).starts_with(hash));

    let wrong_secret = token.replace("s3cret", "guess");
    assert!(refused_join(&s, &wrong_secret).contains("refused the join token (401 Unauthorized)"));
    let other_ca = format!("K10{}::server:s3cret", "0".repeat(64));
    assert!(refused_join(&s, &other_ca).contains("is not the one the token pins"));

    // A bootstrap token authenticates as system:bootstrap:<id> until it is deleted.
    let created = krust(&s, &["token", "create", "--description", "e2e"]);
    let (_, credential) = created.trim().split_once("::").unwrap();
    let (id, _) = credential.split_once('.').unwrap();
    let url = format!("--server=https://127.0.0.1:{}", s.port);
    let ca = format!(
        "--certificate-authority={}",
        s.data_dir().join("server/tls/ca.crt").display()
    );
    // Only the token: the admin kubeconfig's client certificate would authenticate first.
    let whoami = |token: &str| {
        s.kubectl(&[
            "--kubeconfig=/dev/null",
            &url,
            &ca,
            "--token",
            token,
            "auth",
            "whoami",
            "-o",
            "json",
        ])
    };
    let me = whoami(credential);
    assert!(
        me.status.success(),
        "{}",
        String::from_utf8_lossy(&me.stderr)
    );
    let me: serde_json::Value = serde_json::from_slice(&me.stdout).unwrap();
    assert_eq!(
        me["status"]["userInfo"]["username"],
        format!("system:bootstrap:{id}")
    );
    assert!(
        me["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&"system:bootstrappers".into())
    );
    assert!(krust(&s, &["token", "list"]).contains(credential));
    krust(&s, &["token", "delete", id]);
    let gone = whoami(credential);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("Unauthorized"));

    // An expired token is refused, and the token cleaner deletes its Secret.
    let short = krust(&s, &["token", "create", "--ttl", "2s"]);
    let (_, credential) = short.trim().split_once("::").unwrap();
    let (id, _) = credential.split_once('.').unwrap();
    let secret = format!("bootstrap-token-{id}");
    wait_for("the expired token deleted", DEADLINE, || {
        let out = s.kubectl(&["get", "secret", "-n", "kube-system", &secret]);
        (!out.status.success()).then_some(())
    });
    assert!(!whoami(credential).status.success());
}

/// `krust <args>` with the admin kubeconfig in `$KUBECONFIG`, as a user runs it: its output.
fn krust(s: &Server, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_krust"))
        .args(args)
        .env("KUBECONFIG", s.kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "krust {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
