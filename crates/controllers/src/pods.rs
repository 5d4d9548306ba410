//! Pod facts the workload controllers decide on: active, ready, available, and the order
//! in which a ReplicaSet gives up pods when it scales down (upstream's
//! `ActivePodsWithRanks`: unscheduled, then pending, then not ready, then the lowest
//! `pod-deletion-cost`, then pods doubled up on a node, then the most recently ready,
//! then the most restarted, then the newest go first; times compared on a logarithmic
//! scale).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use k8s_openapi::{NamespaceResourceScope, Resource as _};
use krust_api::sync::Unpoisoned;
use kube::Resource;
use serde::{Deserialize, Deserializer};

use crate::intern::Interner;
use crate::owner::Owned;
use krust_client::cache::Cached;

/// A pod as the controllers cache it — one cache for every controller but the Job's,
/// which keeps whole pods of Jobs only: the metadata and the few spec and status fields
/// they decide on, read straight from the apiserver's JSON (everything else is skipped
/// while parsing). A full `Pod` is several kilobytes in memory even when most fields are
/// empty; tens of thousands are cached.
///
/// The labels are shared with every other cached pod that has the same ones: the pods of
/// a ReplicaSet all do, and a label map costs more than half a kilobyte.
/// [`CachedPod::labels`] answers for them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "WirePod")]
pub struct CachedPod {
    pub metadata: PodMeta,
    labels: Arc<BTreeMap<String, String>>,
    pub spec: CachedSpec,
    pub status: CachedStatus,
}

/// The metadata of a cached pod that the controllers read (a third of the size of an
/// `ObjectMeta`, which has room for every field).
#[derive(Clone, Debug, Default)]
pub struct PodMeta {
    pub name: Box<str>,
    /// Shared by the pods of a namespace.
    pub namespace: Arc<str>,
    pub uid: Box<str>,
    pub resource_version: Box<str>,
    pub creation_timestamp: Option<Timestamp>,
    /// `deletionTimestamp` is set.
    pub terminating: bool,
    /// The `controller.kubernetes.io/pod-deletion-cost` annotation (0 when absent or not
    /// an int32, as upstream).
    pub deletion_cost: i32,
    /// Shared: see [`SharedList`].
    pub owner_references: Arc<SharedList<OwnerReference>>,
}

/// The annotation by which users tell a ReplicaSet which pods to give up first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

impl From<ObjectMeta> for PodMeta {
    fn from(meta: ObjectMeta) -> Self {
        let boxed = |s: Option<String>| s.unwrap_or_default().into_boxed_str();
        PodMeta {
            namespace: NAMESPACES
                .locked()
                .intern(meta.namespace.as_deref().unwrap_or_default()),
            name: boxed(meta.name),
            uid: boxed(meta.uid),
            resource_version: boxed(meta.resource_version),
            creation_timestamp: meta.creation_timestamp.map(|t| t.0),
            terminating: meta.deletion_timestamp.is_some(),
            deletion_cost: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(DELETION_COST)?.parse().ok())
                .unwrap_or(0),
            owner_references: OWNER_SETS
                .locked()
                .intern(SharedList(meta.owner_references.unwrap_or_default().into())),
        }
    }
}

impl Owned for PodMeta {
    fn namespace_and_name(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
    fn owner_refs(&self) -> &[OwnerReference] {
        &self.owner_references
    }
    fn version(&self) -> Option<&str> {
        Some(&self.resource_version)
    }
}

/// A pod as a watch delivers it to the pod informer, made into a [`CachedPod`] at once.
#[derive(Clone, Debug, Deserialize)]
pub struct WirePod {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: CachedSpec,
    #[serde(default)]
    status: CachedStatus,
}

impl From<WirePod> for CachedPod {
    fn from(mut pod: WirePod) -> Self {
        let labels = shared_labels(pod.metadata.labels.take().unwrap_or_default());
        // Usually `podIPs` is `[podIP]`: keep no second copy (see `CachedPod::ips`).
        if pod
            .status
            .pod_ips
            .iter()
            .all(|ip| Some(*ip) == pod.status.pod_ip)
        {
            pod.status.pod_ips = Vec::new();
        }
        CachedPod {
            metadata: pod.metadata.into(),
            labels,
            spec: pod.spec,
            status: pod.status,
        }
    }
}

impl Cached for CachedPod {
    type Wire = WirePod;

