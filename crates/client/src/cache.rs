//! `cache`: a kind's objects kept in a kube-rs reflector store by a watch that resumes
//! and re-lists with backoff, for components that recompute their whole state on any
//! change (the Service proxy's rules, the DNS zone) rather than handle each event.

use std::fmt::Debug;
use std::future::Future;

use futures::StreamExt;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;

/// The store of every `K` that `config` selects (managedFields dropped: nobody reads
/// them), and the watch that fills it and wakes `changed` on every event. The watch runs
/// while the returned future is polled.
pub fn cache<'a, K>(
    client: &Client,
    config: watcher::Config,
    changed: &'a Notify,
) -> (Store<K>, impl Future<Output = ()> + 'a)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|obj| obj.meta_mut().managed_fields = None)
        .reflect(writer);
    let watch = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(err) => {
                    tracing::warn!(kind = %K::kind(&()), error = %err, "watch failed; retrying")
                }
            }
        }
    };
    (store, watch)
}
