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
            Some(bundle) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(GoVerifier::new(
                    bundle,
                    provider.clone(),
                )?)),
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
                .map_err(|e| go_tls_error(&e))?;
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

/// Server certificates judged as Go's crypto/x509 judges them for upstream's webhook,
/// conversion and aggregation clients: a chain to a certificate of the bundle (through
/// the intermediates the server sends), the server name among the certificate's SANs,
/// the time within its validity. Unlike WebPKI, Go does not refuse a server certificate
/// marked CA:TRUE: one that is itself in the bundle is trusted as it is (a chain of
/// one), and one a bundle certificate signed is trusted as any leaf would be. A webhook
/// certificate made with `openssl req -x509` or `openssl x509 -req` is CA:TRUE by
/// Debian's defaults, so both happen.
#[derive(Debug)]
struct GoVerifier {
    bundle: Vec<CertificateDer<'static>>,
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
}

impl GoVerifier {
    fn new(pem: &[u8], provider: Arc<rustls::crypto::CryptoProvider>) -> Result<Self, String> {
        let bundle = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("invalid caBundle: {e}"))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in &bundle {
            roots
                .add(cert.clone())
                .map_err(|e| format!("invalid caBundle: {e}"))?;
        }
        let webpki =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("invalid caBundle: {e}"))?;
        Ok(GoVerifier { bundle, webpki })
    }
}

impl GoVerifier {
    /// Whether a certificate of the bundle signed `cert` (its issuer by name, the
    /// signature by key).
    fn signed_by_bundle(&self, cert: &CertificateDer<'_>) -> bool {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
            return false;
        };
        self.bundle.iter().any(|ca| {
            x509_parser::parse_x509_certificate(ca.as_ref()).is_ok_and(|(_, ca)| {
                ca.subject() == cert.issuer()
                    && cert.verify_signature(Some(ca.public_key())).is_ok()
            })
        })
    }
}

impl ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let in_bundle = self
            .bundle
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref());
        if !in_bundle {
            let judged =
                self.webpki
                    .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
            match judged {
                Err(e) if ca_as_end_entity(&e) && !self.signed_by_bundle(end_entity) => {
                    return Err(rustls::CertificateError::UnknownIssuer.into());
                }
                Err(e) if ca_as_end_entity(&e) => {}
                judged => return judged,
            }
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        within_validity(end_entity, now)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// WebPKI's refusal of a server certificate marked CA:TRUE, which rustls passes on as
/// an opaque error.
fn ca_as_end_entity(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
            if other.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity)
    )
}

/// A certificate trusted as it is must still be within its validity at `now`.
fn within_validity(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    use rustls::CertificateError;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let validity = parsed.validity();
    let at = |seconds: i64| UnixTime::since_unix_epoch(Duration::from_secs(seconds.max(0) as u64));
    let (not_before, not_after) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    let time = now.as_secs() as i64;
    if time < not_before {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before: at(not_before),
        }
        .into());
    }
    if time > not_after {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after: at(not_after),
        }
        .into());
    }
    Ok(())
}

