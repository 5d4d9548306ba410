//! Certificate signing requests: [`approver`] approves kubelets' client certificates, and
//! `CsrSigningController` issues the certificates of approved requests for the signers
//! the cluster CA stands behind, as upstream's csrsigning controllers:
//! `kubernetes.io/kube-apiserver-client` (any client), `kube-apiserver-client-kubelet`
//! (`system:node:<name>` in `system:nodes`) and `kubelet-serving` (a node's serving
//! certificate, for its addresses). A request its signer may not honour gets a `Failed`
//! condition (`SignerValidationFailure`) instead.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::Client;
use kube::api::{Api, PostParams};
use rcgen::{
    CertificateSigningRequestParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::pem::Pem;
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509CertificationRequest};

use crate::Error;

pub mod approver;

const CLIENT: &str = "kubernetes.io/kube-apiserver-client";
const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// Issued certificates start this long ago, for clocks that run behind.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// The CA that signs, and the longest validity it gives (upstream's
/// `--cluster-signing-cert-file`, `--cluster-signing-key-file` and
/// `--cluster-signing-duration`).
#[derive(Clone)]
pub struct SigningConfig {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub duration: Duration,
}

/// Never prints the key.
impl std::fmt::Debug for SigningConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningConfig")
            .field("duration", &self.duration)
            .finish_non_exhaustive()
    }
}

pub struct CsrSigningController {
    client: Client,
    requests: Cache<CertificateSigningRequest>,
    queue: Arc<WorkQueue>,
    issuer: Issuer<'static, KeyPair>,
    ca_not_after: OffsetDateTime,
    duration: Duration,
}

impl CsrSigningController {
    pub fn new(
        client: Client,
        informers: &SharedInformers,
        config: &SigningConfig,
    ) -> Result<Arc<Self>, Error> {
        let bad_ca = |what: &str| Error::Config(format!("the cluster signing CA: {what}"));
        let key = KeyPair::from_pem(&config.ca_key_pem).map_err(|e| bad_ca(&e.to_string()))?;
        let issuer = Issuer::from_ca_cert_pem(&config.ca_cert_pem, key)
            .map_err(|e| bad_ca(&e.to_string()))?;
        let ca_not_after = Pem::iter_from_buffer(config.ca_cert_pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .and_then(|pem| Some(pem.parse_x509().ok()?.validity().not_after.to_datetime()))
            .ok_or_else(|| bad_ca("not a PEM certificate"))?;
        let requests = informers.get::<CertificateSigningRequest>();
        let controller = Arc::new(CsrSigningController {
            client,
            requests: requests.cache(),
            queue: WorkQueue::new("csrsigning"),
            issuer,
            ca_not_after,
            duration: config.duration,
        });
        requests.add_handler(Arc::new(Enqueue {
            queue: controller.queue.clone(),
            wants: to_sign,
        }));
        Ok(controller)
    }
}

/// Queues the requests a controller acts on (by name), as `wants` tells.
struct Enqueue {
    queue: Arc<WorkQueue>,
    wants: fn(&CertificateSigningRequest) -> bool,
}

impl EventHandler<CertificateSigningRequest> for Enqueue {
    fn on_apply(
        &self,
        _old: Option<&CertificateSigningRequest>,
        new: &Arc<CertificateSigningRequest>,
    ) {
        if (self.wants)(new) {
            self.queue
                .add(new.metadata.name.clone().unwrap_or_default());
        }
    }
    fn on_delete(&self, _csr: &Arc<CertificateSigningRequest>) {}
}

fn has(csr: &CertificateSigningRequest, ty: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == ty && c.status == "True"))
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

/// Approved, neither denied nor failed, not issued yet, and for one of our signers.
fn to_sign(csr: &CertificateSigningRequest) -> bool {
    has(csr, "Approved")
        && !has(csr, "Denied")
        && !has(csr, "Failed")
        && !issued(csr)
        && [CLIENT, KUBELET_CLIENT, KUBELET_SERVING].contains(&csr.spec.signer_name.as_str())
}

