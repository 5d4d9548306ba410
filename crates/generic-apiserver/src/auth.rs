//! Authentication (who is asking), the first stage of the request chain: an
//! [`Authenticators`] chain asks each authenticator (client certificates, service-account
//! tokens) in turn. What the user may do is [`crate::authz`]'s question.

use krust_api::status::ApiError;
use rustls::pki_types::CertificateDer;
#[cfg(test)]
use rustls::pki_types::pem::PemObject;

/// What a request presents to prove who it is.
pub struct Credentials<'a> {
    /// The verified client certificate of the TLS connection, if any.
    pub client_cert: Option<&'a CertificateDer<'static>>,
    /// The token of an `Authorization: Bearer` header, if any.
    pub bearer: Option<&'a str>,
    /// The audiences a token must be meant for (one of them); empty: the apiserver's own.
    /// Only a TokenReview names others.
    pub audiences: &'a [String],
}

/// One way of authenticating.
pub trait Authenticator: Send + Sync {
    /// `None` when these credentials are not of this authenticator's kind.
    fn authenticate(&self, creds: &Credentials<'_>) -> Option<User>;
}

/// Client certificates signed by the cluster CA (rustls verified the chain): the
/// common name is the user, each organisation a group.
pub struct ClientCertificates;

impl Authenticator for ClientCertificates {
    fn authenticate(&self, creds: &Credentials<'_>) -> Option<User> {
        let (_, parsed) = x509_parser::parse_x509_certificate(creds.client_cert?).ok()?;
        let subject = parsed.subject();
        let name = subject
            .iter_common_name()
            .next()?
            .as_str()
            .ok()?
            .to_string();
        let mut groups: Vec<String> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        groups.push("system:authenticated".into());
        Some(User { name, groups })
    }
}

/// Authenticators tried in order, as upstream's union authenticator.
pub struct Authenticators(pub Vec<Box<dyn Authenticator>>);

impl Authenticators {
    /// The user, anonymous when nothing was presented, or 401 when a bearer token was
    /// presented that no authenticator accepts (upstream does not fall back to anonymous
    /// for a bad token).
    pub fn authenticate(&self, creds: &Credentials<'_>) -> Result<User, ApiError> {
        if let Some(user) = self.0.iter().find_map(|a| a.authenticate(creds)) {
            return Ok(user);
        }
        if creds.bearer.is_some() {
            return Err(ApiError::unauthorized());
        }
        Ok(User::anonymous())
    }
}

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_name_users_and_bad_tokens_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::pki::Pki::load_or_create(dir.path(), &[]).unwrap();
        let cert = CertificateDer::from_pem_slice(pki.admin_cert.as_bytes()).unwrap();
        let chain = Authenticators(vec![Box::new(ClientCertificates)]);
        let user = chain
            .authenticate(&Credentials {
                client_cert: Some(&cert),
                bearer: None,
                audiences: &[],
            })
            .unwrap();
        assert_eq!(user.name, "admin");
        assert_eq!(user.groups, ["system:masters", "system:authenticated"]);
        let anon = chain
            .authenticate(&Credentials {
                client_cert: None,
                bearer: None,
                audiences: &[],
            })
            .unwrap();
        assert!(anon.is_anonymous());
        let err = chain
            .authenticate(&Credentials {
                client_cert: None,
                bearer: Some("x"),
                audiences: &[],
            })
            .unwrap_err();
        assert_eq!(err.code, 401);
    }
}
