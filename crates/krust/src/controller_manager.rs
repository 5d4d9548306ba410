//! `krust controller-manager`: the controllers alone, against any apiserver reachable
//! through a kubeconfig (krust's or upstream's), with Lease-based leader election so
//! several instances can run active/standby. `krust server` runs the same thing
//! in-process, connected to its own apiserver with the admin credentials.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use krust_api::cidr::Ipv4Cidr;

use crate::cli::parse_duration;

#[derive(Args)]
pub struct ControllerManagerArgs {
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    #[command(flatten)]
    pub controllers: ControllerArgs,
}

/// What the controllers do, for `krust controller-manager` and `krust server` alike.
#[derive(Args, Clone, Debug)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub leader: LeaderElectionArgs,
    /// Give every Node a pod range (spec.podCIDR) from --cluster-cidr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allocate_node_cidrs: bool,
    /// Pod IP range of the cluster, cut into one range per node.
    #[arg(long, default_value = "10.42.0.0/16")]
    pub cluster_cidr: Ipv4Cidr,
    /// Prefix length of each node's pod range.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// How often each HorizontalPodAutoscaler measures its target and scales it.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    horizontal_pod_autoscaler_sync_period: std::time::Duration,
    /// PEM CA certificate that issues approved certificate signing requests (`krust
    /// server`: the cluster CA).
    #[arg(long)]
    pub cluster_signing_cert_file: Option<PathBuf>,
    /// Its PEM private key.
    #[arg(long)]
    pub cluster_signing_key_file: Option<PathBuf>,
    /// The longest validity of an issued certificate.
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    cluster_signing_duration: std::time::Duration,
    /// How long a node may go without reporting (status or Lease) before it is
    /// `Unknown` and its pods are marked not ready.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    node_monitor_grace_period: std::time::Duration,
    /// How often nodes' health is checked.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    node_monitor_period: std::time::Duration,
    /// Nodes per second given NoExecute taints (their pods then evicted) in a healthy
    /// zone.
    #[arg(long, default_value_t = 0.1)]
    node_eviction_rate: f64,
    /// The same when most of a zone's nodes are down (large clusters only; small ones
    /// stop evicting).
    #[arg(long, default_value_t = 0.01)]
    secondary_node_eviction_rate: f64,
    /// Finished pods (Succeeded or Failed) kept before the oldest are deleted (0 keeps
    /// them all).
    #[arg(long, default_value_t = krust_controllers::podgc::TERMINATED_POD_GC_THRESHOLD)]
    terminated_pod_gc_threshold: usize,
    /// Built-in parts to leave out (k3s's flag): `servicelb` leaves LoadBalancer
    /// Services pending for another implementation.
    #[arg(long, value_delimiter = ',')]
    disable: Vec<Disable>,
    /// Where the controller manager serves `/metrics` and `/healthz` (its upstream port;
    /// 0: nowhere).
    #[arg(long, default_value = "127.0.0.1:10257")]
    controller_manager_metrics_address: crate::cli::MetricsAddress,
}

/// What `--disable` can leave out.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disable {
    Servicelb,
}

impl ControllerArgs {
    /// Signs with the CA in `tls_dir` unless the signing flags name another.
    pub fn sign_with_cluster_ca(&mut self, tls_dir: &std::path::Path) {
        if self.cluster_signing_cert_file.is_none() && self.cluster_signing_key_file.is_none() {
            self.cluster_signing_cert_file = Some(tls_dir.join("ca.crt"));
            self.cluster_signing_key_file = Some(tls_dir.join("ca.key"));
        }
    }

