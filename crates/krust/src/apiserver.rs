//! `krust apiserver`: the apiserver alone, and the apiserver flags `krust server` shares.
//! The store is the embedded one in the data dir unless `--datastore-endpoint` names an
//! etcd cluster (k3s's flag), in which case several apiservers can share it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use krust_apiserver::pki::admin_kubeconfig;
use krust_store::Store;
use krust_store::embedded::EmbeddedStore;
use krust_store::encrypted::{EncryptedStore, rewrite_stale};
use krust_store::etcd::{EtcdStore, EtcdTls};

use crate::cli::{parse_duration, shutdown_signal, write_private_file};

#[derive(Args, Clone)]
pub struct ApiserverArgs {
    /// Where krust keeps its state (store, certificates).
    #[arg(long, env = "KRUST_DATA_DIR", default_value = "/var/lib/krust")]
    pub data_dir: PathBuf,
    /// Address the apiserver listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// Port the apiserver listens on (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    pub https_listen_port: u16,
    /// Address advertised to clients and in the `kubernetes` Service (default: the first
    /// non-loopback address, else 127.0.0.1).
    #[arg(long)]
    pub advertise_address: Option<IpAddr>,
    /// Write the admin kubeconfig here.
    #[arg(long, default_value = "/etc/krust/krust.yaml")]
    pub write_kubeconfig: PathBuf,
    /// Service ClusterIP range.
    #[arg(long, default_value = "10.43.0.0/16")]
    pub service_cidr: String,
    /// Most non-mutating requests in flight (watches excluded) before 429.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// Most mutating requests in flight before 429.
    #[arg(long, default_value_t = 200)]
    pub max_mutating_requests_inflight: usize,
    /// How often kubelets are scraped for the metrics API behind `kubectl top` and the
    /// HorizontalPodAutoscaler (metrics-server's flag; 0 disables the scraping).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub metric_resolution: std::time::Duration,
    /// How often old history is compacted (e.g. 5m, 30s; 0 disables).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub etcd_compaction_interval: std::time::Duration,
    /// How long Events are kept after their last write (e.g. 1h, 10m; 0 keeps them).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub event_ttl: std::time::Duration,
    /// How often this apiserver renews its identity lease and rewrites the `kubernetes`
    /// endpoints; an apiserver silent for three intervals is dropped from them.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub endpoint_reconcile_interval: std::time::Duration,
    /// An etcd cluster instead of the embedded store: `etcd://host1:2379,host2:2379`
    /// (`https://` members with the TLS flags below).
    #[arg(long)]
    pub datastore_endpoint: Option<String>,
    /// CA of the etcd members' serving certificates.
    #[arg(long, requires = "datastore_endpoint")]
    pub datastore_cafile: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long, requires = "datastore_endpoint")]
    pub datastore_certfile: Option<PathBuf>,
    /// Key of the client certificate for etcd.
    #[arg(long, requires = "datastore_endpoint")]
    pub datastore_keyfile: Option<PathBuf>,
    /// Prefix of every key krust writes to etcd (keys then read `<prefix>/registry/...`).
    #[arg(long, default_value = "")]
    pub etcd_prefix: String,
    /// Encrypt Secrets at rest with a key generated on first start (k3s's flag): the
    /// EncryptionConfiguration is kept in `<data-dir>/server/cred/encryption-config.json`.
    #[arg(long, env = "KRUST_SECRETS_ENCRYPTION")]
    pub secrets_encryption: bool,
    /// Encrypt resources at rest as an EncryptionConfiguration file says (upstream's
    /// flag): aesgcm, aescbc, secretbox or identity providers per resource. At start,
    /// values not written with the first key are re-written with it (key rotation).
    #[arg(long, conflicts_with = "secrets_encryption")]
    pub encryption_provider_config: Option<PathBuf>,
    /// The audit policy (audit.k8s.io/v1 Policy): which requests are logged at which
    /// level. Needs `--audit-log-path`.
    #[arg(long, requires = "audit_log_path")]
    pub audit_policy_file: Option<PathBuf>,
    /// Where audit events are written as JSON lines (`-`: standard output). Needs
    /// `--audit-policy-file`.
    #[arg(long, requires = "audit_policy_file")]
    pub audit_log_path: Option<PathBuf>,
    /// Rotate the audit log past this many megabytes (0: never).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxsize: u64,
    /// Keep at most this many rotated audit logs (0: all).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxbackup: usize,
    /// Remove rotated audit logs older than this many days (0: never).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxage: u64,
    /// Static bearer tokens (upstream's flag): a CSV file of `token,user,uid` lines, with
    /// an optional fourth column of groups (`"group1,group2"`), read at start.
    #[arg(long)]
    pub token_auth_file: Option<PathBuf>,
    /// A CA bundle (PEM) whose client certificates authenticate too, beside the
    /// cluster CA (upstream's flag): the common name is the user, organisations groups.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// The secret agents join with (k3s's flag): a whole `K10...` token or a bare
    /// secret. Default: the one kept in `<data-dir>/server/token`, else a new one.
    #[arg(long, env = "KRUST_TOKEN")]
    pub token: Option<String>,
}

