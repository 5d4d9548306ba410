//! RuntimeClass end to end: a pod that names a class runs under the class's CRI
//! handler (crun here, where runc runs the others), with the class's overhead, node
//! selector and tolerations put into it by the RuntimeClass admission plugin; a class
//! that does not exist, an overhead without a class and a changed handler are refused
//! with upstream's messages; a handler the node lacks is reported by the kubelet; a
//! stopped test node's containers end under either runtime.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Server, container_pid, wait_ended, wait_for};
use crate::kubelet::event_reasons;

const DEADLINE: Duration = Duration::from_secs(60);

fn pod(name: &str, spec: Value) -> String {
    let mut spec = spec;
    spec["terminationGracePeriodSeconds"] = json!(1);
    spec["containers"] = json!([{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}).to_string()
}

/// The ids of the containers an OCI runtime holds under its state root.
fn listed_by(runtime: &str, root: &std::path::Path) -> String {
    let out = Command::new(runtime)
        .arg("--root")
        .arg(root)
        .arg("list")
        .output()
        .expect("the runtime runs");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn pods_run_under_their_runtime_class() {
    let s = Server::with_agent(&["--cluster-cidr=10.51.0.0/16"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": "fast"}, "handler": "crun",
            "overhead": {"podFixed": {"cpu": "10m", "memory": "16Mi"}},
            "scheduling": {"nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]}})
        .to_string(),
    );
    let table = s.ok(&["get", "runtimeclass"]);
    assert!(
        table.starts_with("NAME   HANDLER   AGE\nfast   crun"),
        "{table}"
    );

    // The admission plugin puts the class's overhead and scheduling into the pod.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("on-crun", json!({"runtimeClassName": "fast"})),
    );
    s.ok_stdin(&["apply", "-f", "-"], &pod("on-runc", json!({})));
    let spec = s.get_json(&["pod", "on-crun"])["spec"].clone();
    assert_eq!(spec["overhead"], json!({"cpu": "10m", "memory": "16Mi"}));
    assert_eq!(spec["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert!(
        spec["tolerations"]
            .as_array()
            .unwrap()
            .contains(&json!({"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"})),
        "{spec}"
    );

    // Each runs under its own runtime: crun's state holds the one, runc's the other.
    let id = |name: &str| {
        wait_for(&format!("{name} running"), DEADLINE, || {
            let pod = s.get_json(&["pod", name]);
            let status = &pod["status"]["containerStatuses"][0];
            (status["state"]["running"].is_object())
                .then(|| {
                    status["containerID"]
                        .as_str()?
                        .strip_prefix("containerd://")
                        .map(str::to_string)
                })
                .flatten()
        })
    };
    let (on_crun, on_runc) = (id("on-crun"), id("on-runc"));
    let containerd = s.data_dir().join("agent").join("containerd");
    let crun_list = listed_by("crun", &containerd.join("crun").join("k8s.io"));
    let runc_list = listed_by("runc", &containerd.join("runc").join("k8s.io"));
    assert!(crun_list.contains(&on_crun), "crun lists: {crun_list}");
    assert!(!runc_list.contains(&on_crun), "runc lists: {runc_list}");
    assert!(runc_list.contains(&on_runc), "runc lists: {runc_list}");

    // Refusals, in upstream's words.
    let refused = |manifest: String| {
        let out = s.kubectl_with("kubectl", &["apply", "-f", "-"], Some(&manifest));
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    };
    assert_eq!(
        refused(pod("nowhere", json!({"runtimeClassName": "missing"}))),
        r#"Error from server (Forbidden): error when creating "STDIN": pods "nowhere" is forbidden: pod rejected: RuntimeClass "missing" not found"#
    );
    assert_eq!(
        refused(pod("heavy", json!({"overhead": {"cpu": "1"}}))),
        r#"Error from server (Forbidden): error when creating "STDIN": pods "heavy" is forbidden: pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"#
    );
    assert_eq!(
        refused(pod(
            "clash",
            json!({"runtimeClassName": "fast", "nodeSelector": {"kubernetes.io/os": "windows"}})
        )),
        r#"Error from server (Forbidden): error when creating "STDIN": pods "clash" is forbidden: conflict: runtimeClass.scheduling.nodeSelector[kubernetes.io/os] = linux; pod.spec.nodeSelector[kubernetes.io/os] = windows"#
    );
    let out = s.kubectl(&[
        "patch",
        "runtimeclass",
        "fast",
        "--type=merge",
        "-p",
        r#"{"handler":"runc"}"#,
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"The RuntimeClass "fast" is invalid: handler: Invalid value: "runc": field is immutable"#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A handler this node does not have: the kubelet says so in an event.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": "vm"}, "handler": "kata"})
        .to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("on-kata", json!({"runtimeClassName": "vm"})),
    );
    let (_, message) = wait_for("the sandbox failure", DEADLINE, || {
        event_reasons(&s, "on-kata")
            .into_iter()
            .find(|(reason, _)| reason == "FailedCreatePodSandBox")
    });
    assert!(
        message.starts_with("Failed to create pod sandbox: "),
        "{message}"
    );
    assert!(message.contains("kata"), "{message}");

    // The server stops with its pods still running, as a failing test's would: reaping
    // the node ends crun's containers as well as runc's (crun keeps them under a root
    // of its own), and nothing of either outlives the test.
    let data = s.data_dir();
    let pids = [
        container_pid(&data, "crun", &on_crun),
        container_pid(&data, "runc", &on_runc),
    ];
    drop(s);
    pids.into_iter().for_each(wait_ended);
}
