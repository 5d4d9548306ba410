//! The Service data plane with real nftables, containerd and runc: a node's proxy turns
//! Services and their EndpointSlices into rules, and connections to a cluster IP or a
//! NodePort reach the Service's ready pods.

use std::process::Command;
use std::time::Duration;

use crate::common::{Server, wait_for};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// The body at `url`, or `Err` with curl's exit code (7: connection refused).
fn curl(url: &str) -> Result<String, i32> {
    let out = Command::new("curl")
        .args(["-s", "-f", "--max-time", "2", url])
        .output()
        .expect("running curl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(out.status.code().unwrap_or(-1))
    }
}

#[test]
fn cluster_ips_and_node_ports_reach_ready_pods_and_services_without_endpoints_refuse() {
    let s = Server::with_agent(&[
        "--cluster-cidr=10.78.0.0/16",
        "--service-cidr=10.98.0.0/16",
        "--nftables-table=krust-test-proxy",
        "--sync-period=1s",
    ]);
    let serve = "mkdir -p /www && echo hello-from-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www";
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "httpd", "image": "busybox",
                        "command": ["sh", "-c", serve],
                        "ports": [{"name": "http", "containerPort": 8080}]}]}}}})
        .to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"type": "NodePort", "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
        .to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "nobody"},
            "spec": {"selector": {"app": "nobody"}, "ports": [{"port": 80}]}})
        .to_string(),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let svc = s.get_json(&["service", "web"]);
    let cluster_ip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    let node_port = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
    let pods: Vec<String> = s.get_json(&["pods", "-l", "app=web"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pods.len(), 2);

    // The cluster IP answers from this node, and connections spread over both pods.
    let mut seen = std::collections::BTreeSet::new();
    wait_for("both pods through the cluster IP", DEADLINE, || {
        if let Ok(body) = curl(&format!("http://{cluster_ip}/")) {
            seen.insert(body);
        }
        (seen.len() == 2).then_some(())
    });
    let expected: std::collections::BTreeSet<String> =
        pods.iter().map(|p| format!("hello-from-{p}")).collect();
    assert_eq!(seen, expected, "{}", s.diagnostics());

    // Under ClientIP session affinity, this node (one client address) keeps reaching
    // the pod it reached first (without it, ten tries reach one pod 1 time in 512).
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sticky"},
            "spec": {"selector": {"app": "web"}, "sessionAffinity": "ClientIP",
                "ports": [{"port": 80, "targetPort": "http"}]}})
        .to_string(),
    );
    let sticky = s.get_json(&["service", "sticky"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    let first = wait_for("the sticky Service", DEADLINE, || {
        curl(&format!("http://{sticky}/")).ok()
    });
    for _ in 0..10 {
        assert_eq!(curl(&format!("http://{sticky}/")), Ok(first.clone()));
    }

    // The NodePort answers on the node's address.
    let node_ip = s.get_json(&["pods", "-l", "app=web"])["items"][0]["status"]["hostIP"]
        .as_str()
        .unwrap()
        .to_string();
    let body = wait_for("the NodePort", DEADLINE, || {
        curl(&format!("http://{node_ip}:{node_port}/")).ok()
    });
    assert!(body.starts_with("hello-from-web-"), "{body}");

    // A load balancer (ServiceLB: the node's address) limited to other sources drops
    // this node's connections, and takes them once a range holds its address.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "guarded"},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                "loadBalancerSourceRanges": ["198.51.100.0/24"],
                "ports": [{"port": 8081, "targetPort": "http"}]}})
        .to_string(),
    );
    let balancer = wait_for("the load balancer address", DEADLINE, || {
        let svc = s.get_json(&["service", "guarded"]);
        svc["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .map(str::to_string)
    });
    assert_eq!(balancer, node_ip);
    let guarded = format!("http://{balancer}:8081/");
    // Dropped, not refused: curl gives up (28) rather than being turned away (7).
    wait_for("the balancer to drop this node", DEADLINE, || {
        (curl(&guarded) == Err(28)).then_some(())
    });
    s.ok(&[
        "patch",
        "service",
        "guarded",
        "-p",
        &json!({"spec": {"loadBalancerSourceRanges": ["198.51.100.0/24", format!("{node_ip}/32")]}})
            .to_string(),
    ]);
    let body = wait_for("the balancer to take this node", DEADLINE, || {
        curl(&guarded).ok()
    });
    assert!(body.starts_with("hello-from-web-"), "{body}");

    // A Service without endpoints refuses at once (rejected, not dropped: no timeout).
    let nobody = s.get_json(&["service", "nobody"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("the empty Service to refuse", DEADLINE, || {
        (curl(&format!("http://{nobody}/")) == Err(7)).then_some(())
    });

    // Scaled to zero, the web Service refuses too; scaled back, it answers again.
    s.ok(&["scale", "deployment/web", "--replicas=0"]);
    wait_for("web to refuse", DEADLINE, || {
        (curl(&format!("http://{cluster_ip}/")) == Err(7)).then_some(())
    });
    s.ok(&["scale", "deployment/web", "--replicas=1"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let body = wait_for("web to answer again", DEADLINE, || {
        curl(&format!("http://{cluster_ip}/")).ok()
    });
    assert!(body.starts_with("hello-from-web-"), "{body}");
    // From inside a pod, through the Service, back to that same pod (hairpin: the
    // bridge must send the packet back out of the port it came in on).
    let request = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {cluster_ip} 80");
    let out = s.ok(&["exec", "deployment/web", "--", "sh", "-c", &request]);
    let out = out
        .rsplit("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(out.trim(), body);
    // Rules deleted behind the proxy's back come back within a sync period.
    let deleted = Command::new("nft")
        .args(["delete", "table", "ip", "krust-test-proxy"])
        .status()
        .expect("nft");
    assert!(deleted.success());
    let restored = wait_for("the rules to come back", DEADLINE, || {
        curl(&format!("http://{cluster_ip}/")).ok()
    });
    assert_eq!(restored, body);
    s.ok(&["delete", "deployment", "web", "--timeout=60s"]);
}
