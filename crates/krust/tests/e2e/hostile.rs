//! Hostile clients against a running apiserver: bodies no decoder should choke on,
//! clients that connect and say nothing (or stop halfway), and a watch that never
//! reads. Each gets upstream's answer or loses its connection; none costs memory
//! without bound, and the server serves everyone else throughout.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Server, wait_for};
use crate::errors::{CMS, assert_status, count_configmaps};

const JSON: Option<&str> = Some("application/json");

#[test]
fn malformed_bodies_get_statuses_and_write_nothing() {
    let s = Server::apiserver(&[]);
    let deep = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"deep"}},"data":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let b = assert_status(
        s.curl("POST", CMS, JSON, Some(deep.as_bytes())),
        400,
        "BadRequest",
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("json parse error: recursion limit exceeded"),
        "{b}"
    );
    let deep_yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: deep}}\ndata: {}{}\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert_status(
        s.curl(
            "POST",
            CMS,
            Some("application/yaml"),
            Some(deep_yaml.as_bytes()),
        ),
        400,
        "BadRequest",
    );

    let mut invalid_utf8 =
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"u"},"data":{"k":""#.to_vec();
    invalid_utf8.extend([0xff, 0xfe]);
    invalid_utf8.extend(br#""}}"#);
    assert_status(
        s.curl("POST", CMS, JSON, Some(&invalid_utf8)),
        400,
        "BadRequest",
    );

    for replicas in ["99999999999999999999999", "1e400", "-1e400", "1.5"] {
        let body = format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"huge"}},"spec":{{"replicas":{replicas},"selector":{{"matchLabels":{{"a":"b"}}}},"template":{{"metadata":{{"labels":{{"a":"b"}}}},"spec":{{"containers":[{{"name":"c","image":"i"}}]}}}}}}}}"#
        );
        let (code, b) = s.curl(
            "POST",
            "/apis/apps/v1/namespaces/default/deployments",
            JSON,
            Some(body.as_bytes()),
        );
        assert!(
            code == 400 || code == 422,
            "replicas {replicas}: {code} {b}"
        );
        assert_eq!(b["kind"], "Status", "{b}");
    }

    // 10,000 labels are many, not invalid.
    let labels: serde_json::Map<String, serde_json::Value> = (0..10_000)
        .map(|i| (format!("l{i}"), json!(format!("v{i}"))))
        .collect();
    let many = json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "many", "labels": labels}});
    let (code, b) = s.curl("POST", CMS, JSON, Some(many.to_string().as_bytes()));
    assert_eq!(code, 201, "{b}");
    let (code, found) = s.curl(
        "GET",
        &format!("{CMS}?labelSelector=l9999%3Dv9999"),
        None,
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(found["items"][0]["metadata"]["name"], "many");

    assert_eq!(count_configmaps(&s), 1, "only the labelled one was written");
}

/// `openssl s_client` connected to the server: a client that completes its TLS
/// handshake (with the admin certificate), sends `request`, and then neither writes
/// nor reads another byte.
fn stalled_tls_client(s: &Server, request: &str) -> Child {
    let tls = s.tls();
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-connect",
            &format!("127.0.0.1:{}", s.port),
        ])
        .arg("-cert")
        .arg(tls.join("admin.crt"))
        .arg("-key")
        .arg(tls.join("admin.key"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(request.as_bytes()).unwrap();
    // Kept open (never closed) so that s_client waits for the server.
    std::mem::forget(stdin);
    child
}

#[test]
fn silent_and_slow_clients_lose_their_connection_and_never_starve_others() {
    let s = Server::apiserver(&[]);
    let before = s.rss_kib();
    // A thousand connections that never start TLS, one that completes TLS and then
    // sends half a request, and one that sends nothing at all after TLS.
    let silent: Vec<TcpStream> = (0..1_000)
        .map(|_| TcpStream::connect(("127.0.0.1", s.port)).unwrap())
        .collect();
    let mut slow = stalled_tls_client(&s, "GET /api HTTP/1.1\r\nHost: x\r\n");
    let mut mute = stalled_tls_client(&s, "");
    let started = Instant::now();
    // Everyone else is served meanwhile.
    for _ in 0..5 {
        assert_eq!(s.curl("GET", "/api/v1/namespaces", None, None).0, 200);
    }
    let grown = s.rss_kib().saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "1,000 silent connections cost {grown} KiB"
    );

    // The server gives up on them after its read-header timeout (32 s).
    wait_for("the slow clients cut off", Duration::from_secs(60), || {
        let slow = slow.try_wait().unwrap().is_some();
        let mute = mute.try_wait().unwrap().is_some();
        (slow && mute).then_some(())
    });
    for mut conn in silent {
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut byte = [0u8; 1];
        let closed = matches!(conn.read(&mut byte), Ok(0) | Err(_))
            && started.elapsed() < Duration::from_secs(60);
        assert!(closed, "a silent connection was kept");
    }
    assert!(
        started.elapsed() >= Duration::from_secs(30),
        "not before the timeout"
    );
    assert_eq!(s.curl("GET", "/api/v1/namespaces", None, None).0, 200);
}

/// Creates and deletes `n` ConfigMaps of 512 KiB each: the server's growth, in KiB.
fn churn(s: &Server, prefix: &str, n: usize) -> u64 {
    let value = "x".repeat(512 * 1024);
    let before = s.rss_kib();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name}, "data": {"v": value}});
        let (code, b) = s.curl("POST", CMS, JSON, Some(cm.to_string().as_bytes()));
        assert_eq!(code, 201, "{b}");
        let (code, _) = s.curl("DELETE", &format!("{CMS}/{name}"), None, None);
        assert_eq!(code, 200);
    }
    s.rss_kib().saturating_sub(before)
}

#[test]
fn a_watch_that_never_reads_holds_no_more_than_its_socket() {
    let s = Server::apiserver(&[]);
    // The watch cache keeps recent events whoever watches: the same churn without a
    // stalled watcher is the baseline.
    let baseline = churn(&s, "alone", 100);
    let mut watch = stalled_tls_client(
        &s,
        &format!("GET {CMS}?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
    );
    // 100 MiB of events for it: far more than the socket and pipe buffers hold.
    let watched = churn(&s, "watched", 100);
    assert!(
        watched < baseline + 32 * 1024,
        "a watch that does not read cost {watched} KiB against {baseline} KiB without it"
    );
    assert_eq!(s.curl("GET", "/api/v1/namespaces", None, None).0, 200);
    let _ = watch.kill();
    let _ = watch.wait();
}