    fn signing(&self) -> Result<Option<krust_controllers::certificates::SigningConfig>> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        };
        match (
            &self.cluster_signing_cert_file,
            &self.cluster_signing_key_file,
        ) {
            (Some(cert), Some(key)) => Ok(Some(krust_controllers::certificates::SigningConfig {
                ca_cert_pem: read(cert)?,
                ca_key_pem: read(key)?,
                duration: self.cluster_signing_duration,
            })),
            (None, None) => Ok(None),
            _ => anyhow::bail!(
                "--cluster-signing-cert-file and --cluster-signing-key-file go together"
            ),
        }
    }

    fn config(&self) -> Result<krust_controllers::Config> {
        let mut config = self.leader.config()?;
        if self.allocate_node_cidrs {
            anyhow::ensure!(
                self.cluster_cidr.subnet_count(self.node_cidr_mask_size) > 0
                    && self.node_cidr_mask_size <= 30,
                "--node-cidr-mask-size {} does not fit in --cluster-cidr {}",
                self.node_cidr_mask_size,
                self.cluster_cidr
            );
            config.node_ipam = Some((self.cluster_cidr, self.node_cidr_mask_size));
        }
        config.hpa_sync_period = self.horizontal_pod_autoscaler_sync_period;
        config.signing = self.signing()?;
        config.node_monitor = krust_controllers::nodelifecycle::health::MonitorConfig {
            period: self.node_monitor_period,
            grace_period: self.node_monitor_grace_period,
            eviction_rate: self.node_eviction_rate,
            secondary_eviction_rate: self.secondary_node_eviction_rate,
        };
        config.service_lb = !self.disable.contains(&Disable::Servicelb);
        config.terminated_pod_gc_threshold = self.terminated_pod_gc_threshold;
        Ok(config)
    }
}

/// Leader election flags, named and defaulted as kube-controller-manager's.
#[derive(Args, Clone, Debug)]
pub struct LeaderElectionArgs {
    /// Take the component's Lease in kube-system (kube-controller-manager,
    /// kube-scheduler) before acting, so that of several instances exactly one is active.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long a standby waits after the last renewal it saw before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops acting.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,
}

impl LeaderElectionArgs {
    /// The election for the Lease `kube-system/<lease>`, or `None` with
    /// `--leader-elect=false`.
    pub fn election(
        &self,
        lease: &str,
    ) -> Result<Option<krust_client::leader::LeaderElectionConfig>> {
        if !self.leader_elect {
            return Ok(None);
        }
        anyhow::ensure!(
            self.leader_elect_lease_duration > self.leader_elect_renew_deadline,
            "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline"
        );
        anyhow::ensure!(
            self.leader_elect_renew_deadline > self.leader_elect_retry_period,
            "--leader-elect-renew-deadline must be greater than --leader-elect-retry-period"
        );
        let mut le = krust_client::leader::LeaderElectionConfig::kube_system(lease, identity());
        le.lease_duration = self.leader_elect_lease_duration;
        le.renew_deadline = self.leader_elect_renew_deadline;
        le.retry_period = self.leader_elect_retry_period;
        Ok(Some(le))
    }

    fn config(&self) -> Result<krust_controllers::Config> {
        Ok(krust_controllers::Config {
            leader_election: self.election("kube-controller-manager")?,
            workers: 5,
            node_ipam: None,
            root_ca: None,
            hpa_sync_period: krust_controllers::podautoscaler::SYNC_PERIOD,
            signing: None,
            node_monitor: Default::default(),
            service_lb: true,
            terminated_pod_gc_threshold: krust_controllers::podgc::TERMINATED_POD_GC_THRESHOLD,
        })
    }
}

/// `<hostname>_<unique suffix>`, as upstream: unique per process, so two instances on
/// one host never both believe they hold the lease.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{:x}{:08x}", std::process::id(), nanos)
}

/// `krust controller-manager`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: ControllerManagerArgs) -> Result<()> {
    let yaml = args.kubeconfig.read()?;
    run_with_kubeconfig(&yaml, &args.controllers, crate::cli::shutdown_signal()).await
}

/// Runs the controllers against the apiserver of `kubeconfig` (YAML) until `shutdown`.
pub async fn run_with_kubeconfig(
    kubeconfig: &str,
    args: &ControllerArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let mut config = args.config()?;
    let mut registry = prometheus_client::registry::Registry::default();
    krust_client::metrics::register_work_queues(&mut registry);
    let _serving = krust_client::metrics::MetricsServer::start_if(
        "controller-manager",
        args.controller_manager_metrics_address.0,
        registry,
    )
    .await;
    let (client, root_ca) = krust_client::connect::from_kubeconfig(kubeconfig).await?;
    config.root_ca = root_ca;
    tracing::info!(
        leader_elect = config.leader_election.is_some(),
        "controller-manager starting"
    );
    krust_controllers::run(client, config, shutdown).await;
    tracing::info!("controller-manager stopped");
    Ok(())
}
