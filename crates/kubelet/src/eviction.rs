//! Node-pressure eviction with hard thresholds, as upstream's kubelet does it. Every
//! housekeeping interval the eviction signals are measured — `memory.available`,
//! `nodefs.available`, `nodefs.inodesFree`, `imagefs.available`, `pid.available` — and
//! compared with the thresholds (upstream's hard defaults unless `--eviction-hard`
//! says otherwise). A signal below its threshold puts the node under pressure
//! (MemoryPressure, DiskPressure, PIDPressure, held for the transition period after
//! the signal recovers), and evicts one pod per
//! interval: BestEffort before Burstable before Guaranteed, lower priority first, the
//! biggest user of the starved resource first. An evicted pod's containers are killed
//! at once and it ends Failed with reason Evicted.
//!
//! The conditions' NoSchedule taints are the node lifecycle controller's (as upstream's
//! TaintNodesByCondition): a kubelet may not change its own taints.
//! `memory.available` is the kernel's MemAvailable (upstream subtracts the root
//! cgroup's working set from capacity); container writable layers do not count
//! towards a pod's disk use (its logs and emptyDirs do).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use krust_api::sync::Unpoisoned;
use krust_client::events::{EventRecorder, EventType};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use crate::Config;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::machine::{Filesystem, filesystem};
use crate::pods::spec::{cgroup_parent, pod_dir, qos_class, quantity_bytes};

/// Upstream's `--eviction-hard` defaults (imagefs.inodesFree is not measured).
pub const DEFAULT_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%";
/// Upstream's `--eviction-pressure-transition-period`.
const TRANSITION_PERIOD: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    PidAvailable,
}

const SIGNALS: [Signal; 5] = [
    Signal::MemoryAvailable,
    Signal::NodefsAvailable,
    Signal::NodefsInodesFree,
    Signal::ImagefsAvailable,
    Signal::PidAvailable,
];

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn pressure(self) -> Pressure {
        match self {
            Signal::MemoryAvailable => Pressure::Memory,
            Signal::PidAvailable => Pressure::Pid,
            _ => Pressure::Disk,
        }
    }

    /// The resource named in eviction messages.
    fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodefsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
            _ => "ephemeral-storage",
        }
    }

    /// Whether amounts of this signal are bytes (the others count things).
    fn bytes(self) -> bool {
        !matches!(self, Signal::NodefsInodesFree | Signal::PidAvailable)
    }
}

/// A node condition that eviction signals drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pressure {
    Memory,
    Disk,
    Pid,
}

pub const PRESSURES: [Pressure; 3] = [Pressure::Memory, Pressure::Disk, Pressure::Pid];