    fn from_wire(wire: WirePod) -> Self {
        wire.into()
    }
    fn namespace(&self) -> Option<&str> {
        Some(&self.metadata.namespace)
    }
    fn name(&self) -> &str {
        &self.metadata.name
    }
}

/// Every distinct label map of the cached pods, once. Global because pods are decoded by
/// serde, which has no context to pass a table in.
static LABEL_SETS: LazyLock<Mutex<Interner<BTreeMap<String, String>>>> =
    LazyLock::new(Mutex::default);

/// The namespaces of the cached pods, once each.
static NAMESPACES: LazyLock<Mutex<Interner<str>>> = LazyLock::new(Mutex::default);

fn shared_labels(labels: BTreeMap<String, String>) -> Arc<BTreeMap<String, String>> {
    LABEL_SETS.locked().intern(labels)
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedSpec {
    /// Shared by the pods of a node.
    #[serde(default, deserialize_with = "node_name")]
    pub node_name: Option<Arc<str>>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    /// The named ports of every container (Services may target a port by its name).
    #[serde(rename = "containers", default, deserialize_with = "named_ports")]
    pub named_ports: Vec<NamedPort>,
    /// The node a required node affinity pins an unbound pod to (`matchFields:
    /// metadata.name In [node]`, as a DaemonSet's pods have).
    #[serde(rename = "affinity", default, deserialize_with = "pinned_node")]
    pub pinned_node: Option<Box<str>>,
    /// The PersistentVolumeClaims the pod's volumes use.
    #[serde(rename = "volumes", default, deserialize_with = "volume_claims")]
    pub claims: Box<[VolumeClaim]>,
    /// The tolerations that can tolerate a `NoExecute` taint (that effect, or none):
    /// what decides when the pod leaves a tainted node. Shared like the labels: the pods
    /// of a workload, and most pods at all (admission's default not-ready and
    /// unreachable tolerations), have the same ones.
    #[serde(
        rename = "tolerations",
        default,
        deserialize_with = "no_execute_tolerations"
    )]
    pub no_execute_tolerations: Arc<SharedList<Toleration>>,
}

/// A list of API values kept once for every cached pod that has the same (see
/// [`CachedPod`]): owner references (the pods of a workload share them) and tolerations.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedList<T>(Box<[T]>);

impl<T> Default for SharedList<T> {
    fn default() -> Self {
        SharedList(Box::default())
    }
}

/// The fields that tell values apart, for hashing the API types that do not derive
/// `Hash`.
pub trait Fields {
    fn hash_fields<H: std::hash::Hasher>(&self, state: &mut H);
}

impl Fields for Toleration {
    fn hash_fields<H: std::hash::Hasher>(&self, state: &mut H) {
        use std::hash::Hash;
        let t = self;
        (
            &t.key,
            &t.operator,
            &t.value,
            &t.effect,
            t.toleration_seconds,
        )
            .hash(state);
    }
}

impl Fields for OwnerReference {
    fn hash_fields<H: std::hash::Hasher>(&self, state: &mut H) {
        use std::hash::Hash;
        let r = self;
        (&r.uid, &r.name, &r.kind, &r.api_version).hash(state);
        (r.controller, r.block_owner_deletion).hash(state);
    }
}

impl<T: PartialEq> Eq for SharedList<T> {}

impl<T: Fields> std::hash::Hash for SharedList<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for item in &self.0 {
            item.hash_fields(state);
        }
    }
}

