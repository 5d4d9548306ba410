//! Service-account tokens for projected volumes, as upstream's kubelet token manager
//! keeps them: one TokenRequest per audience and lifetime of a pod, bound to the pod,
//! reused until 80% of its lifetime (at most 24 h) has passed, then replaced.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use krust_api::sync::Unpoisoned;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::env::ConfigError;

/// The longest a token is kept before it is refreshed.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The tokens of one pod, by (audience, expirationSeconds).
#[derive(Debug, Default)]
pub struct Tokens(Mutex<HashMap<(String, i64), (String, Instant)>>);

impl Tokens {
    /// A token for the pod's service account (`""`: the apiserver's own audience).
    pub async fn get(
        &self,
        client: &Client,
        pod: &Pod,
        audience: &str,
        expiration: i64,
    ) -> Result<String, ConfigError> {
        let key = (audience.to_string(), expiration);
        if let Some((token, refresh)) = self.0.locked().get(&key)
            && Instant::now() < *refresh
        {
            return Ok(token.clone());
        }
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience.to_string()]
                },
                expiration_seconds: Some(expiration),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                }),
            },
            ..TokenRequest::default()
        };
        let api: Api<ServiceAccount> =
            Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let answer = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                ConfigError(format!(
                    "failed to fetch token: serviceaccounts \"{sa}\": {e}"
                ))
            })?;
        let token = answer.status.map(|s| s.token).unwrap_or_default();
        let lifetime = Duration::from_secs(expiration.max(0) as u64);
        let refresh = Instant::now() + lifetime.mul_f64(0.8).min(MAX_AGE);
        self.0.locked().insert(key, (token.clone(), refresh));
        Ok(token)
    }
}
