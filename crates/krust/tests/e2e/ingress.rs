//! The Ingress controller end to end: `krust server` serves HTTP on its Ingress port and
//! routes by Host and path to the ready pods (real containers) of the backend Services.

use std::process::Command;
use std::time::Duration;

use crate::common::{Server, free_port, wait_for};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// (status code, body) of a GET to the Ingress port with this Host header.
pub(crate) fn get(port: u16, host: &str, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-w", "\n%{http_code}", "-H"])
        .arg(format!("Host: {host}"))
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.trim().to_string())
}

pub(crate) fn deployment(name: &str, files: &str) -> String {
    let serve = format!("{files} && exec httpd -f -p 8080 -h /www");
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "httpd", "image": "busybox",
                    "command": ["sh", "-c", serve],
                    "ports": [{"name": "http", "containerPort": 8080}]}]}}}})
    .to_string()
}

pub(crate) fn service(name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    .to_string()
}

#[test]
fn ingress_rules_route_by_host_and_path_to_ready_pods() {
    let port = free_port();
    let s = Server::with_agent(&[
        "--cluster-cidr=10.80.0.0/16",
        &format!("--ingress-http-port={port}"),
    ]);
    let apply = |manifest: &str| s.ok_stdin(&["apply", "-f", "-"], manifest);
    apply(&deployment(
        "web",
        "mkdir -p /www && echo web > /www/index.html",
    ));
    apply(&deployment(
        "api",
        "mkdir -p /www/api && echo api > /www/api/index.html",
    ));
    apply(&service("web"));
    apply(&service("api"));
    apply(
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "site"},
            "spec": {"rules": [{"host": "shop.example", "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "/api", "pathType": "Prefix",
                 "backend": {"service": {"name": "api", "port": {"name": "http"}}}},
            ]}}]}})
        .to_string(),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    s.ok(&["rollout", "status", "deployment/api", "--timeout=60s"]);

    assert_eq!(
        wait_for("the web pod through the Ingress", DEADLINE, || {
            let got = get(port, "shop.example", "/");
            (got.0 == 200).then_some(got)
        }),
        (200, "web".to_string())
    );
    assert_eq!(
        wait_for("the api pod through the Ingress", DEADLINE, || {
            let got = get(port, "shop.example", "/api/");
            (got.1 == "api").then_some(got)
        }),
        (200, "api".to_string())
    );
    // `/apix` is not under `/api`: it goes to `/`'s backend, which has no such file.
    assert_eq!(get(port, "shop.example", "/apix").0, 404);
    // No rule for the host: the default backend's 404.
    assert_eq!(
        get(port, "elsewhere.example", "/"),
        (404, "default backend - 404".to_string())
    );

    // The controller reports where it serves, and registered its (default) class.
    let ingress = wait_for("the Ingress status", DEADLINE, || {
        let i = s.get_json(&["ingress", "site"]);
        i["status"]["loadBalancer"]["ingress"][0]["ip"]
            .is_string()
            .then_some(i)
    });
    assert!(
        ingress["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .unwrap()
            .parse::<std::net::Ipv4Addr>()
            .is_ok()
    );
    let class = s.get_json(&["ingressclass", "krust"]);
    assert_eq!(class["spec"]["controller"], "krust.io/ingress");
    assert_eq!(
        class["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"],
        "true"
    );

    // Without ready pods the backend answers 503; with one again, 200.
    s.ok(&["scale", "deployment/api", "--replicas=0"]);
    wait_for("503 without api pods", DEADLINE, || {
        (get(port, "shop.example", "/api/").0 == 503).then_some(())
    });
    s.ok(&["scale", "deployment/api", "--replicas=1"]);
    wait_for("api back", DEADLINE, || {
        (get(port, "shop.example", "/api/") == (200, "api".to_string())).then_some(())
    });
    s.ok(&["delete", "deployment", "web", "api", "--timeout=60s"]);
}
