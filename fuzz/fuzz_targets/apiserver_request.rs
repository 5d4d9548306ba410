//! Any request a client can send to the apiserver, served in process as an admin: every
//! resource path, query parameter (selectors, resourceVersion, continue tokens, limits,
//! dry run, field managers...), and body of every content type — JSON, YAML and
//! protobuf objects and the four patch types. The apiserver answers each with a status,
//! never a panic (libFuzzer's panic hook aborts on any panic, also one the apiserver's
//! own guard would have turned into a 500).
//!
//! Input: a method byte, a content-type byte, the path and query up to a newline, then
//! the body.
#![no_main]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use krust_apiserver::auth::User;
use krust_apiserver::{Api, Config, serve_in_process};
use libfuzzer_sys::fuzz_target;

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
const CONTENT_TYPES: [&str; 8] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
    "text/plain",
];
/// Requests served on one store before starting again on a fresh one, so that what the
/// inputs create does not pile up without bound (a start takes seconds unoptimized).
const REQUESTS_PER_STORE: u32 = 20_000;

struct Apiserver {
    runtime: tokio::runtime::Runtime,
    api: Arc<Api>,
    served: u32,
    _dir: tempfile::TempDir,
}

impl Apiserver {
    fn start() -> Apiserver {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // On tmpfs when there is one: every write is made durable.
        let dir = tempfile::Builder::new()
            .prefix("krust-fuzz")
            .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .expect("temp dir");
        let store = krust_store::embedded::EmbeddedStore::open(dir.path().join("state.redb"))
            .expect("store");
        let config = Config::in_process(dir.path().join("tls"));
        let (api, _) = runtime
            .block_on(Api::new(&config, Arc::new(store), 6443))
            .expect("apiserver");
        Apiserver {
            runtime,
            api,
            served: 0,
            _dir: dir,
        }
    }
}

static APISERVER: Mutex<Option<Apiserver>> = Mutex::new(None);

fuzz_target!(
    // Started before the first input, whose time limit it would otherwise use up.
    init: {
        *APISERVER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Apiserver::start());
    },
    |data: &[u8]| serve(data)
);

fn serve(data: &[u8]) {
    let [method, content_type, rest @ ..] = data else {
        return;
    };
    let newline = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
    let (target, body) = rest.split_at(newline);
    let body = body.get(1..).unwrap_or_default();
    let Ok(request) = http::Request::builder()
        .method(METHODS[usize::from(*method) % METHODS.len()])
        .uri(target)
        .header(
            "content-type",
            CONTENT_TYPES[usize::from(*content_type) % CONTENT_TYPES.len()],
        )
        .body(Bytes::copy_from_slice(body))
    else {
        return;
    };
    let mut guard = APISERVER.lock().unwrap_or_else(|e| e.into_inner());
    if guard
        .as_ref()
        .is_none_or(|a| a.served >= REQUESTS_PER_STORE)
    {
        *guard = None;
        *guard = Some(Apiserver::start());
    }
    let apiserver = guard.as_mut().expect("started");
    apiserver.served += 1;
    let admin = User {
        name: "admin".into(),
        groups: vec!["system:masters".into()],
    };
    let api = apiserver.api.clone();
    let response = apiserver
        .runtime
        .block_on(async move { serve_in_process(&api, &admin, request).await });
    assert_ne!(
        response.status().as_u16(),
        500,
        "an internal error (a panic is caught before this)"
    );
}
