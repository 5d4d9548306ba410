//! DefaultStorageClass: a claim that names no class gets the cluster's default one.

use krust_api::status::ApiError;
use serde_json::Value;

use crate::admission::{Attributes, Operation, Plugin};
use crate::rest::Call;

pub struct DefaultStorageClass;

#[async_trait::async_trait]
impl Plugin for DefaultStorageClass {
    fn name(&self) -> &'static str {
        "DefaultStorageClass"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.operation == Operation::Create && a.is("", "persistentvolumeclaims")
    }

    async fn admit(&self, a: &Attributes<'_>, claim: Option<&mut Value>) -> Result<(), ApiError> {
        if let Some(claim) = claim {
            default_storage_class(a.call, claim);
        }
        Ok(())
    }
}

/// DefaultStorageClass: a claim that names no class (`storageClassName` absent, not
/// `""`) gets the default one: the class annotated `is-default-class`, the newest if
/// there are several (then by name, as upstream).
fn default_storage_class(call: &Call<'_>, claim: &mut Value) {
    const DEFAULT: &str = "storageclass.kubernetes.io/is-default-class";
    const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
    if !claim["spec"]["storageClassName"].is_null()
        || claim["metadata"]["annotations"].get(BETA_CLASS).is_some()
    {
        return;
    }
    let Some(cache) = call.scope.cache.cache("/registry/storageclasses/") else {
        return;
    };
    let classes: Vec<Value> = cache
        .list("/registry/storageclasses/")
        .0
        .iter()
        .map(|c| c.value())
        .filter(|c| c["metadata"]["annotations"][DEFAULT] == "true")
        .collect();
    let newest = classes.iter().max_by(|a, b| {
        let created = |c: &Value| {
            c["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_owned)
        };
        let name = |c: &Value| c["metadata"]["name"].as_str().map(str::to_owned);
        (created(a), name(b)).cmp(&(created(b), name(a)))
    });
    if let Some(class) = newest {
        claim["spec"]["storageClassName"] = class["metadata"]["name"].clone();
    }
}
