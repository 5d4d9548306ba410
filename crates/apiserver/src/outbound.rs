//! The apiserver's calls to servers in the cluster — admission webhooks and aggregated
//! apiservers: find where one listens (a URL, or a ready endpoint of a Service, as
//! upstream's endpoint routing), and send it a request over HTTPS, trusting a CA
//! bundle (or, without one, the cluster CA) or, where the APIService says so, any
//! certificate, within a timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use krust_api::sync::Unpoisoned;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_rustls::TlsConnector;

use crate::watch_cache::WatchCache;

/// Where one call goes.
pub struct Target {
    /// Host and port to connect to.
    pub host: String,
    pub port: u16,
    /// The name its certificate must carry (`<service>.<namespace>.svc` for a Service).
    pub server_name: String,
    /// Path with the query upstream adds (`?timeout=10s`).
    pub path: String,
    /// The URL as upstream prints it in errors.
    pub url: String,
}

/// Which server certificates a call accepts.
#[derive(Clone, Copy)]
pub enum Trust<'a> {
    /// Those signed by a CA of this PEM bundle; the cluster CA when there is none.
    Bundle(Option<&'a [u8]>),
    /// Any (an APIService with `insecureSkipTLSVerify`).
    Anything,
}

/// A client certificate and key, PEM.
pub struct Identity {
    pub cert: String,
    pub key: String,
}

/// TLS configurations by trust, so each CA bundle is parsed once.
pub struct Client {
    cluster_ca: Vec<u8>,
    identity: Option<Identity>,
    configs: Mutex<HashMap<Option<Vec<u8>>, TlsConnector>>,
}

impl Client {
    /// A client presenting `identity` (if any) and trusting `cluster_ca` by default.
    pub fn new(cluster_ca: &str, identity: Option<Identity>) -> Client {
        Client {
            cluster_ca: cluster_ca.as_bytes().to_vec(),
            identity,
            configs: Mutex::new(HashMap::new()),
        }
    }

    fn connector(&self, trust: Trust<'_>) -> Result<TlsConnector, String> {
        let key: Option<Vec<u8>> = match trust {
            Trust::Bundle(b) => Some(
                b.filter(|b| !b.is_empty())
                    .unwrap_or(&self.cluster_ca)
                    .to_vec(),
            ),
            Trust::Anything => None,
        };
        if let Some(c) = self.configs.locked().get(&key) {
            return Ok(c.clone());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &key {
            Some(bundle) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(bundle) {
                    let cert = cert.map_err(|e| format!("invalid caBundle: {e}"))?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("invalid caBundle: {e}"))?;
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServerCertificate(
                    provider.signature_verification_algorithms,
                ))),
        };
        let mut config = match &self.identity {
            Some(id) => {
                let certs = CertificateDer::pem_slice_iter(id.cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let key =
                    PrivateKeyDer::from_pem_slice(id.key.as_bytes()).map_err(|e| e.to_string())?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| e.to_string())?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = TlsConnector::from(Arc::new(config));
        self.configs.locked().insert(key, connector.clone());
        Ok(connector)
    }

    /// Sends `req` (its URI a path) to the target; the whole answer within `timeout`.
    pub async fn send(
        &self,
        target: &Target,
        trust: Trust<'_>,
        req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response<Bytes>, String> {
        within(timeout, async {
            let (parts, body) = self.request(target, trust, req).await?.into_parts();
            let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok(Response::from_parts(parts, bytes))
        })
        .await
    }

    /// Sends `req` to the target; the answer once its head arrived (within `timeout`),
    /// its body streaming for as long as the target sends it (a watch).
    pub async fn open(
        &self,
        target: &Target,
        trust: Trust<'_>,
        req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response<hyper::body::Incoming>, String> {
        within(timeout, self.request(target, trust, req)).await
    }

    /// One request on a connection of its own (which lives as long as the answer's body).
    async fn request(
        &self,
        target: &Target,
        trust: Trust<'_>,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<hyper::body::Incoming>, String> {
        {
            let connector = self.connector(trust)?;
            let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
                .await
                .map_err(|e| e.to_string())?;
            let _ = tcp.set_nodelay(true);
            let name =
                ServerName::try_from(target.server_name.clone()).map_err(|e| e.to_string())?;
            let tls = connector
                .connect(name, tcp)
                .await
                .map_err(|e| format!("tls: {e}"))?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            sender.send_request(req).await.map_err(|e| e.to_string())
        }
    }

    /// POSTs a JSON body to the target; the decoded JSON answer.
    pub async fn post_json(
        &self,
        target: &Target,
        trust: Trust<'_>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        let req = Request::post(&target.path)
            .header(http::header::HOST, target.host_header())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = self.send(target, trust, req, timeout).await?;
        if !resp.status().is_success() {
            return Err(format!(
                "the server responded with the status code {}",
                resp.status().as_u16()
            ));
        }
        serde_json::from_slice(resp.body())
            .map_err(|e| format!("failed to decode the response: {e}"))
    }

    /// POSTs a review (admission, conversion) to the webhook whose `clientConfig` gave
    /// `target`, trusting the configuration's `caBundle`; the decoded answer.
    pub async fn post_review(
        &self,
        client_config: &serde_json::Value,
        target: &Target,
        review: &serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        use base64::Engine;
        let ca_bundle = client_config["caBundle"]
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
        let body = serde_json::to_vec(review).unwrap_or_default();
        self.post_json(target, Trust::Bundle(ca_bundle.as_deref()), body, timeout)
            .await
    }
}

impl Target {
    /// The `Host` header: the name the certificate is checked for, and the port.
    pub fn host_header(&self) -> String {
        format!("{}:{}", self.server_name, self.port)
    }
}

/// `call`'s outcome, or Go's words for a deadline (upstream's messages quote them) when
/// it takes longer than `timeout`.
async fn within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err("context deadline exceeded".into()))
}

/// Where a webhook's `clientConfig` points (with upstream's `?timeout=` query),
/// resolving a Service to one of its ready endpoints.
pub fn target(
    config: &serde_json::Value,
    timeout: Duration,
    cache: &WatchCache,
) -> Result<Target, String> {
    let query = format!("timeout={}s", timeout.as_secs());
    if let Some(url) = config["url"].as_str() {
        return url_target(url, &query);
    }
    let svc = &config["service"];
    let path = svc["path"].as_str().unwrap_or("/");
    service_target(cache, svc, &format!("{path}?{query}"))
}

/// A Service reference (`namespace`, `name`, `port`, default 443) as a target, at `path`.
pub fn service_target(
    cache: &WatchCache,
    svc: &serde_json::Value,
    path: &str,
) -> Result<Target, String> {
    let (ns, name) = (
        svc["namespace"].as_str().unwrap_or_default(),
        svc["name"].as_str().unwrap_or_default(),
    );
    let port = svc["port"].as_i64().unwrap_or(443);
    let host = format!("{name}.{ns}.svc");
    let (ip, target_port) = endpoint(cache, ns, name, port)?;
    Ok(Target {
        host: ip,
        port: target_port,
        url: format!("https://{host}:{port}{path}"),
        server_name: host,
        path: path.to_string(),
    })
}

fn url_target(url: &str, query: &str) -> Result<Target, String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("invalid webhook URL {url}: must be https"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.starts_with('[') || h.ends_with(']') => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse()
                .map_err(|_| format!("invalid port in webhook URL {url}"))?,
        ),
        _ => (authority.trim_start_matches('[').trim_end_matches(']'), 443),
    };
    let sep = if path.contains('?') { '&' } else { '?' };
    Ok(Target {
        host: host.to_string(),
        port,
        server_name: host.to_string(),
        path: format!("{path}{sep}{query}"),
        url: format!("https://{authority}{path}{sep}{query}"),
    })
}

