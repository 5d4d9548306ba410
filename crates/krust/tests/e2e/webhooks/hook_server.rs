//! An admission webhook server for the tests, in the test process (for `127.0.0.1` and
//! `hook.hooks.svc`), answering AdmissionReviews on
//! - `/mutate`: adds the label `mutated-by: hook` (a JSONPatch);
//! - `/unhost`: takes a pod off the host's network (`hostNetwork: false`);
//! - `/meddle`: sets a Deployment's `minReadySeconds` to 7 and its uid to `meddled`;
//! - `/validate`: refuses objects with a `forbidden` data key (403, "forbidden key")
//!   and the deletion of objects named `keep`, and otherwise warns "checked by hook"
//!   and adds the audit annotation `verdict: allowed` (and one with an invalid key).

use base64::Engine;
use serde_json::{Value, json};

use crate::https::{HttpsServer, Seen};

pub fn start() -> HttpsServer {
    HttpsServer::start(&["hook.hooks.svc"], None, answer)
}

/// The AdmissionReview requests received on `path`.
pub fn requests(server: &HttpsServer, path: &str) -> Vec<Value> {
    server
        .requests()
        .into_iter()
        .filter(|s| s.uri.split('?').next() == Some(path))
        .map(|s| s.body["request"].clone())
        .collect()
}

fn answer(seen: &Seen) -> (u16, Value) {
    let request = &seen.body["request"];
    let uid = request["uid"].clone();
    let response = match seen.uri.split('?').next().unwrap_or_default() {
        "/mutate" => {
            let labels = &request["object"]["metadata"]["labels"];
            let patch = if labels.is_object() {
                json!([{"op": "add", "path": "/metadata/labels/mutated-by", "value": "hook"}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated-by": "hook"}}])
            };
            json!({
                "uid": uid, "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            })
        }
        "/unhost" if request["object"]["spec"]["hostNetwork"] == true => {
            let patch = json!([{"op": "replace", "path": "/spec/hostNetwork", "value": false}]);
            json!({
                "uid": uid, "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            })
        }
        "/unhost" => json!({"uid": uid, "allowed": true}),
        "/meddle" => {
            let patch = json!([
                {"op": "replace", "path": "/metadata/uid", "value": "meddled"},
                {"op": "add", "path": "/spec/minReadySeconds", "value": 7}
            ]);
            json!({
                "uid": uid, "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            })
        }
        _ if request["operation"] == "DELETE" && request["name"] == "keep" => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "keep stays"},
        }),
        _ if request["object"]["data"]["forbidden"].is_string() => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "forbidden key"},
        }),
        _ => json!({"uid": uid, "allowed": true, "warnings": ["checked by hook"],
                    "auditAnnotations": {"verdict": "allowed", "not a key!": "dropped"}}),
    };
    (
        200,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}
