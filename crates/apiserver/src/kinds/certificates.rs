//! Strategy of certificates.k8s.io: CertificateSigningRequest — who asked (from the
//! request's user), what each endpoint may change (the main resource only metadata,
//! `/approval` the Approved and Denied conditions, `/status` the certificate and other
//! conditions), upstream's checks and messages, and the `kubectl get csr` columns.

use base64::Engine;
use krust_api::status::Cause;
use serde_json::{Value, json};
use x509_parser::pem::Pem;
use x509_parser::prelude::{FromDer, X509CertificationRequest};

use super::Strategy;
use crate::auth::User;
use crate::rest::Part;
use crate::table::{AGE, Column, human_duration, str_or_none};
use crate::validation::NameRule;

/// The usages a request may name (upstream's `allValidUsages`), sorted as its message lists
/// them.
const USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// Condition types whose only status is True and which, once there, stay.
const TERMINAL: &[&str] = &["Approved", "Denied", "Failed"];

pub struct CertificateSigningRequest;
pub static CERTIFICATE_SIGNING_REQUEST: CertificateSigningRequest = CertificateSigningRequest;

impl Strategy for CertificateSigningRequest {
    /// Upstream accepts any name a URL can carry.
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({});
    }

    /// The requester is whoever created the request, whatever the body says.
    fn record_requester(&self, obj: &mut Value, user: &User) {
        let spec = &mut obj["spec"];
        if let Some(s) = spec.as_object_mut() {
            for f in ["uid", "extra"] {
                s.remove(f);
            }
        }
        spec["username"] = json!(user.name);
        spec["groups"] = json!(user.groups);
    }

    fn prepare_for_update(&self, part: Part, new: &mut Value, old: &Value) {
        // The spec never changes after creation (silently, as upstream).
        new["spec"] = old["spec"].clone();
        match part {
            Part::Status => {
                // Approval is `/approval`'s: the same number of Approved (Denied)
                // conditions keeps the old ones; another number is refused below.
                for ty in ["Approved", "Denied"] {
                    let before: Vec<&Value> = of_type(old, ty).collect();
                    let now: Vec<usize> = conditions(new)
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| c["type"] == ty)
                        .map(|(i, _)| i)
                        .collect();
                    if before.len() == now.len() {
                        for (i, c) in now.into_iter().zip(before) {
                            new["status"]["conditions"][i] = c.clone();
                        }
                    }
                }
                stamp_conditions(new, old);
            }
            Part::Approval => stamp_conditions(new, old),
            _ => {}
        }
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        validate_request(&spec["request"], errs);
        validate_usages(&spec["usages"], errs);
        validate_signer_name(&spec["signerName"], errs);
        if let Some(secs) = spec["expirationSeconds"].as_i64()
            && secs < 600
        {
            errs.push(Cause::invalid(
                "spec.expirationSeconds",
                &spec["expirationSeconds"],
                "may not specify a duration less than 600 seconds (10 minutes)",
            ));
        }
        validate_conditions(obj, errs);
        let certificate = &obj["status"]["certificate"];
        if certificate.as_str().is_some_and(|c| !c.is_empty()) {
            validate_certificate(certificate, errs);
        }
    }

    fn validate_update_of(
        &self,
        subresource: Option<&str>,
        new: &Value,
        old: &Value,
        errs: &mut Vec<Cause>,
    ) {
        let field = "status.conditions";
        for ty in TERMINAL {
            if of_type(new, ty).count() < of_type(old, ty).count() {
                errs.push(Cause::forbidden(
                    field,
                    format!("updates may not remove a condition of type {ty:?}"),
                ));
            }
        }
        if subresource != Some("approval") {
            for ty in ["Approved", "Denied"] {
                let (before, now) = (of_type(old, ty).count(), of_type(new, ty).count());
                if now > before {
                    errs.push(Cause::forbidden(
                        field,
                        format!("updates may not add a condition of type {ty:?}"),
                    ));
                } else if now == before && !of_type(old, ty).eq(of_type(new, ty)) {
                    errs.push(Cause::forbidden(
                        field,
                        format!("updates may not modify a condition of type {ty:?}"),
                    ));
                }
            }
        }
        let (before, now) = (&old["status"]["certificate"], &new["status"]["certificate"]);
        if now != before {
            let message = if subresource != Some("status") {
                "updates may not set certificate content"
            } else if before.as_str().is_some_and(|c| !c.is_empty()) {
                "updates may not modify existing certificate content"
            } else {
                ""
            };
            if !message.is_empty() {
                errs.push(Cause::forbidden("status.certificate", message));
            }
        }
    }

    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![(
            "spec.signerName",
            obj["spec"]["signerName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )]
    }

    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            AGE,
            Column {
                name: "SignerName",
                ty: "string",
                priority: 0,
                description: "Only requests with this signer name are handled by its signer.",
                cell: &|o| str_or_none(o, "/spec/signerName"),
            },
            Column {
                name: "Requestor",
                ty: "string",
                priority: 0,
                description: "Name of the user who created the request.",
                cell: &|o| json!(o["spec"]["username"].as_str().unwrap_or_default()),
            },
            Column {
                name: "RequestedDuration",
                ty: "string",
                priority: 0,
                description: "The validity the requester asked for.",
                cell: &|o| match o["spec"]["expirationSeconds"].as_i64() {
                    Some(secs) => json!(human_duration(secs)),
                    None => json!("<none>"),
                },
            },
            Column {
                name: "Condition",
                ty: "string",
                priority: 0,
                description: "Approved, Denied or Pending, and whether it Failed or was Issued.",
                cell: &|o| json!(condition_summary(o)),
            },
        ];
        C
    }
}

