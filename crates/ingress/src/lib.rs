//! krust's Ingress controller (what k3s ships Traefik for): an HTTP reverse proxy whose
//! routes are the Ingress objects of its class, sending each request straight to a ready
//! pod of the backend Service (as ingress-nginx does, without the Service proxy's hop).
//!
//! It watches Ingresses, Services, EndpointSlices and TLS Secrets, rebuilds its
//! [`routes`] and its [`tls`] certificates on every change, serves HTTP and HTTPS
//! (HTTP/2 through ALPN), reports the address it serves on in each Ingress's
//! `status.loadBalancer.ingress`, and registers its IngressClass (`krust`, the default
//! class: Ingresses without a class are served too). The same proxy serves the
//! [`gateway`] API: Gateways, HTTPRoutes and GRPCRoutes of the `krust` GatewayClass.

pub mod access;
pub mod annotations;
pub mod gateway;
pub mod metrics;
pub mod routes;
pub mod serve;
pub mod tls;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::serde_json::json;
use krust_api::sync::UnpoisonedRw;
use krust_client::informer::Informer;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;

use routes::{Routes, Services};

/// The controller name in the IngressClass.
pub const CONTROLLER: &str = "krust.io/ingress";
const MANAGER: &str = "krust-ingress";
/// The pre-IngressClass way of naming a class.
const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
const RETRY: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct Config {
    /// Where HTTP is served.
    pub listen: SocketAddr,
    /// Where HTTPS is served (TLS from the Ingresses' `spec.tls`).
    pub https_listen: SocketAddr,
    /// The IngressClass served.
    pub class: String,
    /// The address reported in the Ingresses' status.
    pub status_ip: Ipv4Addr,
    /// Where `/metrics` and `/healthz` are served (ingress-nginx: :10254).
    pub metrics_address: Option<SocketAddr>,
    /// Where one line per request goes (`-`: standard output); none without.
    pub access_log: Option<std::path::PathBuf>,
    /// How long a client may take for its TLS handshake, its first byte and each
    /// request's headers.
    pub client_header_timeout: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("making the default certificate: {0}")]
    Certificate(#[source] rcgen::Error),
    #[error("opening the access log {0}: {1}")]
    AccessLog(std::path::PathBuf, #[source] std::io::Error),
}

/// Retries `what` until it succeeds, with a warning each time it fails.
async fn until_done<E: std::fmt::Display, F: std::future::Future<Output = Result<(), E>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) {
    while let Err(err) = attempt().await {
        tracing::warn!(error = %err, "{what} failed; retrying");
        tokio::time::sleep(RETRY).await;
    }
}

