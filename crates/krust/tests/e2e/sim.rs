//! `krust sim` end to end against a real `krust server`: simulated nodes register with
//! their labels, taints, capacity and Leases, get pod ranges from node IPAM, and run the
//! pods bound to them without containers — pods annotated to exit end as their restart
//! policy says, so Jobs complete and fail on simulated nodes.

use std::time::Duration;

use crate::common::{Component, Server, wait_for};
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

fn sim_job(name: &str, spec: Value, annotations: Value, restart: &str) -> String {
    let mut spec = spec;
    spec["template"] = json!({"metadata": {"annotations": annotations},
        "spec": {"restartPolicy": restart, "containers": [{"name": "c", "image": "busybox"}]}});
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

#[test]
fn annotated_pods_exit_so_jobs_run_to_the_end_on_simulated_nodes() {
    // One pod range for two nodes: the pods of the node without one start late
    // (without an IP), and must still exit after their time — counted from the start.
    let s = Server::start_with(&["--cluster-cidr=10.56.0.0/24"]);
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=2"]);
    let exit_ok = json!({"sim.krust.io/exit-after": "500ms"});
    let created = std::time::Instant::now();
    s.ok_stdin(
        &["create", "-f", "-"],
        &sim_job(
            "ok",
            json!({"completions": 4, "parallelism": 4}),
            exit_ok,
            "Never",
        ),
    );
    let failing = json!({"sim.krust.io/exit-after": "200ms", "sim.krust.io/exit-code": "2"});
    s.ok_stdin(
        &["create", "-f", "-"],
        &sim_job("bad", json!({"backoffLimit": 0}), failing.clone(), "Never"),
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &sim_job("restarts", json!({"backoffLimit": 1}), failing, "OnFailure"),
    );
    s.ok(&[
        "wait",
        "--for=condition=complete",
        "job/ok",
        "--timeout=60s",
    ]);
    let ok = s.get_json(&["job", "ok"]);
    assert_eq!(ok["status"]["succeeded"], 4);
    // Past the late start (5 s without a range): no pod came back to life.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(created.elapsed()));
    let pods = s.get_json(&["pods", "-l", "job-name=ok"]);
    let phases: Vec<&Value> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["status"]["phase"])
        .collect();
    assert_eq!(phases, [&json!("Succeeded"); 4], "{pods}");
    let pod = &s.get_json(&["pods", "-l", "job-name=ok"])["items"][0];
    assert_eq!(pod["status"]["phase"], "Succeeded");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
    for job in ["bad", "restarts"] {
        s.ok(&[
            "wait",
            "--for=condition=failed",
            &format!("job/{job}"),
            "--timeout=60s",
        ]);
        let failed = s.get_json(&["job", job]);
        let reason = failed["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Failed")
            .map(|c| c["reason"].clone());
        assert_eq!(
            reason,
            Some(json!("BackoffLimitExceeded")),
            "{job}: {failed}"
        );
    }
}

/// `kubectl top` cell → millicores or MiB (the figures these tests use are whole).
fn figure(cell: &str) -> u64 {
    cell.trim_end_matches(['m', 'M', 'i']).parse().unwrap_or(0)
}

#[test]
fn simulated_pods_report_their_usage_to_kubectl_top_and_the_autoscaler() {
    let s = Server::start_with(&[
        "--metric-resolution=1s",
        "--horizontal-pod-autoscaler-sync-period=2s",
    ]);
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=3"]);
    // Each pod "uses" twice its CPU request: utilization 200 %.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "load"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "load"}},
            "template": {"metadata": {"labels": {"app": "load"}, "annotations": {
                    "sim.krust.io/usage-cpu": "200m", "sim.krust.io/usage-memory": "64Mi"}},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                    "resources": {"requests": {"cpu": "100m"}}}]}}}});
    s.ok_stdin(&["apply", "-f", "-"], &deployment.to_string());
    s.ok(&["rollout", "status", "deployment/load", "--timeout=60s"]);

    // The simulated kubelets serve what the pods say they use.
    let top = wait_for("usage of both pods", DEADLINE, || {
        let out = s.kubectl(&["top", "pod", "-l", "app=load", "--no-headers"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.lines().count() == 2).then_some(text)
    });
    for line in top.lines() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert!((195..=205).contains(&figure(cells[1])), "{top}");
        assert_eq!(figure(cells[2]), 64, "{top}");
    }
    let node = s.get_json(&["pods", "-l", "app=load"])["items"][0]["spec"]["nodeName"]
        .as_str()
        .unwrap()
        .to_string();
    let nodes = wait_for("node usage", DEADLINE, || {
        let out = s.kubectl(&["top", "node", &node, "--no-headers"]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    });
    let cells: Vec<&str> = nodes.split_whitespace().collect();
    assert!(figure(cells[1]) >= 195, "{nodes}");

    // The autoscaler wants 8 replicas for 50 %: the maximum, 4, limits it.
    s.ok(&[
        "autoscale",
        "deployment",
        "load",
        "--cpu-percent=50",
        "--min=1",
        "--max=4",
    ]);
    s.ok(&[
        "patch",
        "hpa",
        "load",
        "--type=merge",
        "-p",
        r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}"#,
    ]);
    // Once the new pods are measured too: 200 % of 100m on average.
    let hpa = wait_for(
        "four replicas, all measured",
        Duration::from_secs(60),
        || {
            let hpa = s.get_json(&["hpa", "load"]);
            let current = &hpa["status"]["currentMetrics"][0]["resource"]["current"];
            (hpa["status"]["desiredReplicas"] == 4
                && hpa["status"]["currentReplicas"] == 4
                && current["averageUtilization"] == 200)
                .then_some(hpa)
        },
    );
    let current = &hpa["status"]["currentMetrics"][0]["resource"]["current"];
    assert_eq!(current["averageValue"], "200m", "{hpa}");
    let limited = condition(&hpa, "ScalingLimited").unwrap();
    assert_eq!(
        (&limited["status"], &limited["reason"]),
        (&json!("True"), &json!("TooManyReplicas")),
        "{hpa}"
    );
    s.ok(&["rollout", "status", "deployment/load", "--timeout=60s"]);

    // The load drops: back to the minimum.
    s.ok(&[
        "annotate",
        "pods",
        "-l",
        "app=load",
        "--overwrite",
        "sim.krust.io/usage-cpu=5m",
    ]);
    wait_for("one replica", Duration::from_secs(60), || {
        let hpa = s.get_json(&["hpa", "load"]);
        (hpa["status"]["desiredReplicas"] == 1
            && s.get_json(&["deployment", "load"])["spec"]["replicas"] == 1)
            .then_some(())
    });
}
