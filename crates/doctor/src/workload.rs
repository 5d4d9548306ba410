//! A workload's links: its controller's progress and refusals (quota, admission), then
//! its pods — the ones not ready walked in full, the ready ones counted.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::{Resource, ResourceExt};

use crate::report::{Link, Owner, State};
use crate::target::WorkloadKind;
use crate::{Context, Error, condition, facts, pod, service};

/// How many pods that are not ready are walked in full.
const PODS_SHOWN: usize = 5;

const REVISION: &str = "deployment.kubernetes.io/revision";

pub async fn examine(ctx: &Context, kind: WorkloadKind, name: &str) -> Result<Link, Error> {
    match kind {
        WorkloadKind::Deployment => deployment(ctx, name).await,
        WorkloadKind::StatefulSet => {
            let sts: StatefulSet = ctx.get("statefulset", name).await?;
            let (spec, st) = (
                sts.spec.clone().unwrap_or_default(),
                sts.status.clone().unwrap_or_default(),
            );
            let want = spec.replicas.unwrap_or(1);
            let ready = st.ready_replicas.unwrap_or(0);
            let link = progress(format!("statefulset/{name}"), want, ready, "statefulset");
            let creation = refusals(ctx, &sts, &format!("statefulset/{name}")).await?;
            let pods = Pods {
                selector: Some(&spec.selector),
                owners: uids([&sts]),
                ready,
                want: want.max(st.replicas),
            };
            with_pods(ctx, link, creation, pods).await
        }
        WorkloadKind::DaemonSet => {
            let ds: DaemonSet = ctx.get("daemonset", name).await?;
            let (spec, st) = (
                ds.spec.clone().unwrap_or_default(),
                ds.status.clone().unwrap_or_default(),
            );
            let link = progress(
                format!("daemonset/{name}"),
                st.desired_number_scheduled,
                st.number_ready,
                "daemonset",
            );
            let creation = refusals(ctx, &ds, &format!("daemonset/{name}")).await?;
            let pods = Pods {
                selector: Some(&spec.selector),
                owners: uids([&ds]),
                ready: st.number_ready,
                want: st.desired_number_scheduled.max(st.current_number_scheduled),
            };
            with_pods(ctx, link, creation, pods).await
        }
        WorkloadKind::Job => job(ctx, name).await,
    }
}

/// `ready/wanted` of a controller's pods.
fn progress(subject: String, want: i32, ready: i32, controller: &str) -> Link {
    let evidence = format!("{ready}/{want} ready ({controller} controller)");
    let state = if ready >= want {
        State::Ok
    } else {
        State::Waiting
    };
    Link::new(subject, Owner::ControllerManager, state, evidence)
}

