//! An HTTPS server in the test process, for what the apiserver calls out to (admission
//! webhooks, aggregated apiservers): a certificate from its own CA for `127.0.0.1` and
//! the Service names given; optionally client certificates required from a CA; every
//! request recorded and answered by a handler. A watch (`watch=true` or `watch=1` in the
//! query) is answered as an apiserver's: the handler's answer is an array of watch
//! events, sent one per line, and the response then stays open until the client goes.

use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::Value;

/// One request as the server saw it.
#[derive(Clone, Debug)]
#[allow(dead_code)] // each test binary reads the parts its server cares about
pub struct Seen {
    /// Path and query.
    pub uri: String,
    pub headers: http::HeaderMap,
    pub body: Value,
}

/// Answers a request: status code and JSON body.
pub type Handler = fn(&Seen) -> (u16, Value);

pub struct HttpsServer {
    pub port: u16,
    /// The CA that signed the server's certificate, PEM.
    pub ca_pem: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _runtime: tokio::runtime::Runtime,
}

/// The names a certificate is for: `127.0.0.1` and `names`.
fn sans(names: &[&str]) -> Vec<String> {
    std::iter::once("127.0.0.1")
        .chain(names.iter().copied())
        .map(str::to_string)
        .collect()
}

/// The events of a watch, one JSON line each, then nothing until the client hangs up.
fn watch_body(events: &Value) -> BoxBody<Bytes, hyper::Error> {
    let lines: Vec<Result<Frame<Bytes>, hyper::Error>> = events
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| Ok(Frame::data(Bytes::from(format!("{e}\n")))))
        .collect();
    let open = futures::stream::pending();
    BodyExt::boxed(StreamBody::new(futures::stream::iter(lines).chain(open)))
}

impl HttpsServer {
    /// Serves `handler` for `127.0.0.1` and `names`; with `client_ca` (PEM), only to
    /// clients with a certificate it signed.
    pub fn start(names: &[&str], client_ca: Option<&str>, handler: Handler) -> HttpsServer {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::from_ca_cert_pem(&ca.pem(), &ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans(names))
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        Self::serve(&cert.pem(), &key, ca.pem(), client_ca, handler)
    }

    /// Serves `handler` with a certificate that is its own CA, as `openssl req -x509`
    /// makes one (CA:TRUE): its `caBundle` is the certificate itself.
    pub fn start_self_signed(names: &[&str], handler: Handler) -> HttpsServer {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans(names)).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Self::serve(&cert.pem(), &key, cert.pem(), None, handler)
    }

    fn serve(
        cert_pem: &str,
        key: &KeyPair,
        ca_pem: String,
        client_ca: Option<&str>,
        handler: Handler,
    ) -> HttpsServer {
        let certs = vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()];
        let private = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    roots.add(c.unwrap()).unwrap();
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(certs, private).unwrap();
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
                // As Go's servers do: else a response's second segment waits for the
                // client's delayed ACK (~40 ms).
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let recorded = recorded.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = body.collect().await?.to_bytes();
                                let seen = Seen {
                                    uri: parts.uri.to_string(),
                                    headers: parts.headers,
                                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                                };
                                let watch = ["watch=true", "watch=1"]
                                    .iter()
                                    .any(|w| seen.uri.contains(w));
                                let (code, answer) = handler(&seen);
                                recorded.lock().unwrap().push(seen);
                                let body = if watch {
                                    watch_body(&answer)
                                } else {
                                    Full::new(Bytes::from(answer.to_string()))
                                        .map_err(|never| match never {})
                                        .boxed()
                                };
                                Ok::<_, hyper::Error>(
                                    Response::builder()
                                        .status(code)
                                        .header("Content-Type", "application/json")
                                        .body(body)
                                        .unwrap(),
                                )
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        HttpsServer {
            port,
            ca_pem,
            seen,
            _runtime: runtime,
        }
    }

    /// The CA as a `caBundle`.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}