impl<T> std::ops::Deref for SharedList<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

static TOLERATION_SETS: LazyLock<Mutex<Interner<SharedList<Toleration>>>> =
    LazyLock::new(Mutex::default);

static OWNER_SETS: LazyLock<Mutex<Interner<SharedList<OwnerReference>>>> =
    LazyLock::new(Mutex::default);

/// The names of the nodes pods are bound to, once each.
static NODE_NAMES: LazyLock<Mutex<Interner<str>>> = LazyLock::new(Mutex::default);

fn node_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<str>>, D::Error> {
    let name = Option::<String>::deserialize(d)?;
    Ok(name.map(|n| NODE_NAMES.locked().intern(n.as_str())))
}

fn no_execute_tolerations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Arc<SharedList<Toleration>>, D::Error> {
    let kept: Box<[Toleration]> = Option::<Vec<Toleration>>::deserialize(d)?
        .unwrap_or_default()
        .into_iter()
        .filter(|t| {
            t.effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "NoExecute")
        })
        .collect();
    Ok(TOLERATION_SETS.locked().intern(SharedList(kept)))
}

/// The claim of one pod volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeClaim {
    /// `persistentVolumeClaim.claimName`.
    Named(Box<str>),
    /// A generic ephemeral volume of this name: its claim is `<pod>-<volume>`.
    Ephemeral(Box<str>),
}

