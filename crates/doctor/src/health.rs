//! `krust doctor` without a target: the cluster's own parts — the apiserver, the
//! leading controller manager and scheduler, every node, the DNS and the Ingress class.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::ListParams;

use crate::report::{Link, Owner, Report, State};
use crate::{Context, Error, facts, node};

/// The components elected through Leases in kube-system, upstream's names.
const LEADERS: [(&str, Owner); 2] = [
    ("kube-controller-manager", Owner::ControllerManager),
    ("kube-scheduler", Owner::Scheduler),
];

pub async fn examine(client: &kube::Client) -> Result<Report, Error> {
    let ctx = Context {
        client: client.clone(),
        namespace: "kube-system".into(),
        probe: false,
    };
    let mut links = vec![apiserver(client).await, store(client).await];
    for (name, owner) in LEADERS {
        links.push(leader(&ctx, name, owner).await?);
    }
    let nodes = ctx
        .cluster::<Node>()
        .list(&ListParams::default())
        .await?
        .items;
    if nodes.is_empty() {
        links.push(
            Link::new(
                "nodes",
                Owner::Kubelet,
                State::Broken,
                "no node has joined: pods cannot run",
            )
            .next("krust agent --server https://<server>:6443 --token <token>"),
        );
    }
    links.extend(nodes_links(&ctx, &nodes).await?);
    links.push(dns(&ctx).await?);
    links.push(ingress_class(&ctx).await?);
    Ok(Report::new("cluster".into(), links))
}

/// How many nodes that are not healthy are walked in full.
const NODES_SHOWN: usize = 10;

/// The healthy nodes counted, the others walked (the first few).
async fn nodes_links(ctx: &Context, nodes: &[Node]) -> Result<Vec<Link>, Error> {
    let renewals = node::renewals(ctx).await?;
    let walked: Vec<Link> = (nodes.iter())
        .map(|n| node::examine(n, renewals.get(&n.name_any()).copied()))
        .collect();
    let (healthy, sick): (Vec<Link>, Vec<Link>) =
        walked.into_iter().partition(|l| l.worst() == State::Ok);
    let mut links = Vec::new();
    if !healthy.is_empty() {
        links.push(Link::ok(
            "nodes",
            Owner::Kubelet,
            format!("{} Ready and healthy", healthy.len()),
        ));
    }
    let more = sick.len().saturating_sub(NODES_SHOWN);
    links.extend(sick.into_iter().take(NODES_SHOWN));
    if more > 0 {
        links.push(Link::new(
            "nodes",
            Owner::Node,
            State::Waiting,
            format!("and {more} more not healthy"),
        ));
    }
    Ok(links)
}

/// `/readyz` with its checks: the apiserver and its store answer.
async fn apiserver(client: &kube::Client) -> Link {
    match get_text(client, "/readyz?verbose").await {
        Ok(text) => {
            let checks = text.lines().filter(|l| l.starts_with("[+]")).count();
            let evidence = match checks {
                0 => "ready".to_string(),
                n => format!("ready ({n} checks pass)"),
            };
            Link::ok("apiserver", Owner::Apiserver, evidence)
        }
        Err(err) => Link::new(
            "apiserver",
            Owner::Apiserver,
            State::Broken,
            format!("/readyz: {err}"),
        )
        .next("kubectl get --raw '/readyz?verbose'"),
    }
}

/// How many times the store's readiness check is timed (the fastest counts: the
/// others include scheduling noise).
const STORE_READS: usize = 3;

