//! Certificates through the CertificateSigningRequest API, as client-go's
//! `util/certificate/csr`: a new key, a request to a signer, then a wait until the
//! request is issued (or denied). Who approves is the caller's business: the
//! controllers for a kubelet's own requests, an administrator otherwise.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};

/// How often a request is looked at while it waits for its certificate.
const POLL: Duration = Duration::from_millis(250);

/// A certificate and its private key (PEM).
pub struct Issued {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
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

/// What to ask a signer for.
pub struct Request<'a> {
    pub common_name: &'a str,
    pub organization: &'a str,
    /// DNS names and IP addresses (subject alternative names).
    pub names: &'a [String],
    pub signer: &'a str,
    pub usages: &'a [&'a str],
    /// The request object's `metadata.generateName`.
    pub generate_name: &'a str,
}

/// A request sent, with the key its certificate will go with.
pub struct Pending {
    pub name: String,
    key: rcgen::KeyPair,
}

/// Generates a key and sends the request for it.
pub async fn create(client: &kube::Client, request: &Request<'_>) -> Result<Pending, Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(request.names.to_vec())?;
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::CommonName, request.common_name);
    subject.push(rcgen::DnType::OrganizationName, request.organization);
    params.distinguished_name = subject;
    let pem = params.serialize_request(&key)?.pem()?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(request.generate_name.into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.into_bytes()),
            signer_name: request.signer.into(),
            usages: Some(request.usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let created = Api::<CertificateSigningRequest>::all(client.clone())
        .create(&PostParams::default(), &csr)
        .await
        .map_err(Error::Create)?;
    Ok(Pending {
        name: created.metadata.name.unwrap_or_default(),
        key,
    })
}

impl Pending {
    /// The certificate once signed (up to `timeout`); an error once denied or failed.
    pub async fn issued(self, client: &kube::Client, timeout: Duration) -> Result<Issued, Error> {
        let api: Api<CertificateSigningRequest> = Api::all(client.clone());
        let name = self.name;
        let started = tokio::time::Instant::now();
        loop {
            let csr = api.get(&name).await.map_err(|source| Error::Read {
                name: name.clone(),
                source,
            })?;
            let status = csr.status.unwrap_or_default();
            if let Some(refused) = status
                .conditions
                .iter()
                .flatten()
                .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
            {
                return Err(Error::Refused {
                    name,
                    condition: refused.type_.to_lowercase(),
                    message: refused.message.clone().unwrap_or_default(),
                });
            }
            if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                return Ok(Issued {
                    cert: String::from_utf8_lossy(&cert.0).into_owned(),
                    key: self.key.serialize_pem(),
                });
            }
            if started.elapsed() >= timeout {
                return Err(Error::TimedOut {
                    name,
                    waited: timeout,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
