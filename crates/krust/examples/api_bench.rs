//! End-to-end apiserver benchmark over HTTPS, load generator included: starts a release
//! `krust server` on a temp dir and measures what the foundation issue targets.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/api_bench [-- <extra apiserver flags>]
//! ```
//!
//! Prints: start to ready; durable creates/s with p50/p99 at 1, 16 and 64 clients; GETs/s
//! and p99 at 16 clients, as the admin (`system:masters`, allowed without consulting
//! policy) and as a user RBAC decides for; LIST latency at 1k and 10k objects; watch event latency to 1,000
//! watchers; server RSS idle, with ~41k objects and with 1,000 watchers. Clients share
//! HTTP/2 connections the way client-go does (one connection carries many streams).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use krust_store::etcd::testing::EtcdCluster;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::task::JoinSet;

mod support;

use support::{Error, Result, krust_binary, percentile, proc_stat};

struct Server {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pool of HTTP/2 connections authenticated with the admin client certificate.
#[derive(Clone)]
struct Client {
    conns: Vec<SendRequest<Full<Bytes>>>,
    port: u16,
    /// The user requests impersonate (`Impersonate-User`), if any.
    acting_as: Option<String>,
}

impl Client {
    async fn connect(tls_dir: &Path, port: u16, connections: usize) -> Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(tls_dir.join("ca.crt"))? {
            roots.add(c?)?;
        }
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(tls_dir.join("admin.crt"))?.collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_file(tls_dir.join("admin.key"))?;
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let mut conns = Vec::new();
        for _ in 0..connections {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector
                .connect(ServerName::try_from("127.0.0.1")?, tcp)
                .await?;
            let (send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await?;
            tokio::spawn(conn);
            conns.push(send);
        }
        Ok(Client {
            conns,
            port,
            acting_as: None,
        })
    }

    /// The same connections, with every request acting as `user`.
    fn impersonating(&self, user: &str) -> Client {
        Client {
            acting_as: Some(user.to_string()),
            ..self.clone()
        }
    }

    fn build(&self, method: &str, path: &str, body: Vec<u8>) -> Result<http::Request<Full<Bytes>>> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1:{}{path}", self.port))
            .header("content-type", "application/json");
        if let Some(user) = &self.acting_as {
            req = req.header("impersonate-user", user);
        }
        Ok(req.body(Full::new(Bytes::from(body)))?)
    }

    async fn request(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes)> {
        let mut send = self.conns[i % self.conns.len()].clone();
        send.ready().await?;
        let resp = send
            .send_request(self.build(method, path, body.unwrap_or_default())?)
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, bytes))
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn configmap(ns: &str, name: &str) -> Vec<u8> {
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench": "yes"}},
        "data": {"key": "value-of-some-length-0123456789"},
    })
    .to_string()
    .into_bytes()
}

/// Starts `krust apiserver` (no controllers, so only the load is measured) with extra
/// flags.
async fn start_server(extra: &[String]) -> Result<(Server, Duration)> {
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let started = Instant::now();
    let child = Command::new(krust_binary())
        .args(["apiserver", "--bind-address", "127.0.0.1"])
        .args(extra)
        .args(["--advertise-address", "127.0.0.1"])
        .args(["--https-listen-port", &port.to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--write-kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .env("KRUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let server = Server { child, dir, port };
    // The kubeconfig is written once the listener is up and bootstrap is done.
    let kubeconfig = server.dir.path().join("kubeconfig");
    while !kubeconfig.exists() {
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    Ok((server, started.elapsed()))
}

/// `clients` tasks create `total` ConfigMaps in `ns`; returns creates/s and latencies.
async fn create_phase(
    client: &Client,
    ns: &str,
    clients: usize,
    total: usize,
) -> Result<(f64, Vec<Duration>)> {
    let per = total / clients;
    let started = Instant::now();
    let mut set = JoinSet::new();
    for c in 0..clients {
        let client = client.clone();
        let ns = ns.to_string();
        set.spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let t = Instant::now();
                let path = format!("/api/v1/namespaces/{ns}/configmaps");
                let (code, body) = client
                    .request(c, "POST", &path, Some(configmap(&ns, &format!("c{c}-{i}"))))
                    .await?;
                if code != 201 {
                    return Err(Error::from(format!(
                        "create returned {code}: {}",
                        String::from_utf8_lossy(&body)
                    )));
                }
                lat.push(t.elapsed());
            }
            Ok(lat)
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r??);
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort();
    Ok((rate, all))
}

/// Lets `user` get ConfigMaps in `namespace` through a Role and a RoleBinding.
async fn grant_reader(client: &Client, namespace: &str, user: &str) -> Result {
    let role = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]});
    let binding = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "configmap-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    for (plural, body) in [("roles", role), ("rolebindings", binding)] {
        let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}");
        let (code, _) = client
            .request(0, "POST", &path, Some(body.to_string().into_bytes()))
            .await?;
        if code != 201 {
            return Err(format!("creating {plural}: {code}").into());
        }
    }
    Ok(())
}

