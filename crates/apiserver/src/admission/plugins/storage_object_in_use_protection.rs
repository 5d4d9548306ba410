//! StorageObjectInUseProtection: claims and volumes in use are kept until released.

use krust_api::status::ApiError;
use serde_json::{Value, json};

use crate::admission::{Attributes, Operation, Plugin};

pub struct StorageObjectInUseProtection;

#[async_trait::async_trait]
impl Plugin for StorageObjectInUseProtection {
    fn name(&self) -> &'static str {
        "StorageObjectInUseProtection"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.operation == Operation::Create
            && (a.is("", "persistentvolumeclaims") || a.is("", "persistentvolumes"))
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        if let Some(obj) = obj {
            let finalizer = if a.is("", "persistentvolumes") {
                "kubernetes.io/pv-protection"
            } else {
                "kubernetes.io/pvc-protection"
            };
            add_finalizer(obj, finalizer);
        }
        Ok(())
    }
}

/// A new claim or volume carries the finalizer that keeps it until no pod uses it
/// (claims) or no claim is bound to it (volumes).
fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let finalizers = &mut obj["metadata"]["finalizers"];
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    let list = finalizers.as_array_mut().expect("made an array above");
    if !list.iter().any(|f| f == finalizer) {
        list.push(json!(finalizer));
    }
}
