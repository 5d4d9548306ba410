//! ingress-nginx's annotations and upgraded connections through the Ingress controller
//! (issue 33, item 3), against backends that run in the test itself — Services without
//! selectors whose EndpointSlices point at this machine — so that each request's path,
//! body size and endpoint can be seen: rewrites, body limits, timeouts, allowed source
//! ranges, cookie affinity, canaries by header and by weight, a WebSocket-style
//! upgrade joined to the backend's connection, requests retried on the next pod when
//! one cannot be reached, and the access log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use crate::common::{Server, free_port, wait_for};
use serde_json::{Value, json};

/// An HTTP/1.1 backend that answers `<name> <request target> <body length>`, sleeps
/// 3 s first for `/slow`, and echoes whatever follows an upgrade.
pub(crate) fn backend(name: &'static str) -> u16 {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer(name, stream));
        }
    });
    port
}

fn answer(name: &str, stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let (mut length, mut upgrade) = (0usize, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let (key, value) = line.split_once(':').unwrap_or_default();
        match key.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "upgrade" => upgrade = Some(value.trim().to_string()),
            _ => {}
        }
    }
    if let Some(protocol) = upgrade {
        let _ = write!(
            stream,
            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n\r\n"
        );
        let mut buf = [0u8; 1024];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || stream.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        return;
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    if target.starts_with("/slow") {
        std::thread::sleep(Duration::from_secs(3));
    }
    let text = format!("{name} {target} {length}");
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// A request through the Ingress on `port` for `host`: (status, head, body).
pub(crate) fn request(port: u16, host: &str, path: &str, extra: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-s", "-i", "--max-time", "10", "-H"])
        .arg(format!("Host: {host}"))
        .args(extra)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.trim().to_string())
}

/// Which backend answered (the first word of the body).
fn who(port: u16, host: &str, extra: &[&str]) -> String {
    let (status, _, body) = request(port, host, "/", extra);
    assert_eq!(status, 200, "{host}: {body}");
    body.split(' ').next().unwrap_or_default().to_string()
}

pub(crate) fn selectorless(name: &str, ip: &str, ports: &[u16]) -> Vec<Value> {
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80}]}}),
    ];
    for (i, port) in ports.iter().enumerate() {
        objects.push(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-{i}"), "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]}));
    }
    objects
}

