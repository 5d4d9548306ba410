//! `pods/eviction`: a delete that respects the pod's PodDisruptionBudget, as upstream's
//! eviction REST handler. A pod that is not running (pending, finished, already being
//! deleted) goes at once; otherwise the one budget selecting it must allow a disruption:
//! the apiserver takes it (`disruptionsAllowed - 1`, the pod recorded in
//! `status.disruptedPods` so the disruption controller does not count it healthy while it
//! goes) with a compare-and-swap on the budget, then deletes the pod. A budget with no
//! disruption left answers 429 TooManyRequests, which `kubectl drain` retries.

use bytes::Bytes;
use http::StatusCode;
use krust_api::selector::LabelSelector;
use krust_api::status::{ApiError, Cause};
use krust_store::{Compare, Op, Txn, TxnResult};
use serde_json::{Value, json};

use super::{Call, now, store_error};
use crate::request::Verb;
use crate::response::{self, Response};

/// Attempts at taking a disruption while the budget keeps changing.
const CONFLICT_RETRIES: usize = 5;
/// Upstream's `MaxDisruptedPodSize`: evictions the controller has not yet confirmed.
const MAX_DISRUPTED_PODS: usize = 2000;
/// `StatusCause.type` of budget refusals (policy/v1 `DisruptionBudgetCause`).
const DISRUPTION_BUDGET: &str = "DisruptionBudget";
const VIOLATION: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