async fn create_namespace(client: &Client, name: &str) -> Result {
    let body =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let (code, _) = client
        .request(
            0,
            "POST",
            "/api/v1/namespaces",
            Some(body.to_string().into_bytes()),
        )
        .await?;
    if code != 201 {
        return Err(format!("creating namespace {name}: {code}").into());
    }
    Ok(())
}

async fn get_phase(client: &Client) -> Result {
    let secs = 5;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut set = JoinSet::new();
    for c in 0..16 {
        let client = client.clone();
        set.spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0usize;
            while Instant::now() < deadline {
                let t = Instant::now();
                let path = format!(
                    "/api/v1/namespaces/list-10k/configmaps/c{}-{}",
                    i % 50,
                    i % 200
                );
                let (code, _) = client.request(c, "GET", &path, None).await?;
                if code != 200 {
                    return Err(Error::from(format!("GET {path}: {code}")));
                }
                lat.push(t.elapsed());
                i += 1;
            }
            Ok(lat)
        });
    }
    let mut lat = Vec::new();
    while let Some(r) = set.join_next().await {
        lat.extend(r??);
    }
    lat.sort();
    println!(
        "{:.0} GETs/s  p50 {:.2} ms  p99 {:.2} ms",
        lat.len() as f64 / secs as f64,
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
    Ok(())
}

async fn list_phase(client: &Client) -> Result {
    for (ns, n) in [("list-1k", 1_000), ("list-10k", 10_000)] {
        let mut lat = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let (code, body) = client
                .request(
                    0,
                    "GET",
                    &format!("/api/v1/namespaces/{ns}/configmaps"),
                    None,
                )
                .await?;
            lat.push(t.elapsed());
            let v: serde_json::Value = serde_json::from_slice(&body)?;
            let items = v["items"].as_array().map_or(0, Vec::len);
            if code != 200 || items != n {
                return Err(format!("LIST {ns}: {code}, {items} items").into());
            }
        }
        lat.sort();
        println!(
            "{n:>6} objects: p50 {:.1} ms  max {:.1} ms",
            ms(percentile(&lat, 0.5)),
            ms(*lat.last().unwrap_or(&Duration::ZERO))
        );
    }
    Ok(())
}

/// One watcher: reports (event index, arrival time) for each `e<N>` object it sees.
async fn watcher(
    client: Client,
    w: usize,
    ready: tokio::sync::oneshot::Sender<()>,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Instant)>,
) -> Result {
    let mut send = client.conns[w % client.conns.len()].clone();
    send.ready().await?;
    let req = client.build(
        "GET",
        "/api/v1/namespaces/watch/configmaps?watch=1&resourceVersion=0",
        Vec::new(),
    )?;
    let resp = send.send_request(req).await?;
    let _ = ready.send(());
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            buf.extend_from_slice(data);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let v: serde_json::Value = serde_json::from_slice(&line)?;
                let name = v["object"]["metadata"]["name"].as_str().unwrap_or_default();
                if let Ok(idx) = name.trim_start_matches('e').parse() {
                    tx.send((idx, Instant::now()))?;
                }
            }
        }
    }
    Ok(())
}