pub fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("tls")
}

/// The etcd member URLs of a `--datastore-endpoint`.
fn etcd_endpoints(spec: &str, tls: bool) -> Result<Vec<String>> {
    let scheme = if tls { "https" } else { "http" };
    let rest = spec
        .strip_prefix("etcd://")
        .or_else(|| spec.strip_prefix("http://"))
        .or_else(|| spec.strip_prefix("https://"))
        .with_context(|| {
            format!("--datastore-endpoint {spec:?}: expected etcd://host:port[,host:port...]")
        })?;
    let members: Vec<String> = rest
        .split(',')
        .map(|m| {
            m.trim()
                .trim_start_matches("etcd://")
                .trim_start_matches("http://")
                .trim_start_matches("https://")
        })
        .filter(|m| !m.is_empty())
        .map(|m| format!("{scheme}://{m}"))
        .collect();
    if members.is_empty() {
        bail!("--datastore-endpoint {spec:?} names no etcd member");
    }
    Ok(members)
}

impl ApiserverArgs {
    /// Opens the configured store, encrypting what the encryption flags say.
    pub async fn open_store(&self) -> Result<Arc<dyn Store>> {
        let store = self.open_backend().await?;
        let rules = match (&self.encryption_provider_config, self.secrets_encryption) {
            (Some(path), _) => krust_apiserver::encryption::load(path)?,
            (None, true) => krust_apiserver::encryption::ensure_generated(
                &krust_apiserver::encryption::generated_config_path(&self.data_dir),
            )?,
            (None, false) => return Ok(store),
        };
        let encrypted = EncryptedStore::new(store, rules);
        let rewritten = rewrite_stale(&encrypted)
            .await
            .context("re-encrypting stored values with the current key")?;
        tracing::info!(rewritten, "encryption at rest on");
        Ok(Arc::new(encrypted))
    }

    /// The embedded store or etcd, as the flags say.
    async fn open_backend(&self) -> Result<Arc<dyn Store>> {
        if let Some(spec) = &self.datastore_endpoint {
            let tls = match (
                &self.datastore_cafile,
                &self.datastore_certfile,
                &self.datastore_keyfile,
            ) {
                (Some(ca), Some(cert), Some(key)) => Some(EtcdTls {
                    ca: ca.clone(),
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                (None, None, None) => None,
                _ => bail!(
                    "--datastore-cafile, --datastore-certfile and --datastore-keyfile go together"
                ),
            };
            let endpoints = etcd_endpoints(spec, tls.is_some() || spec.contains("https://"))?;
            let store = EtcdStore::connect(&endpoints, &self.etcd_prefix, tls)
                .await
                .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))?;
            tracing::info!(endpoints = %endpoints.join(","), "using etcd");
            return Ok(Arc::new(store));
        }
        let db_dir = self.data_dir.join("server").join("db");
        std::fs::create_dir_all(&db_dir)
            .with_context(|| format!("creating {}", db_dir.display()))?;
        let store =
            EmbeddedStore::open(db_dir.join("state.redb")).context("opening the embedded store")?;
        Ok(Arc::new(store))
    }