impl Reconciler for CsrSigningController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Duration>, Error> {
        let Some(csr) = self.requests.get(None, name) else {
            return Ok(None);
        };
        if !to_sign(&csr) {
            return Ok(None);
        }
        let mut csr = (*csr).clone();
        let status = csr.status.get_or_insert_with(Default::default);
        match self.sign(&csr.spec) {
            Ok(pem) => status.certificate = Some(ByteString(pem.into_bytes())),
            Err(Refusal(message)) => {
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                status.conditions.get_or_insert_with(Vec::new).push(
                    CertificateSigningRequestCondition {
                        type_: "Failed".into(),
                        status: "True".into(),
                        reason: Some("SignerValidationFailure".into()),
                        message: Some(message),
                        last_update_time: Some(now.clone()),
                        last_transition_time: Some(now),
                    },
                );
            }
        }
        match Api::<CertificateSigningRequest>::all(self.client.clone())
            .replace_status(name, &PostParams::default(), &csr)
            .await
        {
            Ok(_) => {
                tracing::info!(csr = name, signer = %csr.spec.signer_name, "signed or refused a certificate request");
                Ok(None)
            }
            // Changed meanwhile: the next event brings it back.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
            Err(e) => Err(Error::api("writing the certificate of", name, e)),
        }
    }
}

/// Why a signer will not issue a request's certificate (its Failed condition's message).
struct Refusal(String);

impl CsrSigningController {
    /// The PEM certificate for an approved request, or why its signer refuses it.
    fn sign(
        &self,
        spec: &k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec,
    ) -> Result<String, Refusal> {
        let der = request_der(&spec.request.0)?;
        let (_, request) =
            X509CertificationRequest::from_der(&der).map_err(|e| Refusal(e.to_string()))?;
        check_signer_rules(&spec.signer_name, &request, &spec.usages)?;

        let mut params = CertificateSigningRequestParams::from_der(&der.as_slice().into())
            .map_err(|e| Refusal(format!("unable to parse csr: {e}")))?;
        // Only the subject, its names and its key come from the request; what the
        // certificate may do comes from `spec.usages`.
        let p = &mut params.params;
        p.is_ca = IsCa::ExplicitNoCa;
        let usages = spec.usages.iter().flatten().map(String::as_str);
        p.key_usages = usages.clone().filter_map(key_usage).collect();
        p.extended_key_usages = usages.filter_map(extended_key_usage).collect();
        let (not_before, not_after) = self.validity(spec.expiration_seconds)?;
        p.not_before = not_before;
        p.not_after = not_after;
        p.serial_number = Some(SerialNumber::from(serial()));
        let cert = params
            .signed_by(&self.issuer)
            .map_err(|e| Refusal(format!("signing: {e}")))?;
        Ok(cert.pem())
    }

    /// Upstream's window: the requested duration (at least 10 minutes) capped at the
    /// configured one, backdated 5 minutes (shortened by them unless shorter than 8 h),
    /// and never past the CA's own end.
    fn validity(
        &self,
        expiration_seconds: Option<i32>,
    ) -> Result<(OffsetDateTime, OffsetDateTime), Refusal> {
        let ttl = match expiration_seconds {
            Some(secs) => Duration::from_secs(u64::try_from(secs).unwrap_or(0))
                .max(Duration::from_secs(600))
                .min(self.duration),
            None => self.duration,
        };
        let now = OffsetDateTime::now_utc();
        let not_before = now - BACKDATE;
        let mut not_after = if ttl < Duration::from_secs(8 * 3600) {
            now + ttl
        } else {
            now + ttl - BACKDATE
        };
        if not_after > self.ca_not_after {
            not_after = self.ca_not_after;
        }
        if not_after < now {
            return Err(Refusal(format!(
                "the signer has expired: NotAfter={}",
                self.ca_not_after
            )));
        }
        Ok((not_before, not_after))
    }
}

/// The DER of a request's PEM `CERTIFICATE REQUEST`.
fn request_der(pem: &[u8]) -> Result<Vec<u8>, Refusal> {
    Pem::iter_from_buffer(pem)
        .next()
        .and_then(Result::ok)
        .filter(|p| p.label == "CERTIFICATE REQUEST")
        .map(|p| p.contents)
        .ok_or_else(|| Refusal("PEM block type must be CERTIFICATE REQUEST".into()))
}

