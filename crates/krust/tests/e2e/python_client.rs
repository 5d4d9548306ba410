//! The official Kubernetes Python client (Debian's python3-kubernetes) works unchanged
//! against krust: CRUD, watch, pod logs and exec over WebSocket (v4.channel.k8s.io).

use std::process::Command;

use crate::common::Server;

#[test]
fn the_python_client_creates_watches_reads_logs_and_execs() {
    let s = Server::with_agent(&["--cluster-cidr=10.71.0.0/16"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/client.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .env("KUBECONFIG", s.kubeconfig())
        .output()
        .expect("running /usr/bin/python3 (apt install python3-kubernetes)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "the Python client failed:\n{stdout}\n{}{}",
        String::from_utf8_lossy(&out.stderr),
        s.diagnostics()
    );
}
