//! An Ingress's links: its class and controller, its address, its TLS Secrets, and
//! each backend Service, walked as a Service is.

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};
use kube::ResourceExt;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, service};

/// The IngressClass annotation that marks the default class.
const DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";

pub async fn examine(ctx: &Context, name: &str) -> Result<Link, Error> {
    let ingress: Ingress = ctx.get("ingress", name).await?;
    let spec = ingress.spec.clone().unwrap_or_default();
    let ns = &ctx.namespace;
    let mut links = vec![class(ctx, spec.ingress_class_name.as_deref()).await?];
    let addresses: Vec<String> = (ingress.status.iter())
        .flat_map(|s| {
            s.load_balancer
                .iter()
                .flat_map(|l| l.ingress.iter().flatten())
        })
        .filter_map(|a| a.ip.clone().or(a.hostname.clone()))
        .collect();
    links.push(if addresses.is_empty() {
        Link::new(
            "address",
            Owner::Ingress,
            State::Waiting,
            "no address yet: the controller has not taken it",
        )
    } else {
        Link::ok("address", Owner::Ingress, addresses.join(", "))
    });
    for tls in spec.tls.iter().flatten() {
        let Some(secret) = &tls.secret_name else {
            continue;
        };
        let subject = format!("TLS secret/{secret}");
        links.push(match ctx.namespaced::<Secret>().get_opt(secret).await? {
            Some(s) if s.type_.as_deref() == Some("kubernetes.io/tls") => Link::ok(
                subject,
                Owner::Manifest,
                format!(
                    "for {}",
                    tls.hosts
                        .iter()
                        .flatten()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            Some(s) => Link::new(
                subject,
                Owner::Manifest,
                State::Broken,
                format!(
                    "type {:?}, not kubernetes.io/tls",
                    s.type_.unwrap_or_default()
                ),
            ),
            None => Link::new(
                subject,
                Owner::Manifest,
                State::Broken,
                "not found: the controller serves its default certificate",
            )
            .next(format!(
                "kubectl create secret tls {secret} -n {ns} --cert=... --key=..."
            )),
        });
    }
    let mut backends: Vec<(String, &IngressBackend)> = Vec::new();
    if let Some(default) = &spec.default_backend {
        backends.push(("default backend".into(), default));
    }
    for rule in spec.rules.iter().flatten() {
        let host = rule.host.clone().unwrap_or_else(|| "*".into());
        for path in rule.http.iter().flat_map(|h| &h.paths) {
            let route = format!("{host}{}", path.path.as_deref().unwrap_or("/"));
            backends.push((route, &path.backend));
        }
    }
    for (route, backend) in backends {
        links.push(self::backend(ctx, route, backend).await?);
    }
    Ok(Link::ok(
        format!("ingress/{}", ingress.name_any()),
        Owner::Ingress,
        "routes below",
    )
    .with(links))
}

/// The IngressClass that takes the Ingress: the one it names, else the default.
pub async fn class(ctx: &Context, named: Option<&str>) -> Result<Link, Error> {
    let classes = ctx
        .cluster::<IngressClass>()
        .list(&Default::default())
        .await?
        .items;
    let found = match named {
        Some(name) => classes.iter().find(|c| c.name_any() == name),
        None => classes.iter().find(|c| {
            c.annotations()
                .get(DEFAULT_CLASS)
                .is_some_and(|v| v == "true")
        }),
    };
    Ok(match (found, named) {
        (Some(c), _) => {
            let controller = c
                .spec
                .as_ref()
                .and_then(|s| s.controller.clone())
                .unwrap_or_default();
            Link::ok(
                "class",
                Owner::Ingress,
                format!("IngressClass {} (controller {controller})", c.name_any()),
            )
        }
        (None, Some(name)) => Link::new(
            "class",
            Owner::Manifest,
            State::Broken,
            format!("IngressClass {name:?} not found: no controller takes this Ingress"),
        )
        .next("kubectl get ingressclass"),
        (None, None) => Link::new(
            "class",
            Owner::Manifest,
            State::Broken,
            "no ingressClassName and no default IngressClass: no controller takes this Ingress",
        )
        .next("kubectl get ingressclass"),
    })
}

/// A route's backend Service (and port), walked; what a client then gets if broken.
pub async fn backend(
    ctx: &Context,
    route: String,
    backend: &IngressBackend,
) -> Result<Link, Error> {
    let Some(svc) = &backend.service else {
        return Ok(Link::ok(route, Owner::Manifest, "a resource backend"));
    };
    let Some(found) = ctx.namespaced::<Service>().get_opt(&svc.name).await? else {
        return Ok(Link::new(
            route,
            Owner::Manifest,
            State::Broken,
            format!("service {:?} not found: requests get 503", svc.name),
        )
        .next(format!("kubectl get services -n {}", ctx.namespace)));
    };
    let wanted = svc.port.as_ref();
    let ports = found.spec.iter().flat_map(|s| s.ports.iter().flatten());
    let has_port = ports.clone().any(|p| {
        wanted.is_some_and(|w| w.number == Some(p.port) || (w.name.is_some() && w.name == p.name))
    });
    if !has_port {
        let listed: Vec<String> = ports.map(|p| p.port.to_string()).collect();
        return Ok(Link::new(
            route,
            Owner::Manifest,
            State::Broken,
            format!(
                "service {} has no port {}: requests get 503 (it has {})",
                svc.name,
                wanted
                    .and_then(|w| w.number.map(|n| n.to_string()).or(w.name.clone()))
                    .unwrap_or_default(),
                listed.join(", ")
            ),
        ));
    }
    let walked = service::examine(ctx, &svc.name).await?;
    let evidence = match walked.worst() {
        State::Broken => format!(
            "→ service/{}; requests get 502/503 while it is broken",
            svc.name
        ),
        _ => format!("→ service/{}", svc.name),
    };
    Ok(Link::ok(route, Owner::Ingress, evidence).with(vec![walked]))
}
