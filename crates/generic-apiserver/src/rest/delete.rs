//! DELETE and DELETECOLLECTION: preconditions, finalizers and deletionTimestamp, pod
//! graceful deletion, propagation policy (orphan / foreground add their finalizer; the
//! garbage collector does the rest) and namespace termination.

use http::StatusCode;
use krust_api::status::ApiError;
use krust_store::{Compare, Op, Revision, Txn, TxnResult};
use serde_json::{Value, json};

use super::read::{Filter, list_prefix};
use super::{Call, store_error};
use crate::admission::{Attributes, Operation};
use crate::response::{self, Response};

/// The longest grace period: upstream computes the deadline as a Go `time.Duration`
/// (nanoseconds in an int64), which a longer one overflows.
const MAX_GRACE_PERIOD: i64 = i64::MAX / 1_000_000_000;

/// The parts of metav1.DeleteOptions the server acts on.
#[derive(Debug, Default)]
pub struct DeleteOptions {
    pub grace_period: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

fn options(call: &mut Call<'_>) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    if !call.body.is_empty() {
        let v = call.body_value()?;
        let v = call.decode_value(v, ("v1", "DeleteOptions")).or_else(|_| {
            // Clients send DeleteOptions under meta.k8s.io/v1 or without a version.
            let mut v2 = call.body_value()?;
            v2["apiVersion"] = json!("v1");
            call.decode_value(v2, ("v1", "DeleteOptions"))
        })?;
        opts.grace_period = v["gracePeriodSeconds"].as_i64();
        opts.propagation = v["propagationPolicy"].as_str().map(str::to_string);
        if v["orphanDependents"] == json!(true) && opts.propagation.is_none() {
            opts.propagation = Some("Orphan".into());
        }
        opts.precondition_uid = v["preconditions"]["uid"].as_str().map(str::to_string);
        opts.precondition_rv = v["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        if v["dryRun"]
            .as_array()
            .is_some_and(|d| d.contains(&json!("All")))
        {
            call.query = crate::request::Query::parse(Some("dryRun=All"));
        }
    }
    if let Some(g) = call.query.int("gracePeriodSeconds")? {
        opts.grace_period = Some(g);
    }
    if let Some(g) = opts.grace_period.filter(|g| *g > MAX_GRACE_PERIOD) {
        return Err(ApiError::invalid(
            "DeleteOptions",
            "",
            "",
            vec![krust_api::status::Cause::invalid(
                "gracePeriodSeconds",
                &json!(g),
                format!("must be less than or equal to {MAX_GRACE_PERIOD}"),
            )],
        ));
    }
    if let Some(p) = call.query.get("propagationPolicy") {
        opts.propagation = Some(p.to_string());
    }
    if let Some(p) = &opts.propagation
        && !["Orphan", "Background", "Foreground"].contains(&p.as_str())
    {
        return Err(ApiError::invalid(
            "DeleteOptions",
            "",
            "",
            vec![krust_api::status::Cause::not_supported(
                "propagationPolicy",
                &json!(p),
                &["Foreground", "Background", "Orphan", "nil"],
            )],
        ));
    }
    Ok(opts)
}

pub async fn delete(call: &Call<'_>) -> Result<Response, ApiError> {
    // Options may rewrite the query (dryRun in the body): work on a private copy.
    let mut call = call.clone();
    let opts = options(&mut call)?;
    let name = call.name().to_string();
    // As upstream's store: a write racing this delete (a controller updating status)
    // makes the compare-and-swap fail; read again and retry rather than answer 409 —
    // only a precondition the client set may refuse the delete.
    let mut attempts = 0;
    let outcome = loop {
        let (old, rev) = call.current_for_write(&name, attempts > 0).await?;
        check_preconditions(&call, &name, &opts, &old, rev)?;
        let attrs = Attributes::new(&call, Operation::Delete, Some(&old));
        call.scope.admission.admit(&attrs, None).await?;
        match delete_object(&call, &name, old, rev, &opts).await {
            Err(e) if e.code == 409 && attempts < DELETE_ATTEMPTS => attempts += 1,
            result => break result?,
        }
    };
    Ok(match outcome {
        Deleted::Pending(obj) => call.reply(StatusCode::OK, &call.to_served(obj).await?),
        Deleted::Gone(obj) if call.kind.strategy.returns_deleted_object() => {
            call.reply(StatusCode::OK, &call.kind.strategy.to_served(obj))
        }
        Deleted::Gone(obj) => response::json(
            StatusCode::OK,
            &json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": call.kind.info.group, "kind": call.kind.info.plural, "uid": obj["metadata"]["uid"]},
            }),
        ),
    })
}

/// How often a delete that lost a race with a concurrent write is tried again.
const DELETE_ATTEMPTS: u32 = 16;

