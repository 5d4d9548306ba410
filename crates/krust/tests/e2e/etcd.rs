//! Several `krust apiserver` processes on one real etcd serve one consistent cluster: a
//! write through one is seen by lists and watches on the others with the same
//! resourceVersion, the `kubernetes` endpoints list every live apiserver, and Service IPs
//! are never handed out twice.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::{Etcd, Server, wait_for};
use serde_json::{Value, json};

fn apiservers(etcd: &Etcd, n: usize) -> Vec<Server> {
    let endpoint = etcd.endpoint();
    let args = [
        "--datastore-endpoint",
        endpoint.as_str(),
        "--endpoint-reconcile-interval",
        "1s",
    ];
    let first = Server::start_command("apiserver", &args, None);
    let pki = first.data_dir().join("server/tls");
    let mut all = vec![first];
    for _ in 1..n {
        all.push(Server::start_command("apiserver", &args, Some(&pki)));
    }
    all
}

fn endpoint_ports(s: &Server) -> BTreeSet<i64> {
    let (_, ep) = s.curl(
        "GET",
        "/api/v1/namespaces/default/endpoints/kubernetes",
        None,
        None,
    );
    ep["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|sub| {
            sub["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["port"].as_i64())
        })
        .collect()
}

#[test]
fn apiservers_on_one_etcd_are_one_cluster() {
    let etcd = Etcd::start();
    let mut servers = apiservers(&etcd, 3);
    let (a, b, c) = (&servers[0], &servers[1], &servers[2]);

    // Watch on C from now; write through A; read through B.
    let (_, list) = c.curl("GET", "/api/v1/namespaces/default/configmaps", None, None);
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    a.ok(&["create", "configmap", "shared", "--from-literal=k=v"]);
    let on_a = a.get_json(&["configmap", "shared"]);
    let on_b = b.get_json(&["configmap", "shared"]);
    assert_eq!(
        on_a["metadata"]["resourceVersion"],
        on_b["metadata"]["resourceVersion"]
    );
    assert_eq!(on_b["data"]["k"], "v");
    let (code, body) = c.curl(
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=1"
        ),
        None,
        None,
    );
    assert_eq!(code, 200);
    let text = body
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| body.to_string());
    let event: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(event["type"], "ADDED");
    assert_eq!(
        event["object"]["metadata"]["resourceVersion"],
        on_a["metadata"]["resourceVersion"]
    );
    // An update through C conflicts if it is stale, as on a single apiserver.
    let mut stale = on_a.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let (code, _) = c.curl(
        "PUT",
        "/api/v1/namespaces/default/configmaps/shared",
        Some("application/json"),
        Some(stale.to_string().as_bytes()),
    );
    assert_eq!(code, 409);

    // Every apiserver is in the kubernetes endpoints.
    let ports: BTreeSet<i64> = servers.iter().map(|s| s.port as i64).collect();
    wait_for(
        "all apiservers in the endpoints",
        Duration::from_secs(10),
        || (endpoint_ports(&servers[0]) == ports).then_some(()),
    );

    // Services created through different apiservers get distinct ClusterIPs.
    let mut ips = BTreeSet::new();
    for i in 0..12 {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("s{i}")},
            "spec": {"ports": [{"port": 80}], "type": "NodePort"}});
        let (code, out) = servers[i % 3].curl(
            "POST",
            "/api/v1/namespaces/default/services",
            Some("application/json"),
            Some(svc.to_string().as_bytes()),
        );
        assert_eq!(code, 201, "{out}");
        assert!(
            ips.insert(out["spec"]["clusterIP"].as_str().unwrap().to_string()),
            "duplicate ClusterIP"
        );
    }
    // A requested IP another apiserver handed out is refused.
    let taken = ips.iter().next().unwrap().clone();
    let dup = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dup"}, "spec": {"clusterIP": taken, "ports": [{"port": 80}]}});
    let (code, out) = servers[1].curl(
        "POST",
        "/api/v1/namespaces/default/services",
        Some("application/json"),
        Some(dup.to_string().as_bytes()),
    );
    assert_eq!(code, 422, "{out}");

    // A killed apiserver drops out of the endpoints once its lease goes stale.
    let gone = servers[1].port as i64;
    servers[1].kill();
    wait_for(
        "the dead apiserver to leave the endpoints",
        Duration::from_secs(20),
        || {
            let p = endpoint_ports(&servers[0]);
            (!p.contains(&gone) && p.len() == 2).then_some(())
        },
    );
}
