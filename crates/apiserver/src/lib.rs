//! The krust apiserver: Kubernetes REST over krust's MVCC store, assembled.
//!
//! A request goes through TLS (client certificates authenticate), authorization, the
//! generic REST handlers ([`rest`], from krust-generic-apiserver) with per-kind
//! strategies ([`kinds`]), admission ([`admission`]) and finally one store transaction. Reads and watches are served from
//! the [`watch_cache`], which one store watch keeps current.

/// The admission interface (generic) and the plugins krust enables.
pub mod admission {
    pub use krust_generic_apiserver::admission::*;
    pub mod plugins;
}
pub mod aggregator;
pub mod allocator;
mod bootstrap;
mod component_status;
pub mod connect;
pub mod custom;
pub mod discovery;
mod event_ttl;
pub mod join;
pub mod kinds;
pub mod kubernetes_service;
pub mod openapi;
pub mod openapi_v2;
pub mod resource_metrics;
mod server;
pub mod server_bootstrap;
pub mod snapshots;

// The generic layer, under the paths the rest of the crate and its users name.
pub use krust_generic_apiserver::{
    audit, auth, authz, encryption, loopback, metrics, outbound, pki, request, response, rest,
    table, token_file, tokens, validation, watch_cache, webhook,
};
use krust_generic_apiserver::{cel, compactor, health, json, recover, schema};

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use krust_store::Store;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::admission::Admission;
use crate::allocator::ServiceAllocator;
use crate::auth::{Authenticators, ClientCertificates};
use crate::authz::{Authorizers, PrivilegedGroups, rbac::Rbac};
use crate::watch_cache::WatchCache;

pub use server::serve_in_process;

/// The Kubernetes version krust serves.
pub const KUBE_VERSION: &str = "v1.33.0";

/// Apiserver settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the PKI lives (`<data-dir>/server/tls`).
    pub tls_dir: PathBuf,
    pub bind_address: IpAddr,
    pub port: u16,
    pub service_cidr: String,
    /// The address other components and the `kubernetes` Service use to reach us.
    pub advertise_address: IpAddr,
    /// Most non-mutating requests served at once (watches excluded); more get 429.
    pub max_requests_inflight: usize,
    /// Most mutating requests served at once; more get 429.
    pub max_mutating_requests_inflight: usize,
    /// How often this apiserver renews its identity lease and rewrites the `kubernetes`
    /// endpoints (upstream: 10 s).
    pub endpoint_reconcile_interval: std::time::Duration,
    /// How often history older than the previous interval is compacted (upstream's
    /// `--etcd-compaction-interval`, 5 minutes); zero disables compaction.
    pub compaction_interval: std::time::Duration,
    /// How long an Event lives after its last write (upstream's `--event-ttl`, one hour).
    pub event_ttl: std::time::Duration,
    /// Audit logging (`--audit-policy-file` and `--audit-log-path`); `None` logs nothing.
    pub audit: Option<audit::Config>,
    /// How often kubelets are scraped for the metrics API (metrics-server's
    /// `--metric-resolution`); zero serves no metrics.
    pub metric_resolution: std::time::Duration,
    /// The secret of the server's join token (`server:<secret>` authenticates a
    /// bootstrapper); `None` accepts only bootstrap tokens.
    pub join_secret: Option<String>,
    /// Static bearer tokens (upstream's `--token-auth-file`).
    pub token_auth_file: Option<PathBuf>,
    /// More CAs whose client certificates authenticate, beside the cluster CA (upstream's
    /// `--client-ca-file`), as PEM.
    pub client_ca_file: Option<PathBuf>,
    /// Where store snapshots go and their schedule; `None` offers none.
    pub snapshots: Option<snapshots::Config>,
    /// What joining servers are handed; `None` (an embedded store) lets none join.
    pub server_bootstrap: Option<server_bootstrap::Config>,
}

impl Config {
    /// An apiserver served in process on loopback (tests, fuzzing): certificates in
    /// `tls_dir`, upstream's limits, and none of the periodic work (compaction, Event
    /// expiry, metrics scraping) that would act behind the caller's back.
    pub fn in_process(tls_dir: PathBuf) -> Config {
        Config {
            tls_dir,
            bind_address: [127, 0, 0, 1].into(),
            port: 6443,
            service_cidr: "10.43.0.0/16".into(),
            advertise_address: [127, 0, 0, 1].into(),
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            endpoint_reconcile_interval: std::time::Duration::from_secs(10),
            compaction_interval: std::time::Duration::ZERO,
            event_ttl: std::time::Duration::ZERO,
            audit: None,
            metric_resolution: std::time::Duration::ZERO,
            join_secret: None,
            token_auth_file: None,
            client_ca_file: None,
            snapshots: None,
            server_bootstrap: None,
        }
    }
}

