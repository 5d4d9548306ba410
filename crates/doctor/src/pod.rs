//! A pod's links: scheduling, its node, volumes, sandbox, then each container's image,
//! state and readiness.

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Event, PersistentVolumeClaim, Pod, PodStatus,
};
use kube::ResourceExt;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, condition, facts, node};

pub async fn examine_named(ctx: &Context, name: &str) -> Result<Link, Error> {
    let pod: Pod = ctx.get("pod", name).await?;
    examine(ctx, &pod).await
}

/// Every link of `pod`.
pub async fn examine(ctx: &Context, pod: &Pod) -> Result<Link, Error> {
    let name = pod.name_any();
    let ns = &ctx.namespace;
    let describe = format!("kubectl describe pod {name} -n {ns}");
    let events = facts::events(ctx, pod.metadata.uid.as_deref()).await?;
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.as_deref().unwrap_or("Pending");
    let subject = format!("pod/{name}");

    if phase == "Failed" && status.reason.is_some() {
        // Evicted, node shutdown, deadline exceeded: the kubelet's verdict on the pod.
        let why = format!(
            "{}: {}",
            status.reason.as_deref().unwrap_or_default(),
            status.message.as_deref().unwrap_or_default()
        );
        return Ok(Link::new(subject, Owner::Kubelet, State::Broken, why).next(describe));
    }
    let mut links = claims(ctx, pod).await?;
    let scheduled = condition!(status.conditions, "PodScheduled");
    match (&spec.node_name, scheduled) {
        (Some(node), c) => links.push(
            Link::ok("scheduled", Owner::Scheduler, format!("on node {node}"))
                .since(c.and_then(|c| c.since)),
        ),
        (None, Some(c)) if c.status == "False" => links.push(
            Link::new(
                "scheduled",
                Owner::Scheduler,
                State::Broken,
                format!("{}: {}", c.reason, c.message),
            )
            .since(c.since)
            .next(describe.clone()),
        ),
        (None, _) => links.push(Link::new(
            "scheduled",
            Owner::Scheduler,
            State::Waiting,
            "not scheduled yet",
        )),
    }
    let Some(node) = &spec.node_name else {
        // Nothing further happens to a pod before it has a node.
        return Ok(Link::new(subject, Owner::Scheduler, State::Waiting, "Pending").with(links));
    };
    links.push(node::examine_named(ctx, node).await?);
    let started = status
        .container_statuses
        .iter()
        .flatten()
        .any(|c| c.state.as_ref().is_some_and(|s| s.waiting.is_none()));
    links.extend(mounts(&events, started, &describe));
    if !spec.host_network.unwrap_or(false) {
        links.push(sandbox(&status, &events, &describe));
    }
    let initialized =
        condition!(status.conditions, "Initialized").is_none_or(|c| c.status == "True");
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|_| !initialized);
    for container in init.chain(&spec.containers) {
        let statuses = (status.init_container_statuses.iter().flatten())
            .chain(status.container_statuses.iter().flatten());
        let found = statuses.into_iter().find(|s| s.name == container.name);
        links.push(container_link(pod, container, found, &events, phase));
    }
    let ready = condition!(status.conditions, "Ready");
    let (state, evidence) = match (phase, &ready) {
        ("Succeeded", _) => (State::Ok, "Succeeded".to_string()),
        (_, Some(c)) if c.status == "True" => (State::Ok, format!("{phase}, Ready")),
        _ => (State::Waiting, format!("{phase}, not Ready")),
    };
    Ok(Link::new(subject, Owner::Kubelet, state, evidence)
        .since(ready.and_then(|c| c.since))
        .with(links))
}

/// The pod's claims: bound before the pod can be scheduled (or, waiting for their
/// first consumer, along with it).
async fn claims(ctx: &Context, pod: &Pod) -> Result<Vec<Link>, Error> {
    let mut links = Vec::new();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for claim in volumes.filter_map(|v| v.persistent_volume_claim.as_ref()) {
        let subject = format!("persistentvolumeclaim/{}", claim.claim_name);
        let found = ctx
            .namespaced::<PersistentVolumeClaim>()
            .get_opt(&claim.claim_name)
            .await?;
        let Some(pvc) = found else {
            links.push(Link::new(
                subject,
                Owner::Manifest,
                State::Broken,
                "not found",
            ));
            continue;
        };
        let phase = pvc
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Bound" {
            let volume = pvc
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .unwrap_or_default();
            links.push(Link::ok(
                subject,
                Owner::Storage,
                format!("Bound to {volume}"),
            ));
            continue;
        }
        let claim_events = facts::events(ctx, pvc.metadata.uid.as_deref()).await?;
        let why = facts::newest(
            &claim_events,
            &[
                "ProvisioningFailed",
                "FailedBinding",
                "ExternalProvisioning",
                "WaitForFirstConsumer",
                "WaitForPodScheduled",
            ],
        );
        let (evidence, since) = match why {
            Some((reason, message, at)) => (format!("{phase}: {reason}: {message}"), at),
            None => (format!("{phase}: not bound yet"), None),
        };
        // A claim that waits for its pod to be scheduled is not the problem.
        let waits = why.is_some_and(|(reason, _, _)| reason == "WaitForFirstConsumer");
        let state = if waits { State::Waiting } else { State::Broken };
        let class = pvc
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        links.push(
            Link::new(subject, Owner::Storage, state, evidence)
                .since(since)
                .next(format!(
                    "kubectl describe pvc {} -n {} (class {class:?})",
                    claim.claim_name, ctx.namespace
                )),
        );
    }
    Ok(links)
}

