//! Data-plane benchmark: the Service proxy's rule loading, the cluster DNS and the
//! Ingress controller, each measured on its own.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/dataplane_bench [services=1000] [seconds=5] [proxy-services=2000] [only=all]
//! ```
//!
//! `only` runs one part: `rules`, `proxy`, `dns` or `ingress`.
//!
//! Prints:
//! - rules: time to render and to load (`nft -f`, one transaction) the whole table for
//!   1,000 and 10,000 Service ports with 2 and 10 endpoints each (a table of its own,
//!   deleted after), then the partial transactions for one changed endpoint and one new
//!   Service;
//! - proxy: a `krust proxy` against a release `krust server` (no node) with
//!   `proxy-services` Services of 10 endpoints: its first full sync, then the network
//!   programming latency of single EndpointSlice changes, from its own metric;
//! - DNS: a release `krust server` (no node) with its cluster DNS, `services` Services;
//!   A queries for random ones from 64 UDP clients for `seconds`: answers/s, latency
//!   p50/p99, the server's CPU;
//! - Ingress: the same server's Ingress controller in front of an HTTP server of the
//!   bench (a Service without selector and an EndpointSlice pointing at it), plain and
//!   TLS (a certificate from a Secret), then Debian's nginx (when installed) as the same
//!   reverse proxy to the same backend; GETs from 64 clients, each on its own keep-alive
//!   HTTP/1.1 connection, for `seconds`: requests/s, latency p50/p99.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{Empty, Full};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use krust_proxy::model::{Protocol, ServicePort, TrafficPolicy};
use krust_proxy::nft::{Loaded, Ruleset};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;

mod support;

use support::{Cluster, Result, free_port, percentile, proc_stat};

const CLIENTS: usize = 64;

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let services: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let seconds: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let proxy_services: usize = args.next().map_or(Ok(2_000), |a| a.parse())?;
    let only = args.next().unwrap_or_else(|| "all".into());
    let part = |name: &str| only == "all" || only == name;
    let window = Duration::from_secs(seconds);
    if part("rules") {
        rules()?;
    }
    let node_ip = krust_kubelet::machine::node_ip();
    let (dns_port, http_port, https_port) = (free_port(), free_port(), free_port());
    let cluster = Cluster::start(&[
        "--disable-scheduler",
        &format!("--dns-port={dns_port}"),
        &format!("--ingress-http-port={http_port}"),
        &format!("--ingress-https-port={https_port}"),
    ])
    .await?;
    let client = cluster.client().await?;
    if part("proxy") {
        programming(&client, &cluster, proxy_services).await?;
    }
    if part("dns") {
        dns(
            &client,
            &cluster,
            SocketAddrV4::new(node_ip, dns_port),
            services,
            window,
        )
        .await?;
    }
    if part("ingress") {
        ingress(&client, node_ip, (http_port, https_port), window).await?;
    }
    cluster.stop();
    Ok(())
}

/// `n` synthetic Service ports with `endpoints` endpoints each.
fn synthetic_ports(n: usize, endpoints: usize) -> Vec<ServicePort> {
    (0..n)
        .map(|i| ServicePort {
            namespace: "bench".into(),
            service: format!("svc-{i}"),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            cluster_ip: Ipv4Addr::from(0x0a2b_0000 + i as u32),
            external_ips: Vec::new(),
            port: 80,
            node_port: None,
            endpoints: (0..endpoints)
                .map(|e| {
                    let ip = Ipv4Addr::from(0x0a2a_0000 + (endpoints * i + e) as u32);
                    SocketAddrV4::new(ip, 8080)
                })
                .collect(),
            local_endpoints: Vec::new(),
            local_ready: false,
            internal_policy: TrafficPolicy::Cluster,
            external_policy: TrafficPolicy::Cluster,
            affinity_seconds: None,
            firewall: None,
        })
        .collect()
}