/// The client's preconditions (UID, resourceVersion) against the current object.
fn check_preconditions(
    call: &Call<'_>,
    name: &str,
    opts: &DeleteOptions,
    old: &Value,
    rev: Revision,
) -> Result<(), ApiError> {
    if let Some(uid) = &opts.precondition_uid
        && old["metadata"]["uid"].as_str() != Some(uid)
    {
        return Err(ApiError::conflict(
            call.target(name),
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old["metadata"]["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = &opts.precondition_rv
        && *rv != rev.to_string()
    {
        return Err(ApiError::conflict(
            call.target(name),
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {rev}"
            ),
        ));
    }
    Ok(())
}

/// What a delete did.
pub enum Deleted {
    /// The object is gone; its last state.
    Gone(Value),
    /// The object is marked for deletion and waits for finalizers or its grace period.
    Pending(Value),
}

/// Whether an object marked for deletion still waits out a grace period (a pod, for its
/// kubelet to stop it and delete it for good).
pub fn waits_for_grace(obj: &Value) -> bool {
    obj["metadata"]["deletionGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(0)
        > 0
}

async fn delete_object(
    call: &Call<'_>,
    name: &str,
    old: Value,
    rev: Revision,
    opts: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    let mut new = old.clone();
    let mut finalizers: Vec<Value> = old["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let add = match opts.propagation.as_deref() {
        Some("Orphan") => Some("orphan"),
        Some("Foreground") => Some("foregroundDeletion"),
        _ => None,
    };
    if let Some(f) = add
        && !finalizers.contains(&json!(f))
    {
        finalizers.push(json!(f));
    }
    let grace = call.kind.strategy.deletion_grace(&old, opts.grace_period);
    let held = call.kind.strategy.holds_deletion(&old);
    let already = old["metadata"]["deletionTimestamp"].is_string();
    if finalizers.is_empty() && grace.is_none() && !held {
        return remove(call, name, rev).await.map(Deleted::Gone);
    }
    if already {
        // Only a shorter grace period changes a pending deletion.
        let current = old["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0);
        match grace {
            Some(g) if g < current => {}
            _ if finalizers
                == old["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default() =>
            {
                return Ok(Deleted::Pending(old));
            }
            _ => {}
        }
    }
    let meta = &mut new["metadata"];
    // A grace period from the pod spec is not bounded by validation: clamp it, as the
    // deadline must stay a representable time.
    let deadline = jiff::Timestamp::now()
        + jiff::SignedDuration::from_secs(grace.unwrap_or(0).min(MAX_GRACE_PERIOD));
    meta["deletionTimestamp"] = json!(deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    meta["deletionGracePeriodSeconds"] = json!(grace.unwrap_or(0));
    if !finalizers.is_empty() {
        meta["finalizers"] = Value::Array(finalizers);
    }
    if let Some(g) = meta["generation"].as_i64() {
        meta["generation"] = json!(g + 1);
    }
    call.kind.strategy.prepare_for_delete(&mut new);
    let (stored, _) = call.put(name, new, Compare::ModRevision(rev)).await?;
    Ok(Deleted::Pending(stored))
}

/// Removes the object from the store if it is still at `rev`.
pub async fn remove(call: &Call<'_>, name: &str, rev: Revision) -> Result<Value, ApiError> {
    if call.dry_run() {
        return call.current(name).await.map(|(v, _)| v);
    }
    let result = call
        .scope
        .store
        .txn(Txn {
            key: call.key(name),
            compare: Compare::ModRevision(rev),
            op: Op::Delete,
        })
        .await
        .map_err(store_error)?;
    match result {
        TxnResult::Succeeded { kv, revision, .. } => {
            let mut v: Value =
                serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
            v["metadata"]["resourceVersion"] = json!(revision.to_string());
            krust_apimachinery::protobuf::go_order(&mut v);
            if let Some(storage) = call.scope.storage_of(call.kind) {
                storage.release(call, &v).await;
            }
            // In storage form: converted where it is answered, so that no conversion
            // can fail a delete that has happened.
            Ok(v)
        }
        TxnResult::Failed { current: None, .. } => Err(ApiError::not_found(call.target(name))),
        TxnResult::Failed { .. } => Err(ApiError::stale(call.target(name))),
    }
}

pub async fn delete_collection(call: &Call<'_>) -> Result<Response, ApiError> {
    let mut call = call.clone();
    let opts = options(&mut call)?;
    let filter = Filter::from_call(&call)?;
    call.consistent().await?;
    let (objs, _) = call.resource_cache()?.list(&list_prefix(&call));
    let mut deleted = Vec::new();
    for o in objs.iter().filter(|o| filter.matches(o)) {
        let value = o.value();
        let mut item_call = call.clone();
        item_call.info.name = Some(o.name.clone());
        item_call.info.namespace = Some(o.namespace.clone()).filter(|n| !n.is_empty());
        // Each item is admitted as a delete of its own, as upstream's store does: a
        // refusal ends the collection's delete with that error.
        let attrs = Attributes::new(&item_call, Operation::Delete, Some(&value));
        item_call.scope.admission.admit(&attrs, None).await?;
        match delete_object(&item_call, &o.name, value, o.revision, &opts).await {
            Ok(Deleted::Gone(v) | Deleted::Pending(v)) => deleted.push(v),
            // Deleted or changed concurrently: upstream skips it too.
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let items: Vec<bytes::Bytes> = deleted
        .iter()
        .map(|v| bytes::Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
        .collect();
    let items = call.served_bytes(items).await?;
    Ok(response::list(
        call.kind,
        call.output,
        &items,
        call.scope.cache.revision(),
        None,
    ))
}
