//! DaemonSets through the real kubectl on one real node (containerd + runc) and two
//! simulated ones: a pod on every node it tolerates, pinned there by node affinity and
//! bound by the scheduler; taints keep it off and (NoExecute) drive it away; a rolling
//! update, its history and `rollout undo` through ControllerRevisions.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{Component, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);

fn daemonset(command: &str) -> String {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "busybox",
                        "command": ["sh", "-c", command]}]}}}})
    .to_string()
}

/// node name → the (not terminating) agent pods bound or pinned to it.
fn pods_by_node(s: &Server) -> BTreeMap<String, Vec<Value>> {
    let mut by_node: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for pod in s.get_json(&["pods", "-l", "app=agent"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if pod["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let pinned = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0];
        let node = pod["spec"]["nodeName"]
            .as_str()
            .or(pinned.as_str())
            .unwrap_or_default()
            .to_string();
        by_node.entry(node).or_default().push(pod);
    }
    by_node
}

fn status(s: &Server) -> Value {
    s.get_json(&["daemonset", "agent"])["status"].clone()
}

#[test]
fn a_daemonset_runs_one_pod_per_eligible_node_and_rolls_out_revisions() {
    let s = Server::with_agent(&["--cluster-cidr=10.83.0.0/16"]);
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=2", "--lease-interval=2s"]);
    let nodes = wait_for("three ready nodes", DEADLINE, || {
        let out = s.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == 3).then_some(out)
    });
    let real = nodes
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .find(|n| !n.starts_with("sim-"))
        .expect("the real node");
    s.ok(&["taint", "node", "sim-node-1", "dedicated=db:NoSchedule"]);

    s.ok_stdin(&["apply", "-f", "-"], &daemonset("sleep 3600"));
    wait_for(
        "pods ready on the real node and sim-node-0",
        DEADLINE,
        || {
            let st = status(&s);
            (st["numberReady"] == 2 && st["desiredNumberScheduled"] == 2).then_some(())
        },
    );
    let by_node = pods_by_node(&s);
    let mut expected = vec![real.clone(), "sim-node-0".to_string()];
    expected.sort();
    assert_eq!(
        by_node.keys().cloned().collect::<Vec<_>>(),
        expected,
        "not on the tainted node"
    );
    let pod = &by_node[&real][0];
    assert_eq!(pod["status"]["phase"], "Running", "a real container");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
    let keys: Vec<&str> = pod["spec"]["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["key"].as_str())
        .collect();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/disk-pressure",
    ] {
        assert!(keys.contains(&key), "{key} tolerated: {keys:?}");
    }
    let first_hash = pod["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap()
        .to_string();
    let st = status(&s);
    assert_eq!(st["currentNumberScheduled"], 2);
    assert_eq!(st["updatedNumberScheduled"], 2);
    assert_eq!(st["numberMisscheduled"], 0);
    assert_eq!(st["observedGeneration"], 1);
    let table = s.ok(&["get", "ds", "agent"]);
    assert!(
        table.contains("DESIRED") && table.contains("UP-TO-DATE"),
        "{table}"
    );

    // Untainted, the third node gets its pod; cordoned nodes keep theirs.
    s.ok(&["taint", "node", "sim-node-1", "dedicated-"]);
    s.ok(&["cordon", "sim-node-0"]);
    wait_for("a pod on every node", DEADLINE, || {
        (status(&s)["numberReady"] == 3).then_some(())
    });
    assert_eq!(pods_by_node(&s).len(), 3);

    // A rolling update replaces every pod, one node at a time.
    s.ok_stdin(&["apply", "-f", "-"], &daemonset("sleep 3601"));
    s.ok(&["rollout", "status", "ds/agent", "--timeout=120s"]);
    let updated = pods_by_node(&s);
    assert_eq!(updated.len(), 3);
    for pods in updated.values() {
        assert_eq!(pods.len(), 1, "{pods:?}");
        assert_ne!(
            pods[0]["metadata"]["labels"]["controller-revision-hash"],
            first_hash
        );
        assert_eq!(pods[0]["spec"]["containers"][0]["command"][2], "sleep 3601");
    }
    let revisions = s.get_json(&["controllerrevisions", "-l", "app=agent"]);
    assert_eq!(revisions["items"].as_array().unwrap().len(), 2);
    let history = s.ok(&["rollout", "history", "ds/agent"]);
    assert!(
        history.contains("1 ") && history.contains("2 "),
        "{history}"
    );
    let detail = s.ok(&["rollout", "history", "ds/agent", "--revision=1"]);
    assert!(detail.contains("sleep 3600"), "{detail}");

    // Undo brings the first template back as revision 3, with its old hash.
    s.ok(&["rollout", "undo", "ds/agent"]);
    s.ok(&["rollout", "status", "ds/agent", "--timeout=120s"]);
    wait_for("the first template on every node", DEADLINE, || {
        let by_node = pods_by_node(&s);
        (by_node.len() == 3
            && by_node.values().all(|pods| {
                pods.len() == 1
                    && pods[0]["metadata"]["labels"]["controller-revision-hash"] == first_hash
            }))
        .then_some(())
    });
    let revisions = s.get_json(&["controllerrevisions", "-l", "app=agent"]);
    let mut numbers: Vec<i64> = revisions["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["revision"].as_i64().unwrap())
        .collect();
    numbers.sort();
    assert_eq!(numbers, [2, 3]);

    // A NoExecute taint the pods do not tolerate drives them off the node.
    s.ok(&["taint", "node", "sim-node-1", "evict=now:NoExecute"]);
    wait_for("no pod on sim-node-1", DEADLINE, || {
        let by_node = pods_by_node(&s);
        (!by_node.contains_key("sim-node-1") && status(&s)["desiredNumberScheduled"] == 2)
            .then_some(())
    });
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector=involvedObject.kind=DaemonSet",
    ]);
    assert!(
        events.contains("SuccessfulCreate") && events.contains("SuccessfulDelete"),
        "{events}"
    );

    // Deleting the DaemonSet takes its pods and revisions along.
    s.ok(&["delete", "ds", "agent", "--wait=true"]);
    wait_for("pods and revisions gone", DEADLINE, || {
        let pods = s.get_json(&["pods", "-l", "app=agent"]);
        let revs = s.get_json(&["controllerrevisions", "-l", "app=agent"]);
        (pods["items"].as_array().is_some_and(Vec::is_empty)
            && revs["items"].as_array().is_some_and(Vec::is_empty))
        .then_some(())
    });
}

#[test]
fn failed_daemon_pods_are_replaced_with_a_growing_back_off() {
    let s = Server::start();
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=1"]);
    wait_for("a ready node", DEADLINE, || {
        let out = s.ok(&["get", "nodes", "--no-headers"]);
        out.contains(" Ready ").then_some(())
    });
    s.ok_stdin(&["apply", "-f", "-"], &daemonset("sleep 3600"));
    // What a kubelet that rejects the pod does: its phase becomes Failed, again and
    // again. Each time, the time until the controller has replaced it.
    let mut replaced = Vec::new();
    let mut failed: Option<String> = None;
    for _ in 0..4 {
        let pod = wait_for("a new daemon pod", DEADLINE, || {
            let pods = pods_by_node(&s).remove("sim-node-0")?;
            let name = pods.first()?["metadata"]["name"].as_str()?.to_string();
            (Some(&name) != failed.as_ref()).then_some(name)
        });
        replaced.push(std::time::Instant::now());
        s.ok(&[
            "patch",
            "pod",
            &pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed","reason":"NodeAffinity"}}"#,
        ]);
        failed = Some(pod);
    }
    // The first replacement at once, then after 1 and 2 s (upstream's 1 s doubling).
    // Each gap also holds the test's own latencies, which a loaded machine stretches:
    // only lower bounds are asserted.
    let gaps: Vec<f64> = replaced
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    assert!(
        gaps[2] >= 1.5 && gaps[1] + gaps[2] >= 2.5,
        "waits grow: {gaps:?}"
    );
    let events = s.event_messages("agent", "FailedDaemonPod");
    assert!(
        events
            .iter()
            .any(|m| m.starts_with("Found failed daemon pod default/agent-")
                && m.ends_with("on node sim-node-0, will try to kill it")),
        "{events:?}"
    );
}
