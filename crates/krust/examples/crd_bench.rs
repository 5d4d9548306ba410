//! How fast custom resources are: a release `krust server` without a node.
//! - *served*: from the POST of a CustomResourceDefinition to the first successful
//!   create of one of its objects (naming, establishing, the kind in the watch cache),
//!   one definition at a time;
//! - *creates* and *GETs*: objects of a custom kind with a schema (pruned, defaulted,
//!   validated) against ConfigMaps of the same size, from 32 concurrent clients;
//! - *webhook*: what one validating admission webhook (an HTTPS server in this process,
//!   allowing everything) adds to a create, one client, p50/p99.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/crd_bench [definitions=20] [objects=2000]
//! ```

mod support;
// The e2e tests' HTTPS server serves the webhook.
#[allow(dead_code)]
#[path = "../tests/e2e/https.rs"]
mod https;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;
use support::{Cluster, Result, percentile};

const CLIENTS: usize = 32;

fn definition(i: usize) -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("widget{i}s.bench.krust.io")},
        "spec": {
            "group": "bench.krust.io", "scope": "Namespaced",
            "names": {"plural": format!("widget{i}s"), "kind": format!("Widget{i}")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer", "minimum": 1, "default": 3},
                        "color": {"type": "string", "enum": ["red", "blue"]}}}}}}}]
        }
    }))?)
}

fn widgets(client: &kube::Client, i: usize) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "bench.krust.io".into(),
        version: "v1".into(),
        api_version: "bench.krust.io/v1".into(),
        kind: format!("Widget{i}"),
        plural: format!("widget{i}s"),
    };
    Api::namespaced_with(client.clone(), "default", &resource)
}

fn widget(i: usize, name: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "bench.krust.io/v1", "kind": format!("Widget{i}"),
        "metadata": {"name": name}, "spec": {"color": "red"}
    }))?)
}

/// Runs `n` requests from `CLIENTS` concurrent clients; requests per second.
async fn throughput<F, Fut>(n: usize, create: F) -> f64
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(create)
        .buffer_unordered(CLIENTS)
        .collect::<Vec<()>>()
        .await;
    n as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let definitions: usize = args.next().map_or(Ok(20), |a| a.parse())?;
    let objects: usize = args.next().map_or(Ok(2000), |a| a.parse())?;
    let cluster = Cluster::start(&[]).await?;
    let client = cluster.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());

    let mut served = Vec::new();
    for i in 0..definitions {
        let started = Instant::now();
        crds.create(&PostParams::default(), &definition(i)?).await?;
        let api = widgets(&client, i);
        loop {
            match api
                .create(&PostParams::default(), &widget(i, "first")?)
                .await
            {
                Ok(_) => break,
                Err(_) if started.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        served.push(started.elapsed());
    }
    served.sort();
    println!(
        "definition → first object created  p50 {:>7.1?}  p90 {:>7.1?}  max {:>7.1?}  ({definitions} definitions)",
        percentile(&served, 0.5),
        percentile(&served, 0.9),
        served.last().copied().unwrap_or_default(),
    );

    let api = widgets(&client, 0);
    let custom = throughput(objects, |n| {
        let api = api.clone();
        async move {
            let obj = widget(0, &format!("w{n}")).expect("a widget");
            api.create(&PostParams::default(), &obj)
                .await
                .expect("create");
        }
    })
    .await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let builtin = throughput(objects, |n| {
        let api = config_maps.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(
                json!({"metadata": {"name": format!("c{n}")}, "data": {"color": "red"}}),
            )
            .expect("a configmap");
            api.create(&PostParams::default(), &cm)
                .await
                .expect("create");
        }
    })
    .await;
    println!(
        "creates from {CLIENTS} clients: custom objects {custom:>7.0}/s, ConfigMaps {builtin:>7.0}/s ({objects} each)"
    );
    let gets = 5 * objects;
    let custom = throughput(gets, |n| {
        let api = api.clone();
        async move {
            api.get(&format!("w{}", n % objects)).await.expect("get");
        }
    })
    .await;
    let builtin = throughput(gets, |n| {
        let api = config_maps.clone();
        async move {
            api.get(&format!("c{}", n % objects)).await.expect("get");
        }
    })
    .await;
    println!(
        "GETs from {CLIENTS} clients: custom objects {custom:>7.0}/s, ConfigMaps {builtin:>7.0}/s ({gets} each)"
    );

    webhook_overhead(&client, objects / 4).await?;
    cluster.stop();
    Ok(())
}

/// Allows every review.
fn allow(seen: &https::Seen) -> (u16, serde_json::Value) {
    let uid = seen.body["request"]["uid"].clone();
    (
        200,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "response": {"uid": uid, "allowed": true}}),
    )
}

/// Create latencies, one client, of ConfigMaps where a validating webhook is called
/// (namespace `hooked`) and where none is (`plain`).
async fn webhook_overhead(client: &kube::Client, n: usize) -> Result {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Namespace;
    // It runs a runtime of its own: made and dropped off this one.
    let server =
        tokio::task::spawn_blocking(|| https::HttpsServer::start(&[], None, allow)).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["hooked", "plain"] {
        let namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
    }
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = serde_json::from_value(json!({
        "metadata": {"name": "bench"},
        "webhooks": [{
            "name": "allow.bench.krust.io", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", server.port),
                             "caBundle": server.ca_bundle()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "hooked"}}
        }]
    }))?;
    configs.create(&PostParams::default(), &config).await?;
    let mut report = Vec::new();
    for ns in ["plain", "hooked"] {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let cm: ConfigMap = serde_json::from_value(
                json!({"metadata": {"name": format!("c{i}")}, "data": {"color": "red"}}),
            )?;
            let started = Instant::now();
            api.create(&PostParams::default(), &cm).await?;
            took.push(started.elapsed());
        }
        took.sort();
        report.push((ns, percentile(&took, 0.5), percentile(&took, 0.99)));
    }
    let reviews = server.requests().len();
    tokio::task::spawn_blocking(move || drop(server)).await?;
    for (ns, p50, p99) in &report {
        println!("create, one client, {ns:>6}: p50 {p50:>7.2?}  p99 {p99:>7.2?}");
    }
    let (_, plain50, plain99) = report[0];
    let (_, hooked50, hooked99) = report[1];
    println!(
        "one validating webhook adds p50 {:.2?}, p99 {:.2?} ({reviews} reviews for {n} creates)",
        hooked50.saturating_sub(plain50),
        hooked99.saturating_sub(plain99)
    );
    Ok(())
}
