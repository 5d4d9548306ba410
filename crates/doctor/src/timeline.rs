//! `krust doctor --timeline TARGET`: how long each step of the latest rollout took,
//! pod by pod, from what the API keeps — the pod's creation, its `PodScheduled`
//! condition, its `PodReadyToStartContainers` condition (the sandbox and its network),
//! the kubelet's `Pulled` event, its containers' start and its `Ready` condition — and
//! which step was slowest. The API keeps times to the second.

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use crate::target::{Target, WorkloadKind};
use crate::workload::{owned_by, selected};
use crate::{Context, Error, condition, facts};

/// The steps of a pod's start, in order.
pub const STEPS: [&str; 5] = ["scheduled", "sandbox", "image", "started", "ready"];

/// How many pods of a rollout are read.
const PODS: u32 = 500;

#[derive(Debug, Serialize)]
pub struct PodTimeline {
    pub pod: String,
    pub created: Timestamp,
    /// Seconds each step took after the one before it (the first after creation);
    /// none while a step has not happened.
    pub steps: Vec<Option<i64>>,
}

impl PodTimeline {
    /// Seconds from creation to the last step, once every step has happened.
    pub fn total(&self) -> Option<i64> {
        self.steps.iter().copied().sum()
    }
}

#[derive(Debug, Serialize)]
pub struct Timeline {
    pub target: String,
    pub pods: Vec<PodTimeline>,
    /// The step that took longest in any pod, and how long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slowest: Option<(&'static str, i64)>,
}

pub async fn examine(
    client: &kube::Client,
    namespace: &str,
    target: &Target,
) -> Result<Timeline, Error> {
    let ctx = Context {
        client: client.clone(),
        namespace: namespace.to_string(),
        probe: false,
    };
    let pods = match target {
        Target::Pod(name) => vec![ctx.get::<Pod>("pod", name).await?],
        Target::Workload(WorkloadKind::Deployment, name) => latest_rollout(&ctx, name).await?,
        Target::Workload(kind, name) => owned_pods(&ctx, *kind, name).await?,
        _ => return Err(Error::Timeline(target.to_string())),
    };
    let pulled = pulled(&ctx).await?;
    let mut pods: Vec<PodTimeline> = pods.iter().filter_map(|p| timeline(p, &pulled)).collect();
    pods.sort_by_key(|p| p.created);
    let slowest = (pods.iter())
        .flat_map(|p| {
            STEPS
                .iter()
                .zip(&p.steps)
                .filter_map(|(s, d)| Some((*s, (*d)?)))
        })
        .max_by_key(|(_, d)| *d);
    Ok(Timeline {
        target: target.to_string(),
        pods,
        slowest,
    })
}

