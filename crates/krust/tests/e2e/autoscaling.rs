//! The resource metrics API and what uses it, through the real kubectl on a real node
//! (containerd + runc): `kubectl top` shows a busy container's CPU, read from the
//! runtime by the kubelet and scraped by the apiserver; a HorizontalPodAutoscaler made
//! by `kubectl autoscale` scales a CPU-busy Deployment up, and down once it idles.

use std::time::Duration;

use crate::common::{Server, wait_for};
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

#[test]
fn a_new_pod_has_metrics_once_it_is_ten_seconds_old_without_waiting_for_a_scrape() {
    // Scrapes a minute apart: the pod's only chance is the read's own scrape.
    let s = Server::with_agent(&["--cluster-cidr=10.59.0.0/16", "--metric-resolution=60s"]);
    s.ok(&["run", "fresh", "--image=busybox", "--", "sleep", "3600"]);
    s.ok(&[
        "wait",
        "pod/fresh",
        "--for=condition=Ready",
        "--timeout=60s",
    ]);
    // The fresh-container rule trusts a window of 10 s at least (metrics-server's).
    std::thread::sleep(Duration::from_secs(11));
    let top = s.ok(&["top", "pod", "fresh", "--no-headers"]);
    assert!(top.starts_with("fresh "), "{top}");
    let metrics: Value = serde_json::from_str(&s.ok(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/fresh",
    ]))
    .unwrap();
    let window: f64 = metrics["window"]
        .as_str()
        .and_then(|w| w.trim_end_matches('s').parse().ok())
        .unwrap();
    assert!(
        (10.0..60.0).contains(&window),
        "counted from the container's start: {metrics}"
    );
}

/// Spins a core, or sleeps once its template says `IDLE`.
fn burner() -> String {
    let command = r#"if [ -n "$IDLE" ]; then exec sleep 3600; fi; while :; do :; done"#;
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "burn"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "burn"}},
            "template": {"metadata": {"labels": {"app": "burn"}},
                "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", command],
                        "resources": {"requests": {"cpu": "100m"}}}]}}}})
    .to_string()
}

#[test]
fn an_autoscaler_scales_a_busy_deployment_up_and_an_idle_one_down() {
    let s = Server::with_agent(&[
        "--cluster-cidr=10.87.0.0/16",
        "--metric-resolution=1s",
        "--horizontal-pod-autoscaler-sync-period=2s",
    ]);
    s.ok_stdin(&["apply", "-f", "-"], &burner());
    s.ok(&["rollout", "status", "deployment/burn", "--timeout=60s"]);
    s.ok(&[
        "autoscale",
        "deployment",
        "burn",
        "--cpu-percent=50",
        "--min=1",
        "--max=3",
    ]);
    // Scale down as soon as the metrics say so (the default waits five minutes).
    s.ok(&[
        "patch",
        "hpa",
        "burn",
        "--type=merge",
        "-p",
        r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}"#,
    ]);
    let hpa = wait_for("three replicas", DEADLINE, || {
        let hpa = s.get_json(&["hpa", "burn"]);
        (hpa["status"]["desiredReplicas"] == 3
            && s.get_json(&["deployment", "burn"])["spec"]["replicas"] == 3)
            .then_some(hpa)
    });
    let utilization =
        hpa["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
            .as_i64()
            .unwrap();
    assert!(utilization > 50, "{hpa}");
    let condition = |hpa: &Value, ty: &str| {
        hpa["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty).cloned())
            .unwrap_or_default()
    };
    assert_eq!(
        condition(&hpa, "ScalingActive")["reason"],
        "ValidMetricFound"
    );
    let table = s.ok(&["get", "hpa", "burn"]);
    assert!(
        table.contains("Deployment/burn") && table.contains("%/50%"),
        "{table}"
    );
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector=involvedObject.kind=HorizontalPodAutoscaler",
    ]);
    assert!(
        events.contains("reason: cpu resource utilization (percentage of request) above target"),
        "{events}"
    );

    // Idle pods: back to the minimum.
    // A new template; `kubectl set` keeps the replica count the autoscaler chose.
    s.ok(&["set", "env", "deployment/burn", "IDLE=1"]);
    wait_for("one replica again", Duration::from_secs(120), || {
        let hpa = s.get_json(&["hpa", "burn"]);
        (hpa["status"]["desiredReplicas"] == 1
            && s.get_json(&["deployment", "burn"])["spec"]["replicas"] == 1)
            .then_some(())
    });
    let events = wait_for("the scale-down event", DEADLINE, || {
        let events = s.ok(&[
            "get",
            "events",
            "--field-selector=involvedObject.kind=HorizontalPodAutoscaler",
        ]);
        events
            .contains("New size: 1; reason: All metrics below target")
            .then_some(events)
    });
    assert!(!events.contains("FailedRescale"), "{events}");
}