pub async fn evict(call: &mut Call<'_>) -> Result<Response, ApiError> {
    let eviction = call.decode_body(("policy/v1", "Eviction"))?;
    let name = call.name().to_string();
    if let Some(named) = eviction["metadata"]["name"].as_str()
        && !named.is_empty()
        && named != name
    {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object: {name} vs {named}"
        )));
    }
    let (pod, _) = call.current(&name).await?;
    if !bypasses_budgets(&pod) {
        take_disruption(call, &pod).await?;
    }
    mark_disruption_target(call, &name).await?;
    let mut del = call.clone();
    del.info.verb = Verb::Delete;
    del.info.subresource = None;
    del.body = match eviction.get("deleteOptions") {
        Some(opts) if opts.is_object() => Bytes::from(serde_json::to_vec(opts).unwrap_or_default()),
        _ => Bytes::new(),
    };
    del.content_type = Some("application/json".into());
    super::delete::delete(&del).await?;
    Ok(response::json(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// Upstream's condition on an evicted pod, written before it is deleted so that whoever
/// watches it (a Job's pod failure policy) can tell an eviction from a failure.
async fn mark_disruption_target(call: &Call<'_>, name: &str) -> Result<(), ApiError> {
    for attempt in 0..CONFLICT_RETRIES {
        let (mut pod, revision) = call.current_for_write(name, attempt > 0).await?;
        let mut conditions: Vec<Value> = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "DisruptionTarget");
        conditions.push(json!({
            "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting", "lastTransitionTime": now(),
        }));
        pod["status"]["conditions"] = Value::Array(conditions);
        match call.put(name, pod, Compare::ModRevision(revision)).await {
            Err(e) if e.code == 409 => continue,
            done => return done.map(|_| ()),
        }
    }
    Err(ApiError::conflict(
        call.target(name),
        "the pod kept changing; try again",
    ))
}

/// Pods that are not running cost no availability (upstream's `canIgnorePDB`).
fn bypasses_budgets(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_string()
        || matches!(
            pod["status"]["phase"].as_str(),
            Some("Pending" | "Succeeded" | "Failed")
        )
}

fn refusal(retry_after: u32, cause: String) -> ApiError {
    let mut err = ApiError::too_many_requests(retry_after);
    err.message = VIOLATION.into();
    if let Some(details) = err.details.as_mut() {
        details.causes.push(Cause {
            reason: DISRUPTION_BUDGET,
            message: cause,
            field: String::new(),
        });
    }
    err
}

/// Checks the budget that selects `pod` and takes one disruption from it.
async fn take_disruption(call: &Call<'_>, pod: &Value) -> Result<(), ApiError> {
    let namespace = call.namespace().unwrap_or_default();
    let prefix = format!("/registry/poddisruptionbudgets/{namespace}/");
    let pod_labels = krust_api::selector::object_labels(pod);
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let selects = |pdb: &Value| {
        LabelSelector::from_label_selector_json(&pdb["spec"]["selector"])
            .is_ok_and(|s| !pdb["spec"]["selector"].is_null() && s.matches(&pod_labels))
    };
    call.consistent().await?;
    for _ in 0..CONFLICT_RETRIES {
        let budgets: Vec<(Value, i64)> = call
            .stored(&prefix)
            .await?
            .into_iter()
            .filter(|(pdb, _)| selects(pdb))
            .collect();
        let (mut pdb, revision) = match budgets.len() {
            0 => return Ok(()),
            1 => budgets.into_iter().next().expect("one budget"),
            _ => {
                return Err(ApiError::internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
        };
        let pdb_name = pdb["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let status = &pdb["status"];
        let int = |field: &str| status[field].as_i64().unwrap_or(0);
        if !crate::json::ready(pod) {
            let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
            let healthy_budget =
                int("currentHealthy") >= int("desiredHealthy") && int("desiredHealthy") > 0;
            if always || healthy_budget {
                return Ok(());
            }
        }
        if int("observedGeneration") < pdb["metadata"]["generation"].as_i64().unwrap_or(0) {
            return Err(refusal(
                10,
                format!("The disruption budget {pdb_name} is still being processed by the server."),
            ));
        }
        let forbidden = |why: &str| {
            ApiError::forbidden_for(
                krust_api::status::Target {
                    group: "policy",
                    resource: "poddisruptionbudget",
                    name: &pdb_name,
                },
                why,
            )
        };
        let allowed = int("disruptionsAllowed");
        if allowed < 0 {
            return Err(forbidden("pdb disruptions allowed is negative"));
        }
        let disrupted = status["disruptedPods"].as_object().map_or(0, |m| m.len());
        if disrupted > MAX_DISRUPTED_PODS {
            return Err(forbidden(
                "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
            ));
        }
        if allowed == 0 {
            return Err(refusal(
                0,
                format!(
                    "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                    int("desiredHealthy"),
                    int("currentHealthy")
                ),
            ));
        }
        if call.dry_run() {
            return Ok(());
        }
        pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
        pdb["status"]["disruptedPods"][pod_name] = json!(now());
        if allowed == 1 {
            set_insufficient(&mut pdb);
        }
        if let Some(meta) = pdb["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        let bytes = serde_json::to_vec(&pdb).map_err(|e| ApiError::internal(e.to_string()))?;
        let txn = Txn {
            key: format!("{prefix}{pdb_name}"),
            compare: Compare::ModRevision(revision),
            op: Op::Put(bytes.into()),
        };
        match call.scope.store.txn(txn).await.map_err(store_error)? {
            TxnResult::Succeeded { .. } => return Ok(()),
            TxnResult::Failed { .. } => continue,
        }
    }
    Err(ApiError::conflict(
        call.target(pod_name),
        "the disruption budget kept changing; try again",
    ))
}

/// The DisruptionAllowed condition once the last disruption is taken (upstream's
/// `UpdateDisruptionAllowedCondition`).
fn set_insufficient(pdb: &mut Value) {
    let conditions = pdb["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut kept: Vec<Value> = conditions
        .into_iter()
        .filter(|c| c["type"] != "DisruptionAllowed")
        .collect();
    kept.push(json!({
        "type": "DisruptionAllowed",
        "status": "False",
        "reason": "InsufficientPods",
        "message": "",
        "observedGeneration": pdb["metadata"]["generation"],
        "lastTransitionTime": now(),
    }));
    pdb["status"]["conditions"] = Value::Array(kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_that_are_not_running_bypass_budgets() {
        assert!(bypasses_budgets(&json!({"status": {"phase": "Pending"}})));
        assert!(bypasses_budgets(&json!({"status": {"phase": "Failed"}})));
        assert!(bypasses_budgets(
            &json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}})
        ));
        assert!(!bypasses_budgets(&json!({"status": {"phase": "Running"}})));
    }

    #[test]
    fn a_refusal_is_upstreams_429() {
        let status = refusal(
            0,
            "The disruption budget db needs 2 healthy pods and has 2 currently".into(),
        )
        .to_status();
        assert_eq!(status["code"], 429);
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["message"], VIOLATION);
        assert_eq!(status["details"]["causes"][0]["reason"], "DisruptionBudget");
        assert_eq!(
            status["details"]["causes"][0]["message"],
            "The disruption budget db needs 2 healthy pods and has 2 currently"
        );
    }
}
