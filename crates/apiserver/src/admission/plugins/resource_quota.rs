//! The ResourceQuota admission step: a write that would take its namespace past a
//! quota's `status.hard` is refused (403, upstream's `exceeded quota: …` text); one that
//! fits is charged to the quotas' `status.used` before it is stored, each quota written
//! with a compare on its revision so that concurrent writers (and apiservers) cannot
//! both take the last unit. What to count comes from `krust_api::quota`; the quota
//! controller recounts `status.used` from the stored objects, which also gives back
//! what a charged write that then failed took.

use krust_api::status::{ApiError, Target};
use krust_store::{Compare, Op, Revision, Txn, TxnResult};
use serde_json::Value;

use crate::admission::{Attributes, Operation, Plugin};
use crate::rest::{Call, store_error};

pub struct ResourceQuota;

#[async_trait::async_trait]
impl Plugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        matches!(a.operation, Operation::Create | Operation::Update)
    }

    /// Last of all, on the object as it will be stored.
    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        match obj {
            Some(obj) => charge(a.call, obj, a.old).await,
            None => Ok(()),
        }
    }
}

/// How often a charge is recomputed after another writer changed a quota meanwhile.
const CONFLICT_RETRIES: usize = 10;

/// Charges a create (`old` = `None`) or update of `obj` to its namespace's quotas.
/// Upstream re-evaluates updates of Services and PersistentVolumeClaims only (a pod's
/// resources do not change after creation).
async fn charge(call: &Call<'_>, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let info = call.kind.info;
    if call.info.subresource.is_some()
        || (old.is_some()
            && !(info.group.is_empty()
                && matches!(info.plural, "services" | "persistentvolumeclaims")))
    {
        return Ok(());
    }
    let Some(namespace) = call.namespace() else {
        return Ok(());
    };
    let Some(cache) = call.scope.cache.cache("/registry/resourcequotas/") else {
        return Ok(());
    };
    let prefix = format!("/registry/resourcequotas/{namespace}/");
    let listed = cache.list(&prefix).0;
    let mut quotas: Vec<Value> = listed.iter().map(|q| q.value()).collect();
    let mut revisions: Vec<Revision> = listed.iter().map(|q| q.revision).collect();
    if quotas.is_empty() {
        return Ok(());
    }
    let refuse = |why: String| {
        ApiError::forbidden_for(
            Target {
                group: info.group,
                resource: info.plural,
                name: obj["metadata"]["name"].as_str().unwrap_or_default(),
            },
            &why,
        )
    };
    for _ in 0..CONFLICT_RETRIES {
        let charges =
            krust_api::quota::charge(&quotas, info.group, info.plural, obj, old).map_err(refuse)?;
        if charges.is_empty() || call.dry_run() {
            return Ok(());
        }
        let mut conflicted = Vec::new();
        for (i, used) in charges {
            let (quota, revision) = (&quotas[i], revisions[i]);
            let mut updated = quota.clone();
            updated["status"]["used"] = krust_api::quota::write_list(&used);
            if let Some(meta) = updated["metadata"].as_object_mut() {
                meta.remove("resourceVersion");
            }
            let name = quota["metadata"]["name"].as_str().unwrap_or_default();
            let bytes =
                serde_json::to_vec(&updated).map_err(|e| ApiError::internal(e.to_string()))?;
            let txn = Txn {
                key: format!("{prefix}{name}"),
                compare: Compare::ModRevision(revision),
                op: Op::Put(bytes.into()),
            };
            match call.scope.store.txn(txn).await.map_err(store_error)? {
                TxnResult::Succeeded { .. } => {}
                TxnResult::Failed { .. } => conflicted.push(name.to_string()),
            }
        }
        if conflicted.is_empty() {
            return Ok(());
        }
        // Charge again only the quotas that moved, from what the store holds now; the
        // others already carry this write.
        (quotas, revisions) = call
            .stored(&prefix)
            .await?
            .into_iter()
            .filter(|(q, _)| {
                let name = q["metadata"]["name"].as_str().unwrap_or_default();
                conflicted.iter().any(|n| n == name)
            })
            .unzip();
    }
    Err(ApiError::internal(format!(
        "resource quotas in namespace {namespace} kept changing; try again"
    )))
}
