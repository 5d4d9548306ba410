//! Every component's `/metrics` and health endpoints (issue 17): a server with its node
//! runs a Deployment behind a Service and an Ingress, answers a DNS query from a pod and
//! an HTTP request through the Ingress, and then each component's metrics show the work
//! in upstream's names — work queues, scheduling attempts, pod starts and runtime
//! operations, proxy syncs, DNS answers by response code, Ingress requests by status.

use std::process::Command;
use std::time::Duration;

use crate::common::{Server, free_port, wait_for};
use crate::dns::nslookup_in_pod;
use crate::ingress::{deployment, get, service};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// (status, content type, body) of a plain GET; with `tls` (a server's PKI directory),
/// as its admin over HTTPS (the kubelet's server).
fn fetch(url: &str, tls: Option<&std::path::Path>) -> (u16, String, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "--max-time",
        "5",
        "-w",
        "\n%{http_code} %{content_type}",
    ]);
    if let Some(dir) = tls {
        cmd.arg("--cert").arg(dir.join("admin.crt"));
        cmd.arg("--key").arg(dir.join("admin.key"));
        // The kubelet's certificate names the node, not 127.0.0.1.
        cmd.arg("-k");
    }
    let out = cmd.arg(url).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", "0 "));
    let (code, content_type) = tail.split_once(' ').unwrap_or((tail, ""));
    (
        code.parse().unwrap_or(0),
        content_type.to_string(),
        body.to_string(),
    )
}

/// The value of the sample `series` (name and labels exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn assert_positive(text: &str, series: &str) {
    let value = sample(text, series);
    assert!(
        value.is_some_and(|v| v > 0.0),
        "{series} = {value:?} in\n{text}"
    );
}

