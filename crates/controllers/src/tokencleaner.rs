//! `TokenCleaner`, upstream's tokencleaner controller: a bootstrap token (a Secret of type
//! `bootstrap.kubernetes.io/token` in kube-system, what `krust token create` writes) is
//! deleted once its `expiration` has passed. The authenticator already refuses expired
//! tokens; this keeps them from piling up.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use krust_api::well_known::BOOTSTRAP_TOKEN_SECRET_TYPE;
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};

const NAMESPACE: &str = "kube-system";

pub struct TokenCleaner {
    client: Client,
    secrets: Cache<Secret>,
    queue: Arc<WorkQueue>,
}

impl TokenCleaner {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let secrets = informers.get::<Secret>();
        let controller = Arc::new(TokenCleaner {
            client,
            secrets: secrets.cache(),
            queue: WorkQueue::new("tokencleaner"),
        });
        secrets.add_handler(Arc::new(SecretEvents(controller.clone())));
        controller
    }
}

/// When a bootstrap token Secret expires (`None`: not one, or it never expires).
fn expiry(secret: &Secret) -> Option<Timestamp> {
    if secret.type_.as_deref() != Some(BOOTSTRAP_TOKEN_SECRET_TYPE)
        || secret.namespace().as_deref() != Some(NAMESPACE)
    {
        return None;
    }
    let value = secret.data.as_ref()?.get("expiration")?;
    std::str::from_utf8(&value.0).ok()?.parse().ok()
}

impl Reconciler for TokenCleaner {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (namespace, name) = split_key(key);
        let Some(secret) = self.secrets.get(Some(namespace), name) else {
            return Ok(None);
        };
        let Some(expires) = expiry(&secret) else {
            return Ok(None);
        };
        let now = Timestamp::now();
        if expires > now {
            let left = (expires.as_millisecond() - now.as_millisecond()).max(0) as u64;
            return Ok(Some(Duration::from_millis(left)));
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: secret.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(secret = key, "deleted an expired bootstrap token");
                Ok(None)
            }
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
            Err(e) => Err(Error::api("deleting an expired bootstrap token", key, e)),
        }
    }
}

struct SecretEvents(Arc<TokenCleaner>);

impl EventHandler<Secret> for SecretEvents {
    fn on_apply(&self, _old: Option<&Secret>, new: &Arc<Secret>) {
        if expiry(new).is_some() {
            self.0.queue.add(key_of(&new.metadata));
        }
    }
    fn on_delete(&self, _secret: &Arc<Secret>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::json;

    #[test]
    fn only_bootstrap_tokens_in_kube_system_expire() {
        let token = |namespace: &str, type_: &str, expiration: Option<&str>| -> Secret {
            let mut secret: Secret = k8s_openapi::serde_json::from_value(json!({
                "metadata": {"name": "bootstrap-token-abcdef", "namespace": namespace},
                "type": type_,
            }))
            .unwrap();
            if let Some(e) = expiration {
                secret.data = Some(
                    [(
                        "expiration".to_string(),
                        k8s_openapi::ByteString(e.as_bytes().to_vec()),
                    )]
                    .into(),
                );
            }
            secret
        };
        let at = "2026-01-01T00:00:00Z";
        assert_eq!(
            expiry(&token(NAMESPACE, BOOTSTRAP_TOKEN_SECRET_TYPE, Some(at))),
            Some(at.parse().unwrap())
        );
        assert_eq!(
            expiry(&token(NAMESPACE, BOOTSTRAP_TOKEN_SECRET_TYPE, None)),
            None
        );
        assert_eq!(
            expiry(&token("default", BOOTSTRAP_TOKEN_SECRET_TYPE, Some(at))),
            None
        );
        assert_eq!(expiry(&token(NAMESPACE, "Opaque", Some(at))), None);
    }
}
