//! An HTTPRoute's links (Gateway API): each parent Gateway (its `Accepted` and
//! `Programmed` conditions), the route's own verdict at that parent (`Accepted`,
//! `ResolvedRefs`, as the controller wrote them), then each backend Service, walked.
//! For a URL: the route that takes its host and path on a listener of its port.
//!
//! The Gateway API is CRDs, not in k8s-openapi: objects are read as JSON.

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::Value;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, service};

const GROUP: &str = "gateway.networking.k8s.io";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

fn routes() -> ApiResource {
    resource("HTTPRoute", "httproutes")
}

fn gateways() -> ApiResource {
    resource("Gateway", "gateways")
}

/// `httproute/NAME` in the context's namespace.
pub async fn examine(ctx: &Context, name: &str) -> Result<Link, Error> {
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ctx.namespace, &routes());
    let route = api.get_opt(name).await?.ok_or_else(|| Error::NotFound {
        kind: "httproute",
        name: name.to_string(),
        namespace: ctx.namespace.clone(),
    })?;
    let rules: Vec<&Value> = route.data["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    walk(ctx, &route, &rules, format!("httproute/{name}")).await
}

/// The route's parents, its verdict at each, and the backends of `rules`.
async fn walk(
    ctx: &Context,
    route: &DynamicObject,
    rules: &[&Value],
    subject: String,
) -> Result<Link, Error> {
    let mut links = Vec::new();
    let ns = &ctx.namespace;
    let statuses = route.data["status"]["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for parent in route.data["spec"]["parentRefs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let gateway = parent["name"].as_str().unwrap_or_default();
        let gateway_ns = parent["namespace"].as_str().unwrap_or(ns);
        links.push(gateway_link(ctx, gateway_ns, gateway).await?);
        let status = statuses.iter().find(|s| {
            s["parentRef"]["name"] == parent["name"]
                && s["parentRef"]["namespace"].as_str().unwrap_or(ns) == gateway_ns
                && s["parentRef"]["sectionName"] == parent["sectionName"]
        });
        let at = format!("attached to gateway/{gateway}");
        links.push(match status {
            None => Link::new(
                at,
                Owner::Ingress,
                State::Waiting,
                "no status from the controller for this parent yet",
            ),
            Some(status) => verdict(at, &status["conditions"]),
        });
    }
    for rule in rules {
        for backend in rule["backendRefs"].as_array().into_iter().flatten() {
            links.push(backend_link(ctx, backend).await?);
        }
    }
    Ok(Link::ok(subject, Owner::Ingress, "routes below").with(links))
}

/// A condition list's verdict: broken at the first of `Accepted`, `Programmed`,
/// `ResolvedRefs` that is not True.
fn verdict(subject: String, conditions: &Value) -> Link {
    let conditions: Vec<&Value> = conditions.as_array().into_iter().flatten().collect();
    for wanted in ["Accepted", "Programmed", "ResolvedRefs"] {
        let Some(c) = conditions.iter().find(|c| c["type"] == wanted) else {
            continue;
        };
        if c["status"] != "True" {
            let evidence = format!(
                "{wanted}={}: {}: {}",
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            );
            return Link::new(subject, Owner::Manifest, State::Broken, evidence);
        }
    }
    let held: Vec<&str> = conditions
        .iter()
        .filter(|c| c["status"] == "True")
        .filter_map(|c| c["type"].as_str())
        .collect();
    if held.is_empty() {
        return Link::new(subject, Owner::Ingress, State::Waiting, "no conditions yet");
    }
    Link::ok(subject, Owner::Ingress, held.join(", "))
}

async fn gateway_link(ctx: &Context, namespace: &str, name: &str) -> Result<Link, Error> {
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &gateways());
    let subject = format!("gateway/{name}");
    Ok(match api.get_opt(name).await? {
        None => Link::new(
            subject,
            Owner::Manifest,
            State::Broken,
            format!("not found in namespace {namespace:?}: the route is served nowhere"),
        )
        .next(format!("kubectl get gateways -n {namespace}")),
        Some(gateway) => verdict(subject, &gateway.data["status"]["conditions"]),
    })
}

