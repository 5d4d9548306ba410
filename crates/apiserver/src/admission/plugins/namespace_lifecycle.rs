//! NamespaceLifecycle: nothing is created in a namespace that does not exist or is being
//! terminated, and the namespaces a cluster cannot live without are never deleted.

use krust_api::status::{ApiError, Cause, Target};
use serde_json::Value;

use crate::admission::{Attributes, Operation, Plugin};

/// The namespaces that may not be deleted, as upstream: without them the cluster loses
/// its `kubernetes` Service, its controllers' Leases and its public data. (kube-node-lease
/// may go: the apiserver creates it again.)
pub const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

pub struct NamespaceLifecycle;

#[async_trait::async_trait]
impl Plugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        match a.operation {
            Operation::Create => a.call.kind.info.namespaced,
            Operation::Delete => a.is("", "namespaces"),
            Operation::Update | Operation::Connect => false,
        }
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        match (obj, a.old) {
            (Some(obj), _) => not_terminating(a, obj).await,
            (None, Some(namespace)) => mortal(a, namespace),
            (None, None) => Ok(()),
        }
    }
}

/// An immortal namespace may not be deleted.
fn mortal(a: &Attributes<'_>, namespace: &Value) -> Result<(), ApiError> {
    let name = namespace["metadata"]["name"].as_str().unwrap_or_default();
    if IMMORTAL_NAMESPACES.contains(&name) {
        return Err(a.forbidden(name, "this namespace may not be deleted"));
    }
    Ok(())
}

/// Objects may only be created in namespaces that exist and are not terminating.
async fn not_terminating(a: &Attributes<'_>, obj: &Value) -> Result<(), ApiError> {
    let call = a.call;
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let cache = call
        .scope
        .cache
        .cache("/registry/namespaces/")
        .ok_or_else(|| ApiError::internal("namespace cache missing"))?;
    let key = format!("/registry/namespaces/{ns}");
    // The hot path reads the cache as it is; only a miss (maybe a namespace created a
    // moment ago) pays for catching up with the store first.
    let found = match cache.get(&key) {
        Some(ns) => Some(ns),
        None => {
            call.consistent().await?;
            cache.get(&key)
        }
    };
    let Some(namespace) = found else {
        return Err(ApiError::not_found(Target {
            group: "",
            resource: "namespaces",
            name: ns,
        }));
    };
    if namespace.field("status.phase").as_deref() != Some("Terminating") {
        return Ok(());
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let mut err = a.forbidden(
        name,
        &format!("unable to create new content in namespace {ns} because it is being terminated"),
    );
    if let Some(details) = err.details.as_mut() {
        details.causes.push(Cause {
            reason: "NamespaceTerminating",
            message: format!("namespace {ns} is being terminated"),
            field: "metadata.namespace".into(),
        });
    }
    Err(err)
}