/// The key usage a `spec.usages` entry names, if it is one.
fn key_usage(usage: &str) -> Option<KeyUsagePurpose> {
    Some(match usage {
        "signing" | "digital signature" => KeyUsagePurpose::DigitalSignature,
        "content commitment" => KeyUsagePurpose::ContentCommitment,
        "key encipherment" => KeyUsagePurpose::KeyEncipherment,
        "key agreement" => KeyUsagePurpose::KeyAgreement,
        "data encipherment" => KeyUsagePurpose::DataEncipherment,
        "cert sign" => KeyUsagePurpose::KeyCertSign,
        "crl sign" => KeyUsagePurpose::CrlSign,
        "encipher only" => KeyUsagePurpose::EncipherOnly,
        "decipher only" => KeyUsagePurpose::DecipherOnly,
        _ => return None,
    })
}

/// The extended key usage a `spec.usages` entry names, if it is one.
fn extended_key_usage(usage: &str) -> Option<ExtendedKeyUsagePurpose> {
    Some(match usage {
        "any" => ExtendedKeyUsagePurpose::Any,
        "server auth" => ExtendedKeyUsagePurpose::ServerAuth,
        "client auth" => ExtendedKeyUsagePurpose::ClientAuth,
        "code signing" => ExtendedKeyUsagePurpose::CodeSigning,
        "email protection" | "s/mime" => ExtendedKeyUsagePurpose::EmailProtection,
        "timestamping" => ExtendedKeyUsagePurpose::TimeStamping,
        "ocsp signing" => ExtendedKeyUsagePurpose::OcspSigning,
        _ => return None,
    })
}

/// 16 random bytes with the top bit clear, so the serial is a positive INTEGER.
fn serial() -> Vec<u8> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the system's random source works");
    bytes[0] &= 0x7f;
    bytes.to_vec()
}

/// Each signer's restrictions, checked in upstream's order with its messages.
fn check_signer_rules(
    signer: &str,
    request: &X509CertificationRequest<'_>,
    usages: &Option<Vec<String>>,
) -> Result<(), Refusal> {
    let usages: Vec<&str> = usages.iter().flatten().map(String::as_str).collect();
    let has_usage = |u: &str| usages.contains(&u);
    match signer {
        CLIENT => {
            if let Some(bad) = usages
                .iter()
                .find(|u| !["digital signature", "key encipherment", "client auth"].contains(u))
            {
                return Err(Refusal(format!(
                    "invalid usage for client certificate: {bad}"
                )));
            }
            if !has_usage("client auth") {
                return Err(Refusal(
                    "missing required usage for client certificate: client auth".into(),
                ));
            }
            Ok(())
        }
        KUBELET_CLIENT => {
            node_organization(request)?;
            let names = subject_alt_names(request);
            for (kind, present) in [
                ("DNS", names.dns),
                ("Email", names.email),
                ("IP", names.ip),
                ("URI", names.uri),
            ] {
                if present {
                    return Err(Refusal(format!("{kind} subjectAltNames are not allowed")));
                }
            }
            node_common_name(request)?;
            usages_exactly(
                &usages,
                "client auth",
                "[client auth digital signature key encipherment]",
            )
        }
        KUBELET_SERVING => {
            node_organization(request)?;
            let names = subject_alt_names(request);
            if !names.dns && !names.ip {
                return Err(Refusal("DNS or IP subjectAltName is required".into()));
            }
            if names.email {
                return Err(Refusal("Email subjectAltNames are not allowed".into()));
            }
            if names.uri {
                return Err(Refusal("URI subjectAltNames are not allowed".into()));
            }
            usages_exactly(
                &usages,
                "server auth",
                "[digital signature key encipherment server auth]",
            )?;
            node_common_name(request)
        }
        _ => Ok(()),
    }
}

fn node_organization(request: &X509CertificationRequest<'_>) -> Result<(), Refusal> {
    let orgs: Vec<&str> = request
        .certification_request_info
        .subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    if orgs == ["system:nodes"] {
        Ok(())
    } else {
        Err(Refusal("subject organization is not system:nodes".into()))
    }
}

fn node_common_name(request: &X509CertificationRequest<'_>) -> Result<(), Refusal> {
    let starts = request
        .certification_request_info
        .subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .is_some_and(|cn| cn.starts_with("system:node:"));
    if starts {
        Ok(())
    } else {
        Err(Refusal(
            "subject common name does not begin with system:node:".into(),
        ))
    }
}

