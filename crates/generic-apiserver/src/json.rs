//! Small readers of JSON values that the apiserver's checks share.

use serde_json::Value;

/// The strings of a JSON list (anything else in it, or a non-list, reads as nothing).
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// Whether an object's (a pod's, a node's) `Ready` condition is `True`.
pub fn ready(obj: &Value) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}