/// A ready endpoint of the Service's port `port`: (address, target port).
fn endpoint(cache: &WatchCache, ns: &str, name: &str, port: i64) -> Result<(String, u16), String> {
    let not_found = || format!("service \"{name}\" not found");
    let svc = cache
        .core_object("services", Some(ns), name)
        .ok_or_else(not_found)?;
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(port))
        .ok_or_else(|| format!("service \"{name}\" has no port {port}"))?;
    let port_name = svc_port["name"].as_str().unwrap_or_default();
    let slices = cache
        .cache("/registry/endpointslices/")
        .map(|c| c.list(&format!("/registry/endpointslices/{ns}/")).0)
        .unwrap_or_default();
    for slice in slices {
        let slice = slice.value();
        if slice["metadata"]["labels"]["kubernetes.io/service-name"].as_str() != Some(name) {
            continue;
        }
        let Some(target_port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            .and_then(|p| p["port"].as_u64())
        else {
            continue;
        };
        let ready = slice["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["conditions"]["ready"] != serde_json::Value::Bool(false))
            .find_map(|e| e["addresses"][0].as_str());
        if let Some(ip) = ready {
            return Ok((ip.to_string(), target_port as u16));
        }
    }
    Err(format!("no endpoints available for service \"{name}\""))
}

/// Accepts any serving certificate (signatures are still checked, so the
/// handshake proves the key), as upstream does for `insecureSkipTLSVerify`.
#[derive(Debug)]
pub(crate) struct AnyServerCertificate(pub(crate) rustls::crypto::WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_targets_with_the_timeout_query() {
        let t = url_target("https://127.0.0.1:8443/validate", "timeout=5s").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 8443));
        assert_eq!(t.path, "/validate?timeout=5s");
        assert_eq!(t.url, "https://127.0.0.1:8443/validate?timeout=5s");
        let t = url_target("https://hooks.example.com/m?x=1", "timeout=10s").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("hooks.example.com", 443));
        assert_eq!(t.path, "/m?x=1&timeout=10s");
        let t = url_target("https://[::1]:9443/", "timeout=1s").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9443));
        assert!(url_target("http://insecure/", "timeout=1s").is_err());
    }
}
