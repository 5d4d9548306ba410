//! The etcd backend: the [`Store`] trait mapped one to one onto etcd's v3 API.
//!
//! - `keys`: the store's key prefix in etcd's keyspace, and key-value conversion.
//! - `kv`: reads at a revision, transactions and compaction.
//! - `txn`: a store transaction as an etcd transaction, and its answer.
//! - `compaction`: finding etcd's compacted revision, which etcd does not report.
//! - `leadership`: the member's raft term, to give up on writes a dead leader held.
//! - `watch`: etcd watches as store watch streams.
//! - `snapshot`: etcd's snapshot stream into a file.
//! - `restore`: a snapshot made a new member's data with etcd's own tool.
//! - `managed`: an etcd member as the server's supervised child (`--cluster-init`).
//! - `membership`: a managed member joining (as a learner, then promoted) and leaving.
//! - `error`: failures with context, and etcd's revision errors.
//!
//! Revisions, create and mod revisions and versions are etcd's own, so a store revision can
//! be handed to `etcdctl` and means the same there. Everything the store keeps is in etcd;
//! any number of [`EtcdStore`]s, in any number of processes, can share one etcd.
//!
//! One difference from the embedded backend: [`Store::watch`] checks its start against the
//! compacted revision when it is called, but if another process compacts past the start
//! between that check and etcd setting the watcher up, the error arrives as the stream's first
//! item instead of from the call.

mod compaction;
mod error;
mod keys;
mod kv;
mod leadership;
pub mod managed;
pub mod membership;
pub mod restore;
mod snapshot;
#[cfg(feature = "testing")]
pub mod testing;
mod txn;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, MaintenanceClient, TlsOptions, WatchClient,
};

use crate::{
    KeyValue, RangeRequest, RangeResponse, Result, Revision, Store, StoreError, Txn, TxnResult,
    WatchStream,
};

use error::EtcdError;
use keys::Keys;
use kv::Kv;

/// How long connecting to one endpoint may take before it counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on quiet connections, so a dead member is noticed (and its watches fail)
/// within `KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT` rather than never. etcd refuses pings more
/// often than every 5 s by default; these are Kubernetes' values.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response accepted. A list of a big collection is one range response; etcd itself
/// bounds what it sends, so the client should not refuse it (gRPC's default is 4 MiB).
const MAX_RESPONSE_BYTES: usize = i32::MAX as usize;

/// Client certificates for an etcd that requires TLS (all PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed etcd's serving certificate.
    pub ca: PathBuf,
    /// This client's certificate, for etcd's `--client-cert-auth`.
    pub cert: PathBuf,
    /// The private key of `cert`.
    pub key: PathBuf,
}

impl EtcdTls {
    fn options(&self) -> Result<TlsOptions, EtcdError> {
        let ca = read_pem("CA certificate", &self.ca)?;
        let cert = read_pem("client certificate", &self.cert)?;
        let key = read_pem("client key", &self.key)?;
        Ok(TlsOptions::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key)))
    }
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::TlsFile {
        what,
        path: path.to_owned(),
        source,
    })
}

/// A [`Store`] kept in etcd, under a key prefix.
pub struct EtcdStore {
    kv: Arc<Kv>,
    watch: WatchClient,
    maintenance: MaintenanceClient,
    leadership: Arc<leadership::Leadership>,
}

impl EtcdStore {
    /// Connects to the etcd cluster at `endpoints` (`host:port` or URLs; `https://` with
    /// `tls`). Every key is stored under `prefix` (often empty: krust's keys already start
    /// with `/registry/`) and returned without it.
    ///
    /// Reads the current revision once, so an unreachable etcd or refused credentials fail
    /// here rather than at the first use.
    pub async fn connect(endpoints: &[String], prefix: &str, tls: Option<EtcdTls>) -> Result<Self> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
            // Only while streams (watches) are open: etcd's gRPC server counts pings on an idle
            // connection as abuse and closes it ("too many pings"), as grpc-go does by default.
            .with_keep_alive_while_idle(false)
            // A member cut off from the quorum fails requests (and cancels watches) instead
            // of serving a watch that silently receives nothing.
            .with_require_leader(true);
        if let Some(tls) = &tls {
            options = options.with_tls(tls.options()?);
        }
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|source| EtcdError::Client {
                endpoints: endpoints.join(","),
                source,
            })?;
        let store = EtcdStore {
            kv: Arc::new(Kv::new(
                client
                    .kv_client()
                    .max_decoding_message_size(MAX_RESPONSE_BYTES),
                Keys::new(prefix),
            )),
            watch: client
                .watch_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            maintenance: client.maintenance_client(),
            leadership: leadership::Leadership::follow(client.maintenance_client()),
        };
        let revision = store
            .kv
            .current_revision()
            .await
            .map_err(|source| EtcdError::Connect {
                endpoints: endpoints.join(","),
                source: Box::new(source),
            })?;
        tracing::info!(
            endpoints = %endpoints.join(","),
            prefix,
            tls = tls.is_some(),
            revision,
            "connected to etcd"
        );
        Ok(store)
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str, revision: Revision) -> Result<(Option<KeyValue>, Revision)> {
        self.kv.get(key, revision).await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        self.kv.range(req).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        self.leadership.bound(self.kv.txn(txn)).await
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream> {
        // Like the embedded backend, and stricter than etcd (which watches from its compacted
        // revision itself): the events at the compacted revision may be gone, so a watch must
        // start after it.
        if from > 0 {
            let compacted = self.kv.compacted_revision().await?;
            if from <= compacted {
                return Err(StoreError::Compacted {
                    requested: from,
                    compacted,
                });
            }
        }
        watch::open(Arc::clone(&self.kv), self.watch.clone(), prefix, from).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.kv.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.kv.current_revision().await?)
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.kv.compacted_revision().await
    }

    /// The database size of the member the client asks (members' sizes differ only by
    /// their free pages).
    async fn size(&self) -> Result<u64> {
        let status = self.maintenance.clone().status().await;
        let status = status.map_err(|e| StoreError::Backend(format!("etcd status: {e}")))?;
        Ok(u64::try_from(status.db_size()).unwrap_or(0))
    }

    /// The snapshot of the member the client asks: the whole keyspace, other prefixes'
    /// keys included, as `etcdctl snapshot save` takes it.
    async fn snapshot(&self, dest: &Path) -> Result<u64> {
        Ok(snapshot::save(&mut self.maintenance.clone(), dest).await?)
    }
}
