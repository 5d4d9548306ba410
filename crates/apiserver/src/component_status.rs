//! core/v1 ComponentStatus (`kubectl get componentstatuses`; deprecated upstream, still
//! served): the health of the scheduler, the controller manager and the store, worked out
//! on every request. Upstream probes the components' `/healthz` ports on its own host;
//! krust's components may run in this process or on any machine, so a component is
//! Healthy while the leader-election Lease it renews through the API is fresh — the one
//! sign of life every instance of it gives wherever it runs.

use std::time::Duration;

use http::StatusCode;
use krust_api::status::{ApiError, Target};
use serde_json::json;

use crate::request::Verb;
use crate::response::{self, Response};
use crate::rest::Call;

/// The components reported, in upstream's order, with the Lease each one renews.
const COMPONENTS: &[(&str, Option<&str>)] = &[
    ("scheduler", Some("kube-scheduler")),
    ("controller-manager", Some("kube-controller-manager")),
    ("etcd-0", None),
];

pub const VERBS: &[&str] = &["get", "list"];

pub async fn serve(call: &mut Call<'_>) -> Result<Response, ApiError> {
    let verb = call.read_only_verb()?;
    call.warnings
        .add("v1 ComponentStatus is deprecated in v1.19+".to_string());
    let mut items = Vec::new();
    for (name, lease) in COMPONENTS {
        if verb == Verb::Get && call.name() != *name {
            continue;
        }
        let health = match lease {
            Some(lease) => lease_health(call, lease),
            None => store_health(call).await,
        };
        let condition = match health {
            Ok(()) => json!({"type": "Healthy", "status": "True", "message": "ok"}),
            Err(error) => json!({"type": "Healthy", "status": "False", "error": error}),
        };
        items.push(json!({
            "kind": "ComponentStatus",
            "apiVersion": "v1",
            "metadata": {"name": name},
            "conditions": [condition],
        }));
    }
    let encoded: Vec<bytes::Bytes> = items
        .iter()
        .map(|i| bytes::Bytes::from(serde_json::to_vec(i).unwrap_or_default()))
        .collect();
    let resp = match (verb, encoded.first()) {
        (Verb::Get, Some(one)) => response::object(call.kind, call.output, StatusCode::OK, one),
        (Verb::Get, None) => {
            return Err(ApiError::not_found(Target {
                group: "",
                resource: "componentstatus",
                name: call.name(),
            }));
        }
        _ => response::list(
            call.kind,
            call.output,
            &encoded,
            call.scope.cache.revision(),
            None,
        ),
    };
    Ok(call.with_warnings(resp))
}

/// Whether someone holds `kube-system/<lease>` and renewed it within its duration.
fn lease_health(call: &Call<'_>, lease: &str) -> Result<(), String> {
    let info = krust_api::registry::find("coordination.k8s.io", "v1", "leases")
        .expect("leases are served");
    let Some(obj) = call.scope.cache.object(info, Some("kube-system"), lease) else {
        return Err(format!(
            "no Lease kube-system/{lease}: the component has not started"
        ));
    };
    let spec = &obj["spec"];
    let renewed = spec["renewTime"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let duration = spec["leaseDurationSeconds"].as_i64().unwrap_or(0);
    match renewed {
        Some(at) if jiff::Timestamp::now().as_second() - at.as_second() <= duration => Ok(()),
        _ => Err(format!(
            "the Lease kube-system/{lease} was not renewed within its {duration}s"
        )),
    }
}

/// Whether the store answers within a second.
async fn store_health(call: &Call<'_>) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(1), call.scope.store.current_revision()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the store did not answer within 1s".into()),
    }
}