impl CachedPod {
    /// The names of the claims the pod's volumes use.
    pub fn claim_names(&self) -> impl Iterator<Item = String> + '_ {
        self.spec.claims.iter().map(|c| match c {
            VolumeClaim::Named(name) => name.to_string(),
            VolumeClaim::Ephemeral(volume) => {
                krust_client::volume::ephemeral_claim_name(&self.metadata.name, volume)
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub port: i32,
    pub protocol: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedStatus {
    pub phase: Option<Phase>,
    /// `podIP`, and `podIPs` when it holds more than `podIP` (the first of `podIPs` is
    /// `podIP`).
    #[serde(rename = "podIP", default, deserialize_with = "ip")]
    pub pod_ip: Option<IpAddr>,
    #[serde(rename = "podIPs", default, deserialize_with = "ips")]
    pub pod_ips: Vec<IpAddr>,
    /// The Ready condition.
    #[serde(rename = "conditions", default, deserialize_with = "readiness")]
    pub ready: Readiness,
    /// The most restarts of any container.
    #[serde(rename = "containerStatuses", default, deserialize_with = "restarts")]
    pub restarts: i32,
    /// Why the pod is in its phase (`Evicted`, ...), when a reason is given.
    pub reason: Option<Box<str>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    #[serde(other)]
    Unknown,
}

/// The pod's Ready condition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Readiness {
    #[default]
    NotReady,
    /// Ready, since the condition's lastTransitionTime (if it has one).
    ReadySince(Option<Timestamp>),
}

impl Resource for WirePod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(Pod::KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(Pod::GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(Pod::VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(Pod::URL_PATH_SEGMENT)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn named_ports<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NamedPort>, D::Error> {
    #[derive(Deserialize)]
    struct Container {
        #[serde(default)]
        ports: Option<Vec<Port>>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Port {
        name: Option<String>,
        container_port: i32,
        protocol: Option<String>,
    }
    let containers = Option::<Vec<Container>>::deserialize(d)?.unwrap_or_default();
    Ok(containers
        .into_iter()
        .flat_map(|c| c.ports.unwrap_or_default())
        .filter_map(|p| {
            Some(NamedPort {
                name: p.name.filter(|n| !n.is_empty())?,
                port: p.container_port,
                protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
            })
        })
        .collect())
}

/// An address the apiserver accepted; anything unparsable counts as none.
fn ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.and_then(|s| s.parse().ok()))
}

fn ips<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpAddr>, D::Error> {
    #[derive(Deserialize)]
    struct PodIp {
        ip: String,
    }
    Ok(Option::<Vec<PodIp>>::deserialize(d)?
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.ip.parse().ok())
        .collect())
}

fn readiness<'de, D: Deserializer<'de>>(d: D) -> Result<Readiness, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Condition {
        #[serde(rename = "type")]
        type_: String,
        status: String,
        last_transition_time: Option<Time>,
    }
    let conditions = Option::<Vec<Condition>>::deserialize(d)?.unwrap_or_default();
    Ok(conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .filter(|c| c.status == "True")
        .map_or(Readiness::NotReady, |c| {
            Readiness::ReadySince(c.last_transition_time.map(|t| t.0))
        }))
}

fn volume_claims<'de, D: Deserializer<'de>>(d: D) -> Result<Box<[VolumeClaim]>, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Volume {
        name: Box<str>,
        persistent_volume_claim: Option<Claim>,
        ephemeral: Option<serde::de::IgnoredAny>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Claim {
        claim_name: Box<str>,
    }
    let volumes = Option::<Vec<Volume>>::deserialize(d)?.unwrap_or_default();
    Ok(volumes
        .into_iter()
        .filter_map(|v| match (v.persistent_volume_claim, v.ephemeral) {
            (Some(c), _) => Some(VolumeClaim::Named(c.claim_name)),
            (None, Some(_)) => Some(VolumeClaim::Ephemeral(v.name)),
            (None, None) => None,
        })
        .collect())
}

/// Upstream's `GetTargetNodeName` for an unbound pod: the single value of the first
/// `metadata.name In` field requirement of its required node affinity.
fn pinned_node<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<str>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Affinity {
        node_affinity: Option<NodeAffinity>,
    }
    #[derive(Deserialize)]
    struct NodeAffinity {
        #[serde(rename = "requiredDuringSchedulingIgnoredDuringExecution")]
        required: Option<NodeSelector>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeSelector {
        #[serde(default)]
        node_selector_terms: Vec<Term>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Term {
        match_fields: Option<Vec<Requirement>>,
    }
    #[derive(Deserialize)]
    struct Requirement {
        key: String,
        operator: String,
        values: Option<Vec<String>>,
    }
    let Some(affinity) = Option::<Affinity>::deserialize(d)? else {
        return Ok(None);
    };
    let terms = affinity
        .node_affinity
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    Ok(terms
        .into_iter()
        .flat_map(|t| t.match_fields.unwrap_or_default())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| match r.values.as_deref() {
            Some([node]) => Some(node.as_str().into()),
            _ => None,
        }))
}

fn restarts<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ContainerStatus {
        #[serde(default)]
        restart_count: i32,
    }
    Ok(Option::<Vec<ContainerStatus>>::deserialize(d)?
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0))
}

impl CachedPod {
    /// A `Pod` with only the metadata an Event's `involvedObject` names.
    pub fn reference(&self) -> Pod {
        let meta = &self.metadata;
        Pod {
            metadata: ObjectMeta {
                name: Some(meta.name.to_string()),
                namespace: Some(meta.namespace.to_string()),
                uid: Some(meta.uid.to_string()),
                resource_version: Some(meta.resource_version.to_string()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    /// The pod's labels (shared: see [`CachedPod`]).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Every IP of the pod, `podIP` first, without repeats.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.status.pod_ip.into_iter().chain(
            self.status
                .pod_ips
                .iter()
                .copied()
                .filter(|ip| Some(*ip) != self.status.pod_ip),
        )
    }

    /// The node the pod is bound to, else the node its affinity pins it to (upstream's
    /// `GetTargetNodeName`), if any.
    pub fn target_node(&self) -> Option<&str> {
        match self.node() {
            "" => self.spec.pinned_node.as_deref(),
            bound => Some(bound),
        }
    }

    /// The node the pod is bound to, empty if none.
    pub fn node(&self) -> &str {
        self.spec.node_name.as_deref().unwrap_or_default()
    }

    fn is_scheduled(&self) -> bool {
        !self.node().is_empty()
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status.phase, Some(Phase::Succeeded | Phase::Failed))
    }
}

/// Counts towards a ReplicaSet: neither terminating nor finished.
pub fn is_active(pod: &CachedPod) -> bool {
    !pod.metadata.terminating && !pod.is_finished()
}

/// When the pod's Ready condition became True, if it is True.
pub fn ready_since(pod: &CachedPod) -> Option<Option<Timestamp>> {
    match pod.status.ready {
        Readiness::NotReady => None,
        Readiness::ReadySince(at) => Some(at),
    }
}

pub fn is_ready(pod: &CachedPod) -> bool {
    ready_since(pod).is_some()
}

/// Ready for at least `min_ready_seconds` at `now`.
pub fn is_available(pod: &CachedPod, min_ready_seconds: i32, now: Timestamp) -> bool {
    match ready_since(pod) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(None) => false,
        Some(Some(since)) => since + SignedDuration::from_secs(min_ready_seconds as i64) <= now,
    }
}

/// How long until a ready pod becomes available, if it is ready and not yet available.
pub fn until_available(
    pod: &CachedPod,
    min_ready_seconds: i32,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let since = ready_since(pod)??;
    let at = since + SignedDuration::from_secs(min_ready_seconds as i64);
    (at > now).then(|| at.duration_since(now).unsigned_abs())
}

fn phase_rank(pod: &CachedPod) -> u8 {
    match pod.status.phase {
        Some(Phase::Pending) | None => 0,
        Some(Phase::Unknown) => 1,
        Some(Phase::Running) => 2,
        Some(Phase::Succeeded | Phase::Failed) => 3,
    }
}

/// A ReplicaSet's pod as a candidate for deletion, with the number of active pods of
/// its owner's family (every ReplicaSet of the same Deployment) on its node.
pub struct Candidate<'a> {
    pub pod: &'a CachedPod,
    pub colocated: usize,
}

