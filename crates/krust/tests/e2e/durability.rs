//! Durability: a restart keeps everything, SIGTERM shuts down cleanly, and `kill -9`
//! during a concurrent write load loses no acknowledged write.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::Server;
use serde_json::json;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[test]
fn restart_keeps_objects_and_sigterm_exits_cleanly() {
    let mut s = Server::start();
    s.ok(&["create", "configmap", "keep", "--from-literal=a=1"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"team"}}"#,
    );
    let before = s.get_json(&["configmap", "keep"]);
    let status = s.stop();
    assert!(status.success(), "SIGTERM exit: {status}");
    s.restart();
    let after = s.get_json(&["configmap", "keep"]);
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    assert_eq!(after["data"]["a"], "1");
    assert!(
        s.ok(&["get", "ns", "team", "-o", "name"])
            .contains("namespace/team")
    );
    // Writes continue from the restored revision.
    s.ok(&["create", "configmap", "next", "--from-literal=a=2"]);
    let next: i64 = s.get_json(&["configmap", "next"])["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        next > before["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
    );
}

#[test]
fn kill_dash_nine_under_load_loses_no_acknowledged_write() {
    let mut s = Server::apiserver(&[]);
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let acked = acked.clone();
            let stop = stop.clone();
            let port = s.port;
            let tls = s.data_dir().join("server/tls");
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("w{w}-{i}");
                    i += 1;
                    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": name}});
                    let out = std::process::Command::new("curl")
                        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "Content-Type: application/json", "-d"])
                        .arg(body.to_string())
                        .arg("--cacert").arg(tls.join("ca.crt"))
                        .arg("--cert").arg(tls.join("admin.crt"))
                        .arg("--key").arg(tls.join("admin.key"))
                        .arg(format!("https://127.0.0.1:{port}{CMS}"))
                        .output();
                    if let Ok(out) = out
                        && out.stdout == b"201"
                    {
                        acked.lock().unwrap().insert(name);
                    }
                }
            })
        })
        .collect();
    // Let the load run, then crash the server in the middle of it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < 200 {
        assert!(
            Instant::now() < deadline,
            "load made no progress: {}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    s.restart();
    let (code, list) = s.curl("GET", CMS, None, None);
    assert_eq!(code, 200);
    let present: BTreeSet<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            assert_eq!(i["data"]["v"], i["metadata"]["name"], "value intact: {i}");
            i["metadata"]["name"].as_str().unwrap().to_string()
        })
        .collect();
    let lost: Vec<&String> = acked.difference(&present).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged creates lost: {lost:?}",
        lost.len()
    );
    assert!(acked.len() >= 200);
}

#[test]
fn apiserver_publishes_itself_in_the_kubernetes_endpoints_and_leaves_on_sigterm() {
    let mut s = Server::start();
    let ep = s.get_json(&["endpoints", "kubernetes"]);
    assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "127.0.0.1");
    assert_eq!(ep["subsets"][0]["ports"][0]["port"], s.port);
    let slice = s.get_json(&["endpointslice", "kubernetes"]);
    assert_eq!(slice["endpoints"][0]["addresses"][0], "127.0.0.1");
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "kubernetes"
    );
    let leases = s.get_json(&[
        "-n",
        "kube-system",
        "leases",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
    ]);
    let items = leases["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    let uid = items[0]["metadata"]["uid"].clone();

    // A crash leaves the lease behind (it expires); the restarted apiserver renews it.
    s.restart();
    let leases = s.get_json(&[
        "-n",
        "kube-system",
        "leases",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
    ]);
    assert_eq!(leases["items"][0]["metadata"]["uid"], uid);
    // A clean shutdown removes it, so the next start creates a new one.
    assert!(s.stop().success());
    s.restart();
    let leases = s.get_json(&[
        "-n",
        "kube-system",
        "leases",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
    ]);
    assert_eq!(leases["items"].as_array().unwrap().len(), 1);
    assert_ne!(leases["items"][0]["metadata"]["uid"], uid);
}