    /// `--advertise-address`, else this machine's first non-loopback address.
    pub fn advertise(&self) -> IpAddr {
        self.advertise_address.unwrap_or_else(default_advertise)
    }

    pub fn config(&self) -> krust_apiserver::Config {
        krust_apiserver::Config {
            tls_dir: tls_dir(&self.data_dir),
            bind_address: self.bind_address,
            port: self.https_listen_port,
            service_cidr: self.service_cidr.clone(),
            advertise_address: self.advertise(),
            max_requests_inflight: self.max_requests_inflight,
            max_mutating_requests_inflight: self.max_mutating_requests_inflight,
            compaction_interval: self.etcd_compaction_interval,
            event_ttl: self.event_ttl,
            metric_resolution: self.metric_resolution,
            audit: self
                .audit_policy_file
                .as_ref()
                .zip(self.audit_log_path.as_ref())
                .map(|(policy, log)| krust_apiserver::audit::Config {
                    policy_file: policy.clone(),
                    log: krust_apiserver::audit::log::LogConfig {
                        path: log.clone(),
                        max_size_mb: self.audit_log_maxsize,
                        max_backups: self.audit_log_maxbackup,
                        max_age_days: self.audit_log_maxage,
                    },
                }),
            endpoint_reconcile_interval: self.endpoint_reconcile_interval,
            join_secret: None,
            token_auth_file: self.token_auth_file.clone(),
            client_ca_file: self.client_ca_file.clone(),
            snapshots: None,
            server_bootstrap: None,
        }
    }
}

/// A started apiserver with its admin kubeconfig written.
pub struct Started {
    pub running: krust_apiserver::Running,
    pub kubeconfig: String,
    /// The URL components reach the apiserver at.
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Started {
    /// A kubeconfig for an in-process component that authenticates as `user` in
    /// `groups`, with a client certificate issued now.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<String> {
        self.running
            .pki
            .component_kubeconfig(&self.url, user, groups)
            .with_context(|| format!("issuing the client certificate of {user}"))
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.running.task.await;
    }
}

/// Starts the apiserver with `config` (made by [`ApiserverArgs::config`], with what the
/// caller adds).
pub async fn start(args: &ApiserverArgs, config: krust_apiserver::Config) -> Result<Started> {
    let store = args.open_store().await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let join_secret = crate::token::server_secret(&args.data_dir, args.token.as_deref())?;
    let config = krust_apiserver::Config {
        join_secret: Some(join_secret.clone()),
        ..config
    };
    let running = krust_apiserver::start(config, store, async {
        let _ = stopped.await;
    })
    .await?;
    crate::token::write_server_token(&args.data_dir, &running.pki.ca_cert, &join_secret)?;
    let host = if args.bind_address.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        args.bind_address.to_string()
    };
    let url = format!("https://{host}:{}", running.addr.port());
    let kubeconfig = admin_kubeconfig(&running.pki, &url);
    write_private_file(&args.write_kubeconfig, &kubeconfig)?;
    Ok(Started {
        running,
        kubeconfig,
        url,
        stop,
    })
}

/// `krust apiserver`.
pub async fn run(args: ApiserverArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let apiserver = start(&args, args.config()).await?;
    tracing::info!(
        addr = %apiserver.running.addr,
        kubeconfig = %args.write_kubeconfig.display(),
        ready_ms = started.elapsed().as_millis() as u64,
        "krust apiserver ready"
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    apiserver.stop().await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datastore_endpoints_in_k3s_form() {
        assert_eq!(
            etcd_endpoints("etcd://a:2379,b:2379", false).unwrap(),
            ["http://a:2379", "http://b:2379"]
        );
        assert_eq!(
            etcd_endpoints("https://a:2379", true).unwrap(),
            ["https://a:2379"]
        );
        assert!(etcd_endpoints("mysql://x", false).is_err());
        assert!(etcd_endpoints("etcd://", false).is_err());
    }
}