/// The usages must be {digital signature, `purpose`} with or without key encipherment.
fn usages_exactly(usages: &[&str], purpose: &str, expected: &str) -> Result<(), Refusal> {
    let mut set: Vec<&str> = usages.to_vec();
    set.sort_unstable();
    set.dedup();
    let mut with = vec!["digital signature", "key encipherment", purpose];
    with.sort_unstable();
    let mut without = vec!["digital signature", purpose];
    without.sort_unstable();
    if set == with || set == without {
        Ok(())
    } else {
        Err(Refusal(format!("usages did not match {expected}")))
    }
}

#[derive(Default)]
struct Names {
    dns: bool,
    email: bool,
    ip: bool,
    uri: bool,
}

fn subject_alt_names(request: &X509CertificationRequest<'_>) -> Names {
    let mut names = Names::default();
    for name in alt_names(request) {
        match name {
            AltName::Dns(_) => names.dns = true,
            AltName::Email => names.email = true,
            AltName::Ip(_) => names.ip = true,
            AltName::Uri => names.uri = true,
            AltName::Other => {}
        }
    }
    names
}

/// A subjectAltName a request asks for (the values the approver compares).
#[derive(Debug)]
enum AltName {
    Dns(String),
    Email,
    /// `None`: an address of neither 4 nor 16 bytes.
    Ip(Option<std::net::IpAddr>),
    Uri,
    Other,
}

fn alt_names(request: &X509CertificationRequest<'_>) -> Vec<AltName> {
    let mut names = Vec::new();
    for ext in request.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            names.extend(san.general_names.iter().map(|name| match name {
                GeneralName::DNSName(dns) => AltName::Dns(dns.to_string()),
                GeneralName::RFC822Name(_) => AltName::Email,
                GeneralName::IPAddress(bytes) => AltName::Ip(ip_address(bytes)),
                GeneralName::URI(_) => AltName::Uri,
                _ => AltName::Other,
            }));
        }
    }
    names
}

fn ip_address(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => Some(<[u8; 4]>::try_from(bytes).ok()?.into()),
        16 => Some(<[u8; 16]>::try_from(bytes).ok()?.into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cn: &str, orgs: &[&str], dns: &[&str]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        Pem::iter_from_buffer(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap()
            .contents
    }

    fn check(signer: &str, der: &[u8], usages: &[&str]) -> Result<(), String> {
        let (_, req) = X509CertificationRequest::from_der(der).unwrap();
        let usages = Some(usages.iter().map(|u| u.to_string()).collect());
        check_signer_rules(signer, &req, &usages).map_err(|Refusal(m)| m)
    }

    #[test]
    fn each_signer_keeps_upstreams_rules() {
        let jane = request("jane", &["dev"], &[]);
        assert_eq!(check(CLIENT, &jane, &["client auth"]), Ok(()));
        assert_eq!(
            check(CLIENT, &jane, &["client auth", "server auth"]),
            Err("invalid usage for client certificate: server auth".into())
        );
        assert_eq!(
            check(CLIENT, &jane, &["digital signature"]),
            Err("missing required usage for client certificate: client auth".into())
        );
        let node = request("system:node:a", &["system:nodes"], &[]);
        assert_eq!(
            check(KUBELET_CLIENT, &node, &["digital signature", "client auth"]),
            Ok(())
        );
        assert_eq!(
            check(KUBELET_CLIENT, &jane, &["client auth"]),
            Err("subject organization is not system:nodes".into())
        );
        let not_node = request("a", &["system:nodes"], &[]);
        assert_eq!(
            check(
                KUBELET_CLIENT,
                &not_node,
                &["digital signature", "client auth"]
            ),
            Err("subject common name does not begin with system:node:".into())
        );
        let serving = request("system:node:a", &["system:nodes"], &["a.example"]);
        assert_eq!(
            check(
                KUBELET_CLIENT,
                &serving,
                &["digital signature", "client auth"]
            ),
            Err("DNS subjectAltNames are not allowed".into())
        );
        assert_eq!(
            check(
                KUBELET_SERVING,
                &serving,
                &["digital signature", "server auth"]
            ),
            Ok(())
        );
        assert_eq!(
            check(
                KUBELET_SERVING,
                &node,
                &["digital signature", "server auth"]
            ),
            Err("DNS or IP subjectAltName is required".into())
        );
        assert_eq!(
            check(KUBELET_SERVING, &serving, &["server auth"]),
            Err("usages did not match [digital signature key encipherment server auth]".into())
        );
    }
}
