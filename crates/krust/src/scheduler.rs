//! `krust scheduler`: the scheduler alone, against any apiserver reachable through a
//! kubeconfig, with Lease-based leader election (kube-system/kube-scheduler) so several
//! instances can run active/standby. `krust server` runs the same in-process.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use krust_scheduler::config::SchedulerConfiguration;

use crate::controller_manager::LeaderElectionArgs;

/// The scheduler's Lease in kube-system.
pub const LEASE: &str = "kube-scheduler";

#[derive(Args)]
pub struct SchedulerArgs {
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    /// A KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) file: profiles,
    /// plugins and their weights, percentageOfNodesToScore.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    leader: LeaderElectionArgs,
    #[command(flatten)]
    metrics: SchedulerMetricsArgs,
}

/// Where the scheduler serves its metrics, for `krust scheduler` and `krust server`.
#[derive(Args, Clone, Copy, Debug)]
pub struct SchedulerMetricsArgs {
    /// Where the scheduler serves `/metrics` and `/healthz` (its upstream port; 0:
    /// nowhere).
    #[arg(long, default_value = "127.0.0.1:10259")]
    pub scheduler_metrics_address: crate::cli::MetricsAddress,
}

/// Reads a KubeSchedulerConfiguration file, or the default profile without one.
pub fn configuration(path: Option<&std::path::Path>) -> Result<SchedulerConfiguration> {
    match path {
        None => Ok(SchedulerConfiguration::default()),
        Some(path) => {
            let yaml = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            SchedulerConfiguration::from_yaml(&yaml)
                .with_context(|| format!("parsing {}", path.display()))
        }
    }
}

/// `krust scheduler`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: SchedulerArgs) -> Result<()> {
    let config = configuration(args.config.as_deref())?;
    let yaml = args.kubeconfig.read()?;
    run_with_kubeconfig(
        &yaml,
        config,
        &args.leader,
        args.metrics,
        crate::cli::shutdown_signal(),
    )
    .await
}

/// Runs the scheduler against the apiserver of `kubeconfig` (YAML) until `shutdown`.
pub async fn run_with_kubeconfig(
    kubeconfig: &str,
    config: SchedulerConfiguration,
    leader: &LeaderElectionArgs,
    metrics: SchedulerMetricsArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    // Fail on a bad configuration now, not after winning the lease.
    config
        .build_frameworks()
        .context("scheduler configuration")?;
    let election = leader.election(LEASE)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let counted = krust_scheduler::metrics::Metrics::new(&mut registry);
    let _serving = krust_client::metrics::MetricsServer::start_if(
        "scheduler",
        metrics.scheduler_metrics_address.0,
        registry,
    )
    .await;
    let (client, _) = krust_client::connect::from_kubeconfig(kubeconfig).await?;
    let instance = crate::controller_manager::identity();
    let elector = election.map(|le| krust_client::leader::LeaderElector::new(client.clone(), le));
    tracing::info!(leader_elect = elector.is_some(), "scheduler starting");
    krust_client::leader::run_while_leading(elector, shutdown, || {
        let (client, config, instance) = (client.clone(), config.clone(), instance.clone());
        let counted = counted.clone();
        async move {
            if let Err(err) = krust_scheduler::run(client, config, instance, counted).await {
                tracing::error!(error = %err, "scheduler failed");
            }
        }
    })
    .await;
    tracing::info!("scheduler stopped");
    Ok(())
}
