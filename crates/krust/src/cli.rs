//! Command-line interface: k3s-style flags for `krust server`, and the helper commands.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use krust_apiserver::authz::identity;
use krust_apiserver::pki::{Pki, admin_kubeconfig};

use crate::apiserver::{self, ApiserverArgs, tls_dir};

use crate::controller_manager::{self, ControllerArgs, ControllerManagerArgs};

#[derive(Parser)]
#[command(
    name = "krust",
    version,
    about = "A Kubernetes-compatible orchestrator in one binary"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the control plane (apiserver on an embedded store, controllers, scheduler).
    Server(Box<ServerArgs>),
    /// Run the apiserver alone (several can share one etcd).
    Apiserver(ApiserverArgs),
    /// Run the controllers alone against an apiserver.
    ControllerManager(ControllerManagerArgs),
    /// Run the node agent (containerd + kubelet) against an apiserver.
    Agent(crate::agent::AgentCommand),
    /// Run the scheduler alone against an apiserver.
    Scheduler(crate::scheduler::SchedulerArgs),
    /// Run the Service proxy (nftables rules for Services) alone against an apiserver.
    Proxy(crate::proxy::ProxyCommand),
    /// Run the cluster DNS alone against an apiserver.
    Dns(crate::dns::DnsCommand),
    /// Run the Ingress controller alone against an apiserver.
    Ingress(crate::ingress::IngressCommand),
    /// Walk the chain of an object (or the cluster) and name the first broken link.
    Doctor(crate::doctor::DoctorCommand),
    /// Simulate nodes whose pods run without containers (for scale work and demos).
    Sim(crate::sim::SimArgs),
    /// Manage the bootstrap tokens agents join with.
    #[command(subcommand)]
    Token(crate::token::TokenCommand),
    /// Save, list, delete and prune the store's snapshots (k3s's command).
    #[command(subcommand)]
    EtcdSnapshot(crate::etcd_snapshot::SnapshotCommand),
    /// Manage the node's container images (offline: import tarballs).
    #[command(subcommand)]
    Images(ImagesCommand),
    /// Print the admin kubeconfig of a server's data dir.
    Kubeconfig {
        #[arg(long, env = "KRUST_DATA_DIR", default_value = "/var/lib/krust")]
        data_dir: PathBuf,
        /// Server URL to put in the kubeconfig (default: https://127.0.0.1:6443).
        #[arg(long)]
        server: Option<String>,
    },
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Import docker-archive or OCI tarballs into the node's containerd (as `docker
    /// save` or `skopeo copy ... docker-archive:` write them).
    Import {
        /// The tarballs.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, env = "KRUST_DATA_DIR", default_value = "/var/lib/krust")]
        data_dir: PathBuf,
    },
}

#[derive(Args)]
struct ServerArgs {
    #[command(flatten)]
    api: ApiserverArgs,
    /// Run without the node agent (no containerd, no kubelet: this machine is not a node).
    #[arg(long)]
    disable_agent: bool,
    #[command(flatten)]
    agent: crate::agent::AgentArgs,
    /// Do not run the controllers in this process (run `krust controller-manager`).
    #[arg(long)]
    disable_controllers: bool,
    /// Do not run the scheduler in this process (run `krust scheduler`).
    #[arg(long)]
    disable_scheduler: bool,
    #[command(flatten)]
    scheduler_metrics: crate::scheduler::SchedulerMetricsArgs,
    #[command(flatten)]
    dns: crate::dns::DnsArgs,
    #[command(flatten)]
    ingress: crate::ingress::IngressArgs,
    /// Also run this many simulated nodes (`krust sim` defaults), for demos.
    #[arg(long, default_value_t = 0)]
    sim_nodes: usize,
    #[command(flatten)]
    controllers: ControllerArgs,
    #[command(flatten)]
    snapshots: crate::etcd_snapshot::SnapshotArgs,
    #[command(flatten)]
    reset: crate::etcd_snapshot::ResetArgs,
    #[command(flatten)]
    cluster: crate::managed_etcd::ClusterArgs,
}

