//! First-start objects every cluster has: the namespaces default, kube-system, kube-public
//! and kube-node-lease, the system PriorityClasses, and the `kubernetes` Service at the
//! first service IP. (Its
//! endpoints are the endpoint reconciler's.) Created through the REST layer, so they get
//! the same defaulting and validation as anything a user creates. The namespaces and the
//! Service are created again whenever they go missing, as upstream's system namespaces
//! and kubernetes Service controllers do: kube-node-lease may be deleted (only default,
//! kube-system and kube-public are immortal), and so may the Service.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use crate::Api;
use crate::loopback::{Loopback, Resource};

const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// How often missing system objects are looked for (upstream: the kubernetes Service
/// every endpoint interval, the namespaces every minute; one short interval serves both:
/// a check of objects that exist reads only the cache).
const RECREATE_INTERVAL: Duration = Duration::from_secs(10);

/// Creates the system namespaces and the `kubernetes` Service where they are missing.
async fn system_objects(api: &Api, service_ip: Ipv4Addr, port: u16) -> Result<()> {
    let client = Loopback { scope: &api.scope };
    for ns in SYSTEM_NAMESPACES {
        client
            .ensure(
                Resource::core("namespaces", None),
                &json!({"metadata": {"name": ns}}),
            )
            .await
            .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {e}"))?;
    }
    let service = json!({
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": service_ip.to_string(),
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
    });
    client
        .ensure(Resource::core("services", Some("default")), &service)
        .await
        .map_err(|e| anyhow::anyhow!("creating the kubernetes service: {e}"))
}

/// Creates again, for as long as the apiserver runs, the system objects someone deleted.
pub async fn keep_system_objects(api: Arc<Api>, service_ip: Ipv4Addr, port: u16) {
    // The first look is one interval after start: `run` has just made them.
    let first = tokio::time::Instant::now() + RECREATE_INTERVAL;
    let mut ticker = tokio::time::interval_at(first, RECREATE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(err) = system_objects(&api, service_ip, port).await {
            tracing::warn!(err = format!("{err:#}"), "recreating the system objects");
        }
    }
}

pub async fn run(api: &Api, pki: &crate::pki::Pki, service_ip: Ipv4Addr, port: u16) -> Result<()> {
    system_objects(api, service_ip, port).await?;
    let client = Loopback { scope: &api.scope };
    for (name, value, description) in crate::admission::plugins::SYSTEM_PRIORITY_CLASSES {
        let class = json!({"metadata": {"name": name}, "value": value, "description": description});
        let resource = Resource {
            group: "scheduling.k8s.io",
            version: "v1",
            plural: "priorityclasses",
            namespace: None,
        };
        client
            .ensure(resource, &class)
            .await
            .map_err(|e| anyhow::anyhow!("creating priority class {name}: {e}"))?;
    }
    // How extension apiservers authenticate the requests krust proxies to them (upstream's
    // cluster-authentication-trust controller publishes the same).
    let front_proxy = |v: &str| serde_json::to_string(&[v]).unwrap_or_default();
    let trust = json!({
        "metadata": {"name": "extension-apiserver-authentication"},
        "data": {
            "client-ca-file": pki.ca_cert,
            "requestheader-client-ca-file": pki.front_proxy_ca,
            "requestheader-allowed-names": front_proxy(crate::pki::FRONT_PROXY_USER),
            "requestheader-username-headers": front_proxy("X-Remote-User"),
            "requestheader-group-headers": front_proxy("X-Remote-Group"),
            "requestheader-extra-headers-prefix": front_proxy("X-Remote-Extra-"),
        },
    });
    client
        .upsert(Resource::core("configmaps", Some("kube-system")), &trust)
        .await
        .map_err(|e| anyhow::anyhow!("publishing extension-apiserver-authentication: {e}"))?;
    Ok(())
}
