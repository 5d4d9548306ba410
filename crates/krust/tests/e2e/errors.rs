//! Every error the API returns is a metav1.Status with the upstream code and reason, and
//! no failed request leaves anything behind.

use crate::common;
use std::process::{Command, Stdio};

use crate::common::Server;
use serde_json::{Value, json};

pub(crate) fn assert_status(got: (u16, Value), code: u16, reason: &str) -> Value {
    let (status, body) = got;
    assert_eq!(status, code, "{body}");
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["status"], "Failure", "{body}");
    assert_eq!(body["code"], code, "{body}");
    if !reason.is_empty() {
        assert_eq!(body["reason"], reason, "{body}");
    }
    body
}

pub(crate) const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn cm(name: &str) -> Vec<u8> {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
        .to_string()
        .into_bytes()
}

pub(crate) fn count_configmaps(s: &Server) -> usize {
    let (code, list) = s.curl("GET", CMS, None, None);
    assert_eq!(code, 200);
    list["items"].as_array().map_or(0, Vec::len)
}

#[test]
fn client_errors_are_statuses_and_write_nothing() {
    let s = Server::apiserver(&[]);
    let json_ct = Some("application/json");

    // 400: malformed body, and a body of another kind.
    let b = assert_status(
        s.curl("POST", CMS, json_ct, Some(b"{not json")),
        400,
        "BadRequest",
    );
    // Upstream's words, ending with the body's start (as text: it looks like JSON).
    let message = b["message"].as_str().unwrap();
    assert!(
        message.starts_with("the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: ")
            && message.ends_with(" ({not json)"),
        "{b}"
    );
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}}).to_string();
    assert_status(
        s.curl("POST", CMS, json_ct, Some(svc.as_bytes())),
        400,
        "BadRequest",
    );
    // 400: strict field validation names the unknown field.
    let extra = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "spec": {"a": 1}}).to_string();
    let b = assert_status(
        s.curl(
            "POST",
            &format!("{CMS}?fieldValidation=Strict"),
            json_ct,
            Some(extra.as_bytes()),
        ),
        400,
        "BadRequest",
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains(r#"unknown field "spec""#),
        "{b}"
    );

    let dup = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"1","k":"2"}}"#;
    let b = assert_status(
        s.curl(
            "POST",
            &format!("{CMS}?fieldValidation=Strict"),
            json_ct,
            Some(dup),
        ),
        400,
        "BadRequest",
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains(r#"duplicate field "data.k""#),
        "{b}"
    );

    // 404: a missing object, a missing namespace, an unknown resource.
    let b = assert_status(
        s.curl("GET", &format!("{CMS}/nope"), None, None),
        404,
        "NotFound",
    );
    assert_eq!(b["message"], r#"configmaps "nope" not found"#);
    assert_eq!(b["details"], json!({"name": "nope", "kind": "configmaps"}));
    let b = assert_status(
        s.curl(
            "POST",
            "/api/v1/namespaces/ghost/configmaps",
            json_ct,
            Some(&cm("x")),
        ),
        404,
        "NotFound",
    );
    assert_eq!(b["message"], r#"namespaces "ghost" not found"#);
    assert_status(
        s.curl("GET", "/apis/apps/v1/widgets", None, None),
        404,
        "NotFound",
    );

    // 405: a verb the resource does not have.
    assert_status(
        s.curl("PUT", CMS, json_ct, Some(&cm("x"))),
        405,
        "MethodNotAllowed",
    );

    // 406: a representation we do not serve.
    let (code, _) = s.curl_as(true, "GET", CMS, &["Accept: text/html".into()], None);
    assert_eq!(code, 406);

    // 409: AlreadyExists, and a stale update.
    assert_eq!(s.curl("POST", CMS, json_ct, Some(&cm("dup"))).0, 201);
    let b = assert_status(
        s.curl("POST", CMS, json_ct, Some(&cm("dup"))),
        409,
        "AlreadyExists",
    );
    assert_eq!(b["message"], r#"configmaps "dup" already exists"#);
    let (_, current) = s.curl("GET", &format!("{CMS}/dup"), None, None);
    let mut stale = current.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    stale["data"]["k"] = json!("changed");
    let b = assert_status(
        s.curl(
            "PUT",
            &format!("{CMS}/dup"),
            json_ct,
            Some(stale.to_string().as_bytes()),
        ),
        409,
        "Conflict",
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified"),
        "{b}"
    );
    assert_eq!(
        s.curl("GET", &format!("{CMS}/dup"), None, None).1["data"]["k"],
        "v",
        "the stale update wrote nothing"
    );

    // 413: bodies over 3 MiB.
    let big = vec![b'a'; 3 * 1024 * 1024 + 10];
    assert_status(
        s.curl("POST", CMS, json_ct, Some(&big)),
        413,
        "RequestEntityTooLarge",
    );

    // 415: a body format we do not read.
    assert_status(
        s.curl("POST", CMS, Some("text/plain"), Some(b"hello")),
        415,
        "UnsupportedMediaType",
    );
    assert_status(
        s.curl(
            "PATCH",
            &format!("{CMS}/dup"),
            Some("application/json"),
            Some(b"{}"),
        ),
        415,
        "UnsupportedMediaType",
    );

    // 422: one cause per invalid field.
    let bad = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "Bad_Name"},
        "spec": {"replicas": -1, "selector": {"matchLabels": {"app": "a"}},
                 "template": {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "c"}]}}}});
    let b = assert_status(
        s.curl(
            "POST",
            "/apis/apps/v1/namespaces/default/deployments",
            json_ct,
            Some(bad.to_string().as_bytes()),
        ),
        422,
        "Invalid",
    );
    let fields: Vec<&str> = b["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    for f in [
        "metadata.name",
        "spec.replicas",
        "spec.template.metadata.labels",
        "spec.template.spec.containers[0].image",
    ] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"Deployment.apps "Bad_Name" is invalid: ["#),
        "{b}"
    );
    assert_eq!(b["details"]["kind"], "Deployment");

    // Nothing above left an object behind: only `dup` exists.
    assert_eq!(count_configmaps(&s), 1);
    let (_, deploys) = s.curl("GET", "/apis/apps/v1/deployments", None, None);
    assert_eq!(deploys["items"], json!([]));
}