/// Orders candidates so that the ones to delete first come first, at `now`.
///
/// Upstream's comparison is not a total order (two pods whose ready times differ but
/// fall in the same power-of-two age bucket are ordered by UID at once, while equal
/// times go on to the later rules), which Rust's sort may reject; here every rule is a
/// key of the pod alone and the UID only breaks the last tie.
pub fn deletion_order(a: &Candidate, b: &Candidate, now: Timestamp) -> Ordering {
    let key = |c: &Candidate| {
        let p = c.pod;
        let ready_age = match p.status.ready {
            Readiness::ReadySince(since) => age_bucket(since, now),
            Readiness::NotReady => 0,
        };
        (
            p.is_scheduled(),
            phase_rank(p),
            is_ready(p),
            p.metadata.deletion_cost,
            std::cmp::Reverse(c.colocated),
            ready_age,
            std::cmp::Reverse(p.status.restarts),
            age_bucket(p.metadata.creation_timestamp, now),
        )
    };
    key(a)
        .cmp(&key(b))
        .then_with(|| a.pod.metadata.uid.cmp(&b.pod.metadata.uid))
}

/// Upstream's logarithmic age: ⌊log2(nanoseconds since `t`)⌋, so that pods of similar
/// age count as equally old; -1 for a time not in the past, and first of all for none.
fn age_bucket(t: Option<Timestamp>, now: Timestamp) -> i64 {
    let Some(t) = t else { return i64::MIN };
    let nanos = now.duration_since(t).as_nanos();
    if nanos > 0 {
        (nanos as f64).log2() as i64
    } else {
        -1
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::serde_json::{self, json};

    pub(crate) fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// A pod created at `created`, on `node` or unscheduled, in `phase`, ready since
    /// `ready` if given, read from the JSON the apiserver would send.
    pub(crate) fn pod(
        name: &str,
        created: i64,
        node: Option<&str>,
        phase: &str,
        ready: Option<i64>,
    ) -> CachedPod {
        let conditions: Vec<_> = ready
            .map(|r| json!({"type": "Ready", "status": "True", "lastTransitionTime": ts(r).to_string()}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": ts(created).to_string()},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            "status": {
                "phase": phase,
                "conditions": conditions,
                "containerStatuses": [{"name": "c", "restartCount": 0, "ready": ready.is_some()}],
            },
        }))
        .expect("a pod")
    }

    /// `pod` with exactly these labels.
    pub(crate) fn labelled(mut pod: CachedPod, labels: &[(&str, &str)]) -> CachedPod {
        pod.labels = Arc::new(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        pod
    }

    /// The names in deletion order at `ts(100)`, with how many related pods share each
    /// pod's node.
    fn order(pods: Vec<(CachedPod, usize)>) -> Vec<String> {
        let mut candidates: Vec<Candidate> = pods
            .iter()
            .map(|(pod, colocated)| Candidate {
                pod,
                colocated: *colocated,
            })
            .collect();
        candidates.sort_by(|a, b| deletion_order(a, b, ts(100)));
        candidates
            .into_iter()
            .map(|c| c.pod.metadata.name.to_string())
            .collect()
    }

    fn alone(pods: Vec<CachedPod>) -> Vec<(CachedPod, usize)> {
        pods.into_iter().map(|p| (p, 1)).collect()
    }

    #[test]
    fn scale_down_gives_up_unscheduled_then_pending_then_not_ready_then_newest() {
        let pods = vec![
            pod("ready-old", 0, Some("n1"), "Running", Some(10)),
            pod("ready-new", 5, Some("n1"), "Running", Some(90)),
            pod("running-not-ready", 1, Some("n1"), "Running", None),
            pod("pending", 2, Some("n1"), "Pending", None),
            pod("unscheduled", 3, None, "Pending", None),
        ];
        assert_eq!(
            order(alone(pods)),
            [
                "unscheduled",
                "pending",
                "running-not-ready",
                "ready-new",
                "ready-old"
            ]
        );
    }

    #[test]
    fn among_equals_the_newest_pod_goes_first() {
        // Ages 100 s, 40 s and 10 s: three different powers of two.
        let pods = vec![
            pod("a", 0, None, "Pending", None),
            pod("c", 90, None, "Pending", None),
            pod("b", 60, None, "Pending", None),
        ];
        assert_eq!(order(alone(pods)), ["c", "b", "a"]);
    }

    #[test]
    fn pods_of_about_the_same_age_go_in_uid_order() {
        // Ready for 70 s and 80 s, created 75 s and 99 s ago: the same power-of-two
        // buckets, so neither the newer readiness nor the newer creation decides.
        let mut older = pod("ready-longer", 1, Some("n1"), "Running", Some(20));
        let mut newer = pod("ready-shorter", 25, Some("n1"), "Running", Some(30));
        older.metadata.uid = "a".into();
        newer.metadata.uid = "b".into();
        assert_eq!(
            order(alone(vec![newer.clone(), older.clone()])),
            ["ready-longer", "ready-shorter"]
        );
        older.metadata.uid = "c".into();
        assert_eq!(
            order(alone(vec![older, newer])),
            ["ready-shorter", "ready-longer"]
        );
    }

    #[test]
    fn deletion_cost_then_doubled_up_nodes_come_before_age() {
        let mut cheap = pod("cheap", 0, Some("n1"), "Running", Some(10));
        cheap.metadata.deletion_cost = -5;
        let crowded = pod("crowded", 0, Some("n2"), "Running", Some(10));
        let newest = pod("newest", 90, Some("n3"), "Running", Some(95));
        let mut costly = pod("costly", 95, Some("n2"), "Running", Some(99));
        costly.metadata.deletion_cost = 10;
        assert_eq!(
            order(vec![(costly, 3), (newest, 1), (crowded, 3), (cheap, 1)]),
            ["cheap", "crowded", "newest", "costly"]
        );
    }

    #[test]
    fn availability_waits_for_min_ready_seconds() {
        let p = pod("a", 0, None, "Running", Some(10));
        assert!(is_available(&p, 0, ts(10)));
        assert!(!is_available(&p, 5, ts(12)));
        assert!(is_available(&p, 5, ts(15)));
        assert_eq!(
            until_available(&p, 5, ts(12)),
            Some(std::time::Duration::from_secs(3))
        );
        assert!(!is_available(
            &pod("b", 0, None, "Running", None),
            0,
            ts(10)
        ));
    }

    #[test]
    fn terminating_and_finished_pods_are_not_active() {
        let mut p = pod("a", 0, None, "Running", None);
        assert!(is_active(&p));
        p.metadata.terminating = true;
        assert!(!is_active(&p));
        assert!(!is_active(&pod("b", 0, None, "Succeeded", None)));
    }

    #[test]
    fn a_full_pod_is_read_into_the_fields_the_controllers_use() {
        let p: CachedPod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-1", "namespace": "default", "labels": {"app": "web"},
                "uid": "u1", "resourceVersion": "7",
                "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-3"},
                "creationTimestamp": ts(0).to_string(),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": "web", "uid": "rs1", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {
                "nodeName": "n1",
                "hostname": "h",
                "subdomain": "web",
                "containers": [
                    {"name": "a", "image": "x", "ports": [
                        {"name": "http", "containerPort": 8080},
                        {"containerPort": 9000},
                    ]},
                    {"name": "b", "image": "x", "ports": [
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                    ], "env": [{"name": "A", "value": "1"}]},
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.5",
                "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}],
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": ts(3).to_string()},
                ],
                "containerStatuses": [
                    {"name": "a", "restartCount": 2, "ready": true, "state": {"running": {}}},
                    {"name": "b", "restartCount": 5, "ready": true},
                ],
            },
        }))
        .unwrap();
        assert_eq!(p.labels().get("app").map(String::as_str), Some("web"));
        let m = &p.metadata;
        assert_eq!(
            (&*m.namespace, &*m.name, &*m.uid, &*m.resource_version),
            ("default", "web-1", "u1", "7")
        );
        assert_eq!(m.creation_timestamp, Some(ts(0)));
        assert!(!m.terminating);
        assert_eq!(m.deletion_cost, -3);
        assert_eq!(
            crate::owner::controller_of(m).map(|r| r.uid.as_str()),
            Some("rs1")
        );
        assert!(p.is_scheduled());
        assert_eq!(
            p.spec.named_ports,
            [
                NamedPort {
                    name: "http".into(),
                    port: 8080,
                    protocol: "TCP".into()
                },
                NamedPort {
                    name: "dns".into(),
                    port: 53,
                    protocol: "UDP".into()
                },
            ]
        );
        assert_eq!(p.status.phase, Some(Phase::Running));
        assert_eq!(
            p.ips().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            ["10.0.0.5", "fd00::5"]
        );
        assert_eq!(p.status.ready, Readiness::ReadySince(Some(ts(3))));
        assert_eq!(p.status.restarts, 5);

        let unready: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "status": {"phase": "Evicting", "conditions": [{"type": "Ready", "status": "False"}]},
        }))
        .unwrap();
        assert_eq!(unready.status.phase, Some(Phase::Unknown));
        assert_eq!(unready.status.ready, Readiness::NotReady);
        assert!(!unready.is_scheduled());
    }

    #[test]
    fn pods_with_the_same_labels_share_one_map() {
        let with = |name: &str, app: &str| -> CachedPod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app": app, "pod-template-hash": "abc"}},
            }))
            .unwrap()
        };
        let (a, b, c) = (with("a", "web"), with("b", "web"), with("c", "db"));
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        assert_eq!(c.labels().get("app").map(String::as_str), Some("db"));
    }
}
