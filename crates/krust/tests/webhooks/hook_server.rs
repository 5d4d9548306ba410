//! An admission webhook server for the tests, in the test process: HTTPS with a
//! certificate from its own CA (for `127.0.0.1` and `hook.hooks.svc`), answering
//! AdmissionReviews on
//! - `/mutate`: adds the label `mutated-by: hook` (a JSONPatch);
//! - `/validate`: refuses objects with a `forbidden` data key (403, "forbidden key")
//!   and the deletion of objects named `keep`, and warns "checked by hook" otherwise.
//!
//! It records every request it gets.

use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};

pub struct HookServer {
    pub port: u16,
    /// The CA that signed the server's certificate, PEM (a webhook's `caBundle`).
    pub ca_pem: String,
    /// Every AdmissionReview request received: (path, request).
    pub seen: Arc<Mutex<Vec<(String, Value)>>>,
    _runtime: tokio::runtime::Runtime,
}

impl HookServer {
    pub fn start() -> HookServer {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::from_ca_cert_pem(&ca.pem(), &ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".into(), "hook.hooks.svc".into()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let certs = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
        let private = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let recorded = recorded.clone();
                        async move { Ok::<_, hyper::Error>(answer(req, &recorded).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        HookServer {
            port,
            ca_pem: ca.pem(),
            seen,
            _runtime: runtime,
        }
    }

    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }

    /// The requests received on `path`.
    pub fn requests(&self, path: &str) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

async fn answer(
    req: Request<Incoming>,
    recorded: &Mutex<Vec<(String, Value)>>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = review["request"].clone();
    recorded
        .lock()
        .unwrap()
        .push((path.clone(), request.clone()));
    let uid = request["uid"].clone();
    let response = match path.as_str() {
        "/mutate" => {
            let labels = &request["object"]["metadata"]["labels"];
            let patch = if labels.is_object() {
                json!([{"op": "add", "path": "/metadata/labels/mutated-by", "value": "hook"}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated-by": "hook"}}])
            };
            json!({
                "uid": uid, "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            })
        }
        _ if request["operation"] == "DELETE" && request["name"] == "keep" => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "keep stays"},
        }),
        _ if request["object"]["data"]["forbidden"].is_string() => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "forbidden key"},
        }),
        _ => json!({"uid": uid, "allowed": true, "warnings": ["checked by hook"]}),
    };
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    Response::builder()
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(out.to_string())))
        .unwrap()
}