async fn watch_phase(client: &Client, tls: &Path, port: u16, pid: u32) -> Result {
    let watchers = 1_000;
    let events = 50;
    create_namespace(client, "watch").await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watch_client = Client::connect(tls, port, 8).await?;
    let mut ready = Vec::new();
    for w in 0..watchers {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        ready.push(ready_rx);
        tokio::spawn(watcher(watch_client.clone(), w, ready_tx, tx.clone()));
    }
    for r in ready {
        r.await?;
    }
    let mut sent = Vec::new();
    for e in 0..events {
        sent.push(Instant::now());
        let (code, _) = client
            .request(
                e,
                "POST",
                "/api/v1/namespaces/watch/configmaps",
                Some(configmap("watch", &format!("e{e}"))),
            )
            .await?;
        if code != 201 {
            return Err(format!("watch event create: {code}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut delays = Vec::with_capacity(watchers * events);
    while delays.len() < watchers * events {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some((idx, at))) => delays.push(at - sent[idx]),
            _ => break,
        }
    }
    delays.sort();
    println!(
        "{} of {} deliveries  p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        delays.len(),
        watchers * events,
        ms(percentile(&delays, 0.5)),
        ms(percentile(&delays, 0.99)),
        ms(delays.last().copied().unwrap_or_default())
    );
    println!("RSS with 1,000 watchers: {:.1} MB", proc_stat(pid).1);
    Ok(())
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Anything on the command line is passed to the apiserver (`-- --audit-policy-file …`).
    let flags: Vec<String> = std::env::args().skip(1).filter(|a| a != "--").collect();
    let (server, ready) = start_server(&flags).await?;
    let pid = server.child.id();
    println!("krust api benchmark (server and load generator on this machine)");
    println!("start to ready: {:.0} ms", ms(ready));
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("idle RSS: {:.1} MB", proc_stat(pid).1);
    let tls = server.dir.path().join("data/server/tls");
    let client = Client::connect(&tls, server.port, 8).await?;

    println!("\n== durable creates (ConfigMaps) ==");
    for (clients, total) in [(1, 1_000), (16, 8_000), (64, 20_000)] {
        let ns = format!("create-{clients}");
        create_namespace(&client, &ns).await?;
        let (rate, lat) = create_phase(&client, &ns, clients, total).await?;
        println!(
            "{clients:>2} clients: {rate:>8.0} creates/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
            ms(percentile(&lat, 0.50)),
            ms(percentile(&lat, 0.99))
        );
    }
    create_namespace(&client, "list-1k").await?;
    create_phase(&client, "list-1k", 8, 1_000).await?;
    create_namespace(&client, "list-10k").await?;
    create_phase(&client, "list-10k", 50, 10_000).await?;
    println!("RSS with ~41k objects: {:.1} MB", proc_stat(pid).1);

    println!("\n== GET (16 clients, 5 s) ==");
    get_phase(&client).await?;
    println!("\n== GET as a user RBAC allows (a RoleBinding; impersonated, 16 clients, 5 s) ==");
    grant_reader(&client, "list-10k", "reader").await?;
    get_phase(&client.impersonating("reader")).await?;
    println!("\n== LIST (20 each) ==");
    list_phase(&client).await?;
    println!("\n== watch fan-out (1,000 watchers, 50 events) ==");
    watch_phase(&client, &tls, server.port, pid).await?;
    drop(server);
    etcd_comparison().await?;
    Ok(())
}

/// Creates/s at 64 clients, GETs/s and LIST of 10k, embedded vs etcd, in one run.
async fn etcd_comparison() -> Result {
    println!("\n== embedded vs etcd (same machine, same run) ==");
    let etcd = EtcdCluster::start(1).await;
    let endpoint = etcd.datastore_endpoint();
    for (label, extra) in [
        ("embedded", vec![]),
        ("etcd", vec!["--datastore-endpoint".to_string(), endpoint]),
    ] {
        let (server, _) = start_server(&extra).await?;
        let tls = server.dir.path().join("data/server/tls");
        let client = Client::connect(&tls, server.port, 8).await?;
        create_namespace(&client, "cmp").await?;
        let (rate, lat) = create_phase(&client, "cmp", 64, 10_048).await?;
        let t = Instant::now();
        let (code, _) = client
            .request(0, "GET", "/api/v1/namespaces/cmp/configmaps", None)
            .await?;
        let list = t.elapsed();
        if code != 200 {
            return Err(format!("LIST on {label}: {code}").into());
        }
        println!(
            "{label:>8}: {rate:>7.0} creates/s at 64 clients (p50 {:.2} ms, p99 {:.2} ms); LIST 10k {:.1} ms",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            ms(list)
        );
    }
    Ok(())
}
