//! `krust sim` end to end against a real `krust server`: simulated nodes register with
//! their labels, taints, capacity and Leases, get pod ranges from node IPAM, and run the
//! pods bound to them without containers.

mod common;

use std::time::Duration;

use common::{Component, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn condition<'a>(obj: &'a Value, ty: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

#[test]
fn simulated_nodes_register_keep_their_leases_and_run_bound_pods() {
    let s = Server::start();
    let _sim = Component::start(
        &s,
        "sim",
        "sim",
        &[
            "--nodes=3",
            "--zones=2",
            "--node-cpu=4",
            "--node-label=tier=sim",
            "--node-taint=dedicated=sim:PreferNoSchedule",
            "--node-resource=example.com/gpu=2",
            "--lease-interval=1s",
        ],
    );
    let nodes = wait_for("three nodes with pod ranges", DEADLINE, || {
        let nodes = s.get_json(&["nodes", "-l", "node.krust.io/simulated=true"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (nodes.len() == 3 && nodes.iter().all(|n| n["spec"]["podCIDR"].is_string()))
            .then_some(nodes)
    });
    for n in &nodes {
        let labels = &n["metadata"]["labels"];
        let name = n["metadata"]["name"].as_str().unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], name);
        assert_eq!(labels["tier"], "sim");
        assert!(
            labels["topology.kubernetes.io/zone"]
                .as_str()
                .unwrap()
                .starts_with("zone-")
        );
        assert_eq!(n["spec"]["taints"][0]["effect"], "PreferNoSchedule");
        assert_eq!(n["status"]["allocatable"]["cpu"], "4");
        assert_eq!(n["status"]["allocatable"]["example.com/gpu"], "2");
        assert_eq!(condition(n, "Ready").unwrap()["status"], "True");
        assert_eq!(condition(n, "MemoryPressure").unwrap()["status"], "False");
    }
    let out = s.ok(&["get", "nodes"]);
    assert_eq!(out.matches(" Ready ").count(), 3, "{out}");

    // Each node renews its Lease like a kubelet.
    let renew = |node: &str| {
        s.get_json(&["lease", "-n", "kube-node-lease", node])["spec"]["renewTime"].to_string()
    };
    let first = wait_for("a lease", DEADLINE, || {
        let (code, _) = s.curl(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/sim-node-1",
            None,
            None,
        );
        (code == 200).then(|| renew("sim-node-1"))
    });
    wait_for("a renewal", DEADLINE, || {
        (renew("sim-node-1") != first).then_some(())
    });
    let lease = s.get_json(&["lease", "-n", "kube-node-lease", "sim-node-1"]);
    assert_eq!(lease["spec"]["holderIdentity"], "sim-node-1");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");

    // A pod bound to a simulated node runs, with an IP from the node's range.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"nodeName": "sim-node-1", "containers": [{"name": "c", "image": "busybox"}]}})
        .to_string(),
    );
    s.ok(&["wait", "--for=condition=Ready", "pod/p", "--timeout=30s"]);
    let pod = s.get_json(&["pod", "p"]);
    assert_eq!(pod["status"]["phase"], "Running");
    let cidr = s.get_json(&["node", "sim-node-1"])["spec"]["podCIDR"]
        .as_str()
        .unwrap()
        .to_string();
    let prefix = cidr.rsplit_once(".0/").unwrap().0;
    let ip = pod["status"]["podIP"].as_str().unwrap();
    assert!(ip.starts_with(&format!("{prefix}.")), "{ip} in {cidr}");
    assert_eq!(pod["status"]["containerStatuses"][0]["ready"], true);
    assert!(pod["status"]["containerStatuses"][0]["state"]["running"].is_object());
    assert!(pod["status"]["hostIP"].is_string());

    // Deleting it completes: the simulated kubelet finishes the termination.
    s.ok(&["delete", "pod", "p", "--timeout=30s"]);
    let (code, _) = s.curl("GET", "/api/v1/namespaces/default/pods/p", None, None);
    assert_eq!(code, 404);
}