/// Where a component serves `/metrics` and its health endpoints: `host:port`, or `0`
/// (or nothing) for not at all, as kube-proxy's `--metrics-bind-address`.
#[derive(Clone, Copy, Debug)]
pub struct MetricsAddress(pub Option<std::net::SocketAddr>);

impl std::str::FromStr for MetricsAddress {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "" | "0" => Ok(MetricsAddress(None)),
            _ => s.parse().map(|addr| MetricsAddress(Some(addr))),
        }
    }
}

/// `5m`, `30s`, `1h`, `250ms` or plain seconds.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => return Ok(std::time::Duration::from_secs(n)),
        "ms" => return Ok(std::time::Duration::from_millis(n)),
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("invalid duration unit in {s:?}")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

impl Cli {
    /// Whether the command runs an apiserver.
    pub fn serves_api(&self) -> bool {
        matches!(self.command, Command::Server(_) | Command::Apiserver(_))
    }

    pub async fn run(self) -> Result<()> {
        match self.command {
            Command::Server(args) => server(*args).await,
            Command::Apiserver(args) => apiserver::run(args).await,
            Command::ControllerManager(args) => controller_manager::run(args).await,
            Command::Scheduler(args) => crate::scheduler::run(args).await,
            Command::Agent(args) => crate::agent::run(args).await,
            Command::Proxy(args) => crate::proxy::run(args).await,
            Command::Dns(args) => crate::dns::run(args).await,
            Command::Ingress(args) => crate::ingress::run(args).await,
            Command::Doctor(args) => crate::doctor::run(args).await,
            Command::Sim(args) => crate::sim::run(args).await,
            Command::Token(command) => crate::token::run(command).await,
            Command::EtcdSnapshot(command) => crate::etcd_snapshot::run(command).await,
            Command::Images(ImagesCommand::Import { files, data_dir }) => {
                let socket = krust_cri::containerd::Layout::new(
                    krust_cri::containerd::default_dir(&data_dir),
                )
                .socket();
                for file in &files {
                    krust_cri::image::import(&socket, file)
                        .with_context(|| format!("containerd at {}", socket.display()))?;
                    println!("imported {}", file.display());
                }
                Ok(())
            }
            Command::Kubeconfig { data_dir, server } => {
                anyhow::ensure!(
                    tls_dir(&data_dir).join("ca.crt").exists(),
                    "no krust server has run with data dir {}",
                    data_dir.display()
                );
                let pki = Pki::load_or_create(&tls_dir(&data_dir), &[])?;
                let url = server.unwrap_or_else(|| "https://127.0.0.1:6443".into());
                print!("{}", admin_kubeconfig(&pki, &url));
                Ok(())
            }
        }
    }
}

/// The tenth address of the service range: the cluster DNS Service's, as k3s derives
/// it when `--cluster-dns` is not given.
fn tenth_address(service_cidr: &str) -> Result<std::net::Ipv4Addr> {
    let range: krust_api::cidr::Ipv4Cidr = service_cidr
        .parse()
        .with_context(|| format!("invalid service CIDR {service_cidr}"))?;
    let ip = std::net::Ipv4Addr::from(u32::from(range.network()) + 10);
    anyhow::ensure!(
        range.contains(ip),
        "the service CIDR {service_cidr} has no tenth address for the cluster DNS"
    );
    Ok(ip)
}

