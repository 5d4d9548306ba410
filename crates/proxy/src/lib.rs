//! krust's Service data plane, kube-proxy's job: every node turns Services and their
//! EndpointSlices into nftables rules, so that a connection to a cluster IP (or a
//! NodePort on any of the node's addresses) reaches one of the Service's ready pods.
//!
//! It talks only to the apiserver: two watches (Services, EndpointSlices) feed caches;
//! any change schedules a sync, at most one per `min_sync_period` (upstream's default
//! is 1 s). A sync computes the [`model`] from the caches and the [`nft`] rules from
//! the model, and writes in one transaction only what differs from what the kernel
//! holds (upstream's partial sync); the first sync, one after any failed transaction,
//! one every hour and one when the table went missing (checked every `sync_period`)
//! load the whole table instead. Services whose external traffic stays on nodes with
//! endpoints get their [`health`] check ports answered.

pub mod health;
mod latency;
pub mod metrics;
pub mod model;
pub mod nft;

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use krust_api::cidr::Ipv4Cidr;
use std::sync::Arc;

use krust_client::cache::Cache;
use krust_client::informer::Informer;
use kube::Client;
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Objects kube-proxy leaves to others: headless Services (DNS answers for them) and
/// those that name another proxy implementation.
const NOT_OURS: &str = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";

#[derive(Clone, Debug)]
pub struct Config {
    /// The nftables table (family ip) the rules live in.
    pub table: String,
    /// Traffic from outside this range (not from a pod) is masqueraded.
    pub cluster_cidr: Ipv4Cidr,
    /// The node this proxy runs on: its endpoints are the local ones.
    pub node_name: String,
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    /// Where `/metrics` and `/healthz` are served (kube-proxy: 127.0.0.1:10249).
    pub metrics_address: Option<std::net::SocketAddr>,
}

/// Watches Services and EndpointSlices and keeps the node's rules in step, until the
/// future is dropped. The rules stay when it ends, as kube-proxy's do: connections keep
/// working across a restart.
pub async fn run(client: Client, config: Config) {
    let changed = Arc::new(Notify::new());
    let ours = || watcher::Config::default().labels(NOT_OURS);
    let services = Informer::<Service>::notifying(&client, ours(), &changed);
    let slices = Informer::<EndpointSlice>::notifying(&client, ours(), &changed);
    let caches = (services.cache(), slices.cache());
    let (metrics, registry) = metrics::Metrics::new();
    let _serving =
        krust_client::metrics::MetricsServer::start_if("proxy", config.metrics_address, registry)
            .await;
    tokio::select! {
        _ = services.run() => {}
        _ = slices.run() => {}
        _ = sync(&config, &caches.0, &caches.1, &changed, &metrics) => {}
    }
}

/// How often a full sync replaces the whole table even when updates went well
/// (upstream's nftables proxier: one hour).
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

async fn sync(
    config: &Config,
    services: &Cache<Service>,
    slices: &Cache<EndpointSlice>,
    changed: &Notify,
    metrics: &metrics::Metrics,
) {
    // Rules from half a picture would drop traffic that works now.
    futures::join!(services.wait_until_ready(), slices.wait_until_ready());
    tracing::info!(table = %config.table, "service proxy synced its caches");
    // What the kernel holds; `None` until a full sync has loaded the table, and again
    // after a failed transaction, when the table went missing or a full sync is due.
    let mut loaded: Option<nft::Loaded> = None;
    let mut health = health::HealthServer::default();
    let mut last_full = Instant::now();
    let mut last_check = Instant::now();
    let mut triggers = latency::Triggers::default();
    loop {
        // The sync's time, as kube-proxy measures it: the model, the rules and loading.
        let started = std::time::Instant::now();
        let services = services.state();
        let slices = slices.state();
        let ports = model::service_ports(
            services.iter().map(|s| &**s),
            slices.iter().map(|s| &**s),
            &config.node_name,
        );
        triggers.observe(slices.iter().map(|s| &**s));
        health
            .sync(&health::wanted(services.iter().map(|s| &**s), &ports))
            .await;
        let rules = nft::Ruleset::new(config.cluster_cidr, &ports);
        if loaded.is_some() && last_check.elapsed() >= config.sync_period {
            // Deleted behind our back: load it whole again.
            last_check = Instant::now();
            if !table_exists(&config.table).await {
                tracing::warn!(table = %config.table, "service rules table went missing");
                loaded = None;
            }
        }
        if last_full.elapsed() >= FULL_SYNC_PERIOD {
            loaded = None;
        }
        let (text, after) = match &loaded {
            Some(current) => current.update(&config.table, &rules).into_parts(),
            None => (rules.full(&config.table), nft::Loaded::full(&rules)),
        };
        let full = loaded.is_none();
        let result = if text.is_empty() {
            Ok(())
        } else {
            tokio::task::spawn_blocking(move || krust_net::nft::apply(&text))
                .await
                .unwrap_or_else(|e| Err(krust_net::nft::NftError::Rejected(e.to_string())))
        };
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                let latencies = triggers.programmed();
                tracing::debug!(
                    service_ports = ports.len(),
                    full,
                    changes = latencies.len(),
                    slices = slices.len(),
                    "service rules loaded"
                );
                metrics.synced(took, ports.len(), full);
                metrics.programmed(&latencies);
                loaded = Some(after);
                if full {
                    last_full = Instant::now();
                }
            }
            Err(err) => {
                tracing::error!(error = %err, full, "loading service rules failed; a full sync follows");
                metrics.failed(took);
                loaded = None;
            }
        }
        let last_sync = Instant::now();
        let wait = if loaded.is_some() {
            config.sync_period
        } else {
            config.min_sync_period
        };
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep_until(last_sync + config.min_sync_period).await;
    }
}

/// Whether the table is there; when nft cannot say, assume not (a reload tells more).
async fn table_exists(table: &str) -> bool {
    let table = table.to_string();
    tokio::task::spawn_blocking(move || krust_net::nft::table_exists(&table).unwrap_or(false))
        .await
        .unwrap_or(false)
}