/// A rule's backend: a Service (the default kind) walked; others named.
async fn backend_link(ctx: &Context, backend: &Value) -> Result<Link, Error> {
    let name = backend["name"].as_str().unwrap_or_default();
    let kind = backend["kind"].as_str().unwrap_or("Service");
    let namespace = backend["namespace"].as_str().unwrap_or(&ctx.namespace);
    let subject = format!("backend {name}:{}", backend["port"]);
    if kind != "Service" {
        return Ok(Link::ok(subject, Owner::Manifest, format!("a {kind}")));
    }
    let ctx = ctx.in_namespace(namespace);
    let Some(found) = ctx.namespaced::<Service>().get_opt(name).await? else {
        return Ok(Link::new(
            subject,
            Owner::Manifest,
            State::Broken,
            format!("service {name:?} not found in namespace {namespace:?}: requests get 500"),
        ));
    };
    let port = backend["port"].as_i64();
    let ports = found.spec.iter().flat_map(|s| s.ports.iter().flatten());
    if !ports.clone().any(|p| Some(i64::from(p.port)) == port) {
        let listed: Vec<String> = ports.map(|p| p.port.to_string()).collect();
        return Ok(Link::new(
            subject,
            Owner::Manifest,
            State::Broken,
            format!(
                "service {name} has no port {} (it has {})",
                backend["port"],
                listed.join(", ")
            ),
        ));
    }
    let walked = service::examine(&ctx, name).await?;
    Ok(Link::ok(subject, Owner::Ingress, format!("→ service/{name}")).with(vec![walked]))
}

/// The HTTPRoute that takes a request for `host` and `path` on a Gateway listener of
/// `port`, walked with the rule that matched; `None` when no route takes it.
pub async fn route_for(
    ctx: &Context,
    host: &str,
    port: u16,
    path: &str,
) -> Result<Option<Link>, Error> {
    let all = Api::<DynamicObject>::all_with(ctx.client.clone(), &gateways());
    let gateways = match all.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // The Gateway API is not installed (its CRDs come with the Ingress controller).
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // (namespace, name) of the Gateways with a listener on the port, and their address.
    let listening: Vec<((String, String), Option<String>)> = (gateways.iter())
        .filter(|g| {
            let listeners = g.data["spec"]["listeners"].as_array().into_iter().flatten();
            listeners
                .into_iter()
                .any(|l| l["port"].as_u64() == Some(u64::from(port)))
        })
        .map(|g| {
            let key = (
                g.metadata.namespace.clone().unwrap_or_default(),
                g.metadata.name.clone().unwrap_or_default(),
            );
            let address = g.data["status"]["addresses"][0]["value"]
                .as_str()
                .map(str::to_string);
            (key, address)
        })
        .collect();
    if listening.is_empty() {
        return Ok(None);
    }
    let routes = Api::<DynamicObject>::all_with(ctx.client.clone(), &routes());
    let routes = routes.list(&ListParams::default()).await?.items;
    let mut best: Option<(Rank, &DynamicObject, &Value, Option<&String>)> = None;
    for route in &routes {
        let route_ns = route.metadata.namespace.clone().unwrap_or_default();
        let parents = route.data["spec"]["parentRefs"]
            .as_array()
            .into_iter()
            .flatten();
        let attached = parents.into_iter().find_map(|p| {
            let ns = p["namespace"].as_str().unwrap_or(&route_ns).to_string();
            let key = (ns, p["name"].as_str().unwrap_or_default().to_string());
            listening
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, a)| a.as_ref())
        });
        let Some(address) = attached else {
            continue;
        };
        let Some(host_rank) = hostname_rank(&route.data["spec"]["hostnames"], host) else {
            continue;
        };
        for rule in route.data["spec"]["rules"].as_array().into_iter().flatten() {
            let matches: Vec<&Value> = rule["matches"].as_array().into_iter().flatten().collect();
            // A rule without matches takes every path, as a `/` prefix.
            let default = serde_json::json!({});
            let matches = if matches.is_empty() {
                vec![&default]
            } else {
                matches
            };
            for m in matches {
                let Some(path_rank) = path_rank(&m["path"], path) else {
                    continue;
                };
                let rank = (host_rank, path_rank);
                if best.as_ref().is_none_or(|(r, ..)| rank > *r) {
                    best = Some((rank, route, rule, address));
                }
            }
        }
    }
    let Some((_, route, rule, address)) = best else {
        return Ok(None);
    };
    let in_route = ctx.in_namespace(route.metadata.namespace.as_deref().unwrap_or_default());
    let name = route.metadata.name.clone().unwrap_or_default();
    let mut link = walk(&in_route, route, &[rule], format!("httproute/{name}")).await?;
    if ctx.probe {
        let ip = (address.and_then(|a| a.parse::<std::net::IpAddr>().ok()))
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        let addr = std::net::SocketAddr::new(ip, port);
        link.links
            .push(crate::probe::ingress(addr, host, path).await);
    }
    Ok(Some(link))
}