/// Loads the whole table for each size, then times the partial transactions the
/// proxy writes for one endpoint change and for one new Service.
fn rules() -> Result {
    let cidr = "10.42.0.0/16".parse()?;
    let table = "krust-bench";
    for (n, endpoints) in [(1_000usize, 2usize), (10_000, 2), (1_000, 10), (10_000, 10)] {
        let mut ports = synthetic_ports(n, endpoints);
        let started = Instant::now();
        let ruleset = Ruleset::new(cidr, &ports);
        let text = ruleset.full(table);
        let rendered = started.elapsed();
        let started = Instant::now();
        krust_net::nft::apply(&text)?;
        let loaded = started.elapsed();
        println!(
            "rules for {n} Service ports x {endpoints} endpoints ({} chains): full sync rendered in {rendered:.2?} ({} KB), loaded in {loaded:.2?}",
            ruleset.chains(),
            text.len() / 1024
        );
        let mut state = Loaded::full(&ruleset);
        ports[n / 2].endpoints[0].set_ip(Ipv4Addr::new(10, 42, 255, 1));
        let mut extra = synthetic_ports(n + 1, endpoints).pop().expect("one more");
        extra.service = "svc-new".into();
        for (what, ports) in [
            ("one endpoint changed", ports.clone()),
            ("one Service added", [ports, vec![extra]].concat()),
        ] {
            let started = Instant::now();
            let update = state.update(table, &Ruleset::new(cidr, &ports));
            let rendered = started.elapsed();
            let started = Instant::now();
            krust_net::nft::apply(&update.text)?;
            let loaded = started.elapsed();
            println!(
                "  {what}: partial sync rendered and compared in {rendered:.2?} ({} chains written), loaded in {loaded:.2?}",
                update.chains_written
            );
            state = update.committed();
        }
    }
    krust_net::nft::delete_table(table)?;
    Ok(())
}

