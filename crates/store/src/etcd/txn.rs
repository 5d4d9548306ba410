//! A store [`Txn`] as one etcd transaction, and its answer as a [`TxnResult`].
//!
//! `If(compares).Then(op with prev_kv).Else(Get(key))`:
//!
//! - [`Compare::Always`]: no compare.
//! - [`Compare::Absent`]: `version == 0`, etcd's own "key missing" (`clientv3util.KeyMissing`);
//!   a missing key has version, create and mod revision 0 alike.
//! - [`Compare::ModRevision`]`(r)`: `mod_revision == r`.
//! - A delete also requires `version > 0` (`clientv3util.KeyExists`): etcd would "succeed" at
//!   deleting nothing without writing, and the store reports that as a failed compare with no
//!   current value. Likewise `ModRevision(r)` for `r <= 0`, which etcd would find true of a
//!   missing key (mod revision 0) but never holds in the store.
//!
//! etcd's put answer holds only the previous value, so the new one's metadata is derived from
//! it: the txn's revision, and the previous incarnation's create revision and version + 1 (or
//! a fresh create at this revision). etcd applies the put atomically with reading that previous
//! value, so this is exactly what it stored.

use bytes::Bytes;
use etcd_client::{
    Compare as EtcdCompare, CompareOp, DeleteOptions, PutOptions, Txn as EtcdTxn, TxnOp,
    TxnOpResponse, TxnResponse,
};

use crate::{Compare, KeyValue, Op, Revision, Txn, TxnResult};

use super::error::EtcdError;
use super::keys::Keys;

/// The etcd transaction for `txn`.
pub(crate) fn request(keys: &Keys, txn: &Txn) -> EtcdTxn {
    let key = keys.full(&txn.key);
    let must_exist = matches!(txn.op, Op::Delete)
        || matches!(txn.compare, Compare::ModRevision(revision) if revision <= 0);
    let mut compares = match txn.compare {
        Compare::Always => Vec::new(),
        Compare::Absent => vec![EtcdCompare::version(key.clone(), CompareOp::Equal, 0)],
        Compare::ModRevision(revision) => vec![EtcdCompare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            revision,
        )],
    };
    if must_exist {
        compares.push(EtcdCompare::version(key.clone(), CompareOp::Greater, 0));
    }
    let write = match &txn.op {
        Op::Put(value) => TxnOp::put(
            key.clone(),
            value.to_vec(),
            Some(PutOptions::new().with_prev_key()),
        ),
        Op::Delete => TxnOp::delete(key.clone(), Some(DeleteOptions::new().with_prev_key())),
    };
    EtcdTxn::new()
        .when(compares)
        .and_then([write])
        .or_else([TxnOp::get(key, None)])
}

/// The store's reading of etcd's answer to [`request`]`(txn)`.
pub(crate) fn result(keys: &Keys, txn: Txn, resp: TxnResponse) -> Result<TxnResult, EtcdError> {
    let revision = resp
        .header()
        .map(|header| header.revision())
        .ok_or(EtcdError::NoHeader {
            action: "a transaction",
        })?;
    let answer = resp.op_responses().into_iter().next();
    let missing = |expected| EtcdError::TxnResponse {
        key: txn.key.clone(),
        expected,
    };
    if !resp.succeeded() {
        let Some(TxnOpResponse::Get(mut get)) = answer else {
            return Err(missing("get"));
        };
        let current = get
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| keys.key_value(kv))
            .transpose()?;
        return Ok(TxnResult::Failed { revision, current });
    }
    match (txn.op, answer) {
        (Op::Put(value), Some(TxnOpResponse::Put(mut put))) => {
            let prev = put
                .take_prev_key()
                .map(|kv| keys.key_value(kv))
                .transpose()?;
            let kv = written(txn.key, value, revision, prev.as_ref());
            Ok(TxnResult::Succeeded { revision, kv, prev })
        }
        (Op::Delete, Some(TxnOpResponse::Delete(mut delete))) => {
            let prev = delete
                .take_prev_kvs()
                .into_iter()
                .next()
                .ok_or_else(|| missing("deleted value"))?;
            let prev = keys.key_value(prev)?;
            let kv = KeyValue {
                mod_revision: revision,
                ..prev.clone()
            };
            Ok(TxnResult::Succeeded {
                revision,
                kv,
                prev: Some(prev),
            })
        }
        (Op::Put(_), _) => Err(missing("put")),
        (Op::Delete, _) => Err(missing("delete")),
    }
}

/// The key-value a put at `revision` stored, given the value it replaced.
fn written(key: String, value: Bytes, revision: Revision, prev: Option<&KeyValue>) -> KeyValue {
    let (create_revision, version) = match prev {
        Some(prev) => (prev.create_revision, prev.version + 1),
        None => (revision, 1),
    };
    KeyValue {
        key,
        value,
        create_revision,
        mod_revision: revision,
        version,
    }
}
