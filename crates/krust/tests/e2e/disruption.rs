//! Disruption budgets through the real kubectl on simulated nodes: the disruption
//! controller's status, the eviction subresource's 429 while a budget has no disruption
//! to give, and `kubectl drain` (cordon, DaemonSet pods left alone, evictions retried
//! until another replica is ready), then `kubectl uncordon`.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Component, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn pdb_status(s: &Server) -> Value {
    s.get_json(&["pdb", "web"])["status"].clone()
}

fn web_pods_on(s: &Server, node: &str) -> Vec<String> {
    s.get_json(&[
        "pods",
        "-l",
        "app=web",
        "--field-selector",
        &format!("spec.nodeName={node}"),
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect()
}

#[test]
fn drain_evicts_pods_only_as_far_as_their_budget_allows() {
    let s = Server::start();
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=2"]);
    wait_for("two nodes", DEADLINE, || {
        let out = s.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == 2).then_some(())
    });
    let spread = json!([{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"topologySpreadConstraints": spread,
                        "containers": [{"name": "c", "image": "busybox"}]}}}})
        .to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
        .to_string(),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    s.ok(&[
        "create",
        "pdb",
        "web",
        "--selector=app=web",
        "--min-available=2",
    ]);
    let status = wait_for("the budget's status", DEADLINE, || {
        let st = pdb_status(&s);
        (st["currentHealthy"] == 2 && st["observedGeneration"] == 1).then_some(st)
    });
    assert_eq!(status["desiredHealthy"], 2);
    assert_eq!(status["expectedPods"], 2);
    assert_eq!(status["disruptionsAllowed"], 0);
    assert_eq!(status["conditions"][0]["type"], "DisruptionAllowed");
    assert_eq!(status["conditions"][0]["reason"], "InsufficientPods");
    let table = s.ok(&["get", "pdb", "web"]);
    assert!(table.contains("ALLOWED DISRUPTIONS"), "{table}");

    // The eviction subresource refuses with upstream's 429.
    let victim = web_pods_on(&s, "sim-node-0");
    assert_eq!(victim.len(), 1, "one web pod per node");
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": victim[0]}})
    .to_string();
    let (code, refusal) = s.curl(
        "POST",
        &format!("/api/v1/namespaces/default/pods/{}/eviction", victim[0]),
        Some("application/json"),
        Some(eviction.as_bytes()),
    );
    assert_eq!(code, 429, "{refusal}");
    assert_eq!(refusal["reason"], "TooManyRequests");
    assert_eq!(
        refusal["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        refusal["details"]["causes"][0]["message"],
        "The disruption budget web needs 2 healthy pods and has 2 currently"
    );

    // Drain cordons the node and keeps retrying the eviction...
    let drain = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .args([
            "drain",
            "sim-node-0",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=90s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl drain");
    wait_for("the node cordoned", DEADLINE, || {
        (s.get_json(&["node", "sim-node-0"])["spec"]["unschedulable"] == true).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(web_pods_on(&s, "sim-node-0"), victim, "the budget holds");

    // ...until a third replica (on the other node: this one is cordoned) is ready.
    s.ok(&["scale", "deployment/web", "--replicas=3"]);
    let out = drain.wait_with_output().expect("drain finished");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("node/sim-node-0 drained"), "{stdout}");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ignoring DaemonSet-managed Pods"),
        "{stderr}"
    );
    assert!(web_pods_on(&s, "sim-node-0").is_empty());
    let agent = s.get_json(&[
        "pods",
        "-l",
        "app=agent",
        "--field-selector",
        "spec.nodeName=sim-node-0",
    ]);
    assert_eq!(
        agent["items"].as_array().unwrap().len(),
        1,
        "daemon pods stay"
    );
    // The evicted pod's replacement waits: spread evenly, it belongs on the cordoned node.
    s.ok(&["uncordon", "sim-node-0"]);
    assert!(s.get_json(&["node", "sim-node-0"])["spec"]["unschedulable"].is_null());
    wait_for("the budget back to three healthy pods", DEADLINE, || {
        let st = pdb_status(&s);
        (st["currentHealthy"] == 3 && st["disruptionsAllowed"] == 1).then_some(())
    });
    assert_eq!(pdb_status(&s)["conditions"][0]["reason"], "SufficientPods");
}
