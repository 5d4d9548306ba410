//! Command-line interface: k3s-style flags for `krust server`, and the helper commands.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use krust_apiserver::pki::{Pki, admin_kubeconfig};
use krust_store::embedded::EmbeddedStore;

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
    /// Run the control plane (apiserver on an embedded store).
    Server(ServerArgs),
    /// Print the admin kubeconfig of a server's data dir.
    Kubeconfig {
        #[arg(long, env = "KRUST_DATA_DIR", default_value = "/var/lib/krust")]
        data_dir: PathBuf,
        /// Server URL to put in the kubeconfig (default: https://127.0.0.1:6443).
        #[arg(long)]
        server: Option<String>,
    },
}

#[derive(Args)]
struct ServerArgs {
    /// Where krust keeps its state (store, certificates).
    #[arg(long, env = "KRUST_DATA_DIR", default_value = "/var/lib/krust")]
    data_dir: PathBuf,
    /// Address the apiserver listens on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: IpAddr,
    /// Port the apiserver listens on (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    https_listen_port: u16,
    /// Address advertised to clients and in the `kubernetes` Service (default: the first
    /// non-loopback address, else 127.0.0.1).
    #[arg(long)]
    advertise_address: Option<IpAddr>,
    /// Write the admin kubeconfig here.
    #[arg(long, default_value = "/etc/krust/krust.yaml")]
    write_kubeconfig: PathBuf,
    /// Service ClusterIP range.
    #[arg(long, default_value = "10.43.0.0/16")]
    service_cidr: String,
    /// Pod IP range (a /24 per node).
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: String,
    /// Run without the node agent (the only mode until the kubelet lands).
    #[arg(long)]
    disable_agent: bool,
    /// Most non-mutating requests in flight (watches excluded) before 429.
    #[arg(long, default_value_t = 400)]
    max_requests_inflight: usize,
    /// Most mutating requests in flight before 429.
    #[arg(long, default_value_t = 200)]
    max_mutating_requests_inflight: usize,
    /// How often old history is compacted (e.g. 5m, 30s; 0 disables).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    etcd_compaction_interval: std::time::Duration,
}

/// `5m`, `30s`, `1h`, `250ms` or plain seconds.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
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
    pub async fn run(self) -> Result<()> {
        match self.command {
            Command::Server(args) => server(args).await,
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

fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("tls")
}

async fn server(args: ServerArgs) -> Result<()> {
    let started = std::time::Instant::now();
    if !args.disable_agent {
        tracing::warn!("the node agent is not built yet: running as --disable-agent");
    }
    krust_apiserver::allocator::parse_cidr(&args.cluster_cidr)
        .with_context(|| format!("invalid --cluster-cidr {}", args.cluster_cidr))?;
    let db_dir = args.data_dir.join("server").join("db");
    std::fs::create_dir_all(&db_dir).with_context(|| format!("creating {}", db_dir.display()))?;
    let store =
        EmbeddedStore::open(db_dir.join("state.redb")).context("opening the embedded store")?;
    let advertise = args.advertise_address.unwrap_or_else(default_advertise);
    let config = krust_apiserver::Config {
        tls_dir: tls_dir(&args.data_dir),
        bind_address: args.bind_address,
        port: args.https_listen_port,
        service_cidr: args.service_cidr.clone(),
        advertise_address: advertise,
        max_requests_inflight: args.max_requests_inflight,
        max_mutating_requests_inflight: args.max_mutating_requests_inflight,
        compaction_interval: args.etcd_compaction_interval,
        endpoint_reconcile_interval: std::time::Duration::from_secs(10),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = krust_apiserver::start(config, Arc::new(store), async {
        let _ = stop_rx.await;
    })
    .await?;
    let host = if args.bind_address.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        args.bind_address.to_string()
    };
    let kubeconfig = admin_kubeconfig(
        &running.pki,
        &format!("https://{host}:{}", running.addr.port()),
    );
    write_kubeconfig(&args.write_kubeconfig, &kubeconfig)?;
    tracing::info!(
        addr = %running.addr,
        kubeconfig = %args.write_kubeconfig.display(),
        ready_ms = started.elapsed().as_millis() as u64,
        "krust server ready"
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(());
    let _ = running.task.await;
    Ok(())
}

fn write_kubeconfig(path: &Path, contents: &str) -> Result<()> {
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

/// The first non-loopback IPv4 address of this machine (found by asking the kernel which
/// source address it would use to reach a public address; nothing is sent).
fn default_advertise() -> IpAddr {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("10.255.255.255:1")?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

async fn shutdown_signal() {
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
