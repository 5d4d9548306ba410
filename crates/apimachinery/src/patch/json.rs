//! JSON patch (RFC 6902) as upstream applies it (evanphx/json-patch): as the RFC says,
//! except that a `test` of a missing location against `null` passes. Clients rely on
//! that to add a list only if there is none yet (kube-rs's finalizer helper sends
//! `test /metadata/finalizers null` then `add /metadata/finalizers [...]`).

use json_patch::{PatchError, PatchOperation};
use serde_json::Value;

/// An operation of a JSON patch failed.
#[derive(Debug, thiserror::Error)]
#[error("operation '/{operation}' failed at path '{}': {}", .cause.path, .cause.kind)]
pub struct JsonPatchError {
    /// The index of the failed operation in the patch.
    pub operation: usize,
    cause: PatchError,
}

/// Applies `ops` to `doc`, all or nothing.
pub fn apply_json_patch(doc: &mut Value, ops: &[PatchOperation]) -> Result<(), JsonPatchError> {
    let mut working = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        if let PatchOperation::Test(test) = op
            && test.value.is_null()
            && working.pointer(test.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut working, std::slice::from_ref(op)).map_err(|cause| {
            JsonPatchError {
                operation: i,
                cause,
            }
        })?;
    }
    *doc = working;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ops(v: Value) -> Vec<PatchOperation> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_null_test_of_a_missing_path_passes_as_upstream() {
        let mut doc = json!({"metadata": {"name": "a"}});
        let add = ops(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}
        ]));
        apply_json_patch(&mut doc, &add).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["x"]));
        // Now the list exists: the same test fails, and nothing is changed.
        let err = apply_json_patch(&mut doc, &add).unwrap_err();
        assert_eq!(err.operation, 0);
        assert_eq!(doc["metadata"]["finalizers"], json!(["x"]));
        // A failure later in the patch names its index and undoes the earlier ops.
        let bad = ops(json!([
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "remove", "path": "/spec"}
        ]));
        let err = apply_json_patch(&mut doc, &bad).unwrap_err();
        assert_eq!(err.operation, 1);
        assert_eq!(
            err.to_string(),
            "operation '/1' failed at path '/spec': path is invalid"
        );
        assert_eq!(doc["metadata"]["name"], "a");
    }
}
