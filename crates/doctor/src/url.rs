//! A URL resolved as a client's request would be: an IP is a Service's cluster IP or a
//! pod's IP; `NAME.NAMESPACE[.svc[.cluster.local]]` is a Service's DNS name; any other
//! host goes through the Ingress rules (the most specific host, then the longest path,
//! as the Ingress controller picks).

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::{HTTPIngressPath, Ingress};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::report::{Link, Owner, State};
use crate::{Context, Error, gateway, ingress, pod, probe, service};

pub async fn examine(ctx: &Context, uri: &http::Uri) -> Result<Link, Error> {
    let client = &ctx.client;
    let host = uri.host().unwrap_or_default().trim_end_matches('.');
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<std::net::IpAddr>().is_ok() {
        let services = Api::<Service>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        let owner = services.items.iter().find(|s| {
            let ips = s.spec.iter().flat_map(|s| s.cluster_ips.iter().flatten());
            ips.into_iter().any(|ip| ip == host)
        });
        if let Some(svc) = owner {
            let ctx = ctx.in_namespace(&svc.namespace().unwrap_or_default());
            return service::examine(&ctx, &svc.name_any()).await;
        }
        let params = ListParams::default().fields(&format!("status.podIP={host}"));
        let pods = Api::<Pod>::all(client.clone()).list(&params).await?;
        if let Some(p) = pods.items.first() {
            return pod::examine(&ctx.in_namespace(&p.namespace().unwrap_or_default()), p).await;
        }
        return Ok(Link::new(
            host,
            Owner::Manifest,
            State::Broken,
            "no Service and no pod has this address",
        ));
    }
    let cluster_name = cluster_name(ctx, host).await?;
    if let Some((name, namespace)) = &cluster_name {
        let ctx = ctx.in_namespace(namespace);
        if ctx.namespaced::<Service>().get_opt(name).await?.is_some() {
            return service::examine(&ctx, name).await;
        }
    }
    let ingresses = Api::<Ingress>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let Some((found, rule_host, path)) = route(&ingresses.items, host, uri.path()) else {
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if let Some(link) = gateway::route_for(ctx, host, port, uri.path()).await? {
            return Ok(link);
        }
        if let Some((name, namespace)) = cluster_name {
            return no_such_service(ctx, host, &name, &namespace).await;
        }
        return Ok(Link::new(
            format!("{host}{}", uri.path()),
            Owner::Manifest,
            State::Broken,
            "no Ingress rule and no HTTPRoute matches this host and path: the controller answers 404",
        )
        .next("kubectl get ingress -A"));
    };
    let in_ingress = ctx.in_namespace(&found.namespace().unwrap_or_default());
    let spec = found.spec.clone().unwrap_or_default();
    let class = ingress::class(&in_ingress, spec.ingress_class_name.as_deref()).await?;
    let label = format!("{rule_host}{}", path.path.as_deref().unwrap_or("/"));
    let backend = ingress::backend(&in_ingress, label, &path.backend).await?;
    let mut links = vec![class, backend];
    if ctx.probe && uri.scheme_str() != Some("https") {
        links.push(request(found, uri, host).await);
    }
    let evidence = format!("{} routes {host}{} here", found.name_any(), uri.path());
    Ok(Link::ok(
        format!("ingress/{}", found.name_any()),
        Owner::Ingress,
        evidence,
    )
    .with(links))
}

/// `host` as a name of the cluster DNS — `NAME.NAMESPACE.svc[.cluster.local]`, or
/// `NAME.NAMESPACE` and `NAME` as a pod's search path completes them, when that
/// namespace exists — split into the Service's name and namespace.
async fn cluster_name(ctx: &Context, host: &str) -> Result<Option<(String, String)>, Error> {
    let labels: Vec<&str> = host.split('.').collect();
    let (name, namespace) = match labels.as_slice() {
        [name, namespace, "svc"] | [name, namespace, "svc", "cluster", "local"] => {
            return Ok(Some((name.to_string(), namespace.to_string())));
        }
        [name] => (*name, ctx.namespace.as_str()),
        [name, namespace] => (*name, *namespace),
        _ => return Ok(None),
    };
    let exists = ctx
        .cluster::<Namespace>()
        .get_opt(namespace)
        .await?
        .is_some();
    Ok(exists.then(|| (name.to_string(), namespace.to_string())))
}

/// A cluster name without its Service: the DNS answers NXDOMAIN; the Services of that
/// namespace with the nearest names are offered.
async fn no_such_service(
    ctx: &Context,
    host: &str,
    name: &str,
    namespace: &str,
) -> Result<Link, Error> {
    let services = ctx.in_namespace(namespace).namespaced::<Service>();
    let names: Vec<String> = (services.list_metadata(&ListParams::default()).await?.items)
        .into_iter()
        .map(|s| s.name_any())
        .collect();
    let mut evidence = format!(
        "NXDOMAIN: no Service {name:?} in namespace {namespace:?}, so the name does not resolve"
    );
    if let Some(near) = nearest(name, &names) {
        evidence.push_str(&format!("; did you mean {near}?"));
    }
    Ok(Link::new(host, Owner::Dns, State::Broken, evidence)
        .next(format!("kubectl get services -n {namespace}")))
}

