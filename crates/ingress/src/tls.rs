//! TLS termination, as ingress-nginx does it: each Ingress's `spec.tls` names hosts and
//! the Secret (type `kubernetes.io/tls`, in the Ingress's namespace) whose certificate
//! serves them; a client's SNI picks the certificate (an exact host, then a wildcard
//! covering one more label), and a client that names no known host gets the default
//! certificate, a self-signed one made at start (ingress-nginx's "Kubernetes Ingress
//! Controller Fake Certificate"). Certificates follow their Secrets: the table is
//! rebuilt whenever an Ingress or a Secret changes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use krust_api::sync::UnpoisonedRw;
use kube::ResourceExt;
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::gateway::table::Host;

/// The annotation that keeps plain HTTP for an Ingress with TLS (ingress-nginx's).
const SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/ssl-redirect";

/// The certificates to serve, by host, and the hosts whose plain HTTP requests are sent
/// to HTTPS.
#[derive(Debug, Default)]
pub struct Certificates {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the part after `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// Gateway listeners' wildcards, by the part after `*.`.
    gateway_wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// Hosts, and parents of wildcard hosts, whose plain HTTP goes to HTTPS.
    redirect: HashSet<String>,
    redirect_wildcard: HashSet<String>,
    /// The certificate of an HTTPS Gateway listener without a hostname: for clients
    /// that name no host with a certificate of its own.
    fallback: Option<Arc<CertifiedKey>>,
}

impl Certificates {
    /// The table for `ingresses`, their certificates read from `secrets`. A TLS entry
    /// whose Secret is missing or unusable is skipped (its hosts get the default
    /// certificate), as ingress-nginx does, with a warning.
    pub fn new<'a>(
        ingresses: impl IntoIterator<Item = &'a Ingress>,
        secrets: impl IntoIterator<Item = &'a Secret>,
    ) -> Certificates {
        let secrets: HashMap<(String, String), &Secret> = secrets
            .into_iter()
            .map(|s| ((s.namespace().unwrap_or_default(), s.name_any()), s))
            .collect();
        let mut table = Certificates::default();
        for ingress in ingresses {
            let namespace = ingress.namespace().unwrap_or_default();
            let redirect =
                ingress.annotations().get(SSL_REDIRECT).map(String::as_str) != Some("false");
            for tls in ingress.spec.iter().flat_map(|s| s.tls.iter().flatten()) {
                let Some(name) = &tls.secret_name else {
                    continue;
                };
                let key = match secrets.get(&(namespace.clone(), name.clone())) {
                    Some(secret) => certified_key(secret),
                    None => Err(format!("secret {namespace}/{name} not found")),
                };
                let key = match key {
                    Ok(key) => Arc::new(key),
                    Err(err) => {
                        tracing::warn!(ingress = %ingress.name_any(), %namespace, error = %err, "TLS certificate unusable; hosts get the default one");
                        continue;
                    }
                };
                for host in tls.hosts.iter().flatten() {
                    let host = host.to_ascii_lowercase();
                    let (certificates, redirects, host) = match host.strip_prefix("*.") {
                        Some(parent) => (
                            &mut table.wildcard,
                            &mut table.redirect_wildcard,
                            parent.to_string(),
                        ),
                        None => (&mut table.exact, &mut table.redirect, host),
                    };
                    if redirect {
                        redirects.insert(host.clone());
                    }
                    certificates.insert(host, key.clone());
                }
            }
        }
        table
    }

    /// Adds the certificate of a Gateway listener serving `host`, unless an Ingress
    /// has one for the same hosts. A Gateway's wildcard covers every depth: it is found
    /// for each parent of a host, the longest first.
    pub fn add_listener(&mut self, host: &Host, key: Arc<CertifiedKey>) {
        match host {
            Host::Exact(name) => {
                self.exact.entry(name.clone()).or_insert(key);
            }
            Host::Wildcard(suffix) => {
                self.gateway_wildcard.entry(suffix.clone()).or_insert(key);
            }
            Host::Any => {
                self.fallback.get_or_insert(key);
            }
        }
    }

    /// The certificate for a client that named `host`, if an Ingress or a Gateway
    /// listener has one for it.
    fn find(&self, host: &str) -> Option<Arc<CertifiedKey>> {
        let host = host.to_ascii_lowercase();
        if let Some(key) = self.exact.get(&host) {
            return Some(key.clone());
        }
        let parent = host.split_once('.').map(|(_, parent)| parent);
        if let Some(key) = parent.and_then(|p| self.wildcard.get(p)) {
            return Some(key.clone());
        }
        let suffixes = host.match_indices('.').map(|(i, _)| &host[i + 1..]);
        suffixes
            .filter_map(|suffix| self.gateway_wildcard.get(suffix))
            .next()
            .or(self.fallback.as_ref())
            .cloned()
    }

    /// Whether plain HTTP requests for `host` are redirected to HTTPS (it has TLS and
    /// its Ingress does not turn the redirect off).
    pub fn redirects(&self, host: &str) -> bool {
        // Most requests: no Ingress has TLS, nothing to allocate.
        if self.redirect.is_empty() && self.redirect_wildcard.is_empty() {
            return false;
        }
        let host = host.to_ascii_lowercase();
        self.redirect.contains(&host)
            || host
                .split_once('.')
                .is_some_and(|(_, parent)| self.redirect_wildcard.contains(parent))
    }
}

/// The certificate and key of a `kubernetes.io/tls` Secret.
pub(crate) fn certified_key(secret: &Secret) -> Result<CertifiedKey, String> {
    let data = secret.data.as_ref().ok_or("the secret has no data")?;
    let field = |name: &str| {
        data.get(name)
            .map(|b| b.0.as_slice())
            .ok_or_else(|| format!("the secret has no {name}"))
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(field("tls.crt")?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(field("tls.key")?).map_err(|e| format!("tls.key: {e}"))?;
    let key = any_supported_type(&key).map_err(|e| format!("tls.key: {e}"))?;
    Ok(CertifiedKey::new(chain, key))
}

/// What the TLS listener serves: the current table and the default certificate.
#[derive(Debug)]
pub struct Resolver {
    pub table: RwLock<Arc<Certificates>>,
    default: Arc<CertifiedKey>,
}

impl Resolver {
    /// A resolver with an empty table and a fresh self-signed default certificate.
    pub fn new() -> Result<Resolver, rcgen::Error> {
        let mut params = rcgen::CertificateParams::new(vec!["ingress.local".to_string()])?;
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            "Kubernetes Ingress Controller Fake Certificate",
        );
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Acme Co");
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let der = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
        let signing = any_supported_type(&der).map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
        Ok(Resolver {
            table: RwLock::default(),
            default: Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing)),
        })
    }

    /// The table in use now.
    pub fn current(&self) -> Arc<Certificates> {
        self.table.read_locked().clone()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let found = hello
            .server_name()
            .and_then(|name| self.current().find(name));
        Some(found.unwrap_or_else(|| self.default.clone()))
    }
}

/// The server configuration of the HTTPS listener: certificates by SNI, HTTP/2 and
/// HTTP/1.1 offered through ALPN.
pub fn server_config(resolver: Arc<Resolver>) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    fn secret(name: &str, host: &str) -> Secret {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![host.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        Secret {
            metadata: kube::api::ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                [
                    ("tls.crt".to_string(), ByteString(cert.pem().into_bytes())),
                    (
                        "tls.key".to_string(),
                        ByteString(key.serialize_pem().into_bytes()),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    fn ingress(tls: serde_json::Value, annotations: serde_json::Value) -> Ingress {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "web", "annotations": annotations},
            "spec": {"tls": tls},
        }))
        .unwrap()
    }

    #[test]
    fn hosts_get_their_secrets_certificate_exact_before_wildcard() {
        let secrets = [
            secret("exact", "a.example.com"),
            secret("wild", "*.example.com"),
        ];
        let ing = ingress(
            json!([{"hosts": ["a.example.com"], "secretName": "exact"},
                   {"hosts": ["*.example.com"], "secretName": "wild"},
                   {"hosts": ["missing.example.org"], "secretName": "absent"}]),
            json!({}),
        );
        let table = Certificates::new([&ing], &secrets);
        let exact = table.find("A.example.com").unwrap();
        let wild = table.find("b.example.com").unwrap();
        assert!(!Arc::ptr_eq(&exact, &wild));
        assert!(table.find("x.b.example.com").is_none(), "one label only");
        assert!(
            table.find("missing.example.org").is_none(),
            "its secret is absent"
        );
        assert!(table.redirects("a.example.com") && table.redirects("c.example.com"));
        assert!(!table.redirects("other.example.org"));
    }

    #[test]
    fn the_annotation_keeps_plain_http() {
        let secrets = [secret("exact", "a.example.com")];
        let ing = ingress(
            json!([{"hosts": ["a.example.com"], "secretName": "exact"}]),
            json!({SSL_REDIRECT: "false"}),
        );
        let table = Certificates::new([&ing], &secrets);
        assert!(table.find("a.example.com").is_some());
        assert!(!table.redirects("a.example.com"));
    }
}