/// The pods of a Deployment's newest ReplicaSet.
async fn latest_rollout(ctx: &Context, name: &str) -> Result<Vec<Pod>, Error> {
    let deploy: Deployment = ctx.get("deployment", name).await?;
    let selector = deploy.spec.as_ref().map(|s| s.selector.clone());
    let params = selected(selector.as_ref());
    let sets = ctx.namespaced::<ReplicaSet>().list(&params).await?.items;
    let revision = |rs: &ReplicaSet| {
        (rs.annotations().get("deployment.kubernetes.io/revision"))
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let uid = deploy.meta().uid.clone();
    let newest = (sets.iter())
        .filter(|rs| owned_by(rs.meta(), uid.as_deref()))
        .max_by_key(|rs| revision(rs));
    let Some(newest) = newest else {
        return Ok(Vec::new());
    };
    let pods = ctx
        .namespaced::<Pod>()
        .list(&params.limit(PODS))
        .await?
        .items;
    Ok((pods.into_iter())
        .filter(|p| owned_by(p.meta(), newest.meta().uid.as_deref()))
        .collect())
}

/// The pods a StatefulSet, DaemonSet or Job controls.
async fn owned_pods(ctx: &Context, kind: WorkloadKind, name: &str) -> Result<Vec<Pod>, Error> {
    use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    let (uid, selector) = match kind {
        WorkloadKind::StatefulSet => {
            let o: StatefulSet = ctx.get("statefulset", name).await?;
            (o.metadata.uid, o.spec.map(|s| s.selector))
        }
        WorkloadKind::DaemonSet => {
            let o: DaemonSet = ctx.get("daemonset", name).await?;
            (o.metadata.uid, o.spec.map(|s| s.selector))
        }
        WorkloadKind::Job => {
            let o: Job = ctx.get("job", name).await?;
            (o.metadata.uid, o.spec.and_then(|s| s.selector))
        }
        WorkloadKind::Deployment => unreachable!("deployments have their own walk"),
    };
    let pods = ctx
        .namespaced::<Pod>()
        .list(&selected(selector.as_ref()).limit(PODS))
        .await?
        .items;
    Ok(pods
        .into_iter()
        .filter(|p| owned_by(p.meta(), uid.as_deref()))
        .collect())
}

/// When each pod's image was last reported pulled (or present): one list of the
/// namespace's `Pulled` events.
async fn pulled(ctx: &Context) -> Result<HashMap<String, Timestamp>, Error> {
    let params = ListParams::default().fields("reason=Pulled");
    let events: Vec<Event> = ctx.namespaced::<Event>().list(&params).await?.items;
    let mut at: HashMap<String, Timestamp> = HashMap::new();
    for e in &events {
        if let (Some(uid), Some(seen)) = (e.involved_object.uid.clone(), facts::last_seen(e)) {
            let newest = at.entry(uid).or_insert(seen);
            *newest = (*newest).max(seen);
        }
    }
    Ok(at)
}

/// A pod's steps, as far as they happened.
fn timeline(pod: &Pod, pulled: &HashMap<String, Timestamp>) -> Option<PodTimeline> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let status = pod.status.clone().unwrap_or_default();
    let true_since = |kind: &str| {
        condition!(status.conditions, kind)
            .filter(|c| c.status == "True")
            .and_then(|c| c.since)
    };
    let started = (status.container_statuses.iter().flatten())
        .filter_map(|c| {
            let state = c.state.as_ref()?;
            let running = state.running.as_ref().and_then(|r| r.started_at.as_ref());
            let done = state
                .terminated
                .as_ref()
                .and_then(|t| t.started_at.as_ref());
            running.or(done).map(|t| t.0)
        })
        .min();
    let times = [
        true_since("PodScheduled"),
        true_since("PodReadyToStartContainers"),
        pod.metadata
            .uid
            .as_ref()
            .and_then(|u| pulled.get(u).copied()),
        started,
        true_since("Ready"),
    ];
    // Steps can overlap (the kubelet pulls a new pod's images while its sandbox is
    // made): one that ended before the step before it took no time of its own.
    let mut before = created;
    let steps = times
        .iter()
        .map(|at| {
            let at = (*at)?;
            let took = at
                .duration_since(before)
                .max(SignedDuration::ZERO)
                .as_secs();
            before = before.max(at);
            Some(took)
        })
        .collect();
    Some(PodTimeline {
        pod: pod.name_any(),
        created,
        steps,
    })
}

/// The timeline as a table, with the slowest step.
pub fn text(timeline: &Timeline) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "timeline of {}: {} pods\n",
        timeline.target,
        timeline.pods.len()
    );
    let width = timeline
        .pods
        .iter()
        .map(|p| p.pod.len())
        .max()
        .unwrap_or(3)
        .max(3);
    let _ = write!(out, "{:<width$}", "pod");
    for step in STEPS.iter().chain(&["total"]) {
        let _ = write!(out, "  {step:>9}");
    }
    out.push('\n');
    let cell = |s: Option<i64>| s.map_or("-".to_string(), |s| format!("+{s}s"));
    for p in &timeline.pods {
        let _ = write!(out, "{:<width$}", p.pod);
        for step in p.steps.iter().copied().chain([p.total()]) {
            let _ = write!(out, "  {:>9}", cell(step));
        }
        out.push('\n');
    }
    match timeline.slowest {
        Some((step, secs)) => {
            let _ = writeln!(out, "slowest step: {step} ({secs}s)");
        }
        None => out.push_str("no step has happened yet\n"),
    }
    out
}
