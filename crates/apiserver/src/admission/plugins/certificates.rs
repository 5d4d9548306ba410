//! Upstream's certificate admission plugins: approving a CertificateSigningRequest
//! (`/approval`) needs the `approve` verb on its signer, issuing a certificate (a changed
//! `status.certificate`) the `sign` verb (CertificateApproval, CertificateSigning), both
//! on `signers.certificates.k8s.io` named after the signer or its `<domain>/*`; and no
//! request for the kube-apiserver-client signer may ask for `system:masters`
//! (CertificateSubjectRestriction).

use krust_api::status::ApiError;
use serde_json::Value;
use x509_parser::pem::Pem;
use x509_parser::prelude::{FromDer, X509CertificationRequest};

use crate::admission::{Attributes, Operation, Plugin};
use crate::authz::{self, ResourceAttributes, Target};
use crate::rest::Call;

const GROUP: &str = "certificates.k8s.io";

fn is_request(a: &Attributes<'_>) -> bool {
    a.is(GROUP, "certificatesigningrequests")
}

/// CertificateApproval: approving a request needs `approve` on its signer.
pub struct CertificateApproval;

#[async_trait::async_trait]
impl Plugin for CertificateApproval {
    fn name(&self) -> &'static str {
        "CertificateApproval"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        is_request(a) && a.operation == Operation::Update && a.subresource() == Some("approval")
    }

    async fn validate(&self, a: &Attributes<'_>, csr: Option<&Value>) -> Result<(), ApiError> {
        match csr {
            Some(csr) => require(a.call, "approve", csr).await,
            None => Ok(()),
        }
    }
}

/// CertificateSigning: issuing a certificate (a changed `status.certificate`) needs
/// `sign` on the request's signer.
pub struct CertificateSigning;

#[async_trait::async_trait]
impl Plugin for CertificateSigning {
    fn name(&self) -> &'static str {
        "CertificateSigning"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        is_request(a) && a.operation == Operation::Update && a.subresource() != Some("approval")
    }

    async fn validate(&self, a: &Attributes<'_>, csr: Option<&Value>) -> Result<(), ApiError> {
        match (csr, a.old) {
            (Some(csr), Some(old))
                if csr["status"]["certificate"] != old["status"]["certificate"] =>
            {
                require(a.call, "sign", csr).await
            }
            _ => Ok(()),
        }
    }
}

/// CertificateSubjectRestriction: no request to the kube-apiserver-client signer may ask
/// for `system:masters`.
pub struct CertificateSubjectRestriction;

#[async_trait::async_trait]
impl Plugin for CertificateSubjectRestriction {
    fn name(&self) -> &'static str {
        "CertificateSubjectRestriction"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        is_request(a) && a.operation == Operation::Create
    }

    async fn validate(&self, a: &Attributes<'_>, csr: Option<&Value>) -> Result<(), ApiError> {
        let Some(csr) = csr else { return Ok(()) };
        let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
        if signer == "kubernetes.io/kube-apiserver-client" && asks_for_masters(csr) {
            return Err(forbidden(
                a.call,
                format!("use of {signer} signer with system:masters group is not allowed"),
            ));
        }
        Ok(())
    }
}

/// Refuses the request unless the caller may `verb` the request's signer.
async fn require(call: &Call<'_>, verb: &str, csr: &Value) -> Result<(), ApiError> {
    let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
    if may(call, verb, signer).await {
        Ok(())
    } else {
        Err(forbidden(
            call,
            format!("user not permitted to {verb} requests with signerName {signer:?}"),
        ))
    }
}

/// Whether the caller may `verb` the signer `name`, or every signer of its domain.
async fn may(call: &Call<'_>, verb: &str, name: &str) -> bool {
    let wildcard = name
        .split_once('/')
        .map(|(domain, _)| format!("{domain}/*"));
    for name in std::iter::once(name).chain(wildcard.as_deref()) {
        let attrs = authz::Attributes {
            user: &call.user,
            verb,
            target: Target::Resource(ResourceAttributes {
                group: GROUP,
                resource: "signers",
                subresource: None,
                namespace: None,
                name: Some(name),
            }),
        };
        if authz::authorize(call.scope, &attrs).await.is_ok() {
            return true;
        }
    }
    false
}

/// Whether the request's subject names the `system:masters` organisation.
fn asks_for_masters(csr: &Value) -> bool {
    use base64::Engine;
    let pem = csr["spec"]["request"]
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default();
    let Some(Ok(block)) = Pem::iter_from_buffer(&pem).next() else {
        return false;
    };
    X509CertificationRequest::from_der(&block.contents).is_ok_and(|(_, req)| {
        req.certification_request_info
            .subject
            .iter_organization()
            .any(|o| o.as_str() == Ok("system:masters"))
    })
}

fn forbidden(call: &Call<'_>, why: String) -> ApiError {
    let name = call.info.name.as_deref().unwrap_or_default();
    ApiError::forbidden_for(call.target(name), &why)
}
