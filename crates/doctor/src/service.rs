//! A Service's links: its selector and ports against the pods, its ready endpoints,
//! and its DNS name.

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ListParams;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, facts, pod, policy, probe};

/// How many not-ready pods behind a Service are walked in full.
const PODS_SHOWN: usize = 3;

/// How many of a Service's pods are read to check its ports and readiness.
const SAMPLE: u32 = 100;

pub async fn examine(ctx: &Context, name: &str) -> Result<Link, Error> {
    let svc: Service = ctx.get("service", name).await?;
    let spec = svc.spec.clone().unwrap_or_default();
    let ns = &ctx.namespace;
    let kind = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let subject = format!("service/{name}");
    if kind == "ExternalName" {
        let to = spec.external_name.unwrap_or_default();
        return Ok(Link::ok(
            subject,
            Owner::Dns,
            format!("ExternalName: a CNAME to {to}"),
        ));
    }
    let mut links = Vec::new();
    let Some(selector) = spec.selector.clone().filter(|s| !s.is_empty()) else {
        let link = Link::ok(
            subject,
            Owner::Manifest,
            "no selector: its endpoints are managed by hand",
        );
        let ready = facts::ready_endpoints(&ctx.client, ns, name).await?;
        let mut links = vec![
            endpoints(ctx, name, &ready, &[]).await?,
            dns(ctx, name, &ip).await?,
        ];
        if ctx.probe && !ready.none() {
            links.extend(probe::service(ctx, name, &spec, &ready.addresses, None).await?);
        }
        return Ok(link.with(links));
    };
    let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let selector = selector.join(",");
    // A sample: enough to check ports and find a pod that is not ready, without
    // reading 10,000.
    let params = ListParams::default().labels(&selector).limit(SAMPLE);
    let listed = ctx.namespaced::<Pod>().list(&params).await?;
    let more = listed.metadata.continue_.is_some_and(|c| !c.is_empty());
    let pods = listed.items;
    let count = format!("{}{}", pods.len(), if more { "+" } else { "" });
    if pods.is_empty() {
        links.push(
            Link::new(
                "selector",
                Owner::Manifest,
                State::Broken,
                format!("{selector} matches no pods in namespace {ns}"),
            )
            .next(format!("kubectl get pods -n {ns} --show-labels")),
        );
    } else {
        links.push(Link::ok(
            "selector",
            Owner::Manifest,
            format!("{selector} matches {count} pods"),
        ));
        let ports = spec.ports.as_deref().unwrap_or_default();
        for port in ports {
            links.extend(target_port(port, &pods));
        }
        links.extend(policy::ingress(ctx, &pods[0], ports).await?);
    }
    let ready = facts::ready_endpoints(&ctx.client, ns, name).await?;
    links.push(endpoints(ctx, name, &ready, &pods).await?);
    links.push(dns(ctx, name, &ip).await?);
    if ctx.probe && !ready.none() {
        links.extend(probe::service(ctx, name, &spec, &ready.addresses, pods.first()).await?);
    }
    let ports: Vec<String> = (spec.ports.iter().flatten())
        .map(|p| {
            let target = match &p.target_port {
                Some(IntOrString::Int(n)) => n.to_string(),
                Some(IntOrString::String(s)) => s.clone(),
                None => p.port.to_string(),
            };
            format!(
                "{}→{target}/{}",
                p.port,
                p.protocol.as_deref().unwrap_or("TCP")
            )
        })
        .collect();
    let evidence = format!("{kind} {ip}, ports {}", ports.join(", "));
    Ok(Link::ok(subject, Owner::Manifest, evidence).with(links))
}

