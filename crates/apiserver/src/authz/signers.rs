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

use super::{Attributes, ResourceAttributes, Target};
use crate::rest::Call;

const GROUP: &str = "certificates.k8s.io";

/// Checks a write of a certificate signing request: `old` is `None` on create.
pub async fn admit(call: &Call<'_>, new: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let signer = new["spec"]["signerName"].as_str().unwrap_or_default();
    let Some(old) = old else {
        if signer == "kubernetes.io/kube-apiserver-client" && asks_for_masters(new) {
            return Err(forbidden(
                call,
                format!("use of {signer} signer with system:masters group is not allowed"),
            ));
        }
        return Ok(());
    };
    let verb = match call.info.subresource.as_deref() {
        Some("approval") => "approve",
        _ if new["status"]["certificate"] != old["status"]["certificate"] => "sign",
        _ => return Ok(()),
    };
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
        let attrs = Attributes {
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
        if super::authorize(call.api, &attrs).await.is_ok() {
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
