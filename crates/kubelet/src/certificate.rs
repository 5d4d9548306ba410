//! The kubelet's client certificate, obtained as upstream's TLS bootstrap does: with
//! nothing but a bootstrap credential, the kubelet generates a key, sends a
//! CertificateSigningRequest for `system:node:<name>` in `system:nodes` to the signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, and waits until the controllers have
//! approved and signed it. A certificate kept from an earlier start is used again while
//! it stays valid.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};
use x509_parser::pem::parse_x509_pem;

/// The signer of kubelets' client certificates.
pub const CLIENT_KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// How often the request is looked at while it waits for its certificate.
const POLL: Duration = Duration::from_millis(250);

/// A certificate and its private key (PEM).
pub struct Issued {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("generating the key and request: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("creating the CertificateSigningRequest: {0}")]
    Create(#[source] kube::Error),
    #[error("reading CertificateSigningRequest {name}: {source}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CertificateSigningRequest {name} was {condition}: {message}")]
    Refused {
        name: String,
        condition: String,
        message: String,
    },
    #[error("CertificateSigningRequest {name} got no certificate within {waited:?}")]
    TimedOut { name: String, waited: Duration },
}

/// The user a node's client certificate names.
pub fn node_user(node_name: &str) -> String {
    format!("system:node:{node_name}")
}

/// Whether `cert_pem` names `system:node:<node_name>`, was signed by `ca_pem` and stays
/// valid for at least `margin`.
pub fn still_valid(cert_pem: &str, ca_pem: &str, node_name: &str, margin: Duration) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        parse_x509_pem(cert_pem.as_bytes()),
        parse_x509_pem(ca_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok(cert), Ok(ca)) = (cert.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    let user = node_user(node_name);
    let names_node = cert
        .subject()
        .iter_common_name()
        .any(|cn| cn.as_str() == Ok(user.as_str()));
    let deadline = x509_parser::time::ASN1Time::now().timestamp() + margin.as_secs() as i64;
    names_node
        && cert.validity().not_after.timestamp() > deadline
        && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// Requests a client certificate for `system:node:<node_name>` with a new key and waits
/// (up to `timeout`) until it is issued.
pub async fn request_client_certificate(
    client: &kube::Client,
    node_name: &str,
    timeout: Duration,
) -> Result<Issued, CertificateError> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::CommonName, node_user(node_name));
    subject.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name = subject;
    let request = params.serialize_request(&key)?.pem()?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("node-csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(request.into_bytes()),
            signer_name: CLIENT_KUBELET_SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(CertificateError::Create)?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, "requested the node's client certificate");
    let cert = wait_for_certificate(&api, &name, timeout).await?;
    Ok(Issued {
        cert,
        key: key.serialize_pem(),
    })
}

/// The certificate of request `name` once signed; an error once denied or failed.
async fn wait_for_certificate(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    timeout: Duration,
) -> Result<String, CertificateError> {
    let started = tokio::time::Instant::now();
    loop {
        let csr = api
            .get(name)
            .await
            .map_err(|source| CertificateError::Read {
                name: name.into(),
                source,
            })?;
        let status = csr.status.unwrap_or_default();
        if let Some(refused) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            return Err(CertificateError::Refused {
                name: name.into(),
                condition: refused.type_.to_lowercase(),
                message: refused.message.clone().unwrap_or_default(),
            });
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            return Ok(String::from_utf8_lossy(&cert.0).into_owned());
        }
        if started.elapsed() >= timeout {
            return Err(CertificateError::TimedOut {
                name: name.into(),
                waited: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        (pem, rcgen::Issuer::new(params, key))
    }

    fn issue(ca: &rcgen::Issuer<'_, rcgen::KeyPair>, cn: &str, until_year: i32) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
        params.signed_by(&key, ca).unwrap().pem()
    }

    #[test]
    fn a_kept_certificate_is_reused_only_for_its_node_ca_and_lifetime() {
        let (ca_pem, ca) = ca();
        let day = Duration::from_secs(86_400);
        let good = issue(&ca, "system:node:n1", 2100);
        assert!(still_valid(&good, &ca_pem, "n1", day));
        assert!(!still_valid(&good, &ca_pem, "n2", day), "another node");
        let expired = issue(&ca, "system:node:n1", 2001);
        assert!(!still_valid(&expired, &ca_pem, "n1", day), "expired");
        let (other_pem, _) = self::ca();
        assert!(!still_valid(&good, &other_pem, "n1", day), "another CA");
        assert!(!still_valid("junk", &ca_pem, "n1", day));
    }
}
