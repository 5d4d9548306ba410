//! An apiserver in process for fast tests: an embedded store in a temporary directory
//! and requests handed straight to the handler (no TLS, no socket, no krust binary).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use krust_apiserver::auth::User;
use krust_apiserver::{Api, Config, serve_in_process};
use krust_store::embedded::EmbeddedStore;
use serde_json::Value;

pub struct Harness {
    pub api: Arc<Api>,
    pub admin: User,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub async fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("state.redb")).unwrap();
        Self::on(Arc::new(store), dir).await
    }

    /// An apiserver on `store`, keeping its certificates in `dir`.
    pub async fn on(store: Arc<dyn krust_store::Store>, dir: tempfile::TempDir) -> Harness {
        let config = Config::in_process(dir.path().join("tls"));
        let (api, _) = Api::new(&config, store, 6443).await.unwrap();
        let admin = User {
            name: "admin".into(),
            groups: vec!["system:masters".into()],
        };
        Harness {
            api,
            admin,
            _dir: dir,
        }
    }

    pub fn request(
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> http::Request<Bytes> {
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(body)
            .unwrap()
    }

    /// The status code and JSON body of one JSON request.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(method, path, "application/json", body).await
    }

    pub async fn call_as(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.send(Self::request(method, path, content_type, body))
            .await
    }

    /// The status code and JSON body of a request with a raw JSON body.
    pub async fn call_raw(&self, method: &str, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.call_raw_as(method, path, "application/json", body)
            .await
    }

    /// The status code and JSON body of a request with a raw body of `content_type`.
    pub async fn call_raw_as(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(Bytes::from(body))
            .unwrap();
        self.send(req).await
    }

    async fn send(&self, req: http::Request<Bytes>) -> (u16, Value) {
        let resp = serve_in_process(&self.api, &self.admin, req).await;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}
