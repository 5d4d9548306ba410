//! The kubelet end to end: `krust server` with its node agent (real containerd, runc
//! and CNI bridge) and the real kubectl. A busybox httpd Deployment runs and answers on
//! its pod IP; a crashing container backs off; a missing image cannot be pulled;
//! deleting ends the containers within the grace period.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn create(s: &Server, obj: Value) {
    s.ok_stdin(&["create", "-f", "-"], &obj.to_string());
}

fn pod(name: &str, image: &str, command: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": image, "command": command}]}})
}

fn container_status(s: &Server, pod: &str) -> Value {
    s.get_json(&["pod", pod])["status"]["containerStatuses"][0].clone()
}

#[test]
fn pods_run_on_the_local_node_through_containerd() {
    let s = Server::with_agent(&["--cluster-cidr=10.61.0.0/16"]);
    // The node registers, gets a pod range, and is Ready.
    let node = wait_for("a Ready node", DEADLINE, || {
        let nodes = s.get_json(&["nodes"]);
        let node = nodes["items"].as_array()?.first()?.clone();
        let ready = node["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (ready && node["spec"]["podCIDR"].is_string()).then_some(node)
    });
    assert_eq!(node["spec"]["podCIDR"], "10.61.0.0/24");
    assert!(
        node["status"]["nodeInfo"]["containerRuntimeVersion"]
            .as_str()
            .unwrap()
            .starts_with("containerd://")
    );
    assert_eq!(node["status"]["allocatable"]["pods"], "110");

    // A Deployment of busybox httpd answers on its pod IP.
    let serve = "mkdir -p /www && echo hello-from-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www";
    create(
        &s,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"terminationGracePeriodSeconds": 2, "containers": [{"name": "httpd", "image": "busybox",
                        "command": ["sh", "-c", serve], "ports": [{"containerPort": 8080}]}]}}}}),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let pods = s.get_json(&["pods", "-l", "app=web"]);
    for p in pods["items"].as_array().unwrap() {
        let name = p["metadata"]["name"].as_str().unwrap();
        let ip = p["status"]["podIP"].as_str().expect("a pod IP");
        assert!(ip.starts_with("10.61.0."), "{ip}");
        assert_eq!(p["status"]["phase"], "Running");
        assert_eq!(p["status"]["qosClass"], "BestEffort");
        let cs = &p["status"]["containerStatuses"][0];
        assert!(
            cs["containerID"]
                .as_str()
                .unwrap()
                .starts_with("containerd://")
        );
        assert!(cs["state"]["running"]["startedAt"].is_string());
        let body = wait_for("an HTTP answer", DEADLINE, || {
            let out = Command::new("curl")
                .args(["-s", "--max-time", "2", &format!("http://{ip}:8080/")])
                .output()
                .ok()?;
            let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!body.is_empty()).then_some(body)
        });
        assert_eq!(body, format!("hello-from-{name}"));
    }

    // A container that keeps failing is restarted with growing back-off.
    create(&s, pod("crash", "busybox", &["sh", "-c", "exit 3"]));
    let status = wait_for("CrashLoopBackOff", DEADLINE, || {
        let cs = container_status(&s, "crash");
        (cs["state"]["waiting"]["reason"] == "CrashLoopBackOff").then_some(cs)
    });
    assert!(status["restartCount"].as_i64().unwrap() >= 1, "{status}");
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 3);
    assert_eq!(status["lastState"]["terminated"]["reason"], "Error");

    // An image that exists nowhere cannot be pulled.
    create(
        &s,
        pod("missing", "registry.invalid/nothing:1.0", &["true"]),
    );
    let reason = wait_for("ErrImagePull", DEADLINE, || {
        let reason = container_status(&s, "missing")["state"]["waiting"]["reason"].clone();
        matches!(reason.as_str(), Some("ErrImagePull" | "ImagePullBackOff")).then_some(reason)
    });
    assert!(reason.is_string());

    // Deleting ends the containers (httpd ignores SIGTERM as PID 1: the 2 s grace
    // period runs out, then SIGKILL) and removes the pods.
    let started = Instant::now();
    s.ok(&["delete", "deployment", "web"]);
    s.ok(&["delete", "pod", "crash", "missing", "--timeout=60s"]);
    wait_for("all pods gone", DEADLINE, || {
        s.get_json(&["pods"])["items"]
            .as_array()
            .is_some_and(|a| a.is_empty())
            .then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}
