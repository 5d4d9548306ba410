//! Who removes pods no kubelet will: the eviction subresource marks a pod it evicts with
//! upstream's `DisruptionTarget` condition, and the pod garbage collector fails and
//! force-deletes the pods of a node that is gone (`DeletionByPodGC`), the terminating
//! pods never scheduled, and the oldest finished pods beyond
//! `--terminated-pod-gc-threshold`. No node runs here: the pods are bound to a Node
//! object alone, and finalizers hold them so that their last state can be read.

use std::time::Duration;

use crate::common::{Server, wait_for};
use serde_json::{Value, json};

/// The collector's 20 s period and 40 s quarantine, with room to spare.
const DEADLINE: Duration = Duration::from_secs(100);
const HOLD: &str = "krust.test/hold";

fn pod(name: &str, spec: Value) -> String {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "finalizers": [HOLD]}, "spec": spec})
    .to_string()
}

fn disruption(pod: &Value) -> Option<&Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
}

fn release(s: &Server, name: &str) {
    s.ok(&[
        "patch",
        "pod",
        name,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
}

#[test]
fn evicted_and_orphaned_pods_say_why_and_the_collector_removes_what_no_kubelet_will() {
    let s = Server::start_with(&["--terminated-pod-gc-threshold=2"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost"}}).to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("evicted", json!({"nodeName": "ghost"})),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("orphan", json!({"nodeName": "ghost"})),
    );
    // Never scheduled: no scheduler answers to this name.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("floating", json!({"schedulerName": "nobody"})),
    );

    // The eviction subresource: the condition first, then the deletion.
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "evicted"}})
    .to_string();
    let (code, body) = s.curl(
        "POST",
        "/api/v1/namespaces/default/pods/evicted/eviction",
        Some("application/json"),
        Some(eviction.as_bytes()),
    );
    assert_eq!(code, 201, "{body}");
    let evicted = s.get_json(&["pod", "evicted"]);
    assert!(
        evicted["metadata"]["deletionTimestamp"].is_string(),
        "{evicted}"
    );
    let condition = disruption(&evicted).expect("a DisruptionTarget condition");
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "EvictionByEvictionAPI");
    assert_eq!(condition["message"], "Eviction API: evicting");
    release(&s, "evicted");

    // Finished pods beyond the threshold of two: the oldest go.
    for name in ["done-0", "done-1", "done-2", "done-3"] {
        s.ok_stdin(
            &["apply", "-f", "-"],
            &pod(name, json!({"nodeName": "ghost"})),
        );
        s.ok(&[
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Succeeded"}}"#,
        ]);
        release(&s, name);
        // Creation timestamps have whole seconds: one apart, the order is the names'.
        std::thread::sleep(Duration::from_millis(1100));
    }
    s.ok(&["delete", "pod", "floating", "--wait=false"]);
    wait_for("the two oldest finished pods gone", DEADLINE, || {
        let names: Vec<String> = s.get_json(&["pods"])["items"]
            .as_array()?
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .filter(|n| n.starts_with("done-"))
            .collect();
        (names == ["done-2", "done-3"]).then_some(())
    });
    // The unscheduled terminating pod was failed and force-deleted (its finalizer
    // still holds the object).
    let floating = wait_for("the unscheduled pod failed", DEADLINE, || {
        let pod = s.get_json(&["pod", "floating"]);
        (pod["status"]["phase"] == "Failed").then_some(pod)
    });
    assert!(disruption(&floating).is_none(), "{floating}");
    release(&s, "floating");

    // The node goes: after the quarantine its pods are failed, marked and deleted.
    s.ok(&["delete", "node", "ghost"]);
    // Failed first, then deleted: a read between the two sees only the first.
    let orphan = wait_for(
        "the orphan failed and deleted by the collector",
        DEADLINE,
        || {
            let pod = s.get_json(&["pod", "orphan"]);
            (pod["status"]["phase"] == "Failed" && pod["metadata"]["deletionTimestamp"].is_string())
                .then_some(pod)
        },
    );
    let condition = disruption(&orphan).expect("a DisruptionTarget condition");
    assert_eq!(condition["reason"], "DeletionByPodGC");
    assert_eq!(condition["message"], "PodGC: node no longer exists");
    release(&s, "orphan");
    wait_for("every pod of the gone node deleted", DEADLINE, || {
        let left = s.get_json(&["pods", "--field-selector=spec.nodeName=ghost"]);
        let names: Vec<&str> = left["items"]
            .as_array()?
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        names.is_empty().then_some(())
    });
}
