//! `krust agent` on its own, as on a second machine: it joins a `krust server` that runs
//! no node of its own with the admin kubeconfig, gets a pod range from node IPAM, runs
//! the pods the scheduler gives it, and serves their logs and exec through the
//! apiserver with its self-signed kubelet certificate.

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
    let mut agent = Component::start(
        &s,
        "agent",
        "agent",
        &[
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
