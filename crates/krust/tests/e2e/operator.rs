//! A kube-rs operator, unchanged, against a real `krust server`: the `operator` example
//! (`#[derive(CustomResource)]`, its definition installed with server-side apply, a
//! kube-runtime controller with a finalizer and status) runs as its own process while
//! kubectl creates, changes and deletes a Greeting.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{Server, wait_for};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

/// The example's binary, beside this test's (`cargo build --all-targets` builds it, as
/// CI does).
fn operator_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .join("examples/operator");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --example operator`",
        path.display()
    );
    path
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn greeting(message: &str, times: u32) -> String {
    json!({
        "apiVersion": "demo.krust.io/v1", "kind": "Greeting",
        "metadata": {"name": "hello"},
        "spec": {"message": message, "times": times}
    })
    .to_string()
}

#[test]
fn a_kube_rs_operator_with_a_finalizer_and_status_runs_unchanged() {
    let s = Server::start();
    let _operator = Operator(
        Command::new(operator_binary())
            .arg("--kubeconfig")
            .arg(s.kubeconfig())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the operator"),
    );
    // The operator installs its definition with server-side apply.
    let crd = wait_for("the Greeting definition", DEADLINE, || {
        let out = s.kubectl(&[
            "get",
            "crd",
            "greetings.demo.krust.io",
            "--show-managed-fields",
            "-o",
            "json",
        ]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap())
    });
    assert_eq!(
        crd["metadata"]["managedFields"][0]["manager"],
        "greeting-operator"
    );
    assert_eq!(crd["metadata"]["managedFields"][0]["operation"], "Apply");
    s.ok(&[
        "wait",
        "--for=condition=established",
        "crd/greetings.demo.krust.io",
        "--timeout=20s",
    ]);

    s.ok_stdin(&["apply", "-f", "-"], &greeting("hi", 3));
    let reconciled = wait_for("the greeting's status", DEADLINE, || {
        let g = s.get_json(&["greeting", "hello"]);
        (g["status"]["observedGeneration"] == 1).then_some(g)
    });
    assert_eq!(reconciled["status"]["configMap"], "hello-greeting");
    assert_eq!(
        reconciled["metadata"]["finalizers"],
        json!(["demo.krust.io/cleanup"])
    );
    let cm = s.get_json(&["configmap", "hello-greeting"]);
    assert_eq!(cm["data"]["greeting"], "hi hi hi");
    assert_eq!(cm["metadata"]["ownerReferences"][0]["kind"], "Greeting");
    assert_eq!(
        cm["metadata"]["ownerReferences"][0]["uid"],
        reconciled["metadata"]["uid"]
    );
    // The printer column from `#[kube(printcolumn)]`.
    assert!(s.ok(&["get", "greet"]).starts_with("NAME    MESSAGE"));

    // A change of spec is seen and reported with its generation.
    s.ok_stdin(&["apply", "-f", "-"], &greeting("bye", 2));
    wait_for("the second reconcile", DEADLINE, || {
        let g = s.get_json(&["greeting", "hello"]);
        (g["status"]["observedGeneration"] == 2).then_some(())
    });
    assert_eq!(
        s.get_json(&["configmap", "hello-greeting"])["data"]["greeting"],
        "bye bye"
    );

    // Deletion runs the operator's cleanup before the finalizer lets the object go.
    s.ok(&["delete", "greeting", "hello", "--timeout=30s"]);
    assert!(
        s.ok(&["get", "configmap", "hello-greeting", "--ignore-not-found"])
            .is_empty()
    );
    assert!(
        s.ok(&["get", "greetings", "--ignore-not-found"])
            .trim()
            .is_empty()
    );
}
