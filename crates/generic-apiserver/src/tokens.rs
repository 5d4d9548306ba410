//! Service-account tokens, as upstream issues and checks them: `serviceaccounts/token`
//! (TokenRequest, what `kubectl create token` and the kubelet's projected volumes ask
//! for) returns an ES256-signed JWT for the service account, optionally bound to a pod;
//! [`ServiceAccountTokens`] accepts such bearer tokens while the signature, issuer,
//! audience and expiry hold and the service account (and bound pod) still exist with
//! the same UIDs. The user is `system:serviceaccount:<namespace>:<name>` in the groups
//! `system:serviceaccounts` and `system:serviceaccounts:<namespace>`.

use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use krust_api::status::{ApiError, Cause};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::{Authenticator, Credentials, User};
use crate::watch_cache::WatchCache;

/// The issuer, and the audience the apiserver itself accepts (upstream's defaults for
/// a cluster.local cluster).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Upstream's bounds and default on `spec.expirationSeconds`.
const MIN_EXPIRATION: i64 = 600;
const MAX_EXPIRATION: i64 = 1 << 32;
const DEFAULT_EXPIRATION: i64 = 3600;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ObjectClaim {
    name: String,
    uid: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: ObjectClaim,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod: Option<ObjectClaim>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Claims {
    aud: Vec<String>,
    exp: i64,
    iat: i64,
    nbf: i64,
    iss: String,
    sub: String,
    jti: String,
    #[serde(rename = "kubernetes.io")]
    kubernetes: KubernetesClaims,
}

/// Signs and verifies tokens with the cluster's service-account key.
pub struct TokenIssuer {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl TokenIssuer {
    /// From the PKCS#8 private and SPKI public keys (PEM) in the PKI.
    pub fn new(pki: &crate::pki::Pki) -> anyhow::Result<TokenIssuer> {
        Ok(TokenIssuer {
            encoding: EncodingKey::from_ec_pem(pki.service_account_key.as_bytes())?,
            decoding: DecodingKey::from_ec_pem(pki.service_account_public.as_bytes())?,
        })
    }

    fn sign(&self, claims: &Claims) -> Result<String, ApiError> {
        jsonwebtoken::encode(&Header::new(Algorithm::ES256), claims, &self.encoding)
            .map_err(|e| ApiError::internal(format!("signing the token: {e}")))
    }

    /// The claims of a token signed here, issued by us for one of `audiences` and not
    /// expired.
    fn verify<A: ToString>(&self, token: &str, audiences: &[A]) -> Option<Claims> {
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[ISSUER]);
        validation.set_audience(audiences);
        validation.leeway = 0;
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .ok()
            .map(|d| d.claims)
    }

    /// Answers a TokenRequest for the service account `sa` (stored object): `pod` is
    /// the bound pod when the request names one (already checked to exist).
    pub fn token_request(
        &self,
        sa: &Value,
        request: &Value,
        pod: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let ns = sa["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = sa["metadata"]["name"].as_str().unwrap_or_default();
        let spec = &request["spec"];
        let expiration = spec["expirationSeconds"]
            .as_i64()
            .unwrap_or(DEFAULT_EXPIRATION);
        let invalid = |detail: &str| {
            ApiError::invalid(
                "TokenRequest",
                "authentication.k8s.io",
                name,
                vec![Cause::invalid(
                    "spec.expirationSeconds",
                    &json!(expiration),
                    detail,
                )],
            )
        };
        if expiration < MIN_EXPIRATION {
            return Err(invalid("may not specify a duration less than 10 minutes"));
        }
        if expiration > MAX_EXPIRATION {
            return Err(invalid(
                "may not specify a duration larger than 2^32 seconds",
            ));
        }
        let audiences = crate::json::strings(&spec["audiences"]);
        let audiences = if audiences.is_empty() {
            vec![ISSUER.to_string()]
        } else {
            audiences
        };
        let now = jiff::Timestamp::now();
        let issued = now.as_second();
        let claim = |obj: &Value| ObjectClaim {
            name: obj["metadata"]["name"].as_str().unwrap_or_default().into(),
            uid: obj["metadata"]["uid"].as_str().unwrap_or_default().into(),
        };
        let claims = Claims {
            aud: audiences.clone(),
            exp: issued + expiration,
            iat: issued,
            nbf: issued,
            iss: ISSUER.into(),
            sub: format!("system:serviceaccount:{ns}:{name}"),
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: KubernetesClaims {
                namespace: ns.into(),
                serviceaccount: claim(sa),
                pod: pod.map(claim),
            },
        };
        let token = self.sign(&claims)?;
        let expires = jiff::Timestamp::from_second(claims.exp)
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        let mut spec = spec.clone();
        spec["audiences"] = json!(audiences);
        spec["expirationSeconds"] = json!(expiration);
        Ok(json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": expires},
        }))
    }
}

