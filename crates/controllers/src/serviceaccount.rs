//! `ServiceAccountController`: every active namespace has a `default` ServiceAccount and
//! a `kube-root-ca.crt` ConfigMap holding the cluster's CA bundle (key `ca.crt`), so a
//! pod can trust the apiserver. Upstream runs these as two controllers
//! (serviceaccount and root-ca-cert-publisher); both are keyed by namespace and watch
//! the same kinds, so here they are one pass.
//!
//! A pass over a namespace (level-triggered, safe to repeat): nothing when the
//! namespace is gone or terminating (the apiserver refuses new objects there, and the
//! namespace controller is emptying it); otherwise create `default` if it is missing,
//! and create `kube-root-ca.crt` or reset its data when it differs from the CA.
//! Deleting either object enqueues its namespace, so it comes back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use krust_client::cache::Cache;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};

/// The ServiceAccount every namespace gets.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// The ConfigMap that publishes the cluster CA, and its key.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
pub const ROOT_CA_KEY: &str = "ca.crt";
/// Upstream's annotation on the ConfigMap, explaining it to whoever finds it.
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

pub struct ServiceAccountController {
    client: Client,
    /// The CA bundle (PEM) to publish; `None` when the client trusts no explicit CA, in
    /// which case only ServiceAccounts are managed.
    root_ca: Option<String>,
    namespaces: Cache<Namespace>,
    service_accounts: Cache<ServiceAccount>,
    config_maps: Cache<ConfigMap>,
    queue: Arc<WorkQueue>,
}

impl ServiceAccountController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers, root_ca: Option<String>) -> Arc<Self> {
        let ns_informer = informers.get::<Namespace>();
        let sa_informer = informers.get::<ServiceAccount>();
        let cm_informer = informers.get::<ConfigMap>();
        let controller = Arc::new(ServiceAccountController {
            client,
            root_ca,
            namespaces: ns_informer.cache(),
            service_accounts: sa_informer.cache(),
            config_maps: cm_informer.cache(),
            queue: WorkQueue::new("serviceaccount"),
        });
        ns_informer.add_handler(Arc::new(NamespaceEvents(controller.clone())));
        sa_informer.add_handler(Arc::new(Managed(
            controller.clone(),
            DEFAULT_SERVICE_ACCOUNT,
        )));
        cm_informer.add_handler(Arc::new(Managed(controller.clone(), ROOT_CA_CONFIG_MAP)));
        controller
    }
}

impl Reconciler for ServiceAccountController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, namespace: &str) -> Result<Option<Duration>, Error> {
        let Some(ns) = self.namespaces.get(None, namespace) else {
            return Ok(None);
        };
        if !is_active(&ns) {
            return Ok(None);
        }
        if self
            .service_accounts
            .get(Some(namespace), DEFAULT_SERVICE_ACCOUNT)
            .is_none()
        {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(DEFAULT_SERVICE_ACCOUNT.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
            match api.create(&PostParams::default(), &sa).await {
                Ok(_) => tracing::info!(namespace, "created the default serviceaccount"),
                // Created meanwhile (the cache has not seen it yet).
                Err(e) if is_status(&e, 409) => {}
                Err(e) => {
                    return Err(Error::api(
                        "creating serviceaccount",
                        format!("{namespace}/{DEFAULT_SERVICE_ACCOUNT}"),
                        e,
                    ));
                }
            }
        }
        if let Some(ca) = &self.root_ca {
            self.publish_root_ca(namespace, ca).await?;
        }
        Ok(None)
    }
}

impl ServiceAccountController {
    async fn publish_root_ca(&self, namespace: &str, ca: &str) -> Result<(), Error> {
        let key = format!("{namespace}/{ROOT_CA_CONFIG_MAP}");
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let data = BTreeMap::from([(ROOT_CA_KEY.to_string(), ca.to_string())]);
        match self.config_maps.get(Some(namespace), ROOT_CA_CONFIG_MAP) {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(ROOT_CA_CONFIG_MAP.into()),
                        annotations: Some(BTreeMap::from([(
                            "kubernetes.io/description".to_string(),
                            DESCRIPTION.to_string(),
                        )])),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => {
                        tracing::info!(namespace, "published the root CA");
                        Ok(())
                    }
                    Err(e) if is_status(&e, 409) => Ok(()),
                    Err(e) => Err(Error::api("creating configmap", key, e)),
                }
            }
            // Someone changed it: put the CA back (and drop any other keys, as upstream).
            Some(cm) if cm.data.as_ref() != Some(&data) || cm.binary_data.is_some() => {
                let mut updated = (*cm).clone();
                updated.data = Some(data);
                updated.binary_data = None;
                match api
                    .replace(ROOT_CA_CONFIG_MAP, &PostParams::default(), &updated)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if is_status(&e, 404) => Ok(()),
                    Err(e) => Err(Error::api("updating configmap", key, e)),
                }
            }
            Some(_) => Ok(()),
        }
    }
}

/// Neither being deleted nor marked Terminating.
fn is_active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
}

struct NamespaceEvents(Arc<ServiceAccountController>);

impl EventHandler<Namespace> for NamespaceEvents {
    fn on_apply(&self, old: Option<&Namespace>, new: &Arc<Namespace>) {
        // A new namespace (or one seen again after a re-list) needs its objects; later
        // updates of an existing one do not change what it needs.
        if old.is_none() && is_active(new) {
            self.0.queue.add(new.name_any());
        }
    }
    fn on_delete(&self, _obj: &Arc<Namespace>) {}
}

/// Enqueues the namespace of the managed object named `.1` when it changes or goes.
struct Managed(Arc<ServiceAccountController>, &'static str);

impl<K: kube::Resource> EventHandler<K> for Managed {
    fn on_apply(&self, _old: Option<&K>, new: &Arc<K>) {
        if new.meta().name.as_deref() == Some(self.1) {
            self.0.queue.add(new.namespace().unwrap_or_default());
        }
    }
    fn on_delete(&self, obj: &Arc<K>) {
        if obj.meta().name.as_deref() == Some(self.1) {
            self.0.queue.add(obj.namespace().unwrap_or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NamespaceStatus;

    #[test]
    fn terminating_namespaces_are_left_alone() {
        let mut ns = Namespace::default();
        assert!(is_active(&ns));
        ns.status = Some(NamespaceStatus {
            phase: Some("Terminating".into()),
            ..Default::default()
        });
        assert!(!is_active(&ns));
    }
}