async fn server(mut args: ServerArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let node = args.agent.node_name();
    if args.reset.cluster_reset {
        return reset(&args, &node).await;
    }
    if args.cluster.leave {
        return crate::managed_etcd::leave(&args.api, &args.cluster, &node).await;
    }
    let etcd = match crate::managed_etcd::wanted(&args.cluster, &args.api.data_dir) {
        true => Some(crate::managed_etcd::start(&mut args.api, &args.cluster, &node).await?),
        false => None,
    };
    // The agent's pods and the DNS server agree on one address.
    let cluster_dns = match args.agent.cluster_dns {
        Some(ip) => ip,
        None => tenth_address(&args.api.service_cidr)?,
    };
    args.agent.cluster_dns = Some(cluster_dns);
    let snapshots = args.snapshots.config(&args.api.data_dir, &node);
    let server_bootstrap = etcd
        .as_ref()
        .map(|member| krust_apiserver::server_bootstrap::Config {
            data_dir: args.api.data_dir.clone(),
            etcd_client_urls: vec![member.spec().client_url()],
        });
    let config = krust_apiserver::Config {
        snapshots: Some(snapshots),
        server_bootstrap,
        ..args.api.config()
    };
    let apiserver = apiserver::start(&args.api, config).await?;
    // Supervised from here; stopped after the apiserver that uses it.
    let etcd = etcd.map(|mut member| {
        InProcess::spawn("etcd", move |stop| async move {
            tokio::select! {
                _ = member.keep_running() => {}
                _ = stop => {}
            }
            member.stop().await;
            Ok(())
        })
    });
    // Every component reaches the apiserver like any client, through its HTTPS port,
    // as its own user with only the permissions upstream grants that role.
    let mut components = Vec::new();
    if !args.disable_controllers {
        let kubeconfig = apiserver.kubeconfig_for(identity::CONTROLLER_MANAGER, &[])?;
        let mut controller_args = args.controllers.clone();
        controller_args.sign_with_cluster_ca(&apiserver::tls_dir(&args.api.data_dir));
        components.push(InProcess::spawn("controllers", move |stop| async move {
            controller_manager::run_with_kubeconfig(&kubeconfig, &controller_args, stop).await
        }));
    }
    if !args.disable_scheduler {
        let kubeconfig = apiserver.kubeconfig_for(identity::SCHEDULER, &[])?;
        let leader = args.controllers.leader.clone();
        let config = crate::scheduler::configuration(None)?;
        let metrics = args.scheduler_metrics;
        components.push(InProcess::spawn("scheduler", move |stop| async move {
            crate::scheduler::run_with_kubeconfig(&kubeconfig, config, &leader, metrics, stop).await
        }));
    }
    let node_ip = args.agent.node_ip();
    let instance = args.agent.node_name();
    if let Some(config) = args.dns.config(
        node_ip,
        cluster_dns,
        &args.agent.cluster_domain,
        instance.clone(),
    ) {
        let kubeconfig = apiserver.kubeconfig_for(identity::DNS, &[])?;
        components.push(InProcess::spawn("dns", move |stop| async move {
            crate::dns::serve(&kubeconfig, config, stop).await
        }));
    }
    if let Some(config) = args.ingress.config(node_ip) {
        let kubeconfig = apiserver.kubeconfig_for(identity::INGRESS, &[])?;
        components.push(InProcess::spawn("ingress", move |stop| async move {
            crate::ingress::serve(&kubeconfig, config, stop).await
        }));
    }
    if !args.disable_agent {
        let kubeconfigs = crate::agent::Kubeconfigs {
            kubelet: apiserver
                .kubeconfig_for(&identity::node(&instance), &[identity::NODES_GROUP])?,
            proxy: apiserver.kubeconfig_for(identity::PROXY, &[])?,
            storage: Some(apiserver.kubeconfig_for(identity::LOCAL_STORAGE, &[])?),
            // Issued by the server's own CA at each start.
            client_rotation: None,
        };
        let agent = args.agent.clone();
        let data_dir = args.api.data_dir.clone();
        // With node IPAM off, the one node takes the cluster range's first /24.
        let cluster_cidr = args.controllers.cluster_cidr;
        let fallback = cluster_cidr.subnet(24, 0);
        let pki = apiserver.running.pki.clone();
        components.push(InProcess::spawn("agent", move |stop| async move {
            crate::agent::run_with_kubeconfig(
                &kubeconfigs,
                &data_dir,
                &agent,
                cluster_cidr,
                fallback,
                Some(&pki),
                stop,
            )
            .await
        }));
    }
    if args.sim_nodes > 0 {
        // The simulated nodes stand in for many kubelets at once: no single node identity
        // fits, so they act as the admin.
        let (nodes, kubeconfig) = (args.sim_nodes, apiserver.kubeconfig.clone());
        components.push(InProcess::spawn("sim", move |stop| async move {
            let (client, client_ca) = krust_client::connect::from_kubeconfig(&kubeconfig).await?;
            let config = krust_sim::Config {
                nodes,
                client_ca,
                ..krust_sim::Config::default()
            };
            krust_sim::run(client, config, stop)
                .await
                .context("simulating nodes")
        }));
    }
    tracing::info!(
        addr = %apiserver.running.addr,
        kubeconfig = %args.api.write_kubeconfig.display(),
        ready_ms = started.elapsed().as_millis() as u64,
        "krust server ready"
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    // Components first, so they can give up their leases while the apiserver is up.
    for component in components {
        component.stop().await;
    }
    apiserver.stop().await;
    if let Some(etcd) = etcd {
        etcd.stop().await;
    }
    Ok(())
}

/// `--cluster-reset`: the store reset (restored from a snapshot, or the managed etcd
/// member made alone), then the process ends, as k3s's does, so the next start serves
/// the result.
async fn reset(args: &ServerArgs, node: &str) -> Result<()> {
    let snapshot = args.reset.cluster_reset_restore_path.as_deref();
    if crate::managed_etcd::wanted(&args.cluster, &args.api.data_dir) {
        return crate::managed_etcd::reset(&args.api, &args.cluster, node, snapshot).await;
    }
    anyhow::ensure!(
        args.api.datastore_endpoint.is_none(),
        "--cluster-reset resets krust's own store; an external etcd \
         (--datastore-endpoint) is restored with etcd's tools"
    );
    let snapshot = snapshot.context(
        "--cluster-reset without --cluster-reset-restore-path applies to managed etcd \
         (--cluster-init); the embedded store has no peers to forget",
    )?;
    let old = crate::etcd_snapshot::restore_embedded(&args.api.data_dir, snapshot)?;
    tracing::info!(
        snapshot = %snapshot.display(),
        kept = %old.display(),
        "store restored from the snapshot; start again without --cluster-reset"
    );
    Ok(())
}

/// A component running in the server's process, stopped on request.
struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Runs `run(stop)`, where `stop` completes when the server shuts down.
    fn spawn<F, Fut>(name: &'static str, run: F) -> InProcess
    where
        F: FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(Box::pin(async {
            let _ = stopped.await;
        })));
        let task = tokio::spawn(async move {
            match task.await {
                Ok(Err(err)) => {
                    tracing::error!(component = name, error = %format!("{err:#}"), "failed")
                }
                Err(err) => tracing::error!(component = name, error = %err, "panicked"),
                Ok(Ok(())) => {}
            }
        });
        InProcess { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Runs `work` until it ends or `shutdown` resolves; an error says it was `what` that
/// failed.
pub(crate) async fn until_shutdown<E>(
    what: &'static str,
    work: impl std::future::Future<Output = Result<(), E>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::select! {
        result = work => result.context(what),
        _ = shutdown => Ok(()),
    }
}

/// This machine's name, lowercased (a node's and a DNS server's default name).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

/// The kubeconfig a component was pointed at, as YAML.
/// Where a component finds its kubeconfig, as kubectl does: `--kubeconfig`, else the
/// first file of `$KUBECONFIG` that exists, else `~/.kube/config`.
#[derive(Args, Clone, Debug)]
pub struct Kubeconfig {
    /// Kubeconfig of the apiserver (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long = "kubeconfig", value_name = "PATH")]
    path: Option<PathBuf>,
}

impl Kubeconfig {
    pub fn path(&self) -> Result<PathBuf> {
        if let Some(path) = &self.path {
            return Ok(path.clone());
        }
        if let Some(list) = std::env::var_os("KUBECONFIG") {
            let paths: Vec<PathBuf> = std::env::split_paths(&list)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            if let Some(path) = paths.iter().find(|p| p.exists()).or(paths.first()) {
                return Ok(path.clone());
            }
        }
        let home = std::env::var_os("HOME").context("no --kubeconfig, $KUBECONFIG or $HOME")?;
        Ok(PathBuf::from(home).join(".kube").join("config"))
    }

    /// The kubeconfig's YAML.
    pub fn read(&self) -> Result<String> {
        let path = self.path()?;
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }
}

pub(crate) fn write_private_file(path: &Path, contents: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