/// The pod's mounts, failing before its containers start.
fn mounts(events: &[Event], started: bool, describe: &str) -> Option<Link> {
    if started {
        return None;
    }
    let (reason, message, at) = facts::newest(
        events,
        &["FailedMount", "FailedAttachVolume", "FailedMapVolume"],
    )?;
    let evidence = format!("{reason}: {message}");
    let link = Link::new("volumes mounted", Owner::Storage, State::Broken, evidence);
    Some(link.since(at).next(describe.to_string()))
}

/// The pod's sandbox and network: made once the pod has an IP.
fn sandbox(status: &PodStatus, events: &[Event], describe: &str) -> Link {
    if let Some(ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty()) {
        return Link::ok(
            "sandbox and network",
            Owner::Network,
            format!("pod IP {ip}"),
        );
    }
    match facts::newest(events, &["FailedCreatePodSandBox", "FailedKillPod"]) {
        Some((reason, message, at)) => Link::new(
            "sandbox and network",
            Owner::Network,
            State::Broken,
            format!("{reason}: {message}"),
        )
        .since(at)
        .next(describe.to_string()),
        None => Link::new(
            "sandbox and network",
            Owner::Network,
            State::Waiting,
            "no pod IP yet",
        ),
    }
}

/// A container's image, state and readiness, as its status says.
fn container_link(
    pod: &Pod,
    container: &Container,
    status: Option<&ContainerStatus>,
    events: &[Event],
    phase: &str,
) -> Link {
    let (name, ns) = (pod.name_any(), pod.namespace().unwrap_or_default());
    let subject = format!("container {}", container.name);
    let image = container.image.clone().unwrap_or_default();
    let describe = format!("kubectl describe pod {name} -n {ns}");
    let logs = format!(
        "kubectl logs {name} -c {} -n {ns} --previous",
        container.name
    );
    let Some(status) = status else {
        return Link::new(subject, Owner::Kubelet, State::Waiting, "not created yet");
    };
    let state = status.state.clone().unwrap_or_default();
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    let exits = |restarts: i32| match last {
        Some(t) => format!(
            "restarted {restarts} times; last exit code {}{}{}",
            t.exit_code,
            t.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            t.message
                .as_deref()
                .map(|m| format!(": {}", m.trim()))
                .unwrap_or_default()
        ),
        None => format!("restarted {restarts} times"),
    };
    if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        let message = waiting.message.as_deref().unwrap_or_default();
        let evidence = format!("{reason}: {message}");
        return match reason {
            "ErrImagePull"
            | "ImagePullBackOff"
            | "ErrImageNeverPull"
            | "RegistryUnavailable"
            | "SignatureValidationFailed" => Link::new(
                format!("{subject}: image {image}"),
                Owner::Registry,
                State::Broken,
                evidence,
            )
            .next(describe),
            "InvalidImageName" => Link::new(
                format!("{subject}: image {image}"),
                Owner::Manifest,
                State::Broken,
                evidence,
            ),
            "CrashLoopBackOff" => Link::new(
                subject,
                Owner::Application,
                State::Broken,
                format!("CrashLoopBackOff, {}", exits(status.restart_count)),
            )
            .next(logs),
            "CreateContainerConfigError" => {
                Link::new(subject, Owner::Manifest, State::Broken, evidence).next(describe)
            }
            "CreateContainerError"
            | "RunContainerError"
            | "PreStartHookError"
            | "PostStartHookError" => {
                Link::new(subject, Owner::Kubelet, State::Broken, evidence).next(describe)
            }
            _ => Link::new(subject, Owner::Kubelet, State::Waiting, reason.to_string()),
        };
    }
    if let Some(done) = &state.terminated {
        let code = done.exit_code;
        let reason = done.reason.clone().unwrap_or_default();
        return if code == 0 {
            Link::ok(subject, Owner::Application, format!("completed ({reason})"))
        } else if phase == "Running" || phase == "Pending" {
            // About to be restarted: the exit is the evidence.
            Link::new(
                subject,
                Owner::Application,
                State::Waiting,
                format!("exited with code {code} ({reason})"),
            )
            .next(logs)
        } else {
            Link::new(
                subject,
                Owner::Application,
                State::Broken,
                format!("exited with code {code} ({reason})"),
            )
            .next(logs)
        };
    }
    let since = state
        .running
        .as_ref()
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0);
    let running = match status.restart_count {
        0 => "running".to_string(),
        n => format!("running, {}", exits(n)),
    };
    if status.ready || container.readiness_probe.is_none() && status.started != Some(false) {
        return Link::ok(subject, Owner::Application, running).since(since);
    }
    let mut link = Link::ok(subject.clone(), Owner::Application, running).since(since);
    let probe = facts::newest(events, &["Unhealthy"])
        .filter(|(_, m, _)| m.starts_with("Readiness probe") || m.starts_with("Startup probe"));
    link.links.push(match probe {
        Some((_, message, at)) => Link::new(
            format!("{subject}: readiness"),
            Owner::Application,
            State::Broken,
            message.to_string(),
        )
        .since(at)
        .next(describe),
        None => Link::new(
            format!("{subject}: readiness"),
            Owner::Application,
            State::Waiting,
            "not ready yet",
        ),
    });
    link
}
