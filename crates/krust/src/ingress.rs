//! `krust ingress`: the Ingress controller alone (Traefik's place in k3s), against any
//! apiserver reachable through a kubeconfig. `krust server` runs the same in-process
//! unless `--disable-ingress`.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{Context, Result};
use clap::Args;

/// The Ingress controller's own flags, shared by `krust ingress` and `krust server`.
#[derive(Args, Clone, Debug)]
pub struct IngressArgs {
    /// Do not run the Ingress controller in this process (k3s: `--disable traefik`).
    #[arg(long)]
    disable_ingress: bool,
    /// The port HTTP Ingress traffic is served on, on every address.
    #[arg(long, default_value_t = 80)]
    ingress_http_port: u16,
    /// The port HTTPS Ingress traffic is served on, on every address (TLS from the
    /// Ingresses' `spec.tls` Secrets).
    #[arg(long, default_value_t = 443)]
    ingress_https_port: u16,
    /// The IngressClass served (Ingresses without a class are served too).
    #[arg(long, default_value = "krust")]
    ingress_class: String,
    /// Where the Ingress controller serves `/metrics` and `/healthz` (ingress-nginx's
    /// port; 0: nowhere).
    #[arg(long, default_value = "127.0.0.1:10254")]
    ingress_metrics_address: crate::cli::MetricsAddress,
    /// Where the Ingress controller writes one line per request, in ingress-nginx's
    /// format (`-`: standard output); no access log without it.
    #[arg(long)]
    ingress_access_log: Option<std::path::PathBuf>,
    /// How long a client may take for its TLS handshake, its first byte and each
    /// request's headers before its connection is closed (ingress-nginx's
    /// `client-header-timeout`).
    #[arg(long, default_value = "60s", value_parser = crate::cli::parse_duration)]
    ingress_client_header_timeout: std::time::Duration,
}

impl IngressArgs {
    /// The configuration for a controller reporting `node_ip`, or `None` when disabled.
    pub fn config(&self, node_ip: Ipv4Addr) -> Option<krust_ingress::Config> {
        (!self.disable_ingress).then(|| krust_ingress::Config {
            listen: SocketAddr::from(([0, 0, 0, 0], self.ingress_http_port)),
            https_listen: SocketAddr::from(([0, 0, 0, 0], self.ingress_https_port)),
            class: self.ingress_class.clone(),
            status_ip: node_ip,
            metrics_address: self.ingress_metrics_address.0,
            access_log: self.ingress_access_log.clone(),
            client_header_timeout: self.ingress_client_header_timeout,
        })
    }
}

#[derive(Args)]
pub struct IngressCommand {
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    /// The address reported in Ingress status (default: the default route's source).
    #[arg(long)]
    node_ip: Option<Ipv4Addr>,
    #[command(flatten)]
    ingress: IngressArgs,
}

/// `krust ingress`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: IngressCommand) -> Result<()> {
    let yaml = args.kubeconfig.read()?;
    let node_ip = args.node_ip.unwrap_or_else(krust_kubelet::machine::node_ip);
    let config = args
        .ingress
        .config(node_ip)
        .context("--disable-ingress leaves `krust ingress` nothing to do")?;
    serve(&yaml, config, crate::cli::shutdown_signal()).await
}

/// Serves Ingresses for the apiserver of `kubeconfig` until `shutdown`.
pub async fn serve(
    kubeconfig: &str,
    config: krust_ingress::Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (client, _) = krust_client::connect::from_kubeconfig(kubeconfig).await?;
    crate::cli::until_shutdown(
        "ingress controller",
        krust_ingress::run(client, config),
        shutdown,
    )
    .await
}