async fn deployment(ctx: &Context, name: &str) -> Result<Link, Error> {
    let deploy: Deployment = ctx.get("deployment", name).await?;
    let (spec, st) = (
        deploy.spec.clone().unwrap_or_default(),
        deploy.status.clone().unwrap_or_default(),
    );
    let want = spec.replicas.unwrap_or(1);
    let (updated, available) = (
        st.updated_replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0),
    );
    let evidence = format!(
        "{}/{want} ready, {updated} up to date, {available} available (deployment controller)",
        st.ready_replicas.unwrap_or(0)
    );
    let progressing = condition!(st.conditions, "Progressing");
    let mut link = match progressing.filter(|c| c.status == "False") {
        Some(c) => Link::new(
            format!("deployment/{name}"),
            Owner::ControllerManager,
            State::Broken,
            format!("{evidence}; {}: {}", c.reason, c.message),
        )
        .since(c.since)
        .next(format!(
            "kubectl rollout status deployment/{name} -n {}",
            ctx.namespace
        )),
        // Old pods still there: a rollout is under way.
        None if updated >= want && available >= want && st.replicas.unwrap_or(0) <= updated => {
            Link::ok(
                format!("deployment/{name}"),
                Owner::ControllerManager,
                evidence,
            )
        }
        None => Link::new(
            format!("deployment/{name}"),
            Owner::ControllerManager,
            State::Waiting,
            evidence,
        ),
    };
    // The newest ReplicaSet: where new pods come from, and where refusals show.
    let uid = deploy.meta().uid.clone();
    let sets = ctx
        .namespaced::<ReplicaSet>()
        .list(&selected(Some(&spec.selector)))
        .await?
        .items;
    let owned: Vec<&ReplicaSet> = sets
        .iter()
        .filter(|rs| owned_by(rs.meta(), uid.as_deref()))
        .collect();
    let revision = |rs: &ReplicaSet| {
        rs.annotations()
            .get(REVISION)
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut creation = Vec::new();
    if let Some(newest) = owned.iter().max_by_key(|rs| revision(rs)) {
        let subject = format!("replicaset/{}", newest.name_any());
        creation = refusals(ctx, *newest, &subject).await?;
        if creation.is_empty() {
            let st = newest.status.clone().unwrap_or_default();
            let want = newest.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            link.links.push(Link::ok(
                subject,
                Owner::ControllerManager,
                format!(
                    "{}/{want} pods created (revision {})",
                    st.replicas,
                    revision(newest)
                ),
            ));
        }
    }
    // Old ReplicaSets' pods count too: a rollout that does not finish leaves them.
    let pods = Pods {
        selector: Some(&spec.selector),
        owners: uids(owned.iter().copied()),
        ready: st.ready_replicas.unwrap_or(0),
        want: want.max(st.replicas.unwrap_or(0)),
    };
    with_pods(ctx, link, creation, pods).await
}

async fn job(ctx: &Context, name: &str) -> Result<Link, Error> {
    let job: Job = ctx.get("job", name).await?;
    let (spec, st) = (
        job.spec.clone().unwrap_or_default(),
        job.status.clone().unwrap_or_default(),
    );
    let subject = format!("job/{name}");
    let counts = format!(
        "{} succeeded, {} failed, {} active (job controller)",
        st.succeeded.unwrap_or(0),
        st.failed.unwrap_or(0),
        st.active.unwrap_or(0)
    );
    let link = if let Some(c) = condition!(st.conditions, "Failed").filter(|c| c.status == "True") {
        Link::new(
            subject,
            Owner::Application,
            State::Broken,
            format!("{counts}; {}: {}", c.reason, c.message),
        )
        .since(c.since)
        .next(format!("kubectl logs job/{name} -n {}", ctx.namespace))
    } else if let Some(c) = condition!(st.conditions, "Complete").filter(|c| c.status == "True") {
        Link::ok(subject, Owner::ControllerManager, counts).since(c.since)
    } else {
        Link::new(subject, Owner::ControllerManager, State::Waiting, counts)
    };
    let creation = refusals(ctx, &job, &format!("job/{name}")).await?;
    // Succeeded pods are done, not waiting; a finished Job's failed tries are history.
    let done = st.succeeded.unwrap_or(0) + st.ready.unwrap_or(0);
    let finished = link.state == State::Ok;
    let pods = Pods {
        selector: spec.selector.as_ref(),
        owners: uids([&job]),
        ready: done,
        want: if finished {
            done
        } else {
            st.succeeded.unwrap_or(0) + st.active.unwrap_or(0) + st.failed.unwrap_or(0)
        },
    };
    with_pods(ctx, link, creation, pods).await
}

/// A workload's pods as its controller counts them, and how to find them.
struct Pods<'a> {
    selector: Option<&'a LabelSelector>,
    /// The objects that own them: the workload, or a Deployment's ReplicaSets.
    owners: Vec<String>,
    /// Ready (for a Job, done) as the controller's status counts them.
    ready: i32,
    /// How many there are or should be.
    want: i32,
}

fn uids<'a, K: Resource + 'a>(owners: impl IntoIterator<Item = &'a K>) -> Vec<String> {
    owners
        .into_iter()
        .filter_map(|o| o.meta().uid.clone())
        .collect()
}

