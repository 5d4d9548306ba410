//! JSON patch (RFC 6902) as upstream applies it (evanphx/json-patch): as the RFC says,
//! except that a `test` of a missing location against `null` passes. Clients rely on
//! that to add a list only if there is none yet (kube-rs's finalizer helper sends
//! `test /metadata/finalizers null` then `add /metadata/finalizers [...]`). Upstream's
//! bounds apply too: at most 10,000 operations, and a bounded total of copied content
//! (a few `copy` operations of the whole document would otherwise double it each time).

use json_patch::{PatchError, PatchOperation};
use serde_json::Value;

/// Upstream's limit on the operations of one patch.
pub const MAX_OPERATIONS: usize = 10_000;

/// The most content all `copy` operations of one patch may copy, in serialized bytes
/// (upstream bounds it by a multiple of the request size limit).
pub const MAX_COPIED_BYTES: usize = 3 * 3 * 1024 * 1024;

/// Why a JSON patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum JsonPatchError {
    #[error("operation '/{operation}' failed at path '{}': {}", .cause.path, .cause.kind)]
    Operation { operation: usize, cause: PatchError },
    #[error("The allowed operations in a JSON patch is limited to {MAX_OPERATIONS}, got {0}")]
    TooManyOperations(usize),
    #[error("The allowed limit for copied content has been exceeded")]
    CopyLimit,
}

/// Applies `ops` to `doc`, all or nothing.
pub fn apply_json_patch(doc: &mut Value, ops: &[PatchOperation]) -> Result<(), JsonPatchError> {
    if ops.len() > MAX_OPERATIONS {
        return Err(JsonPatchError::TooManyOperations(ops.len()));
    }
    let mut working = doc.clone();
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        match op {
            PatchOperation::Test(test)
                if test.value.is_null() && working.pointer(test.path.as_str()).is_none() =>
            {
                continue;
            }
            PatchOperation::Copy(copy) => {
                copied += working
                    .pointer(copy.from.as_str())
                    .map_or(0, |v| serde_json::to_vec(v).map_or(0, |b| b.len()));
                if copied > MAX_COPIED_BYTES {
                    return Err(JsonPatchError::CopyLimit);
                }
            }
            _ => {}
        }
        json_patch::patch(&mut working, std::slice::from_ref(op)).map_err(|cause| {
            JsonPatchError::Operation {
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
        assert!(matches!(
            err,
            JsonPatchError::Operation { operation: 0, .. }
        ));
        assert_eq!(doc["metadata"]["finalizers"], json!(["x"]));
        // A failure later in the patch names its index and undoes the earlier ops.
        let bad = ops(json!([
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "remove", "path": "/spec"}
        ]));
        let err = apply_json_patch(&mut doc, &bad).unwrap_err();
        assert_eq!(
            err.to_string(),
            "operation '/1' failed at path '/spec': path is invalid"
        );
        assert_eq!(doc["metadata"]["name"], "a");
    }

    #[test]
    fn copies_that_double_the_document_are_stopped() {
        let mut doc = json!({"data": "x".repeat(1024 * 1024)});
        let bomb: Vec<Value> = (0..40)
            .map(|i| json!({"op": "copy", "from": "", "path": format!("/c{i}")}))
            .collect();
        let err = apply_json_patch(&mut doc, &ops(Value::Array(bomb))).unwrap_err();
        assert!(matches!(err, JsonPatchError::CopyLimit));
        assert!(doc.get("c0").is_none());
        let many: Vec<Value> = (0..=MAX_OPERATIONS)
            .map(|_| json!({"op": "test", "path": "/data", "value": null}))
            .collect();
        assert!(matches!(
            apply_json_patch(&mut doc, &ops(Value::Array(many))),
            Err(JsonPatchError::TooManyOperations(10_001))
        ));
    }
}