/// Whether the selected pods' containers have the port a Service port sends to: a
/// named target must name a container port; a number is checked only against pods
/// that declare ports (declaring is optional).
fn target_port(port: &ServicePort, pods: &[Pod]) -> Option<Link> {
    let declared: Vec<(Option<&str>, i32)> = pods.iter().flat_map(declared).collect();
    let listing: Vec<String> = (declared.iter())
        .map(|(n, p)| n.map_or(p.to_string(), |n| format!("{n}={p}")))
        .collect();
    let subject = format!("port {}: targetPort", port.port);
    match port
        .target_port
        .clone()
        .unwrap_or(IntOrString::Int(port.port))
    {
        IntOrString::String(name) if !declared.iter().any(|(n, _)| *n == Some(name.as_str())) => {
            Some(Link::new(
                subject,
                Owner::Manifest,
                State::Broken,
                format!(
                    "{name:?} names no container port of the selected pods (they declare: {})",
                    or_none(&listing)
                ),
            ))
        }
        IntOrString::Int(n) if !declared.is_empty() && !declared.iter().any(|(_, p)| *p == n) => {
            Some(Link::new(
                subject,
                Owner::Manifest,
                State::Broken,
                format!(
                    "no container of the selected pods declares port {n} (they declare: {})",
                    listing.join(", ")
                ),
            ))
        }
        _ => None,
    }
}

/// The ports `pod`'s containers declare: (name, number).
pub fn declared(pod: &Pod) -> Vec<(Option<&str>, i32)> {
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    (containers.flat_map(|c| c.ports.iter().flatten()))
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect()
}

/// The container port a Service port sends to: a number, or a name resolved on the pod
/// (`None` when the pod has no port of that name: the port link names that).
pub fn target(port: &ServicePort, declared: &[(Option<&str>, i32)]) -> Option<i32> {
    match port.target_port.clone() {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(n),
        Some(IntOrString::String(name)) => declared
            .iter()
            .find(|(n, _)| *n == Some(name.as_str()))
            .map(|(_, p)| *p),
    }
}

fn or_none(list: &[String]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// The Service's ready endpoints, from its EndpointSlices; when none is ready, the
/// pods that are not, walked.
async fn endpoints(
    ctx: &Context,
    name: &str,
    ready: &facts::Ready,
    pods: &[Pod],
) -> Result<Link, Error> {
    if !ready.none() {
        return Ok(Link::ok(
            "endpoints",
            Owner::ControllerManager,
            ready.to_string(),
        ));
    }
    let not_ready: Vec<&Pod> = pods.iter().filter(|p| !pod_ready(p)).collect();
    let mut walked = Vec::new();
    for p in not_ready.iter().take(PODS_SHOWN) {
        walked.push(pod::examine(ctx, p).await?);
    }
    let evidence = if pods.is_empty() {
        "no ready endpoints: no pods selected"
    } else {
        "no ready endpoints: none of the selected pods is ready; connections are refused"
    };
    let owner = if pods.is_empty() {
        Owner::Manifest
    } else {
        Owner::Application
    };
    Ok(Link::new("endpoints", owner, State::Broken, evidence)
        .next(format!(
            "kubectl get endpointslices -n {} -l kubernetes.io/service-name={name}",
            ctx.namespace
        ))
        .with(walked))
}

pub fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().map(|s| &s.conditions);
    conditions
        .into_iter()
        .flatten()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The Service's name in the cluster DNS: answered while the DNS Service has ready
/// endpoints.
async fn dns(ctx: &Context, name: &str, ip: &str) -> Result<Link, Error> {
    let fqdn = format!("{name}.{}.svc.cluster.local", ctx.namespace);
    let serving = !facts::ready_endpoints(&ctx.client, "kube-system", "kube-dns")
        .await?
        .none();
    Ok(if serving {
        Link::ok("DNS name", Owner::Dns, format!("{fqdn} → {ip}"))
    } else {
        Link::new(
            "DNS name",
            Owner::Dns,
            State::Broken,
            format!("{fqdn}: the cluster DNS (kube-system/kube-dns) has no ready endpoints"),
        )
        .next(facts::DNS_ENDPOINTS)
    })
}
