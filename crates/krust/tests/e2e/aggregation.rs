//! API aggregation end to end with the real kubectl against a real `krust server`: the
//! group versions krust serves are Local APIServices; an APIService backed by a Service
//! (an extension apiserver in the test process, which accepts only the front proxy's
//! client certificate) becomes available, its resources appear in discovery, and
//! kubectl's requests reach it with the caller in `X-Remote-User`/`X-Remote-Group`.

use std::process::Command;
use std::time::Duration;

use crate::common::{Server, wait_for};
use crate::https::{HttpsServer, Seen};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// A tiny wardle.example.com/v1alpha1 apiserver: discovery, a list of flunders that
/// names who asked, and a watch of them that sends one event and stays open.
fn wardle(seen: &Seen) -> (u16, Value) {
    let path = seen.uri.split('?').next().unwrap_or_default();
    if seen.uri.contains("watch=") {
        let flunder = json!({"kind": "Flunder", "apiVersion": "wardle.example.com/v1alpha1",
            "metadata": {"name": "watched", "namespace": "default", "resourceVersion": "2"}});
        return (200, json!([{"type": "ADDED", "object": flunder}]));
    }
    match path {
        "/apis/wardle.example.com/v1alpha1" => (
            200,
            json!({
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "wardle.example.com/v1alpha1",
                "resources": [
                    {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
                     "verbs": ["get", "list", "create", "delete"], "shortNames": ["fl"]},
                    {"name": "flunders/status", "singularName": "", "namespaced": true, "kind": "Flunder",
                     "verbs": ["get", "update"]}
                ]
            }),
        ),
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders" => {
            let user = seen
                .headers
                .get("x-remote-user")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            (
                200,
                json!({
                    "kind": "FlunderList", "apiVersion": "wardle.example.com/v1alpha1", "metadata": {},
                    "items": [{"kind": "Flunder", "apiVersion": "wardle.example.com/v1alpha1",
                               "metadata": {"name": format!("for-{user}"), "namespace": "default",
                                            "creationTimestamp": "2026-01-01T00:00:00Z"}}]
                }),
            )
        }
        _ => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
        ),
    }
}

fn available(s: &Server, name: &str) -> Option<Value> {
    let out = s.kubectl(&["get", "apiservice", name, "-o", "json"]);
    let svc: Value = serde_json::from_slice(&out.stdout).ok()?;
    svc["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")
        .cloned()
}

#[test]
fn an_apiservice_makes_its_group_served_by_its_service() {
    let s = Server::start();
    // What krust serves itself is listed as Local.
    let apps = wait_for("the local APIServices", DEADLINE, || {
        available(&s, "v1.apps")
    });
    assert_eq!(apps["status"], "True");
    assert_eq!(apps["reason"], "Local");
    let table = s.ok(&["get", "apiservices"]);
    assert!(
        table.contains("v1.apps") && table.contains("Local"),
        "{table}"
    );

    let front_proxy_ca =
        std::fs::read_to_string(s.data_dir().join("server/tls/front-proxy-ca.crt")).unwrap();
    let trust = s.get_json(&[
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
    ]);
    assert_eq!(
        trust["data"]["requestheader-client-ca-file"],
        front_proxy_ca.as_str()
    );
    assert_eq!(
        trust["data"]["requestheader-allowed-names"],
        r#"["front-proxy-client"]"#
    );
    let server = HttpsServer::start(&["api.wardle.svc"], Some(&front_proxy_ca), wardle);

    s.ok(&["create", "namespace", "wardle"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "wardle"},
             "spec": {"ports": [{"port": 443, "targetPort": server.port}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "api-1", "namespace": "wardle", "labels": {"kubernetes.io/service-name": "api"}},
             "addressType": "IPv4",
             "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
             "ports": [{"name": "", "port": server.port, "protocol": "TCP"}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": "v1alpha1.wardle.example.com"},
             "spec": {"group": "wardle.example.com", "version": "v1alpha1", "groupPriorityMinimum": 1000,
                      "versionPriority": 15, "caBundle": server.ca_bundle(),
                      "service": {"namespace": "wardle", "name": "api"}}}
        ]})
        .to_string(),
    );
    let condition = wait_for("the APIService to be available", DEADLINE, || {
        available(&s, "v1alpha1.wardle.example.com").filter(|c| c["status"] == "True")
    });
    assert_eq!(condition["reason"], "Passed");

    // Discovery and requests go to the extension apiserver, as the caller.
    let resources = s.ok(&["api-resources", "--api-group=wardle.example.com"]);
    assert!(
        resources.contains("flunders") && resources.contains("fl"),
        "{resources}"
    );
    let list = s.get_json(&["flunders"]);
    let me = s.ok(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(list["items"][0]["metadata"]["name"], format!("for-{me}"));
    let proxied = server
        .requests()
        .into_iter()
        .find(|r| r.uri.contains("/flunders"))
        .expect("the list reached the extension apiserver");
    let groups: Vec<&str> = proxied
        .headers
        .get_all("x-remote-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert!(groups.contains(&"system:masters"), "{groups:?}");
    assert!(proxied.headers.get("authorization").is_none());

    // A watch streams through: its first event arrives while the watch stays open.
    let tls = s.tls();
    let watch = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "5", "--cacert"])
        .arg(tls.join("ca.crt"))
        .arg("--cert")
        .arg(tls.join("admin.crt"))
        .arg("--key")
        .arg(tls.join("admin.key"))
        .arg(format!(
            "https://127.0.0.1:{}/apis/wardle.example.com/v1alpha1/namespaces/default/flunders?watch=true",
            s.port
        ))
        .output()
        .unwrap();
    assert_eq!(
        watch.status.code(),
        Some(28),
        "open until curl gave up: {watch:?}"
    );
    let stdout = String::from_utf8_lossy(&watch.stdout);
    let event: Value = serde_json::from_str(stdout.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "watched");

    // Without endpoints the APIService is reported unavailable, with upstream's reason.
    s.ok(&["delete", "endpointslice", "-n", "wardle", "api-1"]);
    let down = wait_for("the APIService to be unavailable", DEADLINE, || {
        available(&s, "v1alpha1.wardle.example.com").filter(|c| c["status"] == "False")
    });
    assert_eq!(down["reason"], "MissingEndpoints");
    assert_eq!(
        down["message"],
        r#"endpoints for service/api in "wardle" have no addresses"#
    );
}
