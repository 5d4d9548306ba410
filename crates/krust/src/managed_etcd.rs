//! `krust server --cluster-init`: the server runs an etcd member as its supervised child
//! and keeps its store there, as k3s does with embedded etcd. The member's data is
//! `<data-dir>/server/db/etcd`, its TLS comes from the cluster's etcd CA in
//! `<data-dir>/server/tls/etcd`, and once that data exists later starts use it without
//! the flag. A restore (`--cluster-reset-restore-path`) rebuilds the data as a one-member
//! cluster from an etcd snapshot; `--cluster-reset` alone makes the member forget its
//! peers.
//!
//! `krust server --server URL --token TOKEN` joins such a cluster: the CAs and keys come
//! from the first server (checked against the token's CA hash), the member is added as a
//! learner and promoted, and the server then runs the whole control plane on it.
//! `krust server --leave` takes a stopped server's member out of the cluster.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use krust_apiserver::pki::EtcdPki;
use krust_store::etcd::EtcdTls;
use krust_store::etcd::managed::{Bootstrap, ManagedEtcd, MemberSpec, MemberTls};
use krust_store::etcd::membership;
use krust_store::etcd::restore::{RestoredMember, restore};

use crate::apiserver::{ApiserverArgs, tls_dir};

/// The flags of managed etcd.
#[derive(Args, Clone, Debug)]
pub struct ClusterArgs {
    /// Keep the store in an etcd member this server runs, the first of an HA cluster
    /// (k3s's flag). Later starts find its data and need not repeat it.
    #[arg(
        long,
        env = "KRUST_CLUSTER_INIT",
        conflicts_with = "datastore_endpoint"
    )]
    pub cluster_init: bool,
    /// The member's client port (krust's flag, for several servers on one machine).
    #[arg(long, default_value_t = 2379)]
    pub etcd_client_port: u16,
    /// The member's peer port.
    #[arg(long, default_value_t = 2380)]
    pub etcd_peer_port: u16,
    /// Join the cluster of this server (k3s's flag), e.g. https://10.0.0.1:6443, with
    /// the server token (`--token`). Later starts find the member's data and rejoin.
    #[arg(
        long = "server",
        env = "KRUST_URL",
        requires = "token",
        conflicts_with = "cluster_init"
    )]
    pub join: Option<String>,
    /// Remove this (stopped) server's member from its cluster, then exit; its data is
    /// kept aside. Run it on the server that leaves, with its data dir and ports.
    #[arg(long)]
    pub leave: bool,
}

fn db_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("db")
}

/// The member's data directory.
pub fn member_dir(data_dir: &Path) -> PathBuf {
    db_dir(data_dir).join("etcd")
}

fn has_member(data_dir: &Path) -> bool {
    member_dir(data_dir).join("member").exists()
}

/// Whether this server runs a member: asked to (or to join), or one ran here before.
pub fn wanted(cluster: &ClusterArgs, data_dir: &Path) -> bool {
    cluster.cluster_init || cluster.join.is_some() || has_member(data_dir)
}

