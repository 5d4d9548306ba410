//! The krust apiserver: Kubernetes REST over krust's MVCC store.
//!
//! A request goes through TLS (client certificates authenticate), authorization, the
//! generic REST handlers ([`rest`]) with per-kind strategies ([`kinds`]), admission
//! ([`admission`]) and finally one store transaction. Reads and watches are served from
//! the [`watch_cache`], which one store watch keeps current.

pub mod admission;
pub mod aggregator;
pub mod allocator;
pub mod audit;
pub mod auth;
pub mod authz;
mod bootstrap;
mod cel;
mod compactor;
mod component_status;
pub mod connect;
pub mod custom;
pub mod discovery;
pub mod encryption;
mod event_ttl;
mod first_byte;
pub mod join;
mod json;
pub mod kinds;
pub mod kubernetes_service;
pub mod loopback;
pub mod metrics;
pub mod openapi;
pub mod openapi_v2;
pub mod outbound;
pub mod pki;
mod recover;
pub mod request;
pub mod resource_metrics;
pub mod response;
pub mod rest;
mod schema;
mod server;
pub mod table;
pub mod token_file;
pub mod tokens;
pub mod validation;
pub mod watch_cache;
pub mod webhook;

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
        }
    }
}

/// Everything a request handler needs.
pub struct Api {
    pub store: Arc<dyn Store>,
    pub cache: Arc<WatchCache>,
    /// The kinds CustomResourceDefinitions add, kept in step with the watch cache.
    pub custom: Arc<custom::CustomKinds>,
    pub admission: Admission,
    /// The Service registry's ClusterIPs and NodePorts.
    pub services: Arc<allocator::ServiceAllocator>,
    pub authenticators: Authenticators,
    /// The authorization chain: `system:masters`, then RBAC.
    pub authorizers: Authorizers,
    pub rbac: Arc<Rbac>,
    pub metrics: Arc<metrics::Metrics>,
    /// `host:port` clients are told to use.
    pub advertise: String,
    /// Bounds on concurrent requests (upstream's max-in-flight filter).
    pub inflight: server::InflightLimits,
    /// Where pods' logs, exec, attach and port-forward go.
    pub kubelet: connect::KubeletClient,
    /// Issues service-account tokens (and checks them, as an authenticator).
    pub tokens: Arc<tokens::TokenIssuer>,
    /// The audit policy and log, when auditing.
    pub audit: Option<Arc<audit::Auditor>>,
    /// Nodes' and containers' CPU and memory, scraped from kubelets for the
    /// metrics.k8s.io API.
    pub resource_metrics: resource_metrics::Samples,
    /// The HTTPS client of admission webhooks.
    pub webhooks: Arc<outbound::Client>,
    /// The aggregated apiservers available now, and the client that reaches them.
    pub aggregator: aggregator::Aggregator,
    /// The cluster CA bundle (PEM), served unauthenticated at `/cacerts` for agents
    /// that pin it by the hash in their join token.
    pub ca_bundle: String,
}

/// A started apiserver.
pub struct Running {
    pub addr: SocketAddr,
    pub pki: pki::Pki,
    pub task: tokio::task::JoinHandle<()>,
}

impl Api {
    /// The kind serving `plural` in `group`/`version`: built in, or added by a
    /// CustomResourceDefinition.
    pub fn kind(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<&'static crate::rest::Kind> {
        kinds::find(group, version, plural).or_else(|| self.custom.find(group, version, plural))
    }

    /// Every kind served now: the built-in ones, then those of the custom resources.
    pub fn kinds(&self) -> impl Iterator<Item = &'static crate::rest::Kind> {
        kinds::all().iter().chain(self.custom.all())
    }

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
        let prefixes = kinds::all()
            .iter()
            .filter(|k| !k.info.is_virtual())
            .filter(|k| kinds::for_storage(k.info.storage).is_some_and(|s| std::ptr::eq(s, *k)))
            .map(|k| (k.info.storage_prefix(), k.strategy))
            .collect();
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
        let api = Arc::new(Api {
            store,
            cache: cache.clone(),
            custom,
            admission: Admission::new(admission::plugins::enabled()),
            services: services.clone(),
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
            advertise: format!("{}:{port}", config.advertise_address),
            inflight: server::InflightLimits::new(
                config.max_requests_inflight,
                config.max_mutating_requests_inflight,
            ),
            kubelet: connect::KubeletClient::new(&pki).context("building the kubelet client")?,
            tokens,
            audit,
            resource_metrics: resource_metrics::Samples::new(config.metric_resolution),
            webhooks: Arc::new(outbound::Client::new(&pki.ca_cert, None)),
            aggregator: aggregator::Aggregator::new(&pki),
            ca_bundle: pki.ca_cert.clone(),
        });
        bootstrap::run(&api, &pki, services.first_ip(), port).await?;
        authz::bootstrap_policy::reconcile(&api)
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
    tokio::spawn(custom::controller::run(api.clone()));
    tokio::spawn(aggregator::run(api.clone()));
    let shutdown = async move {
        shutdown.await;
        reconciler.leave().await;
    };
    if !config.compaction_interval.is_zero() {
        tokio::spawn(compactor::run(
            api.store.clone(),
            config.compaction_interval,
        ));
    }
    if !config.event_ttl.is_zero() {
        tokio::spawn(event_ttl::run(api.clone(), config.event_ttl));
    }
    if !config.metric_resolution.is_zero() {
        tokio::spawn(resource_metrics::scrape(
            api.clone(),
            config.metric_resolution,
        ));
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
