//! `krust dns`: the cluster DNS alone (CoreDNS's place), against any apiserver reachable
//! through a kubeconfig. `krust server` runs the same in-process unless `--disable-dns`.

use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result};
use clap::Args;

/// The DNS server's own flags, shared by `krust dns` and `krust server`.
#[derive(Args, Clone, Debug)]
pub struct DnsArgs {
    /// Do not run the cluster DNS in this process (k3s: `--disable coredns`).
    #[arg(long)]
    disable_dns: bool,
    /// The port the DNS server listens on, on the node's address (the kube-dns
    /// Service's port 53 is forwarded to it).
    #[arg(long, default_value_t = 53)]
    dns_port: u16,
    /// A nameserver for names outside the cluster (repeatable; default: the
    /// nameservers of /etc/resolv.conf).
    #[arg(long)]
    dns_upstream: Vec<std::net::SocketAddr>,
    /// Where the DNS server serves `/metrics` and `/healthz` (CoreDNS's port; 0: nowhere).
    #[arg(long, default_value = "127.0.0.1:9153")]
    dns_metrics_address: crate::cli::MetricsAddress,
}

impl DnsArgs {
    /// The DNS configuration for a server on `node_ip` answering as `service_ip` in
    /// `domain`, or `None` when disabled.
    pub fn config(
        &self,
        node_ip: Ipv4Addr,
        service_ip: Ipv4Addr,
        domain: &str,
        instance: String,
    ) -> Option<krust_dns::Config> {
        if self.disable_dns {
            return None;
        }
        let upstreams = if self.dns_upstream.is_empty() {
            let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            krust_dns::server::upstreams_of(&conf)
        } else {
            self.dns_upstream.clone()
        };
        Some(krust_dns::Config {
            domain: domain.to_string(),
            listen: SocketAddrV4::new(node_ip, self.dns_port),
            service_ip,
            upstreams,
            instance,
            metrics_address: self.dns_metrics_address.0,
        })
    }
}

#[derive(Args)]
pub struct DnsCommand {
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    /// The address to listen on (default: the default route's source).
    #[arg(long)]
    node_ip: Option<Ipv4Addr>,
    /// The cluster IP of the kube-dns Service (the kubelets' `--cluster-dns`).
    #[arg(long, default_value = "10.43.0.10")]
    cluster_dns: Ipv4Addr,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    #[command(flatten)]
    dns: DnsArgs,
}

/// `krust dns`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: DnsCommand) -> Result<()> {
    let yaml = args.kubeconfig.read()?;
    let node_ip = args.node_ip.unwrap_or_else(krust_kubelet::machine::node_ip);
    let config = args
        .dns
        .config(
            node_ip,
            args.cluster_dns,
            &args.cluster_domain,
            crate::cli::hostname(),
        )
        .context("--disable-dns leaves `krust dns` nothing to do")?;
    serve(&yaml, config, crate::cli::shutdown_signal()).await
}

/// Serves the cluster DNS for the apiserver of `kubeconfig` until `shutdown`.
pub async fn serve(
    kubeconfig: &str,
    config: krust_dns::Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (client, _) = krust_client::connect::from_kubeconfig(kubeconfig).await?;
    crate::cli::until_shutdown("cluster DNS", krust_dns::run(client, config), shutdown).await
}
