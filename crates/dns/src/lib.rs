//! krust's cluster DNS (CoreDNS's place in a cluster): answers for Service and pod names
//! under the cluster domain from watches of Services and EndpointSlices, and forwards
//! every other question to the host's nameservers.
//!
//! The server listens on the node's address and [`publish`]es itself as the endpoint of
//! the `kube-system/kube-dns` Service, whose cluster IP is the nameserver in every pod's
//! resolv.conf; the Service proxy carries pods' queries to it. Like every component it
//! talks only to the apiserver.

pub mod metrics;
pub mod publish;
pub mod server;
pub mod zone;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use krust_api::sync::UnpoisonedRw;
use krust_client::cache::Cache;
use krust_client::informer::Informer;
use kube::Client;
use kube::runtime::watcher;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Notify;

use zone::Zone;

#[derive(Clone, Debug)]
pub struct Config {
    /// The cluster domain (`cluster.local`).
    pub domain: String,
    /// Where the server listens: the node's address, port 53 unless told otherwise.
    pub listen: SocketAddrV4,
    /// The cluster IP of the `kube-dns` Service (the kubelet's `--cluster-dns`).
    pub service_ip: Ipv4Addr,
    /// Where other names are resolved.
    pub upstreams: Vec<SocketAddr>,
    /// Names this server's EndpointSlice (`kube-dns-<instance>`).
    pub instance: String,
    /// Where `/metrics` and `/healthz` are served (CoreDNS: :9153).
    pub metrics_address: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listening on {0}: {1}")]
    Listen(SocketAddrV4, #[source] std::io::Error),
}

/// How long a TCP client may stay idle, and how many answers it may have queued.
const TCP_IDLE: Duration = Duration::from_secs(10);
const TCP_BUFFER: usize = 64;
/// How long to wait before publishing again after the apiserver refused.
const PUBLISH_RETRY: Duration = Duration::from_secs(2);

/// Serves the cluster's names until the future is dropped.
pub async fn run(client: Client, config: Config) -> Result<(), Error> {
    let listen = config.listen;
    let udp = UdpSocket::bind(listen)
        .await
        .map_err(|e| Error::Listen(listen, e))?;
    let tcp = TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Listen(listen, e))?;
    let changed = Arc::new(Notify::new());
    let all = watcher::Config::default;
    let services_informer = Informer::<Service>::notifying(&client, all(), &changed);
    let slices_informer = Informer::<EndpointSlice>::notifying(&client, all(), &changed);
    let (services, slices) = (services_informer.cache(), slices_informer.cache());
    let zone: server::SharedZone = Arc::default();
    let (metrics, registry) = metrics::Metrics::new(listen);
    let _serving =
        krust_client::metrics::MetricsServer::start_if("dns", config.metrics_address, registry)
            .await;
    let serve = async {
        // An empty zone would deny names that exist: answer only from complete lists.
        futures::join!(services.wait_until_ready(), slices.wait_until_ready());
        refresh(&zone, &config.domain, &services, &slices);
        let handler = server::Handler::new(
            &config.domain,
            zone.clone(),
            config.upstreams.clone(),
            metrics,
        );
        let mut dns = hickory_server::Server::new(handler);
        dns.register_socket(udp);
        dns.register_listener(tcp, TCP_IDLE, TCP_BUFFER);
        tracing::info!(%listen, domain = %config.domain, upstreams = ?config.upstreams, "cluster DNS serving");
        while let Err(err) =
            publish::publish(&client, config.service_ip, listen, &config.instance).await
        {
            tracing::warn!(error = %err, "publishing the cluster DNS endpoint failed; retrying");
            tokio::time::sleep(PUBLISH_RETRY).await;
        }
        loop {
            changed.notified().await;
            refresh(&zone, &config.domain, &services, &slices);
        }
    };
    tokio::select! {
        _ = services_informer.run() => {}
        _ = slices_informer.run() => {}
        _ = serve => {}
    }
    Ok(())
}

/// Rebuilds the zone snapshot from the caches.
fn refresh(
    zone: &server::SharedZone,
    domain: &str,
    services: &Cache<Service>,
    slices: &Cache<EndpointSlice>,
) {
    let fresh = Zone::new(
        domain,
        services.state().iter().map(|s| &**s),
        slices.state().iter().map(|s| &**s),
    );
    *zone.write_locked() = Arc::new(fresh);
}
