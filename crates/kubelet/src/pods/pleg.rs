//! One relist of the runtime per second for all pods (upstream's pod lifecycle event
//! generator relists the same way): every sandbox and every container in two CRI
//! calls, published as a [`Snapshot`] that the pod workers read instead of each listing
//! the runtime for itself. A worker asks the runtime directly only for what the
//! snapshot cannot know yet (what it created after the snapshot was taken) and for the
//! details of containers whose state changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use krust_cri::Runtime;
use krust_cri::api::{Container, ListContainersRequest, ListPodSandboxRequest, PodSandbox};
use tokio::sync::watch;

/// How often the runtime is relisted (upstream: 1 s).
pub const RELIST: Duration = Duration::from_secs(1);

/// The runtime's sandboxes and containers at one moment.
#[derive(Debug)]
pub struct Snapshot {
    /// When the listing started: anything created after it may be missing.
    pub taken: Instant,
    pub sandboxes: HashMap<String, PodSandbox>,
    /// Containers by sandbox ID.
    pub containers: HashMap<String, Vec<Container>>,
}

impl Snapshot {
    /// A snapshot that knows nothing (before the first relist); taken before any worker
    /// exists, so no worker trusts it.
    pub fn empty() -> Snapshot {
        Snapshot {
            taken: Instant::now(),
            sandboxes: HashMap::new(),
            containers: HashMap::new(),
        }
    }
}

pub type Relisted = watch::Receiver<Arc<Snapshot>>;

/// Relists the runtime every [`RELIST`], forever; a failed relist keeps the previous
/// snapshot (workers then ask the runtime themselves when it is too old).
pub async fn run(runtime: Runtime, tx: watch::Sender<Arc<Snapshot>>) {
    let mut tick = tokio::time::interval(RELIST);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let taken = Instant::now();
        let sandboxes = runtime
            .runtime
            .clone()
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await;
        let containers = runtime
            .runtime
            .clone()
            .list_containers(ListContainersRequest { filter: None })
            .await;
        crate::metrics::PLEG_RELIST.observe(taken.elapsed().as_secs_f64());
        let (Ok(sandboxes), Ok(containers)) = (sandboxes, containers) else {
            tracing::warn!("relisting the runtime failed");
            continue;
        };
        let mut by_sandbox: HashMap<String, Vec<Container>> = HashMap::new();
        for c in containers.into_inner().containers {
            by_sandbox
                .entry(c.pod_sandbox_id.clone())
                .or_default()
                .push(c);
        }
        tx.send_replace(Arc::new(Snapshot {
            taken,
            sandboxes: sandboxes
                .into_inner()
                .items
                .into_iter()
                .map(|s| (s.id.clone(), s))
                .collect(),
            containers: by_sandbox,
        }));
    }
}