/// The assembled apiserver: the scope every request handler gets, and what only the
/// server itself uses (listeners' limits, aggregation, the kubelet client, the metrics
/// API, the CustomResourceDefinition state).
pub struct Api {
    pub scope: Arc<rest::Scope>,
    /// The kinds CustomResourceDefinitions add, kept in step with the watch cache.
    pub custom: Arc<custom::CustomKinds>,
    /// The Service registry's ClusterIPs and NodePorts.
    pub services: Arc<allocator::ServiceAllocator>,
    /// `host:port` clients are told to use.
    pub advertise: String,
    /// Bounds on concurrent requests (upstream's max-in-flight filter).
    pub inflight: server::InflightLimits,
    /// Where pods' logs, exec, attach and port-forward go.
    pub kubelet: connect::KubeletClient,
    /// The audit policy and log, when auditing.
    pub audit: Option<Arc<audit::Auditor>>,
    /// Nodes' and containers' CPU and memory, scraped from kubelets for the
    /// metrics.k8s.io API.
    pub resource_metrics: Arc<resource_metrics::MetricsServer>,
    /// The aggregated apiservers available now, and the client that reaches them.
    pub aggregator: aggregator::Aggregator,
    /// The cluster CA bundle (PEM), served unauthenticated at `/cacerts` for agents
    /// that pin it by the hash in their join token.
    pub ca_bundle: String,
    /// The store's snapshots, when this server keeps them.
    pub snapshots: Option<Arc<snapshots::Snapshots>>,
    /// What joining servers are handed, when servers may join.
    pub server_bootstrap: Option<server_bootstrap::Config>,
}

/// The kinds compiled in: the registry's and apiextensions' own.
fn built_in_kinds() -> impl Iterator<Item = &'static rest::Kind> {
    kinds::all().iter().chain(custom::definition_kinds())
}

/// The kinds this apiserver serves: the built-in ones and the custom ones.
struct ServedKinds(Arc<custom::CustomKinds>);

impl rest::Kinds for ServedKinds {
    fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static rest::Kind> {
        built_in_kinds()
            .find(|k| k.info.group == group && k.info.version == version && k.info.plural == plural)
            .or_else(|| self.0.find(group, version, plural))
    }

    fn find_custom_kind(
        &self,
        group: &str,
        version: &str,
        kind: &str,
    ) -> Option<&'static rest::Kind> {
        self.0.find_kind(group, version, kind)
    }

    fn all(&self) -> Vec<&'static rest::Kind> {
        built_in_kinds().chain(self.0.all()).collect()
    }
}

/// A started apiserver.
pub struct Running {
    pub addr: SocketAddr,
    pub pki: pki::Pki,
    pub task: tokio::task::JoinHandle<()>,
}

impl Api {
    /// Everything a request handler needs, on `store`: the PKI in `config.tls_dir`
    /// (created on first use), the watch cache loaded, and the objects every cluster has
    /// (default namespaces, the `kubernetes` Service reachable on `port`). Serves
    /// nothing yet: [`start`] puts it behind TLS, and tests call
    /// [`serve_in_process`] on it directly.
    pub async fn new(
        config: &Config,
        store: Arc<dyn Store>,
        port: u16,
    ) -> Result<(Arc<Api>, pki::Pki)> {
        let range = config
            .service_cidr
            .parse()
            .with_context(|| format!("invalid service CIDR {}", config.service_cidr))?;
        let services = Arc::new(ServiceAllocator::new(range));
        let mut sans = vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
            services.first_ip().to_string(),
            config.advertise_address.to_string(),
        ];
        if !config.bind_address.is_unspecified() {
            sans.push(config.bind_address.to_string());
        }
        sans.dedup();
        let pki = pki::Pki::load_or_create(&config.tls_dir, &sans)?;
        // One cache per storage prefix, by the kind of its storage version: the first of
        // the kinds stored there (core events before events.k8s.io events).
        let mut prefixes: Vec<(String, &'static dyn rest::strategy::Strategy)> = Vec::new();
        for kind in built_in_kinds().filter(|k| !k.info.is_virtual()) {
            let prefix = kind.info.storage_prefix();
            if !prefixes.iter().any(|(p, _)| *p == prefix) {
                prefixes.push((prefix, kind.strategy));
            }
        }
        let custom = Arc::new(custom::CustomKinds::default());
        let cache = WatchCache::start(store.clone(), prefixes, custom.clone())
            .await
            .context("loading the watch cache")?;
        if let Some(svc_cache) = cache.cache("/registry/services/specs/") {
            for svc in svc_cache.list("/registry/services/specs/").0 {
                services.observe(&svc.value());
            }
        }
        let tokens =
            Arc::new(tokens::TokenIssuer::new(&pki).context("loading the service-account key")?);
        let rbac = Arc::new(Rbac::new(&cache)?);
        let audit = match &config.audit {
            Some(audit) => Some(Arc::new(audit::Auditor::start(audit)?)),
            None => None,
        };
        let mut authenticators: Vec<Box<dyn auth::Authenticator>> = vec![
            Box::new(ClientCertificates),
            Box::new(tokens::ServiceAccountTokens {
                issuer: tokens.clone(),
                cache: cache.clone(),
            }),
            Box::new(join::BootstrapTokens {
                cache: cache.clone(),
            }),
        ];
        if let Some(path) = &config.token_auth_file {
            authenticators.push(Box::new(token_file::TokenFile::load(path)?));
        }
        if let Some(secret) = &config.join_secret {
            authenticators.push(Box::new(join::ServerToken {
                secret: secret.clone(),
            }));
        }
        let scope = Arc::new(rest::Scope {
            store,
            cache: cache.clone(),
            kinds: Arc::new(ServedKinds(custom.clone())),
            storage: kinds::storage(services.clone()),
            admission: Admission::new(admission::plugins::enabled()),
            authenticators: Authenticators(authenticators),
            authorizers: Authorizers(vec![
                Box::new(PrivilegedGroups),
                Box::new(authz::node::NodeAuthorizer {
                    cache: cache.clone(),
                }),
                Box::new(rbac.clone()),
            ]),
            rbac,
            metrics: Arc::new(metrics::Metrics::new()),
            tokens,
            webhooks: Arc::new(outbound::Client::new(&pki.ca_cert, None)),
        });
        let kubelet = connect::KubeletClient::new(&pki).context("building the kubelet client")?;
        let api = Arc::new(Api {
            scope: scope.clone(),
            custom,
            services: services.clone(),
            advertise: format!("{}:{port}", config.advertise_address),
            inflight: server::InflightLimits::new(
                config.max_requests_inflight,
                config.max_mutating_requests_inflight,
            ),
            kubelet: kubelet.clone(),
            audit,
            resource_metrics: Arc::new(resource_metrics::MetricsServer {
                samples: resource_metrics::Samples::new(config.metric_resolution),
                kubelet,
                cache,
            }),
            aggregator: aggregator::Aggregator::new(&pki),
            ca_bundle: pki.ca_cert.clone(),
            snapshots: config
                .snapshots
                .clone()
                .map(|c| snapshots::Snapshots::new(c, scope.store.clone())),
            server_bootstrap: config.server_bootstrap.clone(),
        });
        bootstrap::run(&api, &pki, services.first_ip(), port).await?;
        authz::bootstrap_policy::reconcile(&scope)
            .await
            .context("reconciling the bootstrap RBAC policy")?;
        Ok((api, pki))
    }
}