/// The name in `names` closest to a typo of it (at most two edits away).
fn nearest<'a>(typo: &str, names: &'a [String]) -> Option<&'a str> {
    (names.iter())
        .map(|n| (strsim::damerau_levenshtein(typo, n), n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| n.as_str())
}

/// The request sent to the Ingress controller at the Ingress's address (the local node
/// without one), on the URL's port, with the URL's host.
async fn request(ingress: &Ingress, uri: &http::Uri, host: &str) -> Link {
    let address = (ingress.status.iter())
        .flat_map(|s| {
            s.load_balancer
                .iter()
                .flat_map(|l| l.ingress.iter().flatten())
        })
        .find_map(|a| a.ip.as_deref()?.parse::<std::net::IpAddr>().ok())
        .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    let port = uri.port_u16().unwrap_or(80);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    probe::ingress(std::net::SocketAddr::new(address, port), host, path).await
}

/// An Ingress path that takes a request: its Ingress, its rule's host (`*` for none).
type Route<'a> = (&'a Ingress, String, &'a HTTPIngressPath);

/// How specific a match is: host (exact 2, wildcard 1, none 0), Exact path, path length.
type Rank = (u8, u8, usize);

/// The Ingress path that takes `host` and `path`: an exact host before a wildcard
/// before none, then an Exact path before the longest Prefix.
fn route<'a>(ingresses: &'a [Ingress], host: &str, path: &str) -> Option<Route<'a>> {
    let mut best: Option<(Rank, Route<'a>)> = None;
    for ing in ingresses {
        for rule in ing.spec.iter().flat_map(|s| s.rules.iter().flatten()) {
            let rule_host = rule.host.clone().unwrap_or_default();
            let host_rank = match rule_host.as_str() {
                "" => 0,
                h if h == host => 2,
                h => match h.strip_prefix("*.") {
                    Some(suffix) => {
                        let one_label =
                            host.split_once('.').is_some_and(|(_, rest)| rest == suffix);
                        if one_label { 1 } else { continue }
                    }
                    None => continue,
                },
            };
            for p in rule.http.iter().flat_map(|h| &h.paths) {
                let want = p.path.as_deref().unwrap_or("/");
                let (exact, fits) = match p.path_type.as_str() {
                    "Exact" => (1, path == want),
                    "Prefix" => (0, prefix_matches(want, path)),
                    _ => (0, path.starts_with(want)),
                };
                let rank = (host_rank, exact, want.len());
                if fits && best.as_ref().is_none_or(|(r, _)| rank > *r) {
                    let shown = if rule_host.is_empty() {
                        "*".to_string()
                    } else {
                        rule_host.clone()
                    };
                    best = Some((rank, (ing, shown, p)));
                }
            }
        }
    }
    best.map(|(_, found)| found)
}

/// Prefix matching by path elements, as the Ingress spec defines it: `/foo` takes
/// `/foo` and `/foo/bar`, not `/foobar`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_path_elements() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/foo", "/foo/bar"));
        assert!(prefix_matches("/foo/", "/foo"));
        assert!(!prefix_matches("/foo", "/foobar"));
    }

    #[test]
    fn the_most_specific_rule_wins() {
        let ingress: Ingress = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"rules": [
                {"http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "catch-all", "port": {"number": 80}}}}]}},
                {"host": "*.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "wild", "port": {"number": 80}}}}]}},
                {"host": "shop.example", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": "shop", "port": {"number": 80}}}},
                    {"path": "/cart", "pathType": "Prefix",
                        "backend": {"service": {"name": "cart", "port": {"number": 80}}}}]}}]}}))
        .unwrap();
        let all = [ingress];
        let to = |host: &str, path: &str| {
            route(&all, host, path)
                .and_then(|(_, _, p)| p.backend.service.as_ref())
                .map(|s| s.name.clone())
        };
        assert_eq!(to("shop.example", "/cart/1").as_deref(), Some("cart"));
        assert_eq!(to("shop.example", "/carts").as_deref(), Some("shop"));
        assert_eq!(to("blog.example", "/").as_deref(), Some("wild"));
        assert_eq!(to("a.b.example", "/").as_deref(), Some("catch-all"));
    }

    #[test]
    fn a_typo_is_offered_the_nearest_name() {
        let names = ["web".to_string(), "db".to_string(), "webhook".to_string()];
        assert_eq!(nearest("wbe", &names), Some("web"));
        assert_eq!(nearest("dbs", &names), Some("db"));
        assert_eq!(nearest("cache", &names), None);
    }
}