fn conditions(obj: &Value) -> &[Value] {
    obj["status"]["conditions"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

fn of_type<'a>(obj: &'a Value, ty: &'a str) -> impl Iterator<Item = &'a Value> {
    conditions(obj).iter().filter(move |c| c["type"] == ty)
}

/// `lastUpdateTime` now when missing; `lastTransitionTime` kept from an old condition of
/// the same type and status, else now.
fn stamp_conditions(new: &mut Value, old: &Value) {
    let now = crate::rest::now();
    let Some(list) = new["status"]["conditions"].as_array_mut() else {
        return;
    };
    for c in list {
        if c["lastUpdateTime"].as_str().is_none_or(str::is_empty) {
            c["lastUpdateTime"] = json!(now);
        }
        if c["lastTransitionTime"].as_str().is_none_or(str::is_empty) {
            let kept = conditions(old)
                .iter()
                .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                .and_then(|o| o["lastTransitionTime"].as_str())
                .unwrap_or(&now)
                .to_string();
            c["lastTransitionTime"] = json!(kept);
        }
    }
}

/// `Approved,Issued`, `Pending`, `Denied,Failed`: what `kubectl get csr` shows.
pub fn condition_summary(obj: &Value) -> String {
    let has = |ty: &str| of_type(obj, ty).next().is_some();
    let mut summary = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_string();
    if has("Failed") {
        summary.push_str(",Failed");
    }
    if obj["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
    {
        summary.push_str(",Issued");
    }
    summary
}

/// A ByteString field's bytes (base64 in JSON).
fn bytes(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// `spec.request` is one PEM `CERTIFICATE REQUEST` whose signature holds.
fn validate_request(request: &Value, errs: &mut Vec<Cause>) {
    let field = "spec.request";
    let pem = bytes(request);
    let problem = match Pem::iter_from_buffer(&pem).next() {
        Some(Ok(block)) if block.label == "CERTIFICATE REQUEST" => {
            match X509CertificationRequest::from_der(&block.contents) {
                Ok((_, csr)) => csr.verify_signature().err().map(|e| e.to_string()),
                Err(e) => Some(format!("asn1: {e}")),
            }
        }
        _ => Some("PEM block type must be CERTIFICATE REQUEST".into()),
    };
    if let Some(problem) = problem {
        errs.push(Cause::invalid(field, request, problem));
    }
}

fn validate_usages(usages: &Value, errs: &mut Vec<Cause>) {
    let list = usages.as_array().map_or(&[][..], Vec::as_slice);
    if list.is_empty() {
        errs.push(Cause::required("spec.usages"));
    }
    for (i, usage) in list.iter().enumerate() {
        let field = format!("spec.usages[{i}]");
        if !usage.as_str().is_some_and(|u| USAGES.contains(&u)) {
            errs.push(Cause::not_supported(field, usage, USAGES));
        } else if list[..i].contains(usage) {
            errs.push(Cause::duplicate(field, usage));
        }
    }
}

/// `example.com/signer-name`: a domain of at least two DNS labels, a path of subdomains.
fn validate_signer_name(signer: &Value, errs: &mut Vec<Cause>) {
    let field = "spec.signerName";
    let name = signer.as_str().unwrap_or_default();
    if name.is_empty() {
        errs.push(Cause::required(field));
        return;
    }
    if name == "kubernetes.io/legacy-unknown" {
        errs.push(Cause::invalid(
            field,
            signer,
            "the legacy signerName is not allowed via this API version",
        ));
        return;
    }
    let Some((domain, path)) = name.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        errs.push(Cause::invalid(
            field,
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    };
    let labels: Vec<&str> = domain.split('.').collect();
    if let Some(bad) = labels
        .iter()
        .find(|l| !crate::validation::is_dns1123_label(l))
    {
        errs.push(Cause::invalid(
            field,
            signer,
            format!("validating label \"{bad}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"),
        ));
    } else if labels.len() < 2 {
        errs.push(Cause::invalid(
            field,
            signer,
            "should be a domain with at least two segments separated by dots",
        ));
    } else if let Some(bad) = path
        .split('.')
        .find(|p| !crate::validation::is_dns1123_subdomain(p))
    {
        errs.push(Cause::invalid(
            field,
            signer,
            format!("validating label \"{bad}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
}

fn validate_conditions(obj: &Value, errs: &mut Vec<Cause>) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in conditions(obj).iter().enumerate() {
        let at = format!("status.conditions[{i}]");
        let ty = c["type"].as_str().unwrap_or_default();
        let status = &c["status"];
        if ty.is_empty() {
            errs.push(Cause::required(format!("{at}.type")));
        }
        match status.as_str().unwrap_or_default() {
            "" => errs.push(Cause::required(format!("{at}.status"))),
            "True" => {}
            _ if TERMINAL.contains(&ty) => errs.push(Cause::not_supported(
                format!("{at}.status"),
                status,
                &["True"],
            )),
            "False" | "Unknown" => {}
            _ => errs.push(Cause::not_supported(
                format!("{at}.status"),
                status,
                &["False", "True", "Unknown"],
            )),
        }
        if seen.contains(&ty) {
            errs.push(Cause::duplicate(format!("{at}.type"), &c["type"]));
        } else if (ty == "Denied" && seen.contains(&"Approved"))
            || (ty == "Approved" && seen.contains(&"Denied"))
        {
            errs.push(Cause::invalid(
                format!("{at}.type"),
                &c["type"],
                "Approved and Denied conditions are mutually exclusive",
            ));
        }
        seen.push(ty);
    }
}

/// `status.certificate` holds only well-formed PEM `CERTIFICATE` blocks, at least one.
fn validate_certificate(certificate: &Value, errs: &mut Vec<Cause>) {
    let pem = bytes(certificate);
    let mut blocks = 0;
    let mut problem = None;
    for block in Pem::iter_from_buffer(&pem) {
        match block {
            Ok(b) if b.label != "CERTIFICATE" => {
                problem = Some(format!(
                    "only CERTIFICATE PEM blocks are allowed, found {:?}",
                    b.label
                ));
            }
            Ok(b) => {
                if let Err(e) = b.parse_x509() {
                    problem = Some(e.to_string());
                }
                blocks += 1;
            }
            Err(e) => problem = Some(e.to_string()),
        }
        if problem.is_some() {
            break;
        }
    }
    if problem.is_none() && blocks == 0 {
        problem = Some("must contain at least one CERTIFICATE PEM block".into());
    }
    if let Some(problem) = problem {
        errs.push(Cause::invalid(
            "status.certificate",
            &json!("<certificate data>"),
            problem,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request for `jane` signed with its own key, base64 as in JSON.
    fn request() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "jane");
        let csr = params.serialize_request(&key).unwrap();
        base64::engine::general_purpose::STANDARD.encode(csr.pem().unwrap())
    }

    fn csr(request: &str, usages: Value, signer: &str) -> Value {
        json!({"metadata": {"name": "jane"}, "spec": {
            "request": request, "usages": usages, "signerName": signer}})
    }

    fn causes(obj: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        CERTIFICATE_SIGNING_REQUEST.validate(obj, &mut errs);
        errs.iter().map(Cause::summary).collect()
    }

    #[test]
    fn requests_usages_and_signers_are_checked_as_upstream() {
        let good = request();
        let ok = csr(
            &good,
            json!(["client auth"]),
            "kubernetes.io/kube-apiserver-client",
        );
        assert_eq!(causes(&ok), Vec::<String>::new());

        let bad = csr(
            &base64::engine::general_purpose::STANDARD.encode("nope"),
            json!(["client auth", "client auth", "flying"]),
            "example",
        );
        let got = causes(&bad);
        assert!(
            got[0].starts_with("spec.request: Invalid value:")
                && got[0].ends_with("PEM block type must be CERTIFICATE REQUEST"),
            "{got:?}"
        );
        assert_eq!(got[1], "spec.usages[1]: Duplicate value: \"client auth\"");
        assert!(got[2].starts_with("spec.usages[2]: Unsupported value: \"flying\": supported values: \"any\", \"cert sign\""), "{got:?}");
        assert_eq!(
            got[3],
            "spec.signerName: Invalid value: \"example\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
        );
        let legacy = csr(
            &good,
            json!(["client auth"]),
            "kubernetes.io/legacy-unknown",
        );
        assert_eq!(
            causes(&legacy),
            [
                "spec.signerName: Invalid value: \"kubernetes.io/legacy-unknown\": the legacy signerName is not allowed via this API version"
            ]
        );
        let mut short = ok.clone();
        short["spec"]["expirationSeconds"] = json!(60);
        assert_eq!(
            causes(&short),
            [
                "spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)"
            ]
        );
    }

    #[test]
    fn approval_is_only_approvals_business() {
        let old = csr(&request(), json!(["client auth"]), "example.com/s");
        let mut approved = old.clone();
        approved["status"]["conditions"] = json!([{"type": "Approved", "status": "True"}]);
        let check = |sub, new: &Value, old: &Value| {
            let mut errs = Vec::new();
            CERTIFICATE_SIGNING_REQUEST.validate_update_of(sub, new, old, &mut errs);
            errs.iter().map(Cause::summary).collect::<Vec<_>>()
        };
        assert!(check(Some("approval"), &approved, &old).is_empty());
        assert_eq!(
            check(Some("status"), &approved, &old),
            ["status.conditions: Forbidden: updates may not add a condition of type \"Approved\""]
        );
        assert_eq!(
            check(Some("approval"), &old, &approved),
            [
                "status.conditions: Forbidden: updates may not remove a condition of type \"Approved\""
            ]
        );
        let mut both = approved.clone();
        both["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Denied", "status": "True"}));
        assert_eq!(
            causes(&both),
            [
                "status.conditions[1].type: Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
            ]
        );
        let mut issued = approved.clone();
        issued["status"]["certificate"] = json!("Zm9v");
        assert_eq!(
            check(Some("approval"), &issued, &approved),
            ["status.certificate: Forbidden: updates may not set certificate content"]
        );
        assert_eq!(condition_summary(&issued), "Approved,Issued");
        assert_eq!(condition_summary(&old), "Pending");
    }

    #[test]
    fn the_requester_comes_from_the_request_not_the_body() {
        let mut obj = csr("", json!([]), "");
        obj["spec"]["username"] = json!("someone-else");
        obj["spec"]["uid"] = json!("x");
        let user = User {
            name: "jane".into(),
            groups: vec!["system:authenticated".into()],
        };
        CERTIFICATE_SIGNING_REQUEST.record_requester(&mut obj, &user);
        assert_eq!(obj["spec"]["username"], "jane");
        assert_eq!(obj["spec"]["groups"], json!(["system:authenticated"]));
        assert!(obj["spec"].get("uid").is_none());
    }
}