/// Network programming latency through a real `krust proxy`: `services` selector-less
/// Services with `ENDPOINTS` endpoints each (EndpointSlices written by the bench, which
/// plays the EndpointSlice controller and stamps each slice's trigger time); then one
/// slice at a time gets a new endpoint, and the proxy's own
/// `kubeproxy_network_programming_duration_seconds` says how long after the write its
/// rules carried it.
async fn programming(client: &kube::Client, cluster: &Cluster, services: usize) -> Result {
    const ENDPOINTS: usize = 10;
    const CHANGES: usize = 20;
    let table = "krust-bench-proxy";
    let metrics_port = free_port();
    let ns = "proxy-bench";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let svc_api = Api::<Service>::namespaced(client.clone(), ns);
    let slice_api = Api::<EndpointSlice>::namespaced(client.clone(), ns);
    let slice = |i: usize, first: u32| -> Result<EndpointSlice> {
        let addresses: Vec<_> = (0..ENDPOINTS as u32)
            .map(|e| json!({"addresses": [Ipv4Addr::from(first + e).to_string()]}))
            .collect();
        Ok(serde_json::from_value(json!({
            "metadata": {
                "name": format!("svc-{i}-1"),
                "labels": {"kubernetes.io/service-name": format!("svc-{i}")},
                "annotations": {
                    "endpoints.kubernetes.io/last-change-trigger-time":
                        jiff::Timestamp::now().to_string(),
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": addresses,
        }))?)
    };
    let started = Instant::now();
    let mut writes = JoinSet::new();
    for i in 0..services {
        let (svc_api, slice_api) = (svc_api.clone(), slice_api.clone());
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": format!("svc-{i}")},
            "spec": {"ports": [{"name": "http", "port": 80}]},
        }))?;
        let slice = slice(i, 0x0a2a_0000 + (ENDPOINTS * i) as u32)?;
        writes.spawn(async move {
            svc_api.create(&PostParams::default(), &svc).await?;
            slice_api.create(&PostParams::default(), &slice).await?;
            Ok::<_, kube::Error>(())
        });
        if writes.len() >= CLIENTS {
            writes.join_next().await.expect("a write")??;
        }
    }
    while let Some(done) = writes.join_next().await {
        done??;
    }
    println!(
        "proxy: {services} Services x {ENDPOINTS} endpoints written in {:.2?}",
        started.elapsed()
    );
    let started = Instant::now();
    let _proxy = cluster.component(
        "proxy",
        &[
            "--nftables-table",
            table,
            "--hostname-override",
            "bench-node",
            "--proxy-metrics-address",
            &format!("127.0.0.1:{metrics_port}"),
        ],
    )?;
    let metric = |name: &'static str| async move {
        let body = scrape(metrics_port).await.unwrap_or_default();
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
    };
    loop {
        if metric("krust_proxy_service_ports ").await >= Some(services as f64 + 1.0) {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the proxy did not load the Services' rules in 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let full = metric("kubeproxy_sync_full_proxy_rules_duration_seconds_sum ").await;
    println!(
        "proxy: first rules for {services} Service ports in {:.2?} after start (the full sync itself: {:.2} s)",
        started.elapsed(),
        full.unwrap_or_default()
    );
    let mut latencies = Vec::new();
    for change in 0..CHANGES {
        let count = "kubeproxy_network_programming_duration_seconds_count ";
        let sum = "kubeproxy_network_programming_duration_seconds_sum ";
        let (before, before_sum) = (metric(count).await, metric(sum).await);
        let i = (change * 7919) % services;
        let mut updated = slice(i, 0x0a2b_0000 + (ENDPOINTS * change) as u32)?;
        updated.metadata.resource_version = slice_api
            .get(&format!("svc-{i}-1"))
            .await?
            .metadata
            .resource_version;
        slice_api
            .replace(&format!("svc-{i}-1"), &PostParams::default(), &updated)
            .await?;
        let waited = Instant::now();
        while metric(count).await <= before {
            if waited.elapsed() > Duration::from_secs(30) {
                let text = scrape(metrics_port).await.unwrap_or_default();
                let syncs: Vec<&str> = text
                    .lines()
                    .filter(|l| l.starts_with("kubeproxy_sync") && !l.contains("_bucket"))
                    .collect();
                return Err(format!(
                    "a changed slice was not programmed in 30 s; the proxy's syncs:\n{}",
                    syncs.join("\n")
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = metric(sum).await.unwrap_or_default() - before_sum.unwrap_or_default();
        latencies.push(Duration::from_secs_f64(took.max(0.0)));
        // Past the proxy's minimum sync period, so each change is synced on its own.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    latencies.sort();
    println!(
        "proxy: one endpoint change, EndpointSlice write to rules in the kernel ({CHANGES} changes): p50 {:.1?}, max {:.1?}",
        percentile(&latencies, 0.5),
        latencies.last().copied().unwrap_or_default()
    );
    drop(_proxy);
    krust_net::nft::delete_table(table)?;
    Ok(())
}

/// The text of `http://127.0.0.1:<port>/metrics`, if it answers.
async fn scrape(port: u16) -> Option<String> {
    use http_body_util::BodyExt;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let request = hyper::Request::get(format!("http://127.0.0.1:{port}/metrics"))
        .body(Empty::new())
        .ok()?;
    let body = http
        .request(request)
        .await
        .ok()?
        .into_body()
        .collect()
        .await
        .ok()?;
    String::from_utf8(body.to_bytes().to_vec()).ok()
}

/// An A question for `name` (recursion desired), as a resolver sends it.
fn question(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Whether `reply` answers question `id` with NOERROR and at least one record.
fn answered(reply: &[u8], id: u16) -> bool {
    reply.len() >= 12
        && reply[..2] == id.to_be_bytes()
        && reply[3] & 0x0f == 0
        && u16::from_be_bytes([reply[6], reply[7]]) > 0
}

async fn ask(socket: &UdpSocket, id: u16, name: &str) -> bool {
    let mut buf = [0u8; 512];
    if socket.send(&question(id, name)).await.is_err() {
        return false;
    }
    matches!(
        tokio::time::timeout(Duration::from_secs(1), socket.recv(&mut buf)).await,
        Ok(Ok(n)) if answered(&buf[..n], id)
    )
}

async fn dns(
    client: &kube::Client,
    cluster: &Cluster,
    server: SocketAddrV4,
    services: usize,
    window: Duration,
) -> Result {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut set = JoinSet::new();
    for c in 0..16 {
        let api = api.clone();
        set.spawn(async move {
            for i in (c..services).step_by(16) {
                let svc = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i}")},
                    "spec": {"ports": [{"port": 80}]},
                }))?;
                api.create(&PostParams::default(), &svc).await?;
            }
            Ok::<_, support::Error>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let probe = UdpSocket::bind("0.0.0.0:0").await?;
    probe.connect(server).await?;
    let last = format!("svc-{}.default.svc.cluster.local", services - 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ask(&probe, 1, &last).await {
        if Instant::now() > deadline {
            return Err("the cluster DNS never answered".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (cpu_before, _) = proc_stat(cluster.server.pid());
    let started = Instant::now();
    let mut set = JoinSet::new();
    for c in 0..CLIENTS {
        set.spawn(async move {
            let socket = UdpSocket::bind("0.0.0.0:0").await?;
            socket.connect(server).await?;
            let (mut latencies, mut failed) = (Vec::new(), 0u64);
            let mut id = (c as u16) << 8;
            while started.elapsed() < window {
                id = id.wrapping_add(1);
                let name = format!("svc-{}.default.svc.cluster.local", id as usize % services);
                let sent = Instant::now();
                if ask(&socket, id, &name).await {
                    latencies.push(sent.elapsed());
                } else {
                    failed += 1;
                }
            }
            Ok::<_, support::Error>((latencies, failed))
        });
    }
    let (mut latencies, mut failed) = (Vec::new(), 0);
    while let Some(r) = set.join_next().await {
        let (l, f) = r??;
        latencies.extend(l);
        failed += f;
    }
    let elapsed = started.elapsed();
    let (cpu_after, rss) = proc_stat(cluster.server.pid());
    latencies.sort();
    println!(
        "DNS, {services} Services, {CLIENTS} UDP clients: {:.0} answers/s, p50 {:.2?}, p99 {:.2?}, {failed} unanswered; server CPU {:.2} s of {:.1} s, RSS {rss:.1} MB",
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        cpu_after - cpu_before,
        elapsed.as_secs_f64(),
    );
    Ok(())
}

async fn ingress(
    client: &kube::Client,
    node_ip: Ipv4Addr,
    (port, https_port): (u16, u16),
    window: Duration,
) -> Result {
    // The backend: a minimal HTTP server on the node's address.
    let backend = tokio::net::TcpListener::bind((node_ip, 0)).await?;
    let backend_port = backend.local_addr()?.port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = backend.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let certified = rcgen::generate_simple_self_signed(vec![BENCH_HOST.to_string()])?;
    let (cert_pem, key_pem) = (certified.cert.pem(), certified.signing_key.serialize_pem());
    Api::<Service>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "metadata": {"name": "backend"},
            "spec": {"ports": [{"name": "http", "port": 80}]}}))?,
        )
        .await?;
    Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "metadata": {"name": "backend-1", "labels": {"kubernetes.io/service-name": "backend"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": backend_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [node_ip.to_string()], "conditions": {"ready": true}}]}))?,
        )
        .await?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "metadata": {"name": "bench-tls"}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": cert_pem, "tls.key": key_pem}}))?,
        )
        .await?;
    Api::<Ingress>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "metadata": {"name": "bench",
                "annotations": {"nginx.ingress.kubernetes.io/ssl-redirect": "false"}},
            "spec": {"tls": [{"hosts": [BENCH_HOST], "secretName": "bench-tls"}],
                "rules": [{"host": BENCH_HOST, "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "backend", "port": {"number": 80}}}}]}}]}}))?,
        )
        .await?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ));
    let plain = |port: u16| Target {
        address: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        tls: None,
    };
    let secure = |port: u16| Target {
        address: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        tls: Some(tls.clone()),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while load(&secure(https_port), 1, Duration::from_millis(50))
        .await
        .requests
        == 0
    {
        if Instant::now() > deadline {
            return Err("the Ingress never routed".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let nginx = Nginx::start(node_ip, backend_port, &cert_pem, &key_pem)?;
    let mut targets = vec![("krust", port, https_port)];
    if let Some(nginx) = &nginx {
        targets.push(("nginx", nginx.port, nginx.https_port));
    } else {
        println!("Ingress: no nginx here (apt-get install nginx-light): krust alone");
    }
    for (name, port, https_port) in targets {
        for (scheme, target) in [("http", plain(port)), ("https", secure(https_port))] {
            let run = load(&target, CLIENTS, window).await;
            println!(
                "Ingress, {name} ({scheme}), {CLIENTS} keep-alive clients: {:.0} requests/s, p50 {:.2?}, p99 {:.2?}, {} failed",
                run.requests as f64 / window.as_secs_f64(),
                percentile(&run.latencies, 0.5),
                percentile(&run.latencies, 0.99),
                run.failed,
            );
        }
    }
    Ok(())
}

const BENCH_HOST: &str = "bench.example";

/// Where the load goes: plain HTTP, or HTTPS through `tls`.
struct Target {
    address: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
}

/// What a load run measured.
struct Run {
    requests: u64,
    failed: u64,
    latencies: Vec<Duration>,
}

/// `clients` clients, each on its own keep-alive HTTP/1.1 connection (reopened after a
/// failure), sending GETs for `bench.example` one after another for `window`.
async fn load(target: &Target, clients: usize, window: Duration) -> Run {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..clients {
        let (address, tls) = (target.address, target.tls.clone());
        set.spawn(async move {
            let (mut latencies, mut failed) = (Vec::new(), 0u64);
            while started.elapsed() < window {
                let Some(mut sender) = connect(address, tls.as_ref()).await else {
                    failed += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                while started.elapsed() < window {
                    let request = hyper::Request::get("/")
                        .header("host", BENCH_HOST)
                        .body(Empty::<Bytes>::new())
                        .expect("a request");
                    let sent = Instant::now();
                    let answered = match sender.send_request(request).await {
                        Ok(r) if r.status() == 200 => {
                            http_body_util::BodyExt::collect(r.into_body())
                                .await
                                .is_ok()
                        }
                        _ => false,
                    };
                    if !answered {
                        failed += 1;
                        break;
                    }
                    latencies.push(sent.elapsed());
                }
            }
            (latencies, failed)
        });
    }
    let mut run = Run {
        requests: 0,
        failed: 0,
        latencies: Vec::new(),
    };
    while let Some(Ok((latencies, failed))) = set.join_next().await {
        run.failed += failed;
        run.latencies.extend(latencies);
    }
    run.requests = run.latencies.len() as u64;
    run.latencies.sort();
    run
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(address: SocketAddr, tls: Option<&tokio_rustls::TlsConnector>) -> Option<Sender> {
    let tcp = tokio::net::TcpStream::connect(address).await.ok()?;
    tcp.set_nodelay(true).ok()?;
    let sender = match tls {
        None => {
            let (sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .ok()?;
            tokio::spawn(conn);
            sender
        }
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from(BENCH_HOST).ok()?;
            let stream = tls.connect(name, tcp).await.ok()?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .ok()?;
            tokio::spawn(conn);
            sender
        }
    };
    Some(sender)
}

/// Debian's nginx as the same kind of reverse proxy in front of the same backend (2
/// workers, as many as krust's runtime threads here; keep-alive to the backend and no
/// limit of requests per client connection, as krust's; no access log, as krust writes
/// none), for a side-by-side figure.
struct Nginx {
    child: std::process::Child,
    port: u16,
    https_port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// `None` when nginx is not installed.
    fn start(
        backend_ip: Ipv4Addr,
        backend_port: u16,
        cert: &str,
        key: &str,
    ) -> Result<Option<Nginx>> {
        if std::process::Command::new("nginx")
            .arg("-v")
            .output()
            .is_err()
        {
            return Ok(None);
        }
        let dir = tempfile::tempdir()?;
        let (port, https_port) = (free_port(), free_port());
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(dir.path().join("cert.pem"), cert)?;
        std::fs::write(dir.path().join("key.pem"), key)?;
        let config = format!(
            "worker_processes 2;\npid {pid};\nerror_log {log};\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000;\n\
               upstream backend {{ server {backend_ip}:{backend_port}; keepalive 64; }}\n\
               server {{\n    listen 127.0.0.1:{port};\n    listen 127.0.0.1:{https_port} ssl;\n\
                 ssl_certificate {cert};\n    ssl_certificate_key {key};\n\
                 location / {{\n      proxy_pass http://backend;\n      proxy_http_version 1.1;\n\
                   proxy_set_header Connection \"\";\n      proxy_set_header Host $host;\n\
                   proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n    }}\n  }}\n}}\n",
            pid = path("nginx.pid"),
            log = path("error.log"),
            cert = path("cert.pem"),
            key = path("key.pem"),
        );
        std::fs::write(dir.path().join("nginx.conf"), config)?;
        let child = std::process::Command::new("nginx")
            .args([
                "-p",
                &path(""),
                "-e",
                &path("error.log"),
                "-c",
                &path("nginx.conf"),
            ])
            .args(["-g", "daemon off;"])
            .spawn()?;
        let nginx = Nginx {
            child,
            port,
            https_port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if Instant::now() > deadline {
                return Err("nginx did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Some(nginx))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not yet reaped; SIGTERM stops its workers too.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}
