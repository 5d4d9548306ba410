//! `krust agent` on its own, as on a second machine: it joins a `krust server` that runs
//! no node of its own with nothing but the server's join token (its client certificate
//! comes through a CertificateSigningRequest), gets a pod range from node IPAM, runs
//! the pods the scheduler gives it, and serves their logs and exec through the
//! apiserver with a serving certificate it obtained the same way (the apiserver
//! verifies it). Both certificates rotate before they expire. Wrong tokens are refused.

use crate::common;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{Component, Server, reap_node, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);

/// A joined node's data dir: whatever its node left running (containers, shims, its
/// containerd, mounts) is reaped when it goes, also when a failed assertion unwinds the
/// test. Declared before the agent, it is dropped after it.
pub(crate) struct EdgeDir(tempfile::TempDir);

impl EdgeDir {
    pub(crate) fn new() -> EdgeDir {
        EdgeDir(tempfile::tempdir().expect("temp dir"))
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for EdgeDir {
    fn drop(&mut self) {
        reap_node(self.path());
    }
}

/// `krust agent` joining `s` with its token as node `edge`, with its data in `data`;
/// returns once the Node is Ready with a pod range, which it returns.
pub(crate) fn join_edge(s: &Server, data: &Path) -> (Component, String) {
    let data_dir = data.to_str().unwrap().to_string();
    let token = server_token(s);
    let url = format!("https://127.0.0.1:{}", s.port);
    let agent = Component::spawn(
        s,
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
            common::TEST_IMAGE_GC,
            // Services are not under test: no nftables table left behind.
            "--disable-kube-proxy",
            // Agents of tests running at once share the host's loopback.
            "--lb-server-port",
            "0",
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
    (agent, cidr)
}

/// Stops the agent (SIGTERM stops its containerd) and removes what its node left.
pub(crate) fn stop_edge(mut agent: Component, data: &Path) {
    agent.terminate();
    reap_node(data);
}

/// The CertificateSigningRequests for `signer`, oldest first.
fn requests(s: &Server, signer: &str) -> Vec<serde_json::Value> {
    let mut found: Vec<serde_json::Value> = s.get_json(&["csr"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["spec"]["signerName"] == signer)
        .cloned()
        .collect();
    found.sort_by_key(|c| {
        c["metadata"]["creationTimestamp"]
            .as_str()
            .map(str::to_string)
    });
    found
}

fn issued(csr: &serde_json::Value) -> bool {
    csr["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
}

/// Pod `web`, which prints `line` and sleeps, running.
fn run_web(s: &Server, line: &str) {
    let script = format!("echo {line}; exec sleep 3600");
    s.ok(&["run", "web", "--image=busybox", "--", "sh", "-c", &script]);
    s.ok(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
}

const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

#[test]
fn a_standalone_agent_joins_runs_pods_and_serves_their_logs_and_exec() {
    let s = Server::start_with(&["--allocate-node-cidrs=true", "--cluster-cidr=10.75.0.0/16"]);
    let data = EdgeDir::new();
    let (agent, cidr) = join_edge(&s, data.path());
    assert_eq!(cidr, "10.75.0.0/24");
    // The node's identity came from a request the controllers approved and signed.
    let client = &requests(&s, CLIENT_SIGNER)[0];
    assert_eq!(client["spec"]["username"], "system:bootstrap:server");
    assert_eq!(client["status"]["conditions"][0]["reason"], "AutoApproved");
    assert!(data.path().join("agent/client-kubelet.crt").exists());
    // So did its serving certificate, requested by the node for its own addresses.
    let serving = wait_for("the serving certificate issued", DEADLINE, || {
        requests(&s, SERVING_SIGNER).into_iter().find(issued)
    });
    assert_eq!(serving["spec"]["username"], "system:node:edge");
    assert_eq!(
        serving["status"]["conditions"][0]["message"],
        "Auto approving kubelet serving certificate: its names are its Node's addresses."
    );
    assert_eq!(
        serving["spec"]["usages"],
        serde_json::json!(["digital signature", "server auth"])
    );
    wait_for("the serving certificate kept", DEADLINE, || {
        data.path()
            .join("agent/serving-kubelet.crt")
            .exists()
            .then_some(())
    });

    run_web(&s, "from-agent");
    let pod = s.get_json(&["pod", "web"]);
    assert_eq!(pod["spec"]["nodeName"], "edge");
    assert!(
        pod["status"]["podIP"]
            .as_str()
            .unwrap()
            .starts_with("10.75.0.")
    );
    // Through the verified serving certificate.
    assert_eq!(s.ok(&["logs", "web"]), "from-agent\n");
    assert_eq!(s.ok(&["exec", "web", "--", "hostname"]), "web\n");
    s.ok(&["delete", "pod", "web", "--timeout=60s"]);
    stop_edge(agent, data.path());
}

#[test]
fn node_certificates_rotate_before_they_expire() {
    // Certificates live 40 s (from their issue; signers backdate NotBefore 5 minutes):
    // each is renewed after 28 to 36 s.
    const LIFETIME: Duration = Duration::from_secs(40);
    let s = Server::start_with(&[
        "--allocate-node-cidrs=true",
        "--cluster-cidr=10.70.0.0/16",
        "--cluster-signing-duration=40s",
    ]);
    let data = EdgeDir::new();
    let joined = std::time::Instant::now();
    let (agent, _) = join_edge(&s, data.path());
    let first = std::fs::read_to_string(data.path().join("agent/client-kubelet.crt")).unwrap();
    run_web(&s, "rotated");

    // Two renewals of each, asked by the node itself and approved as renewals.
    let renewals = wait_for("two renewals of each certificate", LIFETIME * 3, || {
        let client = requests(&s, CLIENT_SIGNER);
        let serving = requests(&s, SERVING_SIGNER);
        (client.iter().filter(|c| issued(c)).count() >= 3
            && serving.iter().filter(|c| issued(c)).count() >= 3)
            .then_some(client)
    });
    for renewal in &renewals[1..] {
        assert_eq!(renewal["spec"]["username"], "system:node:edge");
        assert_eq!(
            renewal["status"]["conditions"][0]["message"],
            "Auto approving self kubelet client certificate after SubjectAccessReview."
        );
    }
    let kept = std::fs::read_to_string(data.path().join("agent/client-kubelet.crt")).unwrap();
    assert_ne!(kept, first, "the kept certificate was replaced");
    assert!(
        joined.elapsed() > LIFETIME,
        "the first certificates have expired"
    );

    // Every connection since the last renewal was made with a certificate issued after
    // the first expired, on both sides: the node keeps renewing its Lease and the
    // apiserver reaches its kubelet (whose certificate it verifies).
    let renewed = |s: &Server| {
        s.get_json(&["lease", "-n", "kube-node-lease", "edge"])["spec"]["renewTime"]
            .as_str()
            .map(str::to_string)
    };
    // Twice: a renewal in flight when the connections were closed is not proof.
    for _ in 0..2 {
        let before = renewed(&s);
        wait_for("the Lease renewed again", DEADLINE, || {
            (renewed(&s) != before).then_some(())
        });
    }
    assert_eq!(s.ok(&["logs", "web"]), "rotated\n");
    s.ok(&["delete", "pod", "web", "--timeout=60s"]);
    stop_edge(agent, data.path());
}

#[test]
fn a_restarted_agent_reaps_the_pods_deleted_while_it_was_down() {
    let s = Server::start_with(&["--allocate-node-cidrs=true", "--cluster-cidr=10.86.0.0/16"]);
    let data = EdgeDir::new();
    let (agent, _) = join_edge(&s, data.path());
    run_web(&s, "orphan");
    let ip = s.get_json(&["pod", "web"])["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    let netns = network_namespace_with(&ip).expect("the pod's network namespace");
    // The agent dies; the pod is deleted meanwhile, so no watch will ever tell the
    // next agent about it.
    drop(agent);
    s.ok(&["delete", "pod", "web", "--grace-period=0", "--force"]);
    assert!(netns.exists() && !containers(data.path()).is_empty());
    let (agent, _) = join_edge(&s, data.path());
    // The pod's directory goes last.
    let pods = data.path().join("agent/pods");
    wait_for("the orphaned pod reaped", DEADLINE, || {
        let no_dirs = std::fs::read_dir(&pods).map_or(true, |mut d| d.next().is_none());
        (!netns.exists() && containers(data.path()).is_empty() && no_dirs).then_some(())
    });
    assert!(network_namespace_with(&ip).is_none());
    stop_edge(agent, data.path());
}

/// The network namespace (`/run/netns/...`) holding address `ip`.
fn network_namespace_with(ip: &str) -> Option<std::path::PathBuf> {
    let ip: std::net::Ipv4Addr = ip.parse().ok()?;
    network_namespaces(|a| a == ip).into_iter().next()
}

/// The network namespaces holding an address in `cidr` (a node's pod range).
pub(crate) fn network_namespaces_in(cidr: &str) -> Vec<std::path::PathBuf> {
    let cidr: krust_api::cidr::Ipv4Cidr = cidr.parse().unwrap();
    network_namespaces(|a| cidr.contains(a))
}

/// The network namespaces (`/run/netns/...`) with an IPv4 address `wanted` accepts.
fn network_namespaces(wanted: impl Fn(std::net::Ipv4Addr) -> bool) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let Ok(out) = Command::new("ip")
                .args([
                    "-n",
                    &entry.file_name().to_string_lossy(),
                    "-4",
                    "-o",
                    "addr",
                ])
                .output()
            else {
                return false;
            };
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|w| w.split_once('/')?.0.parse().ok())
                .any(&wanted)
        })
        .map(|entry| entry.path())
        .collect()
}

/// The containers (pause ones included) the node's runc knows.
pub(crate) fn containers(data: &Path) -> Vec<String> {
    let out = Command::new("runc")
        .arg("--root")
        .arg(data.join("agent/containerd/runc/k8s.io"))
        .args(["list", "-q"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
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
    let data = EdgeDir::new();
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