fn ingress(name: &str, host: &str, path: &str, service: &str, annotations: Value) -> Value {
    let annotations: serde_json::Map<String, Value> = (annotations.as_object().into_iter())
        .flatten()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.clone()))
        .collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"rules": [{"host": host, "http": {"paths": [{"path": path,
            "pathType": "ImplementationSpecific",
            "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}})
}

#[test]
fn ingress_nginx_annotations_shape_requests_and_upgrades_pass_through() {
    let port = free_port();
    let logs = tempfile::tempdir().unwrap();
    let access_log = logs.path().join("access.log");
    let s = Server::start_with(&[
        &format!("--ingress-http-port={port}"),
        &format!("--ingress-access-log={}", access_log.display()),
    ]);
    let node_ip = krust_kubelet::machine::node_ip().to_string();
    let (a, b, c) = (backend("a"), backend("b"), backend("c"));
    let mut objects = selectorless("main", &node_ip, &[a, b]);
    objects.extend(selectorless("next", &node_ip, &[c]));
    // One endpoint of `gone` refuses connections (a pod that went away before its
    // EndpointSlice said so).
    objects.extend(selectorless("gone", &node_ip, &[a, free_port()]));
    // A Service without endpoints, behind a canary that must then take nothing.
    objects.extend(selectorless("empty", &node_ip, &[]));
    objects.extend([
        ingress("plain", "plain.example", "/", "main", json!({})),
        ingress(
            "plain-canary",
            "plain.example",
            "/",
            "empty",
            json!({"canary": "true", "canary-by-header": "x-canary"}),
        ),
        ingress(
            "rewrite",
            "rw.example",
            "/api(/|$)(.*)",
            "main",
            json!({"rewrite-target": "/$2"}),
        ),
        ingress(
            "limits",
            "limits.example",
            "/",
            "main",
            json!({"proxy-body-size": "10", "proxy-read-timeout": "1"}),
        ),
        ingress(
            "deny",
            "deny.example",
            "/",
            "main",
            json!({"allowlist-source-range": "203.0.113.0/24"}),
        ),
        ingress(
            "allow",
            "allow.example",
            "/",
            "main",
            json!({"whitelist-source-range": "203.0.113.0/24, 127.0.0.0/8"}),
        ),
        ingress(
            "sticky",
            "sticky.example",
            "/",
            "main",
            json!({"affinity": "cookie"}),
        ),
        ingress("gone", "gone.example", "/", "gone", json!({})),
        ingress("site", "canary.example", "/", "main", json!({})),
        ingress(
            "site-canary",
            "canary.example",
            "/",
            "next",
            json!({"canary": "true", "canary-by-header": "x-canary", "canary-weight": "50"}),
        ),
    ]);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    s.ok_stdin(&["apply", "-f", "-"], &list.to_string());
    wait_for("the Ingresses served", Duration::from_secs(30), || {
        (request(port, "canary.example", "/", &["-H", "x-canary: always"])
            .2
            .starts_with('c'))
        .then_some(())
    });

    // Round robin over the Service's endpoints; the query kept.
    let (status, _, body) = request(port, "plain.example", "/x?q=1", &[]);
    assert_eq!(status, 200);
    assert!(body.ends_with(" /x?q=1 0"), "{body}");
    // The access log has its line, in ingress-nginx's format.
    let line = wait_for(
        "the request's access log line",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(&access_log)
                .ok()?
                .lines()
                .find(|l| l.contains("\"GET /x?q=1 HTTP/1.1\" 200 "))
                .map(str::to_string)
        },
    );
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(
        line.contains(&format!("[default-main-80] [] {node_ip}:")),
        "{line}"
    );
    let mut seen: Vec<String> = (0..4).map(|_| who(port, "plain.example", &[])).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["a", "b"]);

    // A request without a body goes to the next pod when one cannot be reached.
    for _ in 0..6 {
        let (status, _, body) = request(port, "gone.example", "/", &[]);
        assert_eq!((status, body.split(' ').next()), (200, Some("a")));
    }

    // rewrite-target: the path's groups, the rest of the path replaced, the query kept.
    let (status, _, body) = request(port, "rw.example", "/api/v1/users?page=2", &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with(" /v1/users?page=2 0"), "{body}");
    assert!(request(port, "rw.example", "/API", &[]).2.ends_with(" / 0"));
    assert_eq!(request(port, "rw.example", "/apiv2", &[]).0, 404);

    // Body limits: the default 1m, and 10 bytes on limits.example; a read timeout.
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, size: usize| {
        let path = dir.path().join(name);
        std::fs::write(&path, vec![b'x'; size]).unwrap();
        format!("@{}", path.display())
    };
    let (big, fits) = (file("big", 2 << 20), file("fits", 512 << 10));
    let post = |host: &str, data: &str| request(port, host, "/up", &["--data-binary", data]);
    assert_eq!(post("plain.example", &big).0, 413);
    let (status, _, body) = post("plain.example", &fits);
    assert_eq!((status, body.split(' ').nth(2)), (200, Some("524288")));
    assert_eq!(post("limits.example", "0123456789a").0, 413);
    assert_eq!(post("limits.example", "01234").0, 200);
    let started = std::time::Instant::now();
    assert_eq!(request(port, "limits.example", "/slow", &[]).0, 504);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(request(port, "plain.example", "/slow", &[]).0, 200);

    // Allowed source ranges: this client is 127.0.0.1.
    let (status, _, body) = request(port, "deny.example", "/", &[]);
    assert_eq!((status, body.as_str()), (403, "403 Forbidden"));
    assert_eq!(request(port, "allow.example", "/", &[]).0, 200);

    // Cookie affinity: the first answer names an endpoint, which keeps the client.
    let (status, head, body) = request(port, "sticky.example", "/", &[]);
    assert_eq!(status, 200);
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .unwrap_or_else(|| panic!("no cookie in {head}"));
    assert!(
        cookie.starts_with("INGRESSCOOKIE=") && cookie.contains("Path=/"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let first = body.split(' ').next().unwrap().to_string();
    for _ in 0..6 {
        assert_eq!(
            who(port, "sticky.example", &["-H", &format!("Cookie: {pair}")]),
            first
        );
    }

    // Canary: by header, then by weight (50 of every 100 undecided requests).
    for _ in 0..3 {
        assert_eq!(
            who(port, "canary.example", &["-H", "x-canary: always"]),
            "c"
        );
        assert_ne!(who(port, "canary.example", &["-H", "x-canary: never"]), "c");
    }
    // A canary without ready pods is skipped, as ingress-nginx does: no 503.
    assert_ne!(who(port, "plain.example", &["-H", "x-canary: always"]), "c");
    let to_canary = (0..100)
        .filter(|_| who(port, "canary.example", &[]) == "c")
        .count();
    assert_eq!(to_canary, 50);

    // An upgrade: 101 from the backend, then bytes both ways on the same connection.
    let mut ws = TcpStream::connect(("127.0.0.1", port)).unwrap();
    ws.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        ws,
        "GET /chat HTTP/1.1\r\nHost: plain.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(ws.try_clone().unwrap());
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        head.push(line.to_ascii_lowercase());
    }
    assert!(
        head.iter().any(|l| l.starts_with("upgrade: websocket")),
        "{head:?}"
    );
    for message in ["ping\n", "second message\n"] {
        ws.write_all(message.as_bytes()).unwrap();
        let mut echoed = String::new();
        reader.read_line(&mut echoed).unwrap();
        assert_eq!(echoed, message);
    }
}

/// The built-in CSI driver's Identity service, served on a free port of this machine
/// for as long as the test runs: a gRPC backend. Its port.
pub(crate) fn identity_backend(dir: &std::path::Path) -> u16 {
    use krust_csi::v1::identity_server::IdentityServer;
    let port = free_port();
    let driver = krust_csi::local::LocalDriver::new("grpc-node", dir);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(driver))
            .serve(([0, 0, 0, 0], port).into()),
    );
    port
}

/// A gRPC channel to `host` through the proxy on `port`, once the Identity service
/// answers there.
pub(crate) async fn grpc_channel(port: u16, host: &str) -> tonic::transport::Channel {
    use krust_csi::v1::{GetPluginInfoRequest, identity_client::IdentityClient};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .origin(format!("http://{host}").parse().unwrap())
        .connect_lazy();
    let mut identity = IdentityClient::new(channel.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let info = loop {
        match identity.get_plugin_info(GetPluginInfoRequest {}).await {
            Ok(info) => break info.into_inner(),
            Err(status) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no answer through port {port}: {status}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(info.name, krust_csi::local::NAME);
    channel
}

/// `backend-protocol: GRPC`: a gRPC client speaks HTTP/2 to the Ingress, which speaks
/// HTTP/2 to the backend (here the built-in CSI driver's Identity service, served on a
/// port of this machine); answers and error statuses (trailers) come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_backends_are_reached_over_http2() {
    use krust_csi::v1::{CreateVolumeRequest, controller_client::ControllerClient};

    let port = free_port();
    let s = Server::start_with(&[&format!("--ingress-http-port={port}")]);
    let dir = tempfile::tempdir().unwrap();
    let grpc_port = identity_backend(dir.path());
    let node_ip = krust_kubelet::machine::node_ip().to_string();
    let mut objects = selectorless("grpc", &node_ip, &[grpc_port]);
    objects.push(ingress(
        "grpc",
        "grpc.example",
        "/",
        "grpc",
        json!({"backend-protocol": "GRPC"}),
    ));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    s.ok_stdin(&["apply", "-f", "-"], &list.to_string());

    let channel = grpc_channel(port, "grpc.example").await;
    // A service the backend does not serve: its status comes back in the trailers.
    let refused = ControllerClient::new(channel)
        .create_volume(CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused}");
}

/// Whether the server closed `stream` (EOF or reset) before the client's own read
/// timeout, reading whatever it sent first.
fn closed_by_server(mut stream: TcpStream) -> Result<(), std::io::Error> {
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn clients_that_say_nothing_or_too_slowly_lose_their_connection() {
    let (port, https) = (free_port(), free_port());
    let _s = Server::start_with(&[
        &format!("--ingress-http-port={port}"),
        &format!("--ingress-https-port={https}"),
        "--ingress-client-header-timeout=1s",
    ]);
    wait_for("the Ingress listener", Duration::from_secs(60), || {
        (request(port, "nothing.example", "/", &[]).0 == 404).then_some(())
    });
    let connect = |port: u16| TcpStream::connect(("127.0.0.1", port)).unwrap();
    // Nothing at all, on HTTP and before a TLS handshake.
    for port in [port, https] {
        closed_by_server(connect(port))
            .unwrap_or_else(|e| panic!("a silent client on port {port} kept its connection: {e}"));
    }
    // Headers begun and never finished.
    let mut slow = connect(port);
    slow.write_all(b"GET / HTTP/1.1\r\nHost: nothing.example\r\n")
        .unwrap();
    closed_by_server(slow).expect("a client whose headers never end kept its connection");
    // A client that speaks in time is served.
    assert_eq!(request(port, "nothing.example", "/", &[]).0, 404);
}
