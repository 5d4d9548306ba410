//! A TLS certificate that can be replaced while it is in use, as a kubelet's client and
//! serving certificates are when they rotate. The same value answers rustls on both
//! sides (a client presenting it, a server serving it), and connections dialled with
//! it end when it is replaced, so the next request dials again and presents the new
//! one (client-go's connection rotation does the same; without it an HTTP/2 connection
//! would speak with the old identity for as long as it stays up).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use rustls::SignatureScheme;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("parsing the certificate: {0}")]
    Certificate(String),
    #[error("parsing the private key: {0}")]
    Key(String),
}

/// The current certificate; clones share it.
#[derive(Clone)]
pub struct RotatingCertificate {
    current: Arc<watch::Sender<Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for RotatingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatingCertificate")
            .finish_non_exhaustive()
    }
}

impl RotatingCertificate {
    /// Starts with the certificate chain and private key `cert_pem`/`key_pem`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertificateError> {
        let (sender, _) = watch::channel(certified_key(cert_pem, key_pem)?);
        Ok(RotatingCertificate {
            current: Arc::new(sender),
        })
    }

    /// Uses `cert_pem`/`key_pem` from now on and ends the connections dialled with the
    /// previous one.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), CertificateError> {
        self.current.send_replace(certified_key(cert_pem, key_pem)?);
        Ok(())
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current.borrow().clone()
    }

    /// Completes when the certificate is next replaced.
    fn replaced(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut changes = self.current.subscribe();
        async move {
            // The sender lives as long as any clone of `self`, which the connector holds.
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, CertificateError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| CertificateError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(CertificateError::Certificate(
            "no certificate in the PEM".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| CertificateError::Key(e.to_string()))?;
    let signing_key = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| CertificateError::Key(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified
        .keys_match()
        .map_err(|e| CertificateError::Key(e.to_string()))?;
    Ok(Arc::new(certified))
}

impl rustls::client::ResolvesClientCert for RotatingCertificate {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for RotatingCertificate {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// A connector whose connections end when `certificate` (if any) is replaced.
#[derive(Clone)]
pub(crate) struct RotatingConnector<C> {
    pub(crate) inner: C,
    pub(crate) certificate: Option<RotatingCertificate>,
}

impl<C> tower::Service<hyper::Uri> for RotatingConnector<C>
where
    C: tower::Service<hyper::Uri>,
    C::Future: Send + 'static,
{
    type Response = EndsOnRotation<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        // Subscribed before dialling: a rotation during the handshake ends it too.
        let replaced: Pin<Box<dyn Future<Output = ()> + Send>> = match &self.certificate {
            Some(certificate) => Box::pin(certificate.replaced()),
            None => Box::pin(std::future::pending()),
        };
        let dial = self.inner.call(uri);
        Box::pin(async move {
            Ok(EndsOnRotation {
                io: dial.await?,
                replaced,
                ended: false,
            })
        })
    }
}

/// A connection that reads as closed, and refuses writes, once its certificate has been
/// replaced.
pub struct EndsOnRotation<T> {
    io: T,
    replaced: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl<T> EndsOnRotation<T> {
    fn ended(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.ended && self.replaced.as_mut().poll(cx).is_ready() {
            tracing::debug!("the client certificate was replaced: closing a connection");
            self.ended = true;
        }
        self.ended
    }
}

impl<T: Read + Unpin> Read for EndsOnRotation<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.ended(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for EndsOnRotation<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.ended(cx) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for EndsOnRotation<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (cert.cert.pem(), cert.signing_key.serialize_pem())
    }

    #[tokio::test]
    async fn replacing_the_certificate_is_seen_by_resolvers_and_connections() {
        let (cert, key) = pair("one");
        let rotating = RotatingCertificate::from_pem(&cert, &key).unwrap();
        let first = rotating.get();
        let replaced = rotating.replaced();
        let (cert2, key2) = pair("two");
        rotating.replace(&cert2, &key2).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), replaced)
            .await
            .expect("a rotation ends what was dialled before it");
        assert_ne!(first.cert, rotating.get().cert);
        assert!(rotating.replace("junk", &key2).is_err());
        let (_, other_key) = pair("three");
        assert!(
            rotating.replace(&cert2, &other_key).is_err(),
            "a key that is not the certificate's"
        );
        assert_eq!(
            rotating.get().cert,
            RotatingCertificate::from_pem(&cert2, &key2)
                .unwrap()
                .get()
                .cert
        );
    }
}