#[test]
fn every_component_serves_its_metrics_and_health() {
    let [cm, sched, proxy, dns, ingress] = [(); 5].map(|()| free_port());
    let http_port = free_port();
    let s = Server::with_agent(&[
        "--cluster-cidr=10.77.0.0/16",
        "--service-cidr=10.94.0.0/16",
        "--cluster-dns=10.94.0.10",
        "--nftables-table=krust-test-metrics",
        &format!("--dns-port={}", free_port()),
        &format!("--ingress-http-port={http_port}"),
        &format!("--controller-manager-metrics-address=127.0.0.1:{cm}"),
        &format!("--scheduler-metrics-address=127.0.0.1:{sched}"),
        &format!("--proxy-metrics-address=127.0.0.1:{proxy}"),
        &format!("--dns-metrics-address=127.0.0.1:{dns}"),
        &format!("--ingress-metrics-address=127.0.0.1:{ingress}"),
    ]);
    let apply = |manifest: &str| s.ok_stdin(&["apply", "-f", "-"], manifest);
    apply(&deployment(
        "web",
        "mkdir -p /www && echo web > /www/index.html",
    ));
    apply(&service("web"));
    apply(
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "site"},
            "spec": {"rules": [{"host": "metrics.example", "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}})
        .to_string(),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    wait_for("the pod through the Ingress", DEADLINE, || {
        (get(http_port, "metrics.example", "/") == (200, "web".to_string())).then_some(())
    });
    assert_eq!(get(http_port, "nowhere.example", "/").0, 404);
    let cluster_ip = s.get_json(&["service", "web"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("the Service's name from a pod", DEADLINE, || {
        nslookup_in_pod(&s, &["web.default.svc.cluster.local"])
            .contains(&cluster_ip)
            .then_some(())
    });
    assert!(nslookup_in_pod(&s, &["nope.default.svc.cluster.local"]).contains("NXDOMAIN"));

    // Health and the text format on every component's own address.
    for port in [cm, sched, proxy, dns, ingress] {
        for path in ["/healthz", "/livez", "/readyz"] {
            let (code, _, body) = fetch(&format!("http://127.0.0.1:{port}{path}"), None);
            assert_eq!((code, body.as_str()), (200, "ok"), "{port}{path}");
        }
        let (code, content_type, _) = fetch(&format!("http://127.0.0.1:{port}/metrics"), None);
        assert_eq!(code, 200);
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
    }
    let metrics = |port: u16| fetch(&format!("http://127.0.0.1:{port}/metrics"), None).2;

    let text = metrics(cm);
    assert_positive(&text, r#"workqueue_adds_total{name="deployment"}"#);
    assert_positive(
        &text,
        r#"workqueue_work_duration_seconds_count{name="replicaset"}"#,
    );
    assert_positive(
        &text,
        r#"workqueue_queue_duration_seconds_count{name="endpointslice"}"#,
    );
    assert!(
        sample(&text, r#"workqueue_depth{name="deployment"}"#).is_some(),
        "{text}"
    );
    assert!(
        sample(&text, r#"workqueue_retries_total{name="deployment"}"#).is_some(),
        "{text}"
    );

    let text = metrics(sched);
    let scheduled = r#"{result="scheduled",profile="default-scheduler"}"#;
    assert_positive(
        &text,
        &format!("scheduler_schedule_attempts_total{scheduled}"),
    );
    assert_positive(
        &text,
        &format!("scheduler_scheduling_attempt_duration_seconds_count{scheduled}"),
    );
    assert_eq!(
        sample(&text, r#"scheduler_pending_pods{queue="active"}"#),
        Some(0.0),
        "{text}"
    );

    let text = metrics(proxy);
    assert_positive(
        &text,
        r#"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}"#,
    );
    assert_positive(
        &text,
        r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}"#,
    );
    assert_eq!(
        sample(
            &text,
            r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}"#
        ),
        Some(0.0)
    );
    // The first sync loads the whole table. Whether web's pod was ready before the
    // agent's proxy first synced is a race, so a second pod, started now that the proxy
    // has synced, is the change that must come in a partial sync, timed from its
    // EndpointSlice's trigger time.
    assert_positive(
        &text,
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
    );
    s.ok(&["scale", "deployment/web", "--replicas=2"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    wait_for("a partial sync timed from its trigger", DEADLINE, || {
        let text = metrics(proxy);
        [
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
            "kubeproxy_network_programming_duration_seconds_count",
        ]
        .iter()
        .all(|name| sample(&text, name).is_some_and(|v| v > 0.0))
        .then_some(())
    });
    // kubernetes, kube-dns (udp, tcp, metrics) and web.
    assert!(
        sample(&text, "krust_proxy_service_ports").is_some_and(|n| n >= 3.0),
        "{text}"
    );

    let text = metrics(dns);
    let answers = |rcode: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("coredns_dns_responses_total{")
                    && l.contains(&format!("rcode=\"{rcode}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(
        answers("NOERROR") > 0.0 && answers("NXDOMAIN") > 0.0,
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("coredns_dns_requests_total{") && l.contains("type=\"A\"")),
        "{text}"
    );
    assert!(
        text.contains("coredns_dns_request_duration_seconds_count{"),
        "{text}"
    );

    let text = metrics(ingress);
    let served = r#"{controller_class="krust",ingress="site",namespace="default",service="web",method="GET",status="200"}"#;
    assert_positive(
        &text,
        &format!("nginx_ingress_controller_requests_total{served}"),
    );
    let unrouted = r#"{controller_class="krust",ingress="",namespace="",service="",method="GET",status="404"}"#;
    assert_positive(
        &text,
        &format!("nginx_ingress_controller_requests_total{unrouted}"),
    );
    assert_positive(
        &text,
        r#"nginx_ingress_controller_response_duration_seconds_count{controller_class="krust",ingress="site",namespace="default",service="web"}"#,
    );

    // The kubelet serves its metrics on its own HTTPS port, as upstream's.
    let node = &s.get_json(&["nodes"])["items"][0];
    let kubelet = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap();
    let tls = s.tls();
    let (code, _, body) = fetch(&format!("https://127.0.0.1:{kubelet}/healthz"), Some(&tls));
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, _, text) = fetch(&format!("https://127.0.0.1:{kubelet}/metrics"), Some(&tls));
    assert_eq!(code, 200, "{text}");
    assert_positive(&text, "kubelet_pod_start_duration_seconds_count");
    assert_positive(&text, "kubelet_pleg_relist_duration_seconds_count");
    assert_positive(
        &text,
        r#"kubelet_runtime_operations_total{operation_type="run_podsandbox"}"#,
    );
    assert_positive(
        &text,
        r#"kubelet_runtime_operations_duration_seconds_count{operation_type="create_container"}"#,
    );
    assert!(
        text.contains("# TYPE kubelet_runtime_operations_errors counter"),
        "{text}"
    );
}
