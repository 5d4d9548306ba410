//! The cluster DNS end to end: `krust server` serves the cluster's names on the node and
//! publishes itself behind the kube-dns Service; pods (real containers, whose
//! resolv.conf names that Service) resolve Services through the Service proxy; other
//! names go to the upstream nameserver.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{Server, free_port, wait_for};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// A stand-in upstream nameserver: answers every A question with 192.0.2.123.
struct Upstream {
    child: Child,
    port: u16,
}

impl Upstream {
    fn start() -> Upstream {
        let port = free_port();
        let script = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    q, peer = s.recvfrom(4096)
    end = 12
    while q[end] != 0:
        end += 1 + q[end]
    question = q[12:end + 5]
    header = q[:2] + b"\x81\x80" + b"\x00\x01\x00\x01\x00\x00\x00\x00"
    answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + bytes([192, 0, 2, 123])
    s.sendto(header + question + answer, peer)
"#;
        let mut child = Command::new("python3")
            .args(["-c", script, &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready.trim(), "ready");
        Upstream { child, port }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn apply(s: &Server, obj: serde_json::Value) {
    s.ok_stdin(&["apply", "-f", "-"], &obj.to_string());
}

/// `busybox nslookup` inside the pod of deployment/web.
pub(crate) fn nslookup_in_pod(s: &Server, args: &[&str]) -> String {
    let mut cmd = vec!["exec", "deployment/web", "--", "nslookup"];
    cmd.extend_from_slice(args);
    let out = s.kubectl(&cmd);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn pods_resolve_services_through_the_cluster_dns_and_other_names_upstream() {
    let upstream = Upstream::start();
    let s = Server::with_agent(&[
        "--cluster-cidr=10.79.0.0/16",
        // No --cluster-dns: the tenth address of the service range, as k3s.
        "--service-cidr=10.99.0.0/16",
        "--nftables-table=krust-test-dns",
        &format!("--dns-port={}", free_port()),
        &format!("--dns-upstream=127.0.0.1:{}", upstream.port),
    ]);
    let serve = "mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8080 -h /www";
    apply(
        &s,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "httpd", "image": "busybox",
                        "command": ["sh", "-c", serve],
                        "ports": [{"name": "http", "containerPort": 8080}]}]}}}}),
    );
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    );
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "pods"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8080}]}}),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    // The DNS published itself behind the Service the kubelet gives pods.
    let dns = s.get_json(&["service", "kube-dns", "-n", "kube-system"]);
    assert_eq!(dns["spec"]["clusterIP"], "10.99.0.10");
    let cluster_ip = s.get_json(&["service", "web"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    let pod_ip = s.get_json(&["pods", "-l", "app=web"])["items"][0]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();

    // From inside the pod, through its resolv.conf: a Service, a headless Service's pods.
    let out = wait_for("the Service's name from a pod", DEADLINE, || {
        let out = nslookup_in_pod(&s, &["web.default.svc.cluster.local"]);
        out.contains(&cluster_ip).then_some(out)
    });
    assert!(
        out.contains("10.99.0.10"),
        "answered by the cluster DNS: {out}"
    );
    // A short name, through the search path the kubelet wrote (ndots:5).
    let out = nslookup_in_pod(&s, &["web"]);
    assert!(out.contains(&cluster_ip), "{out}");
    let out = wait_for("the headless Service's pod", DEADLINE, || {
        let out = nslookup_in_pod(&s, &["pods.default.svc.cluster.local"]);
        out.contains(&pod_ip).then_some(out)
    });
    assert!(!out.contains(&cluster_ip), "{out}");
    // A name that does not exist, and one outside the cluster (the upstream's answer).
    let out = nslookup_in_pod(&s, &["nope.default.svc.cluster.local"]);
    assert!(out.contains("NXDOMAIN"), "{out}");
    let out = nslookup_in_pod(&s, &["example.com"]);
    assert!(out.contains("192.0.2.123"), "{out}");
    // An ExternalName Service: the CNAME, with its target resolved upstream.
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}}),
    );
    let out = wait_for("the ExternalName Service", DEADLINE, || {
        let out = nslookup_in_pod(&s, &["ext.default.svc.cluster.local"]);
        out.contains("192.0.2.123").then_some(out)
    });
    assert!(out.contains("example.com"), "{out}");

    // SRV and PTR, asked from the node through the kube-dns Service's cluster IP.
    let host = |args: &[&str]| {
        let out = Command::new("busybox")
            .arg("nslookup")
            .args(args)
            .arg("10.99.0.10")
            .output()
            .expect("busybox nslookup");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = host(&["-type=srv", "_http._tcp.web.default.svc.cluster.local"]);
    assert!(
        out.contains("web.default.svc.cluster.local") && out.contains(" 80 "),
        "{out}"
    );
    let reverse: Vec<&str> = cluster_ip.split('.').rev().collect();
    let out = host(&["-type=ptr", &format!("{}.in-addr.arpa", reverse.join("."))]);
    assert!(out.contains("web.default.svc.cluster.local"), "{out}");

    // A new Service resolves once created.
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "late"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 81, "targetPort": 8080}]}}),
    );
    let late = s.get_json(&["service", "late"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("the new Service's name", DEADLINE, || {
        host(&["late.default.svc.cluster.local"])
            .contains(&late)
            .then_some(())
    });
    s.ok(&["delete", "deployment", "web", "--timeout=60s"]);
}
