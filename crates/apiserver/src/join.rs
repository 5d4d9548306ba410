//! Join tokens: how a machine that holds nothing but a token proves that it may become a
//! node. A token reads as k3s writes it, `K10<sha256 of the CA bundle>::<credential>`:
//! the hash lets the joining agent pin the cluster CA it downloads from `/cacerts`
//! before trusting anything else, and the credential authenticates it as a member of
//! `system:bootstrappers`, whose only power is to ask for a node certificate through a
//! CertificateSigningRequest (approved automatically, see the csrapproving controller).
//!
//! Two kinds of credential exist, as in k3s: the server's own token
//! (`server:<secret>`, kept in `<data-dir>/server/token`) and bootstrap tokens
//! (`<id>.<secret>`, upstream's Secrets `kube-system/bootstrap-token-<id>`, which
//! `krust token create` writes and which expire).

use std::fmt;
use std::sync::Arc;

use base64::Engine;
use serde_json::Value;
use sha2::{Digest, Sha256};

use krust_api::well_known::BOOTSTRAP_TOKEN_SECRET_TYPE;

use crate::auth::{Authenticator, Credentials, User};
use crate::watch_cache::WatchCache;

/// The group every join credential authenticates into.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// The user of the server token.
pub const SERVER_TOKEN_USER: &str = "system:bootstrap:server";
/// The prefix of a bootstrap token Secret's name (the token id follows).
pub const BOOTSTRAP_TOKEN_PREFIX: &str = "bootstrap-token-";
const K10: &str = "K10";

/// A parsed join token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Hex SHA-256 of the cluster CA bundle (PEM bytes), when the token pins one.
    pub ca_hash: Option<String>,
    /// What the agent presents as its bearer token.
    pub credential: String,
}

/// Why a string is not a join token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the CA hash of a K10 token must be 64 hex digits")]
    BadHash,
    #[error("the token's credential after '::' is empty")]
    NoCredential,
}

impl JoinToken {
    /// A server token for `secret`, pinned to `ca_pem`.
    pub fn server(ca_pem: &str, secret: &str) -> JoinToken {
        JoinToken {
            ca_hash: Some(ca_hash(ca_pem)),
            credential: format!("server:{secret}"),
        }
    }

    /// A bootstrap token `<id>.<secret>`, pinned to `ca_pem`.
    pub fn bootstrap(ca_pem: &str, id: &str, secret: &str) -> JoinToken {
        JoinToken {
            ca_hash: Some(ca_hash(ca_pem)),
            credential: format!("{id}.{secret}"),
        }
    }

    /// The secret of a server token's credential (`server:<secret>`), or the whole
    /// credential when it names no user (k3s accepts a bare secret for `--token`).
    pub fn server_secret(&self) -> &str {
        self.credential
            .strip_prefix("server:")
            .unwrap_or(&self.credential)
    }

    /// Whether `ca_pem` is the CA this token pins (true when it pins none).
    pub fn pins(&self, ca_pem: &str) -> bool {
        self.ca_hash.as_deref().is_none_or(|h| h == ca_hash(ca_pem))
    }
}

impl std::str::FromStr for JoinToken {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(TokenError::Empty);
        }
        let Some(rest) = s.strip_prefix(K10) else {
            return Ok(JoinToken {
                ca_hash: None,
                credential: s.to_string(),
            });
        };
        let (hash, credential) = rest.split_once("::").ok_or(TokenError::BadHash)?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TokenError::BadHash);
        }
        if credential.is_empty() {
            return Err(TokenError::NoCredential);
        }
        Ok(JoinToken {
            ca_hash: Some(hash.to_ascii_lowercase()),
            credential: credential.to_string(),
        })
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ca_hash {
            Some(hash) => write!(f, "{K10}{hash}::{}", self.credential),
            None => f.write_str(&self.credential),
        }
    }
}

/// Hex SHA-256 of a CA bundle, as k3s hashes `/cacerts`.
pub fn ca_hash(ca_pem: &str) -> String {
    crate::rest::hex(&Sha256::digest(ca_pem.as_bytes()))
}

/// Equality that takes as long whatever the first difference (secrets are compared).
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn bootstrapper(name: String, extra: Vec<String>) -> User {
    let mut groups = vec![BOOTSTRAPPERS.to_string()];
    groups.extend(extra);
    groups.push("system:authenticated".into());
    User { name, groups }
}

/// The server's token (`server:<secret>` as a bearer token).
pub struct ServerToken {
    pub secret: String,
}

