//! krust's Service data plane, kube-proxy's job: every node turns Services and their
//! EndpointSlices into nftables rules, so that a connection to a cluster IP (or a
//! NodePort on any of the node's addresses) reaches one of the Service's ready pods.
//!
//! It talks only to the apiserver: two watches (Services, EndpointSlices) feed caches;
//! any change schedules a sync, at most one per `min_sync_period` (upstream's default
//! is 1 s). A sync computes the [`model`] from the caches and loads the whole [`nft`]
//! table in one transaction when it differs from what was loaded last; every
//! `sync_period` the proxy also checks that its table is still there and loads it again
//! if it was deleted behind its back. Services whose external traffic stays on nodes
//! with endpoints get their [`health`] check ports answered.

pub mod health;
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
    let mut loaded: Option<String> = None;
    let mut last_sync = Instant::now();
    let mut health = health::HealthServer::default();
    loop {
        // The sync's time, as kube-proxy measures it: the model, the rules and loading.
        let started = std::time::Instant::now();
        let services = services.state();
        let ports = model::service_ports(
            services.iter().map(|s| &**s),
            slices.state().iter().map(|s| &**s),
            &config.node_name,
        );
        health
            .sync(&health::wanted(services.iter().map(|s| &**s), &ports))
            .await;
        let ruleset = nft::render(&config.table, config.cluster_cidr, &ports);
        // Unchanged rules are loaded again only if the table went missing (deleted
        // behind our back): reloading a large table costs seconds of CPU.
        let unchanged = loaded.as_deref() == Some(ruleset.as_str());
        let repair = unchanged
            && last_sync.elapsed() >= config.sync_period
            && !table_exists(&config.table).await;
        if !unchanged || repair {
            let text = ruleset.clone();
            let result = tokio::task::spawn_blocking(move || krust_net::nft::apply(&text))
                .await
                .unwrap_or_else(|e| Err(krust_net::nft::NftError::Rejected(e.to_string())));
            let took = started.elapsed().as_secs_f64();
            match result {
                Ok(()) => {
                    tracing::debug!(service_ports = ports.len(), "service rules loaded");
                    metrics.synced(took, ports.len());
                    loaded = Some(ruleset);
                }
                Err(err) => {
                    tracing::error!(error = %err, "loading service rules failed; retrying");
                    metrics.failed(took);
                    loaded = None;
                }
            }
            last_sync = Instant::now();
        } else if last_sync.elapsed() >= config.sync_period {
            last_sync = Instant::now();
        }
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