/// Starts the apiserver on `store` ([`Api::new`]), publishes this apiserver in the
/// `kubernetes` endpoints, then serves HTTPS until `shutdown` resolves.
pub async fn start(
    config: Config,
    store: Arc<dyn Store>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Running> {
    let listener = TcpListener::bind((config.bind_address, config.port))
        .await
        .with_context(|| format!("binding {}:{}", config.bind_address, config.port))?;
    let addr = listener.local_addr()?;
    let (api, pki) = Api::new(&config, store, addr.port()).await?;
    let client_cas = match &config.client_ca_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the client CA file {}", path.display()))?,
        ),
        None => None,
    };
    let acceptor = server::tls_acceptor(&pki, client_cas.as_deref())?;
    let reconciler = kubernetes_service::EndpointReconciler::new(
        api.clone(),
        config.advertise_address,
        addr.port(),
        config.endpoint_reconcile_interval,
    );
    reconciler
        .reconcile_once()
        .await
        .map_err(|e| anyhow::anyhow!("publishing the kubernetes endpoints: {e}"))?;
    tokio::spawn(reconciler.clone().run());
    tokio::spawn(bootstrap::keep_system_objects(
        api.clone(),
        api.services.first_ip(),
        addr.port(),
    ));
    tokio::spawn(custom::controller::run(
        api.scope.clone(),
        api.custom.clone(),
    ));
    tokio::spawn(aggregator::run(api.clone()));
    let shutdown = async move {
        shutdown.await;
        reconciler.leave().await;
    };
    if !config.compaction_interval.is_zero() {
        tokio::spawn(compactor::run(
            api.scope.store.clone(),
            config.compaction_interval,
        ));
    }
    if !config.event_ttl.is_zero() {
        tokio::spawn(event_ttl::run(api.clone(), config.event_ttl));
    }
    if !config.metric_resolution.is_zero() {
        tokio::spawn(resource_metrics::scrape(
            api.resource_metrics.clone(),
            config.metric_resolution,
        ));
    }
    if let Some(snapshots) = api.snapshots.clone() {
        tokio::spawn(snapshots.run_schedule(api.clone()));
    }
    let task = tokio::spawn(server::serve(api, listener, acceptor, shutdown));
    tracing::info!(%addr, "apiserver listening");
    Ok(Running { addr, pki, task })
}

/// The `/version` document.
pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": format!("{KUBE_VERSION}+krust-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("linux/{}", match std::env::consts::ARCH { "x86_64" => "amd64", "aarch64" => "arm64", other => other }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registry_entry_has_a_served_kind() {
        for r in krust_api::registry::RESOURCES {
            assert!(
                built_in_kinds().any(|k| k.info.group == r.group
                    && k.info.version == r.version
                    && k.info.plural == r.plural),
                "{}/{} {}",
                r.group,
                r.version,
                r.plural
            );
        }
    }
}