/// The store: whether it answers (`/readyz/etcd`), how fast, and its size and revisions
/// from the apiserver's metrics.
async fn store(client: &kube::Client) -> Link {
    let mut fastest = None;
    for _ in 0..STORE_READS {
        let started = std::time::Instant::now();
        if let Err(err) = get_text(client, "/readyz/etcd").await {
            return Link::new(
                "store",
                Owner::Store,
                State::Broken,
                format!("the apiserver cannot read its store: {err}"),
            )
            .next("kubectl get --raw '/readyz?verbose'");
        }
        let took = started.elapsed();
        fastest = Some(fastest.map_or(took, |f: std::time::Duration| f.min(took)));
    }
    let took = fastest.unwrap_or_default();
    let mut evidence = format!("a read answers in {:.1} ms", took.as_secs_f64() * 1000.0);
    if let Ok(metrics) = get_text(client, "/metrics").await {
        let value = |name| metric(&metrics, name);
        if let Some(size) = value("apiserver_storage_size_bytes") {
            evidence.push_str(&format!("; {:.1} MiB", size / (1024.0 * 1024.0)));
        }
        if let (Some(current), Some(compacted)) = (
            value("etcd_debugging_mvcc_current_revision"),
            value("etcd_debugging_mvcc_compact_revision"),
        ) {
            evidence.push_str(&format!(
                " at revision {current}, history compacted to {compacted}"
            ));
        }
    }
    if took > SLOW_STORE {
        return Link::new(
            "store",
            Owner::Store,
            State::Broken,
            format!(
                "slow: {evidence} (over {} ms: writes and watches lag)",
                SLOW_STORE.as_millis()
            ),
        )
        .next("check the store's disk (fsync latency) or etcd members' health");
    }
    Link::ok("store", Owner::Store, evidence)
}

/// A store read slower than this makes every write and watch lag behind.
const SLOW_STORE: std::time::Duration = std::time::Duration::from_millis(500);

async fn get_text(client: &kube::Client, path: &str) -> Result<String, kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .expect("static request");
    client.request_text(request).await
}

/// The value of an unlabelled sample `name` in Prometheus's text format.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Who holds a component's Lease, and whether it still renews it.
async fn leader(ctx: &Context, name: &str, owner: Owner) -> Result<Link, Error> {
    let lease = ctx.namespaced::<Lease>().get_opt(name).await?;
    let spec = lease.and_then(|l| l.spec).unwrap_or_default();
    let subject = format!("{name} leader");
    let (Some(holder), Some(renewed)) = (spec.holder_identity.clone(), spec.renew_time.clone())
    else {
        return Ok(Link::new(
            subject,
            owner,
            State::Broken,
            format!("no one holds the Lease kube-system/{name}"),
        )
        .next(format!("kubectl get lease -n kube-system {name} -o yaml")));
    };
    let age = Timestamp::now().duration_since(renewed.0);
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(15).into());
    Ok(if age > duration {
        Link::new(
            subject,
            owner,
            State::Broken,
            format!(
                "{holder} last renewed {}s ago (lease {}s): no one leads",
                age.as_secs(),
                duration.as_secs()
            ),
        )
        .since(Some(renewed.0))
    } else {
        Link::ok(
            subject,
            owner,
            format!("{holder}, renewed {}s ago", age.as_secs()),
        )
    })
}

/// The cluster DNS answers while its Service has ready endpoints.
async fn dns(ctx: &Context) -> Result<Link, Error> {
    let ready = facts::ready_endpoints(&ctx.client, "kube-system", "kube-dns").await?;
    Ok(if ready.none() {
        Link::new(
            "cluster DNS",
            Owner::Dns,
            State::Broken,
            "kube-system/kube-dns has no ready endpoints: names do not resolve",
        )
        .next(facts::DNS_ENDPOINTS)
    } else {
        Link::ok("cluster DNS", Owner::Dns, format!("kube-dns: {ready}"))
    })
}

/// Ingresses without a class go to the default one, if there is one.
async fn ingress_class(ctx: &Context) -> Result<Link, Error> {
    let classes = ctx
        .cluster::<IngressClass>()
        .list(&ListParams::default())
        .await?
        .items;
    let default = classes.iter().find(|c| {
        c.annotations()
            .get("ingressclass.kubernetes.io/is-default-class")
            .is_some_and(|v| v == "true")
    });
    Ok(match default {
        Some(c) => Link::ok(
            "ingress",
            Owner::Ingress,
            format!("default IngressClass {}", c.name_any()),
        ),
        None if classes.is_empty() => Link::new(
            "ingress",
            Owner::Ingress,
            State::Waiting,
            "no IngressClass: Ingresses are not served",
        ),
        None => Link::ok(
            "ingress",
            Owner::Ingress,
            format!("{} IngressClasses, none the default", classes.len()),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn unlabelled_samples_are_read_by_their_whole_name() {
        let text =
            "# HELP x\napiserver_storage_size_bytes_total 1\napiserver_storage_size_bytes 4096\n";
        assert_eq!(metric(text, "apiserver_storage_size_bytes"), Some(4096.0));
        assert_eq!(metric(text, "etcd_debugging_mvcc_current_revision"), None);
    }
}
