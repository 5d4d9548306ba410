//! A managed member joining and leaving its cluster, as k3s's servers do: a new member
//! is added as a learner (it receives the log but has no vote, so the quorum does not
//! change while it catches up), started with the cluster's membership, and promoted to
//! a voter once etcd agrees it has caught up. Leaving removes the member through the
//! cluster, after which etcd stops it.

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, MemberAddOptions};

use super::EtcdTls;
use super::error::EtcdError;
use super::managed::{Bootstrap, ManagedEtcd, MemberSpec};

/// Longest a learner may take to catch up and be promoted.
const PROMOTION: Duration = Duration::from_secs(120);

async fn client(endpoints: &[String], tls: &EtcdTls) -> Result<Client, EtcdError> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10))
        .with_tls(tls.options()?);
    Client::connect(endpoints, Some(options))
        .await
        .map_err(|source| EtcdError::Client {
            endpoints: endpoints.join(","),
            source,
        })
}

fn rpc(action: &str) -> impl FnOnce(etcd_client::Error) -> EtcdError + '_ {
    move |source| EtcdError::Rpc {
        action: action.to_owned(),
        source,
    }
}

/// Adds `spec`'s member to the cluster whose members serve `peers` (client URLs), starts
/// it, and returns once it is a voting member that serves reads. A join interrupted
/// after the add finds its member listed by its peer URL and carries on with it.
pub async fn join(mut spec: MemberSpec, peers: &[String]) -> crate::Result<ManagedEtcd> {
    let mut cluster = client(peers, &spec.tls.client).await?;
    let peer_url = spec.peer_url();
    let listed = cluster
        .member_list()
        .await
        .map_err(rpc("listing members"))?;
    let known = listed
        .members()
        .iter()
        .find(|m| m.peer_urls().contains(&peer_url))
        .map(|m| (m.id(), m.is_learner()));
    let (id, learner, members) = match known {
        Some((id, learner)) => (id, learner, listed.members().to_vec()),
        None => {
            let added = reconfigure("adding a learner", || {
                let (mut cluster, url) = (cluster.clone(), peer_url.clone());
                let options = MemberAddOptions::new().with_is_learner();
                async move { cluster.member_add([url], Some(options)).await }
            })
            .await?;
            let id = added
                .member()
                .map(|m| m.id())
                .ok_or(EtcdError::NoMemberAdded)?;
            (id, true, added.member_list().to_vec())
        }
    };
    let initial_cluster: Vec<String> = members
        .iter()
        .flat_map(|m| {
            let name = if m.id() == id {
                spec.name.clone()
            } else {
                m.name().to_owned()
            };
            m.peer_urls()
                .iter()
                .map(move |url| format!("{name}={url}"))
                .collect::<Vec<_>>()
        })
        .collect();
    spec.bootstrap = Bootstrap::Existing {
        initial_cluster: initial_cluster.join(","),
    };
    tracing::info!(id = format!("{id:x}"), learner, members = %initial_cluster.join(","), "joining the etcd cluster");
    let mut member = ManagedEtcd::spawn_unready(spec)?;
    if learner {
        promote(&mut cluster, &mut member, id).await?;
    }
    member.wait_ready().await?;
    tracing::info!(id = format!("{id:x}"), "etcd member joined as a voter");
    Ok(member)
}

/// Runs a membership change, again while etcd refuses it as unsafe: etcd changes
/// membership only once every voter has been connected for its health interval (5 s),
/// so right after a cluster starts or changes this waits.
async fn reconfigure<T, F, Fut>(action: &'static str, mut change: F) -> crate::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let started = Instant::now();
    loop {
        match change().await {
            Ok(done) => return Ok(done),
            Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("unhealthy cluster")
                    && started.elapsed() < PROMOTION =>
            {
                tracing::debug!(action, "the etcd cluster is not ready for the change yet");
            }
            Err(err) => return Err(rpc(action)(err).into()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Asks the cluster to promote the learner until etcd finds it caught up.
async fn promote(cluster: &mut Client, member: &mut ManagedEtcd, id: u64) -> crate::Result<()> {
    let started = Instant::now();
    loop {
        member.check_running()?;
        match cluster.member_promote(id).await {
            Ok(_) => return Ok(()),
            Err(err) if started.elapsed() > PROMOTION => {
                return Err(rpc("promoting the learner")(err).into());
            }
            // "can only promote a learner member which is in sync with leader", or the
            // leader has not heard from it yet.
            Err(err) => tracing::debug!(error = %err, "learner not promoted yet"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Removes the member of `spec` (running or not) from its cluster through the members at
/// `endpoints`, found by its peer URL. Removing a member that is not listed is done.
pub async fn remove(spec: &MemberSpec, endpoints: &[String]) -> crate::Result<bool> {
    let mut cluster = client(endpoints, &spec.tls.client).await?;
    let peer_url = spec.peer_url();
    let listed = cluster
        .member_list()
        .await
        .map_err(rpc("listing members"))?;
    let Some(id) = listed
        .members()
        .iter()
        .find(|m| m.peer_urls().contains(&peer_url))
        .map(|m| m.id())
    else {
        return Ok(false);
    };
    reconfigure("removing the member", || {
        let mut cluster = cluster.clone();
        async move { cluster.member_remove(id).await }
    })
    .await?;
    tracing::info!(id = format!("{id:x}"), name = %spec.name, "etcd member removed");
    Ok(true)
}

/// The client URLs of every started member of the cluster `endpoints` reach.
pub async fn client_urls(endpoints: &[String], tls: &EtcdTls) -> crate::Result<Vec<String>> {
    let mut cluster = client(endpoints, tls).await?;
    let listed = cluster
        .member_list()
        .await
        .map_err(rpc("listing members"))?;
    Ok(listed
        .members()
        .iter()
        .flat_map(|m| m.client_urls().iter().cloned())
        .collect())
}
