//! The pods of this node: one watch (`spec.nodeName=<node>`), one [`worker::Worker`]
//! per pod UID, fed the latest version of its pod.

pub mod env;
pub mod lifecycle;
mod ownership;
pub mod pleg;
pub mod probe;
pub mod security;
pub mod spec;
pub mod status;
pub mod tokens;
pub mod volumes;
pub mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use krust_api::sync::Unpoisoned;
use krust_client::events::EventRecorder;
use krust_client::informer::{EventHandler, Informer};
use krust_client::supervise::restart_on_panic;
use krust_cri::Runtime;
use kube::api::Api;
use kube::runtime::watcher;
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
    csi: crate::csi::Drivers,
) {
    let selector = format!("spec.nodeName={}", config.node_name);
    let pods = Informer::<Pod>::new(
        Api::all(client.clone()),
        watcher::Config::default().fields(&selector),
    );
    let (relisted, relist) = watch::channel(Arc::new(pleg::Snapshot::empty()));
    tokio::spawn(pleg::run(runtime.clone(), relisted));
    pods.add_handler(Arc::new(Workers {
        shared: worker::Shared {
            client,
            runtime,
            config,
            events: recorder,
            evictions,
            relist,
            csi,
        },
        running: Mutex::default(),
    }));
    pods.run().await
}

/// One worker per pod UID, each fed the latest version of its pod; `None` tells it the
/// pod is gone from the API.
struct Workers {
    shared: worker::Shared,
    running: Mutex<HashMap<String, watch::Sender<Option<Arc<Pod>>>>>,
}

/// Tells the worker of `pod`'s UID that the pod is gone.
fn stop(running: &mut HashMap<String, watch::Sender<Option<Arc<Pod>>>>, pod: &Pod) {
    if let Some(tx) = running.remove(&pod.uid().unwrap_or_default()) {
        let _ = tx.send(None);
    }
}

impl EventHandler<Pod> for Workers {
    fn on_apply(&self, old: Option<&Pod>, pod: &Arc<Pod>) {
        let uid = pod.uid().unwrap_or_default();
        let mut running = self.running.locked();
        // A pod deleted and created again under the same name while the watch was down
        // comes back as an update: the old one's worker tears it down.
        if let Some(old) = old.filter(|old| old.uid() != pod.uid()) {
            stop(&mut running, old);
        }
        running.retain(|_, tx| !tx.is_closed());
        match running.get(&uid) {
            Some(tx) => {
                let _ = tx.send(Some(pod.clone()));
            }
            None => {
                let (tx, rx) = watch::channel(Some(pod.clone()));
                // A worker that panics is replaced by a fresh one, which finds the pod's
                // sandbox and containers by label as a restarted kubelet does.
                let shared = self.shared.clone();
                let start = move || worker::Worker::new(shared.clone()).run(rx.clone());
                let what = format!("pod worker of {}", pod.name_any());
                tokio::spawn(restart_on_panic(what, start));
                running.insert(uid, tx);
            }
        }
    }

    fn on_delete(&self, pod: &Arc<Pod>) {
        stop(&mut self.running.locked(), pod);
    }
}