impl Authenticator for ServerToken {
    fn authenticate(&self, creds: &Credentials<'_>) -> Option<User> {
        let secret = creds.bearer?.strip_prefix("server:")?;
        same_secret(secret, &self.secret).then(|| bootstrapper(SERVER_TOKEN_USER.into(), vec![]))
    }
}

/// Upstream's bootstrap token authenticator: `<id>.<secret>` is accepted while the
/// Secret `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`
/// holds that secret, allows authentication and has not expired. The user is
/// `system:bootstrap:<id>`, in `system:bootstrappers` and the Secret's
/// `auth-extra-groups`.
pub struct BootstrapTokens {
    pub cache: Arc<WatchCache>,
}

/// `<id>.<secret>` with upstream's shape: 6 and 16 characters of `[a-z0-9]`.
pub fn parse_bootstrap_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// The decoded `data[key]` of a stored Secret.
fn secret_data(secret: &Value, key: &str) -> Option<String> {
    let encoded = secret["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok()
}

impl Authenticator for BootstrapTokens {
    fn authenticate(&self, creds: &Credentials<'_>) -> Option<User> {
        let (id, secret) = parse_bootstrap_token(creds.bearer?)?;
        let stored = self.cache.core_object(
            "secrets",
            Some("kube-system"),
            &format!("{BOOTSTRAP_TOKEN_PREFIX}{id}"),
        )?;
        if stored["type"] != BOOTSTRAP_TOKEN_SECRET_TYPE
            || !stored["metadata"]["deletionTimestamp"].is_null()
            || secret_data(&stored, "token-id").as_deref() != Some(id)
            || !same_secret(&secret_data(&stored, "token-secret")?, secret)
            || secret_data(&stored, "usage-bootstrap-authentication").as_deref() != Some("true")
        {
            return None;
        }
        if let Some(expiration) = secret_data(&stored, "expiration") {
            let expires: jiff::Timestamp = expiration.parse().ok()?;
            if expires <= jiff::Timestamp::now() {
                tracing::debug!(token = id, "bootstrap token expired");
                return None;
            }
        }
        let extra = secret_data(&stored, "auth-extra-groups")
            .map(|groups| {
                groups
                    .split(',')
                    .map(str::trim)
                    .filter(|g| g.starts_with("system:bootstrappers:"))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Some(bootstrapper(format!("system:bootstrap:{id}"), extra))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_in_k3s_form_and_pin_their_ca() {
        let token = JoinToken::server("CA PEM", "s3cret");
        let text = token.to_string();
        assert!(text.starts_with("K10") && text.ends_with("::server:s3cret"));
        let parsed: JoinToken = text.parse().unwrap();
        assert_eq!(parsed, token);
        assert_eq!(parsed.server_secret(), "s3cret");
        assert!(parsed.pins("CA PEM"));
        assert!(!parsed.pins("another CA"));
        let bare: JoinToken = "justasecret".parse().unwrap();
        assert_eq!(bare.ca_hash, None);
        assert_eq!(bare.server_secret(), "justasecret");
        assert_eq!(
            "K10abc::server:x".parse::<JoinToken>(),
            Err(TokenError::BadHash)
        );
        let no_cred = format!("K10{}::", "a".repeat(64));
        assert_eq!(no_cred.parse::<JoinToken>(), Err(TokenError::NoCredential));
    }

    #[test]
    fn the_server_token_authenticates_a_bootstrapper_and_nothing_else() {
        let auth = ServerToken {
            secret: "s3cret".into(),
        };
        let creds = |bearer| Credentials {
            client_cert: None,
            bearer: Some(bearer),
            audiences: &[],
        };
        let user = auth.authenticate(&creds("server:s3cret")).unwrap();
        assert_eq!(user.name, SERVER_TOKEN_USER);
        assert_eq!(user.groups, [BOOTSTRAPPERS, "system:authenticated"]);
        assert!(auth.authenticate(&creds("server:s3creT")).is_none());
        assert!(auth.authenticate(&creds("s3cret")).is_none());
    }

    #[test]
    fn bootstrap_tokens_have_upstreams_shape() {
        assert_eq!(
            parse_bootstrap_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        assert_eq!(parse_bootstrap_token("abcdef.0123456789ABCDEF"), None);
        assert_eq!(parse_bootstrap_token("abcde.0123456789abcdef"), None);
        assert_eq!(parse_bootstrap_token("abcdef0123456789abcdef"), None);
    }
}
