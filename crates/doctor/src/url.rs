//! A URL resolved as a client's request would be: an IP is a Service's cluster IP or a
//! pod's IP; `NAME.NAMESPACE[.svc[.cluster.local]]` is a Service's DNS name; any other
//! host goes through the Ingress rules (the most specific host, then the longest path,
//! as the Ingress controller picks).

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::{HTTPIngressPath, Ingress};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::report::{Link, Owner, State};
use crate::{Context, Error, ingress, pod, service};

pub async fn examine(client: &kube::Client, uri: &http::Uri) -> Result<Link, Error> {
    let host = uri.host().unwrap_or_default().trim_end_matches('.');
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let in_namespace = |namespace: &str| Context {
        client: client.clone(),
        namespace: namespace.to_string(),
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        let services = Api::<Service>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        let owner = services.items.iter().find(|s| {
            let ips = s.spec.iter().flat_map(|s| s.cluster_ips.iter().flatten());
            ips.into_iter().any(|ip| ip == host)
        });
        if let Some(svc) = owner {
            let ctx = in_namespace(&svc.namespace().unwrap_or_default());
            return service::examine(&ctx, &svc.name_any()).await;
        }
        let params = ListParams::default().fields(&format!("status.podIP={host}"));
        let pods = Api::<Pod>::all(client.clone()).list(&params).await?;
        if let Some(p) = pods.items.first() {
            return pod::examine(&in_namespace(&p.namespace().unwrap_or_default()), p).await;
        }
        return Ok(Link::new(
            host,
            Owner::Manifest,
            State::Broken,
            "no Service and no pod has this address",
        ));
    }
    let labels: Vec<&str> = host.split('.').collect();
    let service_name = match labels.as_slice() {
        [name, namespace] | [name, namespace, "svc"] => Some((*name, *namespace)),
        [name, namespace, "svc", ..] => Some((*name, *namespace)),
        _ => None,
    };
    if let Some((name, namespace)) = service_name {
        let ctx = in_namespace(namespace);
        if ctx.namespaced::<Service>().get_opt(name).await?.is_some() {
            return service::examine(&ctx, name).await;
        }
    }
    let ingresses = Api::<Ingress>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let Some((found, rule_host, path)) = route(&ingresses.items, host, uri.path()) else {
        return Ok(Link::new(
            format!("{host}{}", uri.path()),
            Owner::Manifest,
            State::Broken,
            "no Ingress rule matches this host and path: the Ingress controller answers 404",
        )
        .next("kubectl get ingress -A"));
    };
    let ctx = in_namespace(&found.namespace().unwrap_or_default());
    let spec = found.spec.clone().unwrap_or_default();
    let class = ingress::class(&ctx, spec.ingress_class_name.as_deref()).await?;
    let label = format!("{rule_host}{}", path.path.as_deref().unwrap_or("/"));
    let backend = ingress::backend(&ctx, label, &path.backend).await?;
    let evidence = format!("{} routes {host}{} here", found.name_any(), uri.path());
    Ok(Link::ok(
        format!("ingress/{}", found.name_any()),
        Owner::Ingress,
        evidence,
    )
    .with(vec![class, backend]))
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
}
