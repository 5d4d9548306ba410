//! Real etcd clusters on loopback, the one launcher of every test and benchmark that
//! needs etcd (the store's suite, the end-to-end tests, `store_bench`, `api_bench`).
//! Built with the `testing` feature.
//!
//! [`EtcdCluster::start`] runs `size` members in a temporary directory on free ports and
//! returns once every member serves linearizable reads. Members can be killed (SIGKILL) and
//! restarted on their data. Dropping the cluster kills every process it started and removes
//! the directory. A single member starts in well under a second, so each test gets its own.

mod member;

use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use super::{EtcdStore, EtcdTls};
use member::Member;
pub use member::{ServerTls, free_port};

/// Longest a member may take to serve reads after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Starts retried when a member exits at once, most likely because another process took one
/// of its ports first.
const START_ATTEMPTS: usize = 3;

/// A running etcd cluster.
pub struct EtcdCluster {
    // Dropped first: the processes must be dead before their directory is removed.
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    client_tls: Option<EtcdTls>,
    /// Holds the members' data and logs; removed on drop.
    _dir: TempDir,
}

impl EtcdCluster {
    /// A cluster of `size` plain-HTTP members.
    pub async fn start(size: usize) -> Self {
        Self::start_in(&std::env::temp_dir(), size).await
    }

    /// A cluster of `size` plain-HTTP members keeping their data under `parent` (for a
    /// benchmark on a particular disk).
    pub async fn start_in(parent: &Path, size: usize) -> Self {
        Self::start_with(size, None, parent).await
    }

    /// A cluster whose client ports serve TLS with `server` and require client certificates;
    /// the harness itself connects with `client`.
    pub async fn start_with_tls(size: usize, server: ServerTls, client: EtcdTls) -> Self {
        Self::start_with(size, Some((server, client)), &std::env::temp_dir()).await
    }

    async fn start_with(size: usize, tls: Option<(ServerTls, EtcdTls)>, parent: &Path) -> Self {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let mut cluster = Self::spawn(size, tls.clone(), parent);
            match cluster.wait_ready_all().await {
                Ok(()) => return cluster,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "etcd did not start in {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n---\n")
        );
    }

    /// A one-member plain-HTTP cluster over the data of an etcd snapshot, restored with
    /// [`crate::etcd::restore`] as a server restoring a backup does.
    pub async fn restore(snapshot: &Path) -> Self {
        let mut cluster = Self::spawn(0, None, &std::env::temp_dir());
        let member = Member::new("m0".into(), cluster._dir.path(), None);
        crate::etcd::restore::restore(
            snapshot,
            &crate::etcd::restore::RestoredMember {
                name: &member.name,
                data_dir: member.data_dir(),
                peer_url: &member.peer_url(),
                cluster_token: &cluster.token,
            },
        )
        .expect("restoring the etcd snapshot");
        cluster.initial_cluster = format!("{}={}", member.name, member.peer_url());
        cluster.members.push(member);
        cluster.spawn_member(0);
        if let Err(failure) = cluster.wait_ready_all().await {
            panic!("the restored etcd member did not start: {failure}");
        }
        cluster
    }

    fn spawn(size: usize, tls: Option<(ServerTls, EtcdTls)>, parent: &Path) -> Self {
        let dir = tempfile::tempdir_in(parent).expect("temporary directory for etcd");
        let (server_tls, client_tls) = tls.unzip();
        let members: Vec<Member> = (0..size)
            .map(|i| Member::new(format!("m{i}"), dir.path(), server_tls.clone()))
            .collect();
        let initial_cluster = members
            .iter()
            .map(|member| format!("{}={}", member.name, member.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "krust-test-{}",
            dir.path().file_name().unwrap_or_default().to_string_lossy()
        );
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            token,
            client_tls,
            _dir: dir,
        };
        for i in 0..size {
            cluster.spawn_member(i);
        }
        cluster
    }

    fn spawn_member(&mut self, member: usize) {
        let (initial_cluster, token) = (&self.initial_cluster, &self.token);
        self.members[member].spawn(initial_cluster, token);
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The `--datastore-endpoint` of a krust apiserver naming every member.
    pub fn datastore_endpoint(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", members.join(","))
    }

    /// One member's client URL.
    pub fn endpoint(&self, member: usize) -> String {
        self.members[member].client_url()
    }

    /// The TLS files a client needs, for a TLS cluster.
    pub fn client_tls(&self) -> Option<EtcdTls> {
        self.client_tls.clone()
    }

    /// A store over all members, keys under `prefix`.
    pub async fn store(&self, prefix: &str) -> EtcdStore {
        EtcdStore::connect(&self.endpoints(), prefix, self.client_tls())
            .await
            .expect("connecting to the etcd cluster")
    }

    /// Kills one member with SIGKILL.
    pub fn kill(&mut self, member: usize) {
        self.members[member].kill();
    }

    /// Restarts a killed member on its data and waits until it serves reads again, which
    /// means it has caught up with the cluster.
    pub async fn restart(&mut self, member: usize) {
        self.spawn_member(member);
        if let Err(failure) = self.wait_ready(member).await {
            panic!("restarted etcd member did not become ready: {failure}");
        }
    }

    /// The index of the member that is the raft leader now, asking the running members (of a
    /// plain-HTTP cluster).
    pub async fn leader(&self) -> usize {
        let mut ids = Vec::new();
        let mut leader = None;
        for member in &self.members {
            let status = match etcd_client::Client::connect([member.client_url()], None).await {
                Ok(mut client) => client.status().await.ok(),
                Err(_) => None,
            };
            let Some(status) = status else {
                ids.push(None);
                continue;
            };
            ids.push(status.header().map(|header| header.member_id()));
            leader = leader.or(Some(status.leader()).filter(|&id| id != 0));
        }
        let leader = leader.expect("no running etcd member knows a leader");
        ids.iter()
            .position(|&id| id == Some(leader))
            .unwrap_or_else(|| panic!("the leader {leader:x} is not a running member"))
    }

    async fn wait_ready_all(&mut self) -> Result<(), String> {
        for member in 0..self.members.len() {
            self.wait_ready(member).await?;
        }
        Ok(())
    }

    /// Waits until `member` answers a linearizable read, which needs an elected leader and
    /// the member caught up with it.
    async fn wait_ready(&mut self, member: usize) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let endpoint = [self.endpoint(member)];
        loop {
            if let Some(exit) = self.members[member].exited() {
                return Err(exit);
            }
            let attempt = EtcdStore::connect(&endpoint, "", self.client_tls());
            let last_error = match tokio::time::timeout(Duration::from_secs(2), attempt).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(err)) => err.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "etcd member {member} not ready after {READY_TIMEOUT:?} ({last_error}); \
                     its log ends with:\n{}",
                    self.members[member].log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