/// The workload's link with what refused its pods, the ready pods counted and those
/// not ready walked (the first few).
async fn with_pods(
    ctx: &Context,
    mut link: Link,
    creation: Vec<Link>,
    pods: Pods<'_>,
) -> Result<Link, Error> {
    link.links.extend(creation);
    if pods.ready > 0 {
        link.links.push(Link::ok(
            "pods",
            Owner::Kubelet,
            format!("{} ready", pods.ready),
        ));
    }
    if pods.ready >= pods.want {
        // The controller counts them all ready: no pod needs reading.
        return Ok(link);
    }
    let not_ready = not_ready(ctx, &pods).await?;
    for p in not_ready.iter().take(PODS_SHOWN) {
        link.links.push(pod::examine(ctx, p).await?);
    }
    if not_ready.len() > PODS_SHOWN {
        link.links.push(Link::new(
            "pods",
            Owner::Kubelet,
            State::Waiting,
            "and more not ready",
        ));
    }
    if not_ready.is_empty() {
        let missing = pods.want - pods.ready;
        link.links.push(Link::new(
            "pods",
            Owner::ControllerManager,
            State::Waiting,
            format!("{missing} not created or not counted yet"),
        ));
    }
    Ok(link)
}

/// Up to one more than [`PODS_SHOWN`] of the workload's pods that are not ready: those
/// not running first (the usual suspects, and few: one field-selected list), then
/// running ones page by page only while the controller's count says more are not
/// ready — a workload of 10,000 pods is not read whole to find the one that fails.
async fn not_ready(ctx: &Context, pods: &Pods<'_>) -> Result<Vec<Pod>, Error> {
    let api = ctx.namespaced::<Pod>();
    let ours = |p: &Pod| pods.owners.iter().any(|uid| owned_by(p.meta(), Some(uid)));
    let params = selected(pods.selector).fields("status.phase!=Running,status.phase!=Succeeded");
    let mut found: Vec<Pod> = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter(|p| ours(p))
        .collect();
    let mut params = selected(pods.selector)
        .fields("status.phase=Running")
        .limit(500);
    // The controller's count says how many there are to find.
    let missing = usize::try_from(pods.want - pods.ready).unwrap_or(0);
    while found.len() < missing.min(PODS_SHOWN + 1) {
        let page = api.list(&params).await?;
        found.extend(
            page.items
                .into_iter()
                .filter(|p| ours(p) && !service::pod_ready(p)),
        );
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Ok(found)
}

/// Pod creations the controller reported as refused (FailedCreate: quota, admission,
/// webhooks), as a broken link of the owner named in the message.
async fn refusals<K: Resource>(ctx: &Context, obj: &K, subject: &str) -> Result<Vec<Link>, Error> {
    let events = facts::events(ctx, obj.meta().uid.as_deref()).await?;
    let Some((reason, message, at)) = facts::newest(&events, &["FailedCreate", "FailedPlacement"])
    else {
        return Ok(Vec::new());
    };
    let owner = if message.contains("exceeded quota")
        || message.contains("LimitRange")
        || message.contains("maximum")
    {
        Owner::Quota
    } else if message.contains("admission webhook")
        || message.contains("failed calling webhook")
        || message.contains("PodSecurity")
        || message.contains("forbidden")
    {
        Owner::Admission
    } else {
        Owner::ControllerManager
    };
    Ok(vec![
        Link::new(
            subject,
            owner,
            State::Broken,
            format!("{reason}: {message}"),
        )
        .since(at)
        .next(format!("kubectl describe {} -n {}", subject, ctx.namespace)),
    ])
}

/// A list of what `selector` selects (everything without one).
pub(crate) fn selected(selector: Option<&LabelSelector>) -> ListParams {
    let parsed = selector.cloned().map(kube::core::Selector::try_from);
    match parsed {
        Some(Ok(selector)) => ListParams::default().labels_from(&selector),
        _ => ListParams::default(),
    }
}

/// Whether the object of `meta` is controlled by the object with `uid`.
pub(crate) fn owned_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    uid: Option<&str>,
) -> bool {
    (meta.owner_references.iter().flatten())
        .any(|o| Some(o.uid.as_str()) == uid && o.controller == Some(true))
}
