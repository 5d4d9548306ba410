//! The resource metrics API and what uses it, through the real kubectl on a real node
//! (containerd + runc): `kubectl top` shows a busy container's CPU, read from the
//! runtime by the kubelet and scraped by the apiserver.

mod common;

use std::time::Duration;

use common::{Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);

/// Millicores in a `kubectl top` CPU cell (`250m`, or whole cores as `2`).
fn millicores(cell: &str) -> u64 {
    match cell.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(0),
        None => cell.parse::<u64>().map_or(0, |c| c * 1000),
    }
}

#[test]
fn kubectl_top_shows_what_a_busy_container_uses() {
    let s = Server::with_agent(&["--cluster-cidr=10.85.0.0/16", "--metric-resolution=1s"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "labels": {"app": "busy"}},
            "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                "containers": [{"name": "spin", "image": "busybox",
                    "command": ["sh", "-c", "while :; do :; done"]}]}})
        .to_string(),
    );
    let line = wait_for("the busy pod's usage", DEADLINE, || {
        let out = s.kubectl(&["top", "pod", "busy", "--no-headers"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let cpu = text.split_whitespace().nth(1).map(millicores)?;
        (cpu >= 200).then_some(text)
    });
    assert!(line.starts_with("busy "), "{line}");
    let out = s.ok(&[
        "top",
        "pod",
        "-l",
        "app=busy",
        "--containers",
        "--no-headers",
    ]);
    assert!(out.contains("spin"), "{out}");
    let nodes = s.ok(&["top", "node", "--no-headers"]);
    let cpu = nodes.split_whitespace().nth(1).map(millicores).unwrap_or(0);
    assert!(cpu >= 200, "the node is at least as busy: {nodes}");

    // The API itself: a PodMetrics with its window, a NotFound as upstream names it.
    let metrics: Value = serde_json::from_str(&s.ok(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/busy",
    ]))
    .unwrap();
    assert_eq!(metrics["kind"], "PodMetrics");
    assert_eq!(metrics["containers"][0]["name"], "spin");
    assert!(metrics["window"].as_str().unwrap().ends_with('s'));
    let missing = s.fails(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope",
    ]);
    assert!(
        missing.contains("podmetrics.metrics.k8s.io \"nope\" not found"),
        "{missing}"
    );
    let resources = s.ok(&["api-resources", "--api-group=metrics.k8s.io"]);
    assert!(
        resources.contains("PodMetrics") && resources.contains("NodeMetrics"),
        "{resources}"
    );
}
