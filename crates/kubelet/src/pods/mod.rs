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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    let pull_slots =
        (config.parallel_pulls).map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1))));
    let workers = Arc::new(Workers {
        shared: worker::Shared {
            client,
            runtime,
            config,
            events: recorder,
            evictions,
            relist,
            csi,
            pull_slots,
        },
        running: Mutex::default(),
        stopping: Mutex::default(),
    });
    pods.add_handler(workers.clone());
    let cache = pods.cache();
    tokio::select! {
        _ = pods.run() => {}
        _ = housekeeping(workers, cache) => {}
    }
}

/// How often the runtime is searched for sandboxes of pods nobody knows.
const HOUSEKEEPING: Duration = Duration::from_secs(10);

type Senders = HashMap<String, watch::Sender<Option<Arc<Pod>>>>;

/// One worker per pod UID, each fed the latest version of its pod; `None` tells it the
/// pod is gone from the API.
struct Workers {
    shared: worker::Shared,
    running: Mutex<Senders>,
    /// Workers told their pod is gone, until they have torn it down.
    stopping: Mutex<Senders>,
}

impl Workers {
    /// Tells the worker of `pod`'s UID that the pod is gone.
    fn stop(&self, running: &mut Senders, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        if let Some(tx) = running.remove(&uid) {
            let _ = tx.send(None);
            self.stopping.locked().insert(uid, tx);
        }
    }

    /// The pod UIDs a worker runs or is tearing down.
    fn known(&self) -> HashSet<String> {
        // In `stop`'s order: running, then stopping.
        let running = self.running.locked();
        let mut stopping = self.stopping.locked();
        stopping.retain(|_, tx| !tx.is_closed());
        running.keys().chain(stopping.keys()).cloned().collect()
    }
}

/// Reaps sandboxes whose pod neither the API nor a worker knows (upstream's housekeeping
/// of orphaned pods): a pod deleted while this kubelet was down is not in the first
/// list, so no worker would ever stop it, and its containers, network namespace and
/// volumes would stay. A sandbox is reaped once it has been seen orphaned twice, one
/// housekeeping period apart, with the pod cache in sync.
async fn housekeeping(workers: Arc<Workers>, cache: krust_client::cache::Cache<Pod>) {
    cache.wait_until_ready().await;
    let mut relist = workers.shared.relist.clone();
    let mut suspects: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(HOUSEKEEPING);
    loop {
        tick.tick().await;
        // A snapshot taken after this pass started: it shows every sandbox a known
        // worker made before its pod was listed.
        let started = tokio::time::Instant::now();
        let snapshot = loop {
            let snapshot = relist.borrow_and_update().clone();
            if snapshot.taken >= started.into_std() {
                break snapshot;
            }
            if relist.changed().await.is_err() {
                // No more relists (never, while the kubelet runs): nothing to compare.
                std::future::pending::<()>().await;
            }
        };
        let mut known = workers.known();
        known.extend(cache.state().iter().filter_map(|p| p.uid()));
        let orphans = orphans(&snapshot, &known);
        for (uid, sandbox) in &orphans {
            if suspects.contains(sandbox) {
                tracing::info!(pod_uid = %uid, %sandbox, "reaping the sandbox of a pod the API no longer has");
                worker::Worker::reap(workers.shared.clone(), uid, sandbox.clone()).await;
            }
        }
        suspects = orphans.into_iter().map(|(_, sandbox)| sandbox).collect();
    }
}

/// `(pod UID, sandbox ID)` of the sandboxes whose pod is not `known`.
fn orphans(snapshot: &pleg::Snapshot, known: &HashSet<String>) -> Vec<(String, String)> {
    snapshot
        .sandboxes
        .values()
        .filter_map(|s| {
            let uid = s.labels.get(spec::POD_UID)?;
            (!known.contains(uid)).then(|| (uid.clone(), s.id.clone()))
        })
        .collect()
}

impl EventHandler<Pod> for Workers {
    fn on_apply(&self, old: Option<&Pod>, pod: &Arc<Pod>) {
        let uid = pod.uid().unwrap_or_default();
        let mut running = self.running.locked();
        // A pod deleted and created again under the same name while the watch was down
        // comes back as an update: the old one's worker tears it down.
        if let Some(old) = old.filter(|old| old.uid() != pod.uid()) {
            self.stop(&mut running, old);
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
        self.stop(&mut self.running.locked(), pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use krust_cri::api::PodSandbox;

    #[test]
    fn orphans_are_sandboxes_of_unknown_pods() {
        let sandbox = |id: &str, uid: Option<&str>| PodSandbox {
            id: id.into(),
            labels: uid
                .map(|u| HashMap::from([(spec::POD_UID.to_string(), u.to_string())]))
                .unwrap_or_default(),
            ..PodSandbox::default()
        };
        let snapshot = pleg::Snapshot {
            taken: std::time::Instant::now(),
            sandboxes: [
                sandbox("s1", Some("known")),
                sandbox("s2", Some("gone")),
                sandbox("s3", None),
            ]
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect(),
            containers: HashMap::new(),
        };
        let known = HashSet::from(["known".to_string()]);
        assert_eq!(
            orphans(&snapshot, &known),
            [("gone".to_string(), "s2".to_string())],
            "not ours (no pod UID label) is left alone"
        );
    }
}
