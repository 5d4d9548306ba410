//! An admission webhook server for the tests, in the test process (for `127.0.0.1` and
//! `hook.hooks.svc`), answering AdmissionReviews on
//! - `/mutate`: adds the label `mutated-by: hook` (a JSONPatch);
//! - `/unhost`: takes a pod off the host's network (`hostNetwork: false`);
//! - `/meddle`: sets a Deployment's `minReadySeconds` to 7 and its uid to `meddled`;
//! - `/stray`: sets a ConfigMap's data key `added` or a custom object's `spec.size`
//!   to 3, and adds a field neither kind has (`/stray` or `/spec/stray`);
//! - `/grow`: sets a pod's first container's memory limit to 2Gi;
//! - `/first`: sets the data key `first` to `after second` once the object has the
//!   label `second`, else to `alone`;
//! - `/second`: adds the label `second: yes`, and `skip-first: yes` to objects
//!   labelled `ask-skip`;
//! - `/validate`: refuses objects with a `forbidden` data key (403, "forbidden key"),
//!   the deletion of objects named `keep` and connections asking for a terminal
//!   (`tty`, "no terminals here"), objects labelled `refuse` ("labelled refuse"),
//!   and otherwise warns "checked by hook"
//!   and adds the audit annotation `verdict: allowed` (and one with an invalid key).

use base64::Engine;
use serde_json::{Value, json};

use crate::https::{HttpsServer, Seen};

pub fn start() -> HttpsServer {
    HttpsServer::start(&["hook.hooks.svc"], None, answer)
}

/// The same server with a certificate that is its own CA (`openssl req -x509`'s kind).
pub fn start_self_signed() -> HttpsServer {
    HttpsServer::start_self_signed(&["hook.hooks.svc"], answer)
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
            patched(uid, patch)
        }
        "/unhost" if request["object"]["spec"]["hostNetwork"] == true => {
            let patch = json!([{"op": "replace", "path": "/spec/hostNetwork", "value": false}]);
            patched(uid, patch)
        }
        "/unhost" => json!({"uid": uid, "allowed": true}),
        "/meddle" => {
            let patch = json!([
                {"op": "replace", "path": "/metadata/uid", "value": "meddled"},
                {"op": "add", "path": "/spec/minReadySeconds", "value": 7}
            ]);
            patched(uid, patch)
        }
        "/stray" if request["kind"]["kind"] == "ConfigMap" => patched(
            uid,
            json!([{"op": "add", "path": "/data/added", "value": "3"},
                   {"op": "add", "path": "/stray", "value": "x"}]),
        ),
        "/stray" => patched(
            uid,
            json!([{"op": "add", "path": "/spec/size", "value": 3},
                   {"op": "add", "path": "/spec/stray", "value": "x"}]),
        ),
        "/grow" => patched(
            uid,
            json!([{"op": "add", "path": "/spec/containers/0/resources",
                    "value": {"limits": {"memory": "2Gi"}}}]),
        ),
        "/first" => {
            let labels = &request["object"]["metadata"]["labels"];
            let seen = if labels["second"].is_string() {
                "after second"
            } else {
                "alone"
            };
            patched(
                uid,
                json!([{"op": "add", "path": "/data/first", "value": seen}]),
            )
        }
        "/second" => {
            let labels = &request["object"]["metadata"]["labels"];
            let mut patch =
                vec![json!({"op": "add", "path": "/metadata/labels/second", "value": "yes"})];
            if labels["ask-skip"].is_string() {
                patch.push(
                    json!({"op": "add", "path": "/metadata/labels/skip-first", "value": "yes"}),
                );
            }
            patched(uid, Value::Array(patch))
        }
        _ if request["operation"] == "DELETE" && request["name"] == "keep" => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "keep stays"},
        }),
        _ if request["operation"] == "CONNECT" && request["object"]["tty"] == true => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "no terminals here"},
        }),
        _ if request["object"]["metadata"]["labels"]["refuse"].is_string() => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "labelled refuse"},
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

/// An allowing response with a JSONPatch.
fn patched(uid: Value, patch: Value) -> Value {
    json!({
        "uid": uid, "allowed": true, "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
    })
}