#[test]
fn authentication_and_authorization_errors() {
    let s = Server::apiserver(&[]);
    // 401: a credential that does not authenticate.
    let (code, body) = s.curl_as(
        false,
        "GET",
        CMS,
        &["Authorization: Bearer not-a-token".into()],
        None,
    );
    assert_eq!(code, 401, "{body}");
    assert_eq!(body["reason"], "Unauthorized");
    // 403: anonymous users may not read resources.
    let (code, body) = s.curl_as(false, "GET", CMS, &[], None);
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["reason"], "Forbidden");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("system:anonymous"),
        "{body}"
    );
    // ...but health and version are public, as upstream.
    assert_eq!(s.curl_as(false, "GET", "/readyz", &[], None).0, 200);
    let (code, version) = s.curl_as(false, "GET", "/version", &[], None);
    assert_eq!(code, 200);
    assert_eq!(
        (version["major"].as_str(), version["minor"].as_str()),
        (Some("1"), Some("33"))
    );
}

#[test]
fn too_many_requests_when_in_flight_budget_is_spent() {
    let s = Server::apiserver(&["--max-mutating-requests-inflight", "1"]);
    // Hold the only mutating slot with a request whose body never finishes.
    let fifo = s.dir.path().join("body.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let tls = s.data_dir().join("server/tls");
    let mut slow = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-H",
            "Transfer-Encoding: chunked",
        ])
        .arg("--cacert")
        .arg(tls.join("ca.crt"))
        .arg("--cert")
        .arg(tls.join("admin.crt"))
        .arg("--key")
        .arg(tls.join("admin.key"))
        .arg("--upload-file")
        .arg(&fifo)
        .arg(format!("https://127.0.0.1:{}{CMS}", s.port))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Opening the fifo for writing blocks until curl opens it for reading; its request
    // holds the only slot once the gauge says so (probing earlier could take the slot
    // first and turn the slow request away).
    let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    use std::io::Write;
    writer.write_all(b"{\"apiVersion\":\"v1\",").unwrap();
    writer.flush().unwrap();
    let inflight = |s: &Server| {
        let (_, text) = s.curl("GET", "/metrics", None, None);
        let text = text.as_str().unwrap_or_default().to_string();
        metric(
            &text,
            "apiserver_current_inflight_requests",
            "request_kind=\"mutating\"",
        )
    };
    common::wait_for(
        "the slow request to hold the mutating slot",
        std::time::Duration::from_secs(30),
        || (inflight(&s).as_deref() == Some("1")).then_some(()),
    );
    let got = s.curl("POST", CMS, Some("application/json"), Some(&cm("probe")));
    let b = assert_status(got, 429, "TooManyRequests");
    assert_eq!(b["details"]["retryAfterSeconds"], 1);
    // Reads have their own budget.
    assert_eq!(s.curl("GET", CMS, None, None).0, 200);
    writer
        .write_all(b"\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"slow\"}}")
        .unwrap();
    drop(writer);
    slow.wait().unwrap();
    assert_eq!(s.curl("GET", &format!("{CMS}/slow"), None, None).0, 200);
    assert_eq!(inflight(&s).as_deref(), Some("0"));
    assert_eq!(
        s.curl("POST", CMS, Some("application/json"), Some(&cm("after")))
            .0,
        201
    );
}

/// The value of the sample of `name` whose labels contain `labels`.
fn metric(text: &str, name: &str, labels: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
}

/// The first event line of a watch that ends by itself (timeoutSeconds).
fn first_watch_event(s: &Server, path: &str) -> Value {
    let (code, body) = s.curl("GET", path, None, None);
    assert_eq!(code, 200, "{body}");
    match body {
        Value::String(text) => serde_json::from_str(text.lines().next().unwrap_or("null")).unwrap(),
        v => v,
    }
}

