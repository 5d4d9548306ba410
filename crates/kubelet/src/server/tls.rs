//! TLS for the kubelet server: a serving certificate (given, e.g. signed by the cluster
//! CA in `krust server`, or else self-signed as upstream's kubelet does without one)
//! and required client certificates from the cluster CA.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use crate::{Config, Error};

/// The apiserver's client certificate user, as upstream's kubeadm names it.
pub const APISERVER_CLIENT: &str = "kube-apiserver-kubelet-client";
const MASTERS: &str = "system:masters";

pub fn acceptor(config: &Config) -> Result<TlsAcceptor, Error> {
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Server(format!("{what}: {e}"));
    let (cert_pem, key_pem) = match &config.serving_cert {
        Some(pair) => pair.clone(),
        None => {
            let sans = vec![config.node_name.clone(), config.node_ip.to_string()];
            let cert = rcgen::generate_simple_self_signed(sans)
                .map_err(|e| fail("generating the serving certificate", &e))?;
            (cert.cert.pem(), cert.signing_key.serialize_pem())
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(config.client_ca.as_bytes()) {
        let cert = cert.map_err(|e| fail("parsing the client CA", &e))?;
        roots
            .add(cert)
            .map_err(|e| fail("adding the client CA", &e))?;
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| fail("building the client verifier", &e))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| fail("parsing the serving certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| fail("parsing the serving key", &e))?;
    let mut tls = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| fail("building the TLS configuration", &e))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

/// Whether a verified client certificate belongs to the apiserver's kubelet client or a
/// `system:masters` member.
pub fn may_call(cert: &CertificateDer<'_>) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return false;
    };
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok());
    let masters = subject
        .iter_organization()
        .any(|o| o.as_str().ok() == Some(MASTERS));
    masters || user == Some(APISERVER_CLIENT)
}