/// The member's name, made once (`<node>-<8 hex digits>`, as k3s names them) and kept.
fn member_name(data_dir: &Path, node: &str) -> Result<String> {
    let path = db_dir(data_dir).join("etcd-name");
    if let Ok(name) = std::fs::read_to_string(&path) {
        return Ok(name.trim().to_owned());
    }
    let mut random = [0u8; 4];
    getrandom::fill(&mut random)
        .map_err(|e| anyhow::anyhow!("random bytes for the member name: {e}"))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{node}-{suffix}");
    std::fs::create_dir_all(db_dir(data_dir))?;
    std::fs::write(&path, format!("{name}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(name)
}

fn spec(
    api: &ApiserverArgs,
    cluster: &ClusterArgs,
    node: &str,
    bootstrap: Bootstrap,
) -> Result<MemberSpec> {
    let advertise = api.advertise();
    let sans = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        advertise.to_string(),
        crate::cli::hostname(),
    ];
    let pki = EtcdPki::load_or_create(&tls_dir(&api.data_dir), &sans)
        .context("issuing the etcd certificates")?;
    Ok(MemberSpec {
        name: member_name(&api.data_dir, node)?,
        data_dir: member_dir(&api.data_dir),
        advertise,
        client_port: cluster.etcd_client_port,
        peer_port: cluster.etcd_peer_port,
        tls: MemberTls {
            ca: pki.ca.clone(),
            server_cert: pki.server_cert,
            server_key: pki.server_key,
            peer_cert: pki.peer_cert,
            peer_key: pki.peer_key,
            client: EtcdTls {
                ca: pki.ca,
                cert: pki.client_cert,
                key: pki.client_key,
            },
        },
        bootstrap,
        log: db_dir(&api.data_dir).join("etcd.log"),
    })
}

/// Starts the member (joining the cluster of `--server` the first time) and points the
/// apiserver's store at it.
pub async fn start(
    api: &mut ApiserverArgs,
    cluster: &ClusterArgs,
    node: &str,
) -> Result<ManagedEtcd> {
    let joining = match &cluster.join {
        Some(url) if !has_member(&api.data_dir) => Some(fetch_bootstrap(api, url).await?),
        _ => None,
    };
    let spec = spec(api, cluster, node, Bootstrap::New)?;
    api.datastore_endpoint = Some(spec.local_client_url());
    api.datastore_cafile = Some(spec.tls.client.ca.clone());
    api.datastore_certfile = Some(spec.tls.client.cert.clone());
    api.datastore_keyfile = Some(spec.tls.client.key.clone());
    match joining {
        Some(peers) => membership::join(spec, &peers)
            .await
            .context("joining the etcd cluster"),
        None => ManagedEtcd::start(spec)
            .await
            .context("starting the etcd member"),
    }
}

/// Writes the cluster's CAs and keys from the server at `url` into the data dir and
/// returns the etcd members' client URLs. Files already there must be the same: a data
/// dir that holds another cluster's CA is not silently taken over.
async fn fetch_bootstrap(api: &ApiserverArgs, url: &str) -> Result<Vec<String>> {
    let token = api.token.as_deref().context("--server needs --token")?;
    let bootstrap = crate::join::server_bootstrap(url, token).await?;
    for (name, contents) in &bootstrap.files {
        anyhow::ensure!(
            krust_apiserver::server_bootstrap::FILES.contains(&name.as_str()),
            "{url} handed over an unexpected file {name:?}"
        );
        let path = api.data_dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(existing) if existing == *contents => continue,
            Ok(_) => anyhow::bail!(
                "{} holds another cluster's {name}: join with an empty data dir",
                api.data_dir.display()
            ),
            Err(_) => crate::cli::write_private_file(&path, contents)?,
        }
    }
    anyhow::ensure!(
        !bootstrap.etcd_client_urls.is_empty(),
        "{url} named no etcd member to join"
    );
    tracing::info!(server = url, etcd = %bootstrap.etcd_client_urls.join(","), "joining the cluster");
    Ok(bootstrap.etcd_client_urls)
}

/// `--leave`: the member started on its data, removed from the cluster through itself
/// (etcd then stops it), and its data moved aside so a later start does not bring it
/// back.
pub async fn leave(api: &ApiserverArgs, cluster: &ClusterArgs, node: &str) -> Result<()> {
    anyhow::ensure!(
        has_member(&api.data_dir),
        "{} holds no etcd member",
        api.data_dir.display()
    );
    let spec = spec(api, cluster, node, Bootstrap::New)?;
    let member = ManagedEtcd::start(spec.clone())
        .await
        .context("starting the member to remove it")?;
    let removed = membership::remove(&spec, &[spec.local_client_url()]).await;
    member.stop().await;
    removed.context("removing the member")?;
    let aside = db_dir(&api.data_dir).join(format!(
        "etcd-removed-{}",
        jiff::Timestamp::now().as_second()
    ));
    std::fs::rename(&spec.data_dir, &aside)
        .with_context(|| format!("moving the member's data to {}", aside.display()))?;
    tracing::info!(kept = %aside.display(), "this server's member left the cluster");
    Ok(())
}

/// `--cluster-reset`: with a snapshot, the member's data rebuilt from it (the old data
/// kept as `etcd-old-<unix seconds>`); without, the member started once alone
/// (`--force-new-cluster`) so it forgets its peers.
pub async fn reset(
    api: &ApiserverArgs,
    cluster: &ClusterArgs,
    node: &str,
    snapshot: Option<&Path>,
) -> Result<()> {
    let Some(snapshot) = snapshot else {
        let member = ManagedEtcd::start(spec(api, cluster, node, Bootstrap::ForceNewCluster)?)
            .await
            .context("starting the etcd member alone")?;
        member.stop().await;
        tracing::info!(
            "the etcd member is now alone in its cluster; start again without --cluster-reset"
        );
        return Ok(());
    };
    let spec = spec(api, cluster, node, Bootstrap::New)?;
    let old =
        db_dir(&api.data_dir).join(format!("etcd-old-{}", jiff::Timestamp::now().as_second()));
    let restoring = db_dir(&api.data_dir).join("etcd-restoring");
    let _ = std::fs::remove_dir_all(&restoring);
    restore(
        snapshot,
        &RestoredMember {
            name: &spec.name,
            data_dir: &restoring,
            peer_url: &spec.peer_url(),
            cluster_token: "krust",
        },
    )
    .with_context(|| format!("restoring {}", snapshot.display()))?;
    if spec.data_dir.exists() {
        std::fs::rename(&spec.data_dir, &old)
            .with_context(|| format!("keeping the old member data as {}", old.display()))?;
    }
    std::fs::rename(&restoring, &spec.data_dir)
        .with_context(|| format!("putting the restored data at {}", spec.data_dir.display()))?;
    tracing::info!(
        snapshot = %snapshot.display(),
        kept = %old.display(),
        "etcd restored from the snapshot; start again without --cluster-reset"
    );
    Ok(())
}
