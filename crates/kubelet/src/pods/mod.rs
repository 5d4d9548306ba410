//! The pods of this node: one watch (`spec.nodeName=<node>`), one [`worker::Worker`]
//! per pod UID, fed the latest version of its pod.

pub mod env;
pub mod lifecycle;
pub mod pleg;
pub mod probe;
pub mod security;
pub mod spec;
pub mod status;
pub mod tokens;
pub mod volumes;
pub mod worker;

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use krust_client::events::EventRecorder;
use krust_cri::Runtime;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use crate::Config;
use crate::eviction::Evictions;

/// Watches this node's pods and runs a worker for each. Never returns.
pub async fn run(
    client: Client,
    runtime: Runtime,
    config: Arc<Config>,
    recorder: EventRecorder,
    evictions: Evictions,
) {
    let api: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", config.node_name);
    let mut events = watcher::watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let (relisted, relist) = watch::channel(Arc::new(pleg::Snapshot::empty()));
    tokio::spawn(pleg::run(runtime.clone(), relisted));
    let mut workers: HashMap<String, watch::Sender<Option<Arc<Pod>>>> = HashMap::new();
    let mut relisted: Vec<String> = Vec::new();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(err) => {
                tracing::warn!(error = %err, "watching this node's pods failed; retrying");
                continue;
            }
        };
        match event {
            Event::Apply(pod) | Event::InitApply(pod) => {
                let uid = pod.uid().unwrap_or_default();
                relisted.push(uid.clone());
                let pod = Arc::new(pod);
                workers.retain(|_, tx| !tx.is_closed());
                match workers.get(&uid) {
                    Some(tx) => {
                        let _ = tx.send(Some(pod));
                    }
                    None => {
                        let (tx, rx) = watch::channel(Some(pod));
                        let worker = worker::Worker::new(
                            client.clone(),
                            runtime.clone(),
                            config.clone(),
                            recorder.clone(),
                            evictions.clone(),
                            relist.clone(),
                        );
                        tokio::spawn(worker.run(rx));
                        workers.insert(uid, tx);
                    }
                }
            }
            Event::Delete(pod) => {
                if let Some(tx) = workers.remove(&pod.uid().unwrap_or_default()) {
                    let _ = tx.send(None);
                }
            }
            Event::Init => relisted.clear(),
            Event::InitDone => {
                // Pods deleted while the watch was down.
                let gone: Vec<String> = workers
                    .keys()
                    .filter(|uid| !relisted.contains(uid))
                    .cloned()
                    .collect();
                for uid in gone {
                    if let Some(tx) = workers.remove(&uid) {
                        let _ = tx.send(None);
                    }
                }
            }
        }
    }
}
