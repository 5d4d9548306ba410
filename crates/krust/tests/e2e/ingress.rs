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
    let (port, https) = (free_port(), free_port());
    let s = Server::with_agent(&[
        "--cluster-cidr=10.80.0.0/16",
        &format!("--ingress-http-port={port}"),
        &format!("--ingress-https-port={https}"),
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
    tls_from_secrets(&s, port, https);
    s.ok(&["delete", "deployment", "web", "api", "--timeout=60s"]);
}

/// A self-signed certificate for `host` in `dir`: (cert path, key path).
pub(crate) fn certificate(dir: &std::path::Path, host: &str, name: &str) -> (String, String) {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", &format!("/CN={host}")])
        .args(["-addext", &format!("subjectAltName=DNS:{host}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    (cert.display().to_string(), key.display().to_string())
}

/// curl over HTTPS to the Ingress port, `host` resolving to it: (exit code, HTTP
/// version, status, body).
pub(crate) fn get_tls(https: u16, host: &str, ca: Option<&str>) -> (i32, String, String) {
    let mut curl = Command::new("curl");
    curl.args([
        "-s",
        "--max-time",
        "5",
        "-w",
        "\n%{http_version} %{http_code}",
    ])
    .args(["--resolve", &format!("{host}:{https}:127.0.0.1")]);
    match ca {
        Some(ca) => curl.args(["--cacert", ca]),
        None => curl.arg("-k"),
    };
    let out = curl
        .arg(format!("https://{host}:{https}/"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", ""));
    (
        out.status.code().unwrap_or(-1),
        status.trim().to_string(),
        body.trim().to_string(),
    )
}

/// TLS from a `kubernetes.io/tls` Secret named in `spec.tls`: served by SNI over
/// HTTP/2, plain HTTP redirected, unknown names given the default certificate, and a
/// replaced Secret's certificate served without a restart.
fn tls_from_secrets(s: &Server, port: u16, https: u16) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (cert, key) = certificate(dir.path(), "shop.example", "first");
    s.ok(&[
        "create", "secret", "tls", "shop-tls", "--cert", &cert, "--key", &key,
    ]);
    s.ok(&[
        "patch",
        "ingress",
        "site",
        "--type=merge",
        "-p",
        r#"{"spec":{"tls":[{"hosts":["shop.example"],"secretName":"shop-tls"}]}}"#,
    ]);
    let served = wait_for("the Secret's certificate", DEADLINE, || {
        let got = get_tls(https, "shop.example", Some(&cert));
        (got.0 == 0).then_some(got)
    });
    assert_eq!(served, (0, "2 200".to_string(), "web".to_string()));
    // Plain HTTP for that host goes to HTTPS, keeping the path.
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
            "-H",
        ])
        .arg("Host: shop.example")
        .arg(format!("http://127.0.0.1:{port}/api/"))
        .output()
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("308 https://shop.example:{https}/api/")
    );
    // A name no Ingress has TLS for gets the default certificate (not the Secret's).
    assert_eq!(get_tls(https, "elsewhere.example", Some(&cert)).0, 60);
    assert_eq!(get_tls(https, "elsewhere.example", None).1, "2 404");
    // A new certificate in the Secret is served, without a restart.
    let (cert2, key2) = certificate(dir.path(), "shop.example", "second");
    let secret = s.ok(&[
        "create",
        "secret",
        "tls",
        "shop-tls",
        "--cert",
        &cert2,
        "--key",
        &key2,
        "--dry-run=client",
        "-o",
        "json",
    ]);
    s.ok_stdin(&["replace", "-f", "-"], &secret);
    wait_for("the new certificate", DEADLINE, || {
        (get_tls(https, "shop.example", Some(&cert2)).0 == 0).then_some(())
    });
}