/// Serves Ingresses until the future is dropped.
pub async fn run(client: Client, config: Config) -> Result<(), Error> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Listen(config.listen, e))?;
    let https_listener = TcpListener::bind(config.https_listen)
        .await
        .map_err(|e| Error::Listen(config.https_listen, e))?;
    let tls = Arc::new(tls::Resolver::new().map_err(Error::Certificate)?);
    let access_log = (config.access_log.as_ref())
        .map(|path| access::AccessLog::open(path).map_err(|e| Error::AccessLog(path.clone(), e)))
        .transpose()?;
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(tls.clone())));
    let changed = Arc::new(Notify::new());
    let all = watcher::Config::default;
    let ingresses_informer = Informer::<Ingress>::notifying(&client, all(), &changed);
    let services_informer = Informer::<Service>::notifying(&client, all(), &changed);
    let slices_informer = Informer::<EndpointSlice>::notifying(&client, all(), &changed);
    let tls_secrets = || watcher::Config::default().fields("type=kubernetes.io/tls");
    let secrets_informer = Informer::<Secret>::notifying(&client, tls_secrets(), &changed);
    let (ingresses, services, slices, secrets) = (
        ingresses_informer.cache(),
        services_informer.cache(),
        slices_informer.cache(),
        secrets_informer.cache(),
    );
    let gateways = gateway::Informers::new(&client, &changed);
    let routes: serve::SharedRoutes = Arc::default();
    let (metrics, registry) = metrics::Metrics::new(&config.class);
    let _serving =
        krust_client::metrics::MetricsServer::start_if("ingress", config.metrics_address, registry)
            .await;
    let ingress_ports = (config.listen.port(), config.https_listen.port());
    let proxy = serve::Proxy::new(
        routes.clone(),
        tls.clone(),
        ingress_ports,
        metrics,
        (access_log, config.client_header_timeout),
    );
    // The Gateway API's CRDs, installed beside the Ingresses' work (credentials that
    // may not install them leave Ingresses served); the loop below hears when its
    // caches are complete.
    let gateway_api = async {
        until_done("installing the Gateway API", || gateway::install(&client)).await;
        gateways.wait_until_ready().await;
        changed.notify_one();
        std::future::pending::<()>().await
    };
    let control = async {
        futures::join!(
            ingresses.wait_until_ready(),
            services.wait_until_ready(),
            slices.wait_until_ready(),
            secrets.wait_until_ready(),
        );
        until_done("registering the IngressClass", || {
            register_class(&client, &config.class)
        })
        .await;
        let mut ports = gateway::Ports::new(ingress_ports);
        loop {
            let ours: Vec<Arc<Ingress>> = ingresses
                .state()
                .into_iter()
                .filter(|i| serves(i, &config.class))
                .collect();
            let (all_services, all_slices, all_secrets) =
                (services.state(), slices.state(), secrets.state());
            let index = Services::new(
                all_services.iter().map(|s| &**s),
                all_slices.iter().map(|s| &**s),
            );
            let ingress = Routes::new(ours.iter().map(|i| &**i), &index);
            let mut certificates =
                tls::Certificates::new(ours.iter().map(|i| &**i), all_secrets.iter().map(|s| &**s));
            let snapshot = gateways.snapshot();
            let world = snapshot.world(&all_secrets, &index, config.status_ip);
            // Routes judged against Gateways not listed yet would lose their status.
            let plan = if gateways.is_ready() {
                ports.sync(&gateway::plan::ports(&world), &proxy, &acceptor);
                gateway::plan::Plan::new(&world, &|port, protocol| ports.listening(port, protocol))
            } else {
                gateway::plan::Plan::default()
            };
            for (host, key) in &plan.certificates {
                certificates.add_listener(host, key.clone());
            }
            *tls.table.write_locked() = Arc::new(certificates);
            *routes.write_locked() = Arc::new(serve::Tables {
                ingress,
                gateways: plan.tables,
            });
            snapshot.report(&client, &plan.reports).await;
            for ingress in &ours {
                if let Err(err) = report_address(&client, ingress, config.status_ip).await {
                    tracing::warn!(ingress = %ingress.name_any(), error = %err, "updating ingress status failed");
                }
            }
            changed.notified().await;
        }
    };
    tracing::info!(listen = %config.listen, https = %config.https_listen, class = %config.class, "ingress controller serving");
    tokio::select! {
        _ = ingresses_informer.run() => {}
        _ = services_informer.run() => {}
        _ = slices_informer.run() => {}
        _ = secrets_informer.run() => {}
        _ = gateways.run() => {}
        _ = gateway_api => {}
        _ = control => {}
        _ = serve::serve(listener, proxy.clone(), None) => {}
        _ = serve::serve(https_listener, proxy.clone(), Some(acceptor.clone())) => {}
    }
    Ok(())
}

/// Whether an Ingress is this controller's: its class, or no class at all (ours is
/// the default class).
fn serves(ingress: &Ingress, class: &str) -> bool {
    let named = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| {
            ingress
                .annotations()
                .get(CLASS_ANNOTATION)
                .map(String::as_str)
        });
    named.is_none_or(|c| c == class)
}

/// The IngressClass, marked as the cluster's default.
async fn register_class(client: &Client, class: &str) -> Result<(), kube::Error> {
    let classes: Api<IngressClass> = Api::all(client.clone());
    let object = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": class, "annotations": {
            "ingressclass.kubernetes.io/is-default-class": "true"}},
        "spec": {"controller": CONTROLLER},
    });
    classes
        .patch(
            class,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await?;
    Ok(())
}

/// Sets `status.loadBalancer.ingress` to this controller's address, unless it says so.
async fn report_address(
    client: &Client,
    ingress: &Ingress,
    ip: Ipv4Addr,
) -> Result<(), kube::Error> {
    let current = ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let wanted = ip.to_string();
    if current.is_some_and(|list| list.len() == 1 && list[0].ip.as_deref() == Some(wanted.as_str()))
    {
        return Ok(());
    }
    let api: Api<Ingress> =
        Api::namespaced(client.clone(), &ingress.namespace().unwrap_or_default());
    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": wanted}]}}});
    api.patch_status(
        &ingress.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}