#[test]
fn watch_older_than_the_cache_replays_the_store_until_compacted() {
    let mut s = Server::apiserver(&["--etcd-compaction-interval", "1s"]);
    let post = |s: &Server, name: &str| {
        assert_eq!(
            s.curl("POST", CMS, Some("application/json"), Some(&cm(name)))
                .0,
            201
        )
    };
    post(&s, "a");
    let (_, list) = s.curl("GET", CMS, None, None);
    let rv: i64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    post(&s, "b");
    s.restart();
    // The restarted cache's history starts at its load revision; the store still has
    // the older history, so the watch is served from it.
    let event = first_watch_event(
        &s,
        &format!("{CMS}?watch=1&resourceVersion={rv}&timeoutSeconds=1"),
    );
    assert_eq!(event["type"], "ADDED", "{event}");
    assert_eq!(event["object"]["metadata"]["name"], "b");

    // Once compaction has passed that revision, the same watch is 410 Gone.
    let (_, page) = s.curl("GET", &format!("{CMS}?limit=1"), None, None);
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    post(&s, "c");
    common::wait_for(
        "compaction past the first page",
        std::time::Duration::from_secs(15),
        || {
            (s.curl(
                "GET",
                &format!("{CMS}?limit=1&continue={token}"),
                None,
                None,
            )
            .0 == 410)
                .then_some(())
        },
    );
    s.restart();
    let event = first_watch_event(
        &s,
        &format!("{CMS}?watch=1&resourceVersion={rv}&timeoutSeconds=1"),
    );
    assert_eq!(event["type"], "ERROR", "{event}");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
}

#[test]
fn metrics_count_requests_by_verb_resource_and_code() {
    let s = Server::apiserver(&[]);
    assert_eq!(
        s.curl(
            "GET",
            "/api/v1/namespaces/default/configmaps/missing",
            None,
            None
        )
        .0,
        404
    );
    assert_eq!(s.curl("GET", CMS, None, None).0, 200);
    let (code, text) = s.curl("GET", "/metrics", None, None);
    assert_eq!(code, 200);
    let text = text.as_str().unwrap_or_default().to_string();
    let line = |verb: &str, code: &str| {
        metric(
            &text,
            "apiserver_request_total",
            &format!("verb=\"{verb}\",resource=\"configmaps\",code=\"{code}\""),
        )
    };
    assert_eq!(line("get", "404").as_deref(), Some("1"), "{text}");
    assert_eq!(
        metric(
            &text,
            "apiserver_current_inflight_requests",
            "request_kind=\"readOnly\""
        )
        .as_deref(),
        Some("0"),
        "{text}"
    );
    assert_eq!(line("list", "200").as_deref(), Some("1"), "{text}");
    assert!(
        text.contains("apiserver_request_duration_seconds_bucket"),
        "{text}"
    );
    // The process, as the soak test samples it.
    let gauge = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
    };
    assert!(gauge("process_resident_memory_bytes") > 1 << 20);
    assert!(gauge("process_open_fds") > 3);
    assert!(gauge("tokio_alive_tasks") > 0);
}

/// Two requests that once panicked their handler (a `generateName` cut inside a
/// character; a grace period whose deadline overflowed) get 422 Invalid, change nothing,
/// and the server goes on serving; `/metrics` counts no panic.
#[test]
fn inputs_that_once_panicked_a_handler_are_invalid() {
    let s = Server::apiserver(&[]);
    let json_ct = Some("application/json");
    let before = count_configmaps(&s);
    let prefix = format!("{}é", "a".repeat(57));
    let body =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": prefix}});
    let b = assert_status(
        s.curl("POST", CMS, json_ct, Some(body.to_string().as_bytes())),
        422,
        "Invalid",
    );
    assert_eq!(
        b["details"]["causes"][0]["field"], "metadata.generateName",
        "{b}"
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("a lowercase RFC 1123 subdomain"),
        "{b}"
    );
    assert_eq!(count_configmaps(&s), before);
    // A prefix ending in '-' is valid: characters follow it.
    let body =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "fine-"}});
    let (code, created) = s.curl("POST", CMS, json_ct, Some(body.to_string().as_bytes()));
    assert_eq!(code, 201, "{created}");
    assert!(
        created["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("fine-")
    );

    s.ok(&["create", "configmap", "kept"]);
    let out = s.fails(&["delete", "configmap", "kept", "--grace-period=300000000000"]);
    assert!(out.contains("gracePeriodSeconds"), "{out}");
    let b = assert_status(
        s.curl(
            "DELETE",
            &format!("{CMS}/kept?gracePeriodSeconds=300000000000"),
            None,
            None,
        ),
        422,
        "Invalid",
    );
    assert_eq!(
        b["details"]["causes"][0]["field"], "gracePeriodSeconds",
        "{b}"
    );
    s.ok(&["get", "configmap", "kept"]);
    s.ok(&["delete", "configmap", "kept", "--grace-period=9223372036"]);

    let (_, metrics) = s.curl("GET", "/metrics", None, None);
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains("apiserver_request_panics_total 0"),
        "{metrics}"
    );
}