/// The audiences a token says it is meant for, read without checking its signature: for
/// a token an authenticator has already accepted.
pub fn audiences_of(token: &str) -> Vec<String> {
    use base64::Engine;
    let claims = token
        .split('.')
        .nth(1)
        .and_then(|payload| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .ok()
        })
        .and_then(|json| serde_json::from_slice::<Value>(&json).ok())
        .unwrap_or_default();
    match &claims["aud"] {
        Value::String(one) => vec![one.clone()],
        many => crate::json::strings(many),
    }
}

/// Bearer tokens from [`TokenIssuer`], checked against the objects they name.
pub struct ServiceAccountTokens {
    pub issuer: Arc<TokenIssuer>,
    pub cache: Arc<WatchCache>,
}

impl ServiceAccountTokens {
    /// Whether the core/v1 object exists with `uid`.
    fn exists(&self, plural: &str, namespace: &str, object: &ObjectClaim) -> bool {
        self.cache
            .core_object(plural, Some(namespace), &object.name)
            .is_some_and(|o| o["metadata"]["uid"] == object.uid.as_str())
    }
}

impl Authenticator for ServiceAccountTokens {
    fn authenticate(&self, creds: &Credentials<'_>) -> Option<User> {
        let claims = if creds.audiences.is_empty() {
            self.issuer.verify(creds.bearer?, &[ISSUER])?
        } else {
            self.issuer.verify(creds.bearer?, creds.audiences)?
        };
        let k = &claims.kubernetes;
        if !self.exists("serviceaccounts", &k.namespace, &k.serviceaccount) {
            return None;
        }
        if let Some(pod) = &k.pod
            && !self.exists("pods", &k.namespace, pod)
        {
            return None;
        }
        Some(User {
            name: claims.sub,
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", k.namespace),
                "system:authenticated".into(),
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> TokenIssuer {
        let dir = tempfile::tempdir().unwrap();
        TokenIssuer::new(&crate::pki::Pki::load_or_create(dir.path(), &[]).unwrap()).unwrap()
    }

    fn sa() -> Value {
        json!({"metadata": {"name": "default", "namespace": "ns", "uid": "sa-uid"}})
    }

    #[test]
    fn tokens_carry_upstreams_claims_and_verify_only_for_their_audience() {
        let issuer = issuer();
        let pod = json!({"metadata": {"name": "p", "uid": "pod-uid"}});
        let answer = issuer
            .token_request(&sa(), &json!({"spec": {}}), Some(&pod))
            .unwrap();
        assert_eq!(answer["spec"]["expirationSeconds"], 3600);
        assert_eq!(answer["spec"]["audiences"], json!([ISSUER]));
        let token = answer["status"]["token"].as_str().unwrap();
        let claims = issuer.verify(token, &[ISSUER]).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:ns:default");
        assert_eq!(claims.exp - claims.iat, 3600);
        assert_eq!(
            claims.kubernetes.pod,
            Some(ObjectClaim {
                name: "p".into(),
                uid: "pod-uid".into()
            })
        );
        assert!(issuer.verify(token, &["vault"]).is_none());
        let other = self::issuer();
        assert!(other.verify(token, &[ISSUER]).is_none(), "another key");
        let mut tampered = token.to_string();
        tampered.insert(tampered.len() / 2, 'x');
        assert!(issuer.verify(&tampered, &[ISSUER]).is_none());
    }

    #[test]
    fn expiration_bounds_as_upstream() {
        let issuer = issuer();
        let short = issuer
            .token_request(&sa(), &json!({"spec": {"expirationSeconds": 60}}), None)
            .unwrap_err();
        assert_eq!(short.code, 422);
        assert!(
            short
                .to_status()
                .to_string()
                .contains("may not specify a duration less than 10 minutes")
        );
        let audience = issuer
            .token_request(
                &sa(),
                &json!({"spec": {"audiences": ["vault"], "expirationSeconds": 7200}}),
                None,
            )
            .unwrap();
        let token = audience["status"]["token"].as_str().unwrap();
        assert!(issuer.verify(token, &["vault"]).is_some());
        assert!(issuer.verify(token, &[ISSUER]).is_none());
    }
}