/// How specific a match is: hostname, then path.
type Rank = ((u8, usize), (u8, usize));

/// How a route's hostnames take `host`: exact (2), wildcard by its length (1), no
/// hostnames (0); `None` when they do not.
fn hostname_rank(hostnames: &Value, host: &str) -> Option<(u8, usize)> {
    let names: Vec<&str> = hostnames
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str())
        .collect();
    if names.is_empty() {
        return Some((0, 0));
    }
    names
        .iter()
        .filter_map(|h| match h.strip_prefix('*') {
            None => (*h == host).then_some((2, h.len())),
            Some(suffix) => {
                (host.ends_with(suffix) && host.len() > suffix.len()).then_some((1, h.len()))
            }
        })
        .max()
}

/// How a path match takes `path`: Exact (2), PathPrefix by length (1) (whole path
/// elements; the default, `/`); `None` when it does not. Regular expressions are left
/// to the controller.
fn path_rank(matcher: &Value, path: &str) -> Option<(u8, usize)> {
    let kind = matcher["type"].as_str().unwrap_or("PathPrefix");
    let value = matcher["value"].as_str().unwrap_or("/");
    match kind {
        "Exact" => (path == value).then_some((2, value.len())),
        "PathPrefix" => {
            let prefix = value.trim_end_matches('/');
            let fits = prefix.is_empty()
                || path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'));
            fits.then_some((1, prefix.len()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hostnames_rank_exact_over_wildcard_over_none() {
        assert_eq!(hostname_rank(&json!(null), "a.example"), Some((0, 0)));
        assert_eq!(
            hostname_rank(&json!(["a.example"]), "a.example"),
            Some((2, 9))
        );
        assert_eq!(
            hostname_rank(&json!(["*.example"]), "a.b.example"),
            Some((1, 9))
        );
        assert_eq!(hostname_rank(&json!(["*.example"]), "example"), None);
        assert_eq!(hostname_rank(&json!(["b.example"]), "a.example"), None);
    }

    #[test]
    fn paths_rank_exact_over_the_longest_prefix() {
        assert_eq!(path_rank(&json!(null), "/x"), Some((1, 0)));
        assert_eq!(
            path_rank(&json!({"type": "Exact", "value": "/x"}), "/x"),
            Some((2, 2))
        );
        assert_eq!(
            path_rank(&json!({"value": "/api"}), "/api/v1"),
            Some((1, 4))
        );
        assert_eq!(path_rank(&json!({"value": "/api"}), "/apis"), None);
    }
}
