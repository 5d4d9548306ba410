//! TLS for the kubelet server: the serving certificate (see [`crate::certificate`],
//! replaced in place when it rotates) and required client certificates from the
//! cluster CA.

use std::sync::Arc;

use krust_client::certificate::RotatingCertificate;
use rustls::pki_types::{CertificateDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use crate::{Config, Error};

/// The apiserver's client certificate user, as upstream's kubeadm names it.
pub const APISERVER_CLIENT: &str = "kube-apiserver-kubelet-client";
const MASTERS: &str = "system:masters";

pub fn acceptor(config: &Config, serving: &RotatingCertificate) -> Result<TlsAcceptor, Error> {
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Server(format!("{what}: {e}"));
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
    let mut tls = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(serving.clone()));
    // No session resumption: it would skip checking the caller's certificate again.
    tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    tls.send_tls13_tickets = 0;
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
