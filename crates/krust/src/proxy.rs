//! `krust proxy`: the Service data plane alone (kube-proxy's place), against any
//! apiserver reachable through a kubeconfig. `krust agent` and `krust server` run the
//! same in-process unless `--disable-kube-proxy`.

use anyhow::{Context, Result};
use clap::Args;
use krust_api::cidr::Ipv4Cidr;

/// The proxy's flags, shared by `krust proxy`, `krust agent` and `krust server`.
#[derive(Args, Clone, Debug)]
pub struct ProxyArgs {
    /// Do not run the Service proxy (k3s's flag): Services then need another data plane.
    #[arg(long)]
    disable_kube_proxy: bool,
    /// The nftables table (family ip) that holds the Service rules.
    #[arg(long, default_value = "krust")]
    nftables_table: String,
    /// The shortest time between two rule syncs (upstream's `--min-sync-period`).
    #[arg(long, default_value = "1s", value_parser = crate::cli::parse_duration)]
    min_sync_period: std::time::Duration,
    /// How often the proxy checks that its table is still there, loading it again if
    /// it was deleted (upstream's `--sync-period`).
    #[arg(long, default_value = "30s", value_parser = crate::cli::parse_duration)]
    sync_period: std::time::Duration,
    /// Where the proxy serves `/metrics` and `/healthz` (kube-proxy's port; 0: nowhere).
    #[arg(long, default_value = "127.0.0.1:10249")]
    proxy_metrics_address: crate::cli::MetricsAddress,
}

impl ProxyArgs {
    /// The proxy's configuration on node `node_name`, or `None` when it is disabled.
    pub fn config(&self, cluster_cidr: Ipv4Cidr, node_name: &str) -> Option<krust_proxy::Config> {
        (!self.disable_kube_proxy).then(|| krust_proxy::Config {
            table: self.nftables_table.clone(),
            cluster_cidr,
            node_name: node_name.to_string(),
            min_sync_period: self.min_sync_period,
            sync_period: self.sync_period,
            metrics_address: self.proxy_metrics_address.0,
        })
    }
}

#[derive(Args)]
pub struct ProxyCommand {
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    /// The pods' address range: traffic from outside it is masqueraded.
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: Ipv4Cidr,
    /// The name of this node (kube-proxy's flag): endpoints on it are local, for
    /// Services whose traffic policy is `Local`. Default: the hostname.
    #[arg(long)]
    hostname_override: Option<String>,
    #[command(flatten)]
    proxy: ProxyArgs,
}

/// `krust proxy`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: ProxyCommand) -> Result<()> {
    let yaml = args.kubeconfig.read()?;
    let config = args
        .proxy
        .config(
            args.cluster_cidr,
            &args.hostname_override.unwrap_or_else(crate::cli::hostname),
        )
        .context("--disable-kube-proxy leaves `krust proxy` nothing to do")?;
    let (client, _) = krust_client::connect::from_kubeconfig(&yaml).await?;
    tokio::select! {
        _ = krust_proxy::run(client, config) => {}
        _ = crate::cli::shutdown_signal() => {}
    }
    Ok(())
}
