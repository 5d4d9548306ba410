//! The key-value calls: reads at a revision, transactions and compaction, each one etcd RPC
//! (plus a follow-up read when etcd refuses a revision, to report the store's numbers).
//!
//! Revisions are etcd's own. etcd's response header carries its current revision, also for a
//! read at an older one, so a read reports the revision it asked for, and only a read at 0
//! ("latest") reports the header's.

use etcd_client::{GetOptions, GetResponse, KvClient};

use crate::{KeyValue, RangeRequest, RangeResponse, Result, Revision, StoreError, Txn, TxnResult};

use super::compaction::CompactionTracker;
use super::error::{EtcdError, RevisionError, revision_error};
use super::keys::Keys;
use super::txn;

/// How long a read is tried again while etcd is unavailable: an election takes one to
/// two election timeouts (1 s each by default).
const READ_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
const READ_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// The etcd KV client with the store's key prefix and compaction tracking.
pub(crate) struct Kv {
    client: KvClient,
    keys: Keys,
    compaction: CompactionTracker,
}

impl Kv {
    pub(crate) fn new(client: KvClient, keys: Keys) -> Self {
        Kv {
            client,
            keys,
            compaction: CompactionTracker::default(),
        }
    }

    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(crate) fn compaction(&self) -> &CompactionTracker {
        &self.compaction
    }

    pub(crate) async fn get(
        &self,
        key: &str,
        revision: Revision,
    ) -> Result<(Option<KeyValue>, Revision)> {
        let options = GetOptions::new().with_revision(revision);
        let mut resp = match self.read(self.keys.full(key), options).await {
            Ok(resp) => resp,
            Err(source) => {
                return Err(self
                    .revision_failure(source, revision, || format!("get of {key:?}"))
                    .await);
            }
        };
        let revision = read_revision(&resp, revision)?;
        let kv = resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| self.keys.key_value(kv))
            .transpose()?;
        Ok((kv, revision))
    }

    pub(crate) async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let (start, end) = self.keys.range(&req.prefix, req.start_after.as_deref());
        let limit = i64::try_from(req.limit).unwrap_or(i64::MAX);
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(limit)
            .with_revision(req.revision);
        let mut resp = match self.read(start, options).await {
            Ok(resp) => resp,
            Err(source) => {
                return Err(self
                    .revision_failure(source, req.revision, || {
                        format!("range over {:?}", req.prefix)
                    })
                    .await);
            }
        };
        let revision = read_revision(&resp, req.revision)?;
        let kvs = resp
            .take_kvs()
            .into_iter()
            .map(|kv| self.keys.key_value(kv))
            .collect::<Result<_, _>>()?;
        Ok(RangeResponse {
            kvs,
            // etcd reads one key past the limit to set this, so it is exact.
            more: resp.more(),
            revision,
        })
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let request = txn::request(&self.keys, &txn);
        let resp = self
            .client()
            .txn(request)
            .await
            .map_err(|source| EtcdError::Rpc {
                action: format!("txn on {:?}", txn.key),
                source,
            })?;
        Ok(txn::result(&self.keys, txn, resp)?)
    }

    pub(crate) async fn compact(&self, revision: Revision) -> Result<()> {
        // Not `physical`: etcd refuses reads below `revision` as soon as it answers, and
        // waiting for the deletion on disk would only slow the caller down.
        match self.client().compact(revision, None).await {
            Ok(_) => {
                self.compaction.observe(revision);
                tracing::info!(revision, "compacted etcd history");
                Ok(())
            }
            Err(source) => Err(self
                .revision_failure(source, revision, || format!("compaction at {revision}"))
                .await),
        }
    }

    pub(crate) async fn compacted_revision(&self) -> Result<Revision> {
        self.compaction.compacted(self).await
    }

    /// etcd's current revision, from the header of a count-only read.
    pub(crate) async fn current_revision(&self) -> Result<Revision, EtcdError> {
        let options = GetOptions::new().with_count_only();
        let resp = self
            .read(self.keys.probe(), options)
            .await
            .map_err(|source| EtcdError::Rpc {
                action: "read of the current revision".to_owned(),
                source,
            })?;
        header_revision(&resp)
    }

    /// Whether etcd still serves reads at `revision` (at or above its compacted revision).
    pub(crate) async fn readable(&self, revision: Revision) -> Result<bool> {
        let options = GetOptions::new().with_count_only().with_revision(revision);
        match self.read(self.keys.probe(), options).await {
            Ok(_) => Ok(true),
            Err(err) if revision_error(&err) == Some(RevisionError::Compacted) => Ok(false),
            Err(source) => Err(EtcdError::Rpc {
                action: format!("compaction check at revision {revision}"),
                source,
            }
            .into()),
        }
    }

    /// Turns etcd's revision errors into the store's, with the numbers etcd leaves out (read
    /// right after, so they describe the store a moment later); other errors are backend
    /// errors.
    async fn revision_failure(
        &self,
        source: etcd_client::Error,
        requested: Revision,
        action: impl FnOnce() -> String,
    ) -> StoreError {
        let failure = match revision_error(&source) {
            Some(RevisionError::Compacted) => {
                self.compacted_revision()
                    .await
                    .map(|compacted| StoreError::Compacted {
                        requested,
                        compacted,
                    })
            }
            Some(RevisionError::Future) => self
                .current_revision()
                .await
                .map(|current| StoreError::FutureRevision { requested, current })
                .map_err(StoreError::from),
            None => Ok(EtcdError::Rpc {
                action: action(),
                source,
            }
            .into()),
        };
        failure.unwrap_or_else(|err| err)
    }

    /// A read, tried again while etcd answers Unavailable ("leader changed", "no leader"
    /// while an election runs): reads change nothing, so retrying is safe, as etcd's own
    /// client retries them. Writes are not retried: one that failed so may have been
    /// applied.
    async fn read(
        &self,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Result<GetResponse, etcd_client::Error> {
        let key = key.into();
        let deadline = tokio::time::Instant::now() + READ_RETRY;
        loop {
            match self.client().get(key.clone(), Some(options.clone())).await {
                Err(etcd_client::Error::GRpcStatus(status))
                    if status.code() == tonic::Code::Unavailable
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(message = status.message(), "etcd read unavailable; again");
                    tokio::time::sleep(READ_RETRY_DELAY).await;
                }
                result => return result,
            }
        }
    }

    /// A handle for one call: etcd's client methods take `&mut self`, and a clone shares the
    /// connection.
    fn client(&self) -> KvClient {
        self.client.clone()
    }
}

/// The revision a read was served at: the one asked for, or the current one for 0.
fn read_revision(resp: &GetResponse, requested: Revision) -> Result<Revision, EtcdError> {
    if requested > 0 {
        Ok(requested)
    } else {
        header_revision(resp)
    }
}

fn header_revision(resp: &GetResponse) -> Result<Revision, EtcdError> {
    resp.header()
        .map(|header| header.revision())
        .ok_or(EtcdError::NoHeader { action: "a range" })
}