impl Pressure {
    /// (type, reason, message) of the node condition, under pressure or not.
    pub fn condition(self, under: bool) -> (&'static str, &'static str, &'static str) {
        match (self, under) {
            (Pressure::Memory, false) => (
                "MemoryPressure",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (Pressure::Memory, true) => (
                "MemoryPressure",
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (Pressure::Disk, false) => (
                "DiskPressure",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            (Pressure::Disk, true) => (
                "DiskPressure",
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
            ),
            (Pressure::Pid, false) => (
                "PIDPressure",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            (Pressure::Pid, true) => (
                "PIDPressure",
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        }
    }
}

/// The set of pressures the node is under.
pub type Pressures = BTreeSet<Pressure>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Limit {
    Absolute(u64),
    Percent(f64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    signal: Signal,
    limit: Limit,
}

impl Threshold {
    /// The threshold as an amount of the signal's capacity.
    fn amount(&self, capacity: u64) -> u64 {
        match self.limit {
            Limit::Absolute(n) => n,
            Limit::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

/// Parses upstream's `--eviction-hard` form: `signal<quantity` (bytes with a unit
/// suffix, a count, or a percentage of capacity), comma-separated.
pub fn parse_thresholds(spec: &str) -> Result<Vec<Threshold>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (name, value) = t
                .split_once('<')
                .ok_or_else(|| format!("invalid eviction threshold {t:?}: want signal<quantity"))?;
            let signal = SIGNALS
                .into_iter()
                .find(|s| s.name() == name.trim())
                .ok_or_else(|| format!("unknown eviction signal {name:?}"))?;
            let value = value.trim();
            let limit = match value.strip_suffix('%') {
                Some(p) => Limit::Percent(
                    p.parse()
                        .ok()
                        .filter(|p: &f64| (0.0..=100.0).contains(p))
                        .ok_or_else(|| format!("invalid percentage in {t:?}"))?,
                ),
                None => Limit::Absolute(
                    bytes(value).ok_or_else(|| format!("invalid quantity in {t:?}"))?,
                ),
            };
            Ok(Threshold { signal, limit })
        })
        .collect()
}

/// `100Mi`, `1G`, `512` as a number.
fn bytes(s: &str) -> Option<u64> {
    quantity_bytes(&Quantity(s.to_string())).and_then(|n| u64::try_from(n).ok())
}

/// `1234Ki` for whole KiB amounts of bytes, else the plain number.
fn format_amount(signal: Signal, n: u64) -> String {
    if signal.bytes() && n.is_multiple_of(1024) {
        format!("{}Ki", n / 1024)
    } else {
        n.to_string()
    }
}

/// One signal's measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// Measures every signal: memory from /proc/meminfo, the filesystems of `nodefs` (the
/// kubelet's data dir) and `imagefs` (containerd's root), PIDs against pid_max.
pub fn observe(nodefs: &Path, imagefs: &Path) -> HashMap<Signal, Observation> {
    let mut seen = HashMap::new();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    if let (Some(available), Some(capacity)) = (kib("MemAvailable:"), kib("MemTotal:")) {
        seen.insert(
            Signal::MemoryAvailable,
            Observation {
                available,
                capacity,
            },
        );
    }
    if let Some(fs) = filesystem(nodefs) {
        let (bytes, inodes) = fs.observations();
        seen.insert(Signal::NodefsAvailable, bytes);
        seen.insert(Signal::NodefsInodesFree, inodes);
    }
    if let Some(fs) = filesystem(imagefs) {
        seen.insert(Signal::ImagefsAvailable, fs.observations().0);
    }
    let pid_max: Option<u64> = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    // /proc/loadavg: "0.00 0.01 0.05 1/234 5678" — 234 scheduling entities exist.
    let threads: Option<u64> = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok());
    if let (Some(capacity), Some(used)) = (pid_max, threads) {
        seen.insert(
            Signal::PidAvailable,
            Observation {
                available: capacity.saturating_sub(used),
                capacity,
            },
        );
    }
    seen
}

impl Filesystem {
    /// (bytes, inodes) as eviction signals.
    fn observations(&self) -> (Observation, Observation) {
        (
            Observation {
                available: self.bytes_available,
                capacity: self.bytes,
            },
            Observation {
                available: self.inodes_available,
                capacity: self.inodes,
            },
        )
    }
}

/// Pods chosen for eviction, by UID, with the message their status will carry; the
/// pod workers act on it.
#[derive(Clone, Debug, Default)]
pub struct Evictions(Arc<Mutex<HashMap<String, String>>>);

impl Evictions {
    pub fn message(&self, uid: &str) -> Option<String> {
        self.0.locked().get(uid).cloned()
    }

    fn insert(&self, uid: String, message: String) {
        self.0.locked().insert(uid, message);
    }

    /// Forgets pods no longer on the node.
    fn retain(&self, live: &BTreeSet<String>) {
        self.0.locked().retain(|uid, _| live.contains(uid));
    }
}

/// The eviction manager of one node.
pub struct Manager {
    pub client: Client,
    pub config: Arc<Config>,
    pub thresholds: Vec<Threshold>,
    pub interval: Duration,
    pub image_fs: PathBuf,
    /// Unused images are reclaimed before a pod is evicted for disk pressure.
    pub images: crate::images::Images,
    pub evictions: Evictions,
    pub pressures: watch::Sender<Pressures>,
    pub events: EventRecorder,
}

impl Manager {
    /// Measures, reports and evicts every interval. Never returns.
    pub async fn run(self) {
        let mut last_seen: HashMap<Pressure, Instant> = HashMap::new();
        let mut tick = tokio::time::interval(self.interval);
        loop {
            tick.tick().await;
            let observed = observe(&self.config.data_dir, &self.image_fs);
            let crossed: Vec<(Threshold, Observation)> = self
                .thresholds
                .iter()
                .filter_map(|t| {
                    let o = observed.get(&t.signal)?;
                    (o.available < t.amount(o.capacity)).then_some((*t, *o))
                })
                .collect();
            let now = Instant::now();
            for (t, _) in &crossed {
                last_seen.insert(t.signal.pressure(), now);
            }
            let under: Pressures = last_seen
                .iter()
                .filter(|(_, at)| now.duration_since(**at) < TRANSITION_PERIOD)
                .map(|(p, _)| *p)
                .collect();
            if *self.pressures.borrow() != under {
                for (t, o) in &crossed {
                    tracing::warn!(
                        signal = t.signal.name(),
                        available = format_amount(t.signal, o.available),
                        threshold = format_amount(t.signal, t.amount(o.capacity)),
                        "eviction threshold crossed: pods will be evicted (see --eviction-hard)"
                    );
                }
                tracing::info!(?under, "node pressure changed");
                self.pressures.send_replace(under);
            }
            let Some((threshold, observation)) = crossed.first() else {
                continue;
            };
            if threshold.signal.pressure() == Pressure::Disk && self.reclaimed(threshold).await {
                continue;
            }
            if let Err(err) = self.evict_one(threshold, observation).await {
                tracing::warn!(error = %err, "eviction failed");
            }
        }
    }

    /// Upstream's node-level reclaim for disk signals: every unused image goes (whatever
    /// its age); whether the threshold is met again without evicting a pod.
    async fn reclaimed(&self, threshold: &Threshold) -> bool {
        match self.images.free(u64::MAX, None).await {
            Ok(freed) => tracing::info!(
                signal = threshold.signal.name(),
                freed,
                "reclaimed unused images before evicting"
            ),
            Err(err) => tracing::warn!(error = %err, "reclaiming images failed"),
        }
        let observed = observe(&self.config.data_dir, &self.image_fs);
        observed
            .get(&threshold.signal)
            .is_some_and(|o| o.available >= threshold.amount(o.capacity))
    }

    /// Chooses the first pod by upstream's ranking and hands it to its worker.
    async fn evict_one(&self, threshold: &Threshold, o: &Observation) -> Result<(), kube::Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let selector = format!("spec.nodeName={}", self.config.node_name);
        let listed = pods
            .list(&ListParams::default().fields(&selector))
            .await?
            .items;
        let live: BTreeSet<String> = listed.iter().filter_map(|p| p.uid()).collect();
        self.evictions.retain(&live);
        let signal = threshold.signal;
        let candidates = listed.iter().filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            p.metadata.deletion_timestamp.is_none()
                && !matches!(phase, Some("Succeeded" | "Failed"))
                && p.uid()
                    .is_some_and(|uid| self.evictions.message(&uid).is_none())
                && !is_critical(p)
        });
        let Some(victim) = candidates.min_by_key(|p| rank(p, usage(&self.config, p, signal)))
        else {
            return Ok(());
        };
        let message = format!(
            "The node was low on resource: {}. Threshold quantity: {}, available: {}. ",
            signal.resource(),
            format_amount(signal, threshold.amount(o.capacity)),
            format_amount(signal, o.available),
        );
        tracing::info!(pod = %victim.name_any(), signal = signal.name(), "evicting");
        self.events
            .record(victim, EventType::Warning, "Evicted", message.clone());
        self.evictions
            .insert(victim.uid().unwrap_or_default(), message);
        Ok(())
    }
}

/// Static and mirror pods, and system-critical ones, are not evicted.
fn is_critical(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority)
        .is_some_and(|p| p >= 2_000_000_000)
}

/// The eviction order key: QoS class (BestEffort first), then priority, then the
/// most usage first.
fn rank(pod: &Pod, usage: u64) -> (u8, i32, std::cmp::Reverse<u64>) {
    let qos = match qos_class(pod) {
        "BestEffort" => 0,
        "Burstable" => 1,
        _ => 2,
    };
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    (qos, priority, std::cmp::Reverse(usage))
}

/// A pod's use of the starved resource: memory from its cgroup, disk from its
/// directory (logs, emptyDirs, volumes).
fn usage(config: &Config, pod: &Pod, signal: Signal) -> u64 {
    match signal {
        Signal::MemoryAvailable => {
            let parent = cgroup_parent(pod);
            [
                format!("/sys/fs/cgroup/memory{parent}/memory.usage_in_bytes"),
                format!("/sys/fs/cgroup{parent}/memory.current"),
            ]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
            .unwrap_or(0)
        }
        _ => dir_size(&pod_dir(config, pod)),
    }
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::from_value;
    use k8s_openapi::serde_json::json;

    #[test]
    fn thresholds_in_upstreams_form() {
        let t = parse_thresholds(DEFAULT_HARD).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(
            t[0],
            Threshold {
                signal: Signal::MemoryAvailable,
                limit: Limit::Absolute(100 << 20)
            }
        );
        assert_eq!(t[1].amount(1000), 100);
        assert!(parse_thresholds("memory.available>1Mi").is_err());
        assert!(parse_thresholds("disk.available<1Mi").is_err());
        assert!(parse_thresholds("nodefs.available<101%").is_err());
        assert_eq!(parse_thresholds("").unwrap(), vec![]);
    }

    #[test]
    fn the_machine_can_be_measured() {
        let seen = observe(Path::new("/"), Path::new("/"));
        for s in SIGNALS {
            let o = seen[&s];
            assert!(o.capacity > 0 && o.available <= o.capacity, "{s:?} {o:?}");
        }
    }

    #[test]
    fn best_effort_and_low_priority_go_first() {
        let pod = |resources: k8s_openapi::serde_json::Value, priority: i32| -> Pod {
            from_value(
                json!({"metadata": {"name": "p", "uid": "u"}, "spec": {"priority": priority,
                "containers": [{"name": "c", "resources": resources}]}}),
            )
            .unwrap()
        };
        let guaranteed = pod(
            json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}),
            0,
        );
        let burstable = pod(json!({"requests": {"memory": "1Mi"}}), 0);
        let best = pod(json!({}), 1000);
        let best_low = pod(json!({}), 0);
        let mut order = [
            (rank(&guaranteed, 10), "guaranteed"),
            (rank(&burstable, 10), "burstable"),
            (rank(&best, 5), "best-effort, priority 1000"),
            (rank(&best_low, 1), "best-effort, small"),
            (rank(&best_low, 9), "best-effort, big"),
        ];
        order.sort();
        let names: Vec<&str> = order.iter().map(|(_, n)| *n).collect();
        assert_eq!(
            names,
            [
                "best-effort, big",
                "best-effort, small",
                "best-effort, priority 1000",
                "burstable",
                "guaranteed"
            ]
        );
        assert_eq!(
            format_amount(Signal::MemoryAvailable, 100 << 20),
            "102400Ki"
        );
        assert_eq!(format_amount(Signal::PidAvailable, 2048), "2048");
    }
}
