//! A node's links: the kubelet reporting (Ready, heartbeats), pressure, cordon, taints.

use std::collections::HashMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, condition};

/// Taints the node lifecycle controller and the kubelet set themselves: the conditions
/// already say what they mean.
const CONDITION_TAINTS: &str = "node.kubernetes.io/";

/// How long a kubelet may go without renewing its Lease before the doctor calls it silent
/// (the node lifecycle controller's grace period).
const SILENT: SignedDuration = SignedDuration::from_secs(40);

pub async fn examine_named(ctx: &Context, name: &str) -> Result<Link, Error> {
    let node = ctx
        .cluster::<Node>()
        .get_opt(name)
        .await?
        .ok_or_else(|| Error::NotFound {
            kind: "node",
            name: name.to_string(),
            namespace: String::new(),
        })?;
    let lease = leases(ctx).get_opt(name).await?;
    Ok(examine(&node, lease.and_then(renewed)))
}

/// When each node's kubelet last renewed its Lease, in one list.
pub async fn renewals(ctx: &Context) -> Result<HashMap<String, Timestamp>, Error> {
    let listed = leases(ctx).list(&Default::default()).await?.items;
    Ok((listed.into_iter())
        .filter_map(|l| Some((l.metadata.name.clone()?, renewed(l)?)))
        .collect())
}

fn leases(ctx: &Context) -> kube::Api<Lease> {
    kube::Api::namespaced(ctx.client.clone(), "kube-node-lease")
}

fn renewed(lease: Lease) -> Option<Timestamp> {
    lease.spec?.renew_time.map(|t| t.0)
}

/// A node's links; `renewed` is when its kubelet last renewed its Lease.
pub fn examine(node: &Node, renewed: Option<Timestamp>) -> Link {
    let name = node.name_any();
    let describe = format!("kubectl describe node {name}");
    let status = node.status.clone().unwrap_or_default();
    let mut links = Vec::new();
    let kubelet = status
        .node_info
        .as_ref()
        .map(|i| {
            format!(
                " (kubelet {}, {})",
                i.kubelet_version, i.container_runtime_version
            )
        })
        .unwrap_or_default();
    links.push(match condition!(status.conditions, "Ready") {
        Some(c) if c.status == "True" => {
            Link::ok("Ready", Owner::Kubelet, format!("Ready{kubelet}")).since(c.since)
        }
        Some(c) if c.status == "Unknown" => Link::new(
            "Ready",
            Owner::Kubelet,
            State::Broken,
            format!("the kubelet stopped reporting: {}", c.message),
        )
        .since(c.since)
        .next(format!(
            "systemctl status krust (or the agent's log) on {name}"
        )),
        Some(c) => Link::new(
            "Ready",
            Owner::Kubelet,
            State::Broken,
            format!("{}: {}", c.reason, c.message),
        )
        .since(c.since)
        .next(describe.clone()),
        None => Link::new(
            "Ready",
            Owner::Kubelet,
            State::Waiting,
            "no Ready condition yet",
        ),
    });
    if let Some(renewed) = renewed {
        let age = Timestamp::now().duration_since(renewed);
        if age > SILENT {
            links.push(
                Link::new(
                    "heartbeat",
                    Owner::Kubelet,
                    State::Broken,
                    format!("the kubelet last renewed its Lease {}s ago", age.as_secs()),
                )
                .since(Some(renewed)),
            );
        }
    }
    for pressure in ["DiskPressure", "MemoryPressure", "PIDPressure"] {
        if let Some(c) = condition!(status.conditions, pressure).filter(|c| c.status == "True") {
            links.push(
                Link::new(
                    pressure,
                    Owner::Node,
                    State::Broken,
                    format!("{}: {}", c.reason, c.message),
                )
                .since(c.since)
                .next(describe.clone()),
            );
        }
    }
    let spec = node.spec.clone().unwrap_or_default();
    if spec.unschedulable == Some(true) {
        links.push(
            Link::new(
                "cordoned",
                Owner::Node,
                State::Waiting,
                "cordoned: no new pods are scheduled here",
            )
            .next(format!("kubectl uncordon {name}")),
        );
    }
    let taints: Vec<String> = (spec.taints.iter().flatten())
        .filter(|t| !t.key.starts_with(CONDITION_TAINTS) && t.effect != "PreferNoSchedule")
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or_default(),
                t.effect
            )
        })
        .collect();
    if !taints.is_empty() {
        links.push(
            Link::new(
                "taints",
                Owner::Node,
                State::Waiting,
                format!(
                    "tainted {}: only pods that tolerate it run here",
                    taints.join(", ")
                ),
            )
            .next(describe),
        );
    }
    let problems: Vec<&str> = (links.iter())
        .filter(|l| l.state != State::Ok)
        .map(|l| l.subject.as_str())
        .collect();
    let evidence = match problems.as_slice() {
        [] => "healthy".to_string(),
        some => some.join(", "),
    };
    Link::new(format!("node/{name}"), Owner::Node, State::Ok, evidence).with(links)
}