/// A failed TLS handshake in the words of Go's crypto/tls and crypto/x509, which
/// upstream's webhook and aggregation errors quote.
fn go_tls_error(e: &std::io::Error) -> String {
    use rustls::CertificateError as E;
    let rustls = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    let Some(rustls::Error::InvalidCertificate(cert)) = rustls else {
        return format!("tls: {e}");
    };
    let rfc3339 = |t: &UnixTime| {
        jiff::Timestamp::from_second(t.as_secs() as i64)
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default()
    };
    let x509 = match cert {
        // A bundle certificate with the issuer's name but not its key is no issuer to
        // Go either (it adds a hint after these words).
        E::UnknownIssuer | E::BadSignature => "certificate signed by unknown authority".to_string(),
        E::NotValidForNameContext {
            expected,
            presented,
        } => {
            let host = expected.to_str();
            // The certificate's names as WebPKI shows them: `DnsName("a.b")`, `IpAddress(1.2.3.4)`.
            let of = |kind: &str| -> Vec<String> {
                presented
                    .iter()
                    .filter_map(|p| p.strip_prefix(kind)?.strip_prefix('(')?.strip_suffix(')'))
                    .map(|v| v.trim_matches('"').to_string())
                    .collect()
            };
            let by_ip = host.parse::<std::net::IpAddr>().is_ok();
            let valid = if by_ip {
                of("IpAddress")
            } else {
                of("DnsName")
            };
            match (valid.is_empty(), by_ip) {
                (true, true) => format!(
                    "cannot validate certificate for {host} because it doesn't contain any IP SANs"
                ),
                (true, false) => {
                    format!("certificate is not valid for any names, but wanted to match {host}")
                }
                (false, _) => format!("certificate is valid for {}, not {host}", valid.join(", ")),
            }
        }
        E::ExpiredContext { time, not_after } => format!(
            "certificate has expired or is not yet valid: current time {} is after {}",
            rfc3339(time),
            rfc3339(not_after)
        ),
        E::NotValidYetContext { time, not_before } => format!(
            "certificate has expired or is not yet valid: current time {} is before {}",
            rfc3339(time),
            rfc3339(not_before)
        ),
        other => return format!("tls: failed to verify certificate: {other:?}"),
    };
    format!("tls: failed to verify certificate: x509: {x509}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    /// A CA: its certificate and the issuer that signs with it.
    fn ca(name: &str) -> (CertificateDer<'static>, Issuer<'static, KeyPair>) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.der().clone(), Issuer::new(params, key))
    }

    fn leaf(names: &[&str], issuer: &Issuer<'_, KeyPair>) -> CertificateDer<'static> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names).unwrap();
        cert.signed_by(&key, issuer).unwrap().der().clone()
    }

    fn pem(certs: &[&CertificateDer<'_>]) -> Vec<u8> {
        use base64::Engine;
        certs
            .iter()
            .map(|c| {
                let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
                format!("-----BEGIN CERTIFICATE-----\n{b64}\n-----END CERTIFICATE-----\n")
            })
            .collect::<String>()
            .into_bytes()
    }

    /// What a client trusting `bundle` says of a server presenting `chain` as `name`:
    /// nothing when it trusts it, else Go's words.
    fn judged(
        bundle: &[&CertificateDer<'_>],
        chain: &[CertificateDer<'_>],
        name: &str,
    ) -> Option<String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = GoVerifier::new(&pem(bundle), provider).unwrap();
        let name = ServerName::try_from(name.to_string()).unwrap();
        let outcome =
            verifier.verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now());
        outcome
            .err()
            .map(|e| go_tls_error(&std::io::Error::other(e)))
    }

    #[test]
    fn a_self_signed_certificate_in_the_bundle_is_trusted_as_it_is() {
        // What `openssl req -x509` makes: its own CA (CA:TRUE), serving as the leaf.
        let mut params = CertificateParams::new(vec!["hook.ns.svc".to_string()]).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let own = params.self_signed(&key).unwrap().der().clone();
        assert_eq!(
            judged(&[&own], std::slice::from_ref(&own), "hook.ns.svc"),
            None
        );
        // Still only for its own names...
        assert_eq!(
            judged(&[&own], std::slice::from_ref(&own), "other.ns.svc").as_deref(),
            Some(
                "tls: failed to verify certificate: x509: certificate is valid for hook.ns.svc, not other.ns.svc"
            )
        );
        // ...and only while valid.
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let expired = params.self_signed(&key).unwrap().der().clone();
        let said = judged(&[&expired], std::slice::from_ref(&expired), "hook.ns.svc").unwrap();
        assert!(
            said.starts_with("tls: failed to verify certificate: x509: certificate has expired or is not yet valid: current time ")
                && said.ends_with(" is after 2021-01-01T00:00:00Z"),
            "{said}"
        );
    }

    #[test]
    fn leaves_are_trusted_through_a_chain_to_the_bundle_and_nothing_else() {
        let (root, root_issuer) = ca("root");
        let direct = leaf(&["hook.ns.svc"], &root_issuer);
        assert_eq!(
            judged(&[&root], std::slice::from_ref(&direct), "hook.ns.svc"),
            None
        );

        // Through an intermediate the server sends along.
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let intermediate = params.signed_by(&key, &root_issuer).unwrap().der().clone();
        let by_intermediate = leaf(&["hook.ns.svc"], &Issuer::new(params, key));
        let chain = [by_intermediate.clone(), intermediate];
        assert_eq!(judged(&[&root], &chain, "hook.ns.svc"), None);
        let unknown =
            "tls: failed to verify certificate: x509: certificate signed by unknown authority";
        assert_eq!(
            judged(&[&root], &[by_intermediate], "hook.ns.svc").as_deref(),
            Some(unknown)
        );

        // Another CA's leaf, and a name the certificate does not carry.
        let (other, _) = ca("other");
        assert_eq!(
            judged(&[&other], std::slice::from_ref(&direct), "hook.ns.svc").as_deref(),
            Some(unknown)
        );
        assert_eq!(
            judged(&[&root], &[direct], "10.0.0.1").as_deref(),
            Some(
                "tls: failed to verify certificate: x509: cannot validate certificate for 10.0.0.1 because it doesn't contain any IP SANs"
            )
        );
    }

    #[test]
    fn a_ca_certificate_signed_by_the_bundle_serves_as_go_allows() {
        let (root, root_issuer) = ca("root");
        // What `openssl x509 -req` signs with Debian's defaults: CA:TRUE.
        let mut params = CertificateParams::new(vec!["hook.ns.svc".to_string()]).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let served = params.signed_by(&key, &root_issuer).unwrap().der().clone();
        assert_eq!(
            judged(&[&root], std::slice::from_ref(&served), "hook.ns.svc"),
            None
        );
        assert_eq!(
            judged(&[&root], std::slice::from_ref(&served), "other.ns.svc").as_deref(),
            Some(
                "tls: failed to verify certificate: x509: certificate is valid for hook.ns.svc, not other.ns.svc"
            )
        );
        // Another bundle trusts it no more than any other leaf.
        let (other, _) = ca("other");
        assert_eq!(
            judged(&[&other], &[served], "hook.ns.svc").as_deref(),
            Some(
                "tls: failed to verify certificate: x509: certificate signed by unknown authority"
            )
        );
        // A CA of the same name with another key signed nothing the bundle trusts.
        let (_, impostor) = ca("root");
        let forged = params.signed_by(&key, &impostor).unwrap().der().clone();
        assert_eq!(
            judged(&[&root], &[forged], "hook.ns.svc").as_deref(),
            Some(
                "tls: failed to verify certificate: x509: certificate signed by unknown authority"
            )
        );
        // Expiry counts as for any leaf.
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let expired = params.signed_by(&key, &root_issuer).unwrap().der().clone();
        let said = judged(&[&root], &[expired], "hook.ns.svc").unwrap();
        assert!(
            said.contains("certificate has expired or is not yet valid"),
            "{said}"
        );
    }

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
