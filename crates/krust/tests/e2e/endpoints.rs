//! The EndpointSlice and Endpoints controllers end to end, with the real kubectl against
//! a real `krust server`. There is no kubelet here: the test plays it, giving pods an IP
//! and a Ready condition through the pods/status subresource.

use std::time::{Duration, Instant};

use crate::common::{Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn pod(name: &str, app: &str, http_port: i32, node: Option<&str>) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox",
        "ports": [{"name": "http", "containerPort": http_port}]}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}}, "spec": spec})
}

fn create(s: &Server, objects: Vec<Value>) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    s.ok_stdin(&["create", "-f", "-"], &list.to_string());
}

/// Plays the kubelet: the pod runs with this IP, Ready or not.
fn set_status(s: &Server, pod: &str, ip: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status}],
    }});
    let (code, body) = s.curl(
        "PATCH",
        &format!("/api/v1/namespaces/default/pods/{pod}/status"),
        Some("application/merge-patch+json"),
        Some(patch.to_string().as_bytes()),
    );
    assert_eq!(code, 200, "{body}");
}

fn slices(s: &Server, service: &str) -> Vec<Value> {
    s.get_json(&[
        "endpointslices",
        "-l",
        &format!("kubernetes.io/service-name={service}"),
    ])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Endpoint name → (ready, serving, terminating, port) across the Service's slices.
fn endpoints_of(s: &Server, service: &str) -> Vec<(String, bool, bool, bool, i64)> {
    let mut out = Vec::new();
    for slice in slices(s, service) {
        let port = slice["ports"][0]["port"].as_i64().unwrap_or(-1);
        for e in slice["endpoints"].as_array().into_iter().flatten() {
            let c = &e["conditions"];
            out.push((
                e["targetRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["ready"] == true,
                c["serving"] == true,
                c["terminating"] == true,
                port,
            ));
        }
    }
    out.sort();
    out
}

fn endpoint(
    name: &str,
    ready: bool,
    serving: bool,
    terminating: bool,
    port: i64,
) -> (String, bool, bool, bool, i64) {
    (name.to_string(), ready, serving, terminating, port)
}

#[test]
fn endpointslices_and_endpoints_follow_pod_readiness() {
    let s = Server::start();
    create(
        &s,
        vec![
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": {"tier": "front"}},
                "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
            pod("a", "web", 8080, None),
            pod("b", "web", 8080, Some("node-1")),
            pod("c", "web", 8080, None),
            // The named target port resolves per pod: this one lands in its own slice.
            pod("d", "web", 9090, None),
            pod("other", "db", 8080, None),
        ],
    );
    for (i, p) in ["a", "b", "c", "d", "other"].iter().enumerate() {
        set_status(&s, p, &format!("10.42.0.{}", i + 10), true);
    }
    wait_for("four ready endpoints", DEADLINE, || {
        (endpoints_of(&s, "web")
            == vec![
                endpoint("a", true, true, false, 8080),
                endpoint("b", true, true, false, 8080),
                endpoint("c", true, true, false, 8080),
                endpoint("d", true, true, false, 9090),
            ])
        .then_some(())
    });
    let all = slices(&s, "web");
    assert_eq!(all.len(), 2);
    let svc = s.get_json(&["service", "web"]);
    for slice in &all {
        let labels = &slice["metadata"]["labels"];
        assert_eq!(
            labels["endpointslice.kubernetes.io/managed-by"],
            "endpointslice-controller.k8s.io"
        );
        assert_eq!(labels["tier"], "front", "service labels are copied");
        assert!(labels.get("service.kubernetes.io/headless").is_none());
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(slice["ports"][0]["name"], "http");
        assert_eq!(slice["ports"][0]["protocol"], "TCP");
        let owner = &slice["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Service");
        assert_eq!(owner["uid"], svc["metadata"]["uid"]);
        // The latest change behind the slice, where the proxies' network programming
        // latency starts: the Service's creation or a pod's, whichever came last.
        let time = |v: &serde_json::Value| {
            v.as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .unwrap_or_else(|| panic!("a timestamp: {v}"))
        };
        assert!(
            time(
                &slice["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"]
            ) >= time(&svc["metadata"]["creationTimestamp"]),
            "{slice}"
        );
        assert!(
            slice["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("web-")
        );
    }
    let b = all
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .find(|e| e["targetRef"]["name"] == "b")
        .expect("endpoint b");
    assert_eq!(b["nodeName"], "node-1");
    assert_eq!(b["addresses"], json!(["10.42.0.11"]));
    assert_eq!(b["targetRef"]["kind"], "Pod");

    // Readiness flips show up promptly.
    let started = Instant::now();
    set_status(&s, "a", "10.42.0.10", false);
    wait_for("a unready", Duration::from_secs(3), || {
        endpoints_of(&s, "web")
            .contains(&endpoint("a", false, false, false, 8080))
            .then_some(())
    });
    eprintln!(
        "readiness change reached the slice in {:?}",
        started.elapsed()
    );

    // The legacy Endpoints object mirrors the same state.
    let ep = wait_for("Endpoints", DEADLINE, || {
        let ep = s.get_json(&["endpoints", "web"]);
        (ep["subsets"].as_array().map(Vec::len) == Some(2)
            && ep["subsets"][0]["notReadyAddresses"].is_array())
        .then_some(ep)
    });
    let ips = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|a| a["ip"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        ep["subsets"][0]["ports"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    assert_eq!(
        ips(&ep["subsets"][0]["addresses"]),
        vec!["10.42.0.11", "10.42.0.12"]
    );
    assert_eq!(
        ips(&ep["subsets"][0]["notReadyAddresses"]),
        vec!["10.42.0.10"]
    );
    assert_eq!(ips(&ep["subsets"][1]["addresses"]), vec!["10.42.0.13"]);
    assert_eq!(ep["metadata"]["labels"]["tier"], "front");

    // A pod on a node terminates (it waits for its kubelet): serving, not ready.
    s.ok(&["delete", "pod", "b", "--wait=false"]);
    // A pod without a node goes at once.
    s.ok(&["delete", "pod", "c"]);
    wait_for("b terminating, c gone", DEADLINE, || {
        (endpoints_of(&s, "web")
            == vec![
                endpoint("a", false, false, false, 8080),
                endpoint("b", false, true, true, 8080),
                endpoint("d", true, true, false, 9090),
            ])
        .then_some(())
    });
    wait_for("Endpoints without b and c", DEADLINE, || {
        let ep = s.get_json(&["endpoints", "web"]);
        let all: Vec<String> = ep["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| [ips(&s["addresses"]), ips(&s["notReadyAddresses"])].concat())
            .collect();
        (all.len() == 2 && !all.contains(&"10.42.0.11".to_string())).then_some(())
    });

    // Deleting the Service removes its slices (garbage collector) and its Endpoints.
    s.ok(&["delete", "service", "web"]);
    wait_for("slices and Endpoints gone", DEADLINE, || {
        let (code, _) = s.curl(
            "GET",
            "/api/v1/namespaces/default/endpoints/web",
            None,
            None,
        );
        (slices(&s, "web").is_empty() && code == 404).then_some(())
    });
}

#[test]
fn a_headless_service_with_many_pods_gets_slices_of_at_most_100_and_a_service_without_selector_none()
 {
    let s = Server::start();
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
            "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext"},
            "spec": {"ports": [{"port": 80}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "empty"},
            "spec": {"selector": {"app": "nothing"}, "ports": [{"port": 80}]}}),
    ];
    objects.extend((0..150).map(|i| pod(&format!("db-{i}"), "db", 5432, None)));
    create(&s, objects);
    for i in 0..150 {
        set_status(
            &s,
            &format!("db-{i}"),
            &format!("10.42.{}.{}", i / 100, i % 100 + 2),
            true,
        );
    }
    let sizes = wait_for("150 endpoints in slices", DEADLINE, || {
        let mut sizes: Vec<usize> = slices(&s, "db")
            .iter()
            .map(|s| s["endpoints"].as_array().map(Vec::len).unwrap_or(0))
            .collect();
        sizes.sort();
        (sizes.iter().sum::<usize>() == 150).then_some(sizes)
    });
    assert!(sizes.iter().all(|n| *n <= 100), "{sizes:?}");
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    for slice in slices(&s, "db") {
        assert_eq!(
            slice["metadata"]["labels"]["service.kubernetes.io/headless"],
            ""
        );
        assert_eq!(slice["ports"][0]["port"], 5432);
    }
    let ep = s.get_json(&["endpoints", "db"]);
    assert_eq!(
        ep["subsets"][0]["addresses"].as_array().map(Vec::len),
        Some(150)
    );
    assert_eq!(
        ep["metadata"]["labels"]["service.kubernetes.io/headless"],
        ""
    );

    // A Service selecting nothing gets one empty placeholder slice and no addresses.
    let placeholder = wait_for("the placeholder slice", DEADLINE, || {
        let all = slices(&s, "empty");
        (all.len() == 1).then(|| all[0].clone())
    });
    assert!(placeholder["endpoints"].is_null() || placeholder["endpoints"] == json!([]));
    // A Service without a selector is left alone (its slices are someone else's).
    assert!(slices(&s, "ext").is_empty());
    let (code, _) = s.curl(
        "GET",
        "/api/v1/namespaces/default/endpoints/ext",
        None,
        None,
    );
    assert_eq!(code, 404);
}
