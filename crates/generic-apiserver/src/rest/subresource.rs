//! Subresources: `status` (and namespaces' `finalize`), `scale` (an autoscaling/v1 Scale
//! view of `spec.replicas`), pods' `binding` (the scheduler's write), `eviction`
//! ([`super::eviction`]) and `ephemeralcontainers`, and the `approval` of certificate
//! signing requests.

use http::StatusCode;
use krust_api::registry::Subresource;
use krust_api::status::ApiError;
use krust_store::Compare;
use serde_json::{Value, json};

use krust_apimachinery::patch::{TypeRef, root_type};

use super::write::{Ownership, PatchType, apply_patch, patch, patch_type, update, update_object};
use super::{Call, Part, now, parse_rv};
use crate::request::Verb;
use crate::response::{self, Response};

pub async fn serve(call: &mut Call<'_>, sub: &str) -> Result<Response, ApiError> {
    let info = call.kind.info;
    let verb = call.info.verb;
    if sub == "finalize" && info.plural == "namespaces" {
        return match verb {
            Verb::Update => update(call, Part::Finalize).await,
            _ => Err(ApiError::method_not_allowed(
                verb.as_str(),
                "namespaces/finalize",
            )),
        };
    }
    let Some(sub) = Subresource::parse(sub).filter(|s| info.has_subresource(*s)) else {
        return Err(ApiError::path_not_found());
    };
    if !sub.verbs().contains(&verb.as_str()) {
        return Err(ApiError::method_not_allowed(
            verb.as_str(),
            &format!("{}/{}", info.plural, sub.name()),
        ));
    }
    match (sub, verb) {
        (
            Subresource::Status | Subresource::Approval | Subresource::EphemeralContainers,
            Verb::Get,
        ) => super::read::get(call).await,
        (Subresource::Status, Verb::Update) => update(call, Part::Status).await,
        (Subresource::Status, Verb::Patch) => patch(call, Part::Status).await,
        (Subresource::Approval, Verb::Update) => update(call, Part::Approval).await,
        (Subresource::Approval, Verb::Patch) => patch(call, Part::Approval).await,
        (Subresource::EphemeralContainers, Verb::Update) => {
            update(call, Part::EphemeralContainers).await
        }
        (Subresource::EphemeralContainers, Verb::Patch) => {
            patch(call, Part::EphemeralContainers).await
        }
        (Subresource::Scale, Verb::Get) => {
            let (obj, rev) = call.current(call.name()).await?;
            Ok(response::json(StatusCode::OK, &scale_of(call, &obj, rev)))
        }
        (Subresource::Scale, Verb::Update | Verb::Patch) => scale_write(call).await,
        (Subresource::Binding, Verb::Create) => bind(call).await,
        (Subresource::Eviction, Verb::Create) => super::eviction::evict(call).await,
        (Subresource::Token, Verb::Create) => token(call).await,
        _ => Err(ApiError::method_not_allowed(verb.as_str(), sub.name())),
    }
}

/// The autoscaling/v1 Scale of a workload.
fn scale_of(call: &Call<'_>, obj: &Value, rev: i64) -> Value {
    let m = &obj["metadata"];
    let (replicas, current, selector) = call.kind.strategy.scale(obj);
    let mut scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"], "resourceVersion": rev.to_string(), "creationTimestamp": m["creationTimestamp"]},
        "spec": {"replicas": replicas},
        "status": {"replicas": current},
    });
    if !selector.is_empty() {
        scale["status"]["selector"] = json!(selector);
    }
    scale
}

/// Writes of the scale subresource. Without a resourceVersion in the Scale, a write
/// that loses a race with another writer of the object (its controller's status, say)
/// is made again on the fresh object, as upstream's `GuaranteedUpdate` does.
async fn scale_write(call: &mut Call<'_>) -> Result<Response, ApiError> {
    const ATTEMPTS: usize = 5;
    let name = call.name().to_string();
    let body = match call.info.verb {
        Verb::Update => Some(call.decode_body(("autoscaling/v1", "Scale"))?),
        _ => None,
    };
    for attempt in 1..=ATTEMPTS {
        let (old, rev) = call.current(&name).await?;
        let scale = match &body {
            Some(scale) => scale.clone(),
            None => {
                // Patch the Scale view, then map it back.
                let patched = patch_scale_view(call, &scale_of(call, &old, rev))?;
                call.decode_value(patched, ("autoscaling/v1", "Scale"))?
            }
        };
        let precondition = scale["metadata"]["resourceVersion"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(parse_rv)
            .transpose()?;
        if precondition.is_some_and(|want| want != rev) {
            return Err(ApiError::stale(call.target(&name)));
        }
        let replicas = scale["spec"]["replicas"].as_i64().unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                "Scale",
                "autoscaling",
                &name,
                vec![krust_api::status::Cause::invalid(
                    "spec.replicas",
                    &json!(replicas),
                    "must be greater than or equal to 0",
                )],
            ));
        }
        let mut new = old.clone();
        call.kind.strategy.set_replicas(&mut new, replicas);
        let updated = match update_object(call, Part::Main, new, old, rev, Ownership::Record).await
        {
            Err(e) if e.code == 409 && precondition.is_none() && attempt < ATTEMPTS => continue,
            other => other?,
        };
        let new_rev = updated["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(rev);
        return Ok(response::json(
            StatusCode::OK,
            &scale_of(call, &updated, new_rev),
        ));
    }
    unreachable!("the last attempt returns")
}

/// A JSON, merge or strategic merge patch of the Scale view (server-side apply of a
/// Scale is not supported yet: 415).
fn patch_scale_view(call: &Call<'_>, view: &Value) -> Result<Value, ApiError> {
    let ty = patch_type(call.content_type.as_deref())?;
    if ty == PatchType::Apply {
        return Err(ApiError::unsupported_media_type(
            "application/apply-patch+yaml",
        ));
    }
    let patch: Value = serde_json::from_slice(&call.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let root = root_type("autoscaling", "v1", "Scale").unwrap_or(TypeRef::UNTYPED);
    apply_patch(ty, view, &patch, root)
}

/// pods/binding: sets spec.nodeName once, with the PodScheduled condition.
async fn bind(call: &mut Call<'_>) -> Result<Response, ApiError> {
    let binding = call.decode_body(("v1", "Binding"))?;
    let name = call.name().to_string();
    let node = binding["target"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "Binding",
            "",
            &name,
            vec![krust_api::status::Cause::required("target.name")],
        ));
    }
    let (old, rev) = call.current(&name).await?;
    if old["metadata"]["deletionTimestamp"].is_string() {
        return Err(ApiError::conflict(
            call.target(&name),
            "pod is being deleted, cannot be assigned to a host",
        ));
    }
    if let Some(current) = old["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        return Err(ApiError::conflict(
            call.target(&name),
            &format!("pod {name} is already assigned to node \"{current}\""),
        ));
    }
    let mut new = old.clone();
    new["spec"]["nodeName"] = json!(node);
    let mut conditions: Vec<Value> = new["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != "PodScheduled");
    conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now()}));
    new["status"]["conditions"] = Value::Array(conditions);
    call.put(&name, new, Compare::ModRevision(rev)).await?;
    Ok(response::json(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// A TokenRequest for a service account, optionally bound to a pod of its namespace
/// (which must exist, with the UID given).
async fn token(call: &mut Call<'_>) -> Result<Response, ApiError> {
    // The status is the answer's; clients send it empty (kubectl: a null timestamp).
    let mut body = call.body_value()?;
    if let Some(obj) = body.as_object_mut() {
        obj.remove("status");
    }
    let request = call.decode_value(body, ("authentication.k8s.io/v1", "TokenRequest"))?;
    let name = call.name().to_string();
    let (sa, _) = call.current(&name).await?;
    let bound = &request["spec"]["boundObjectRef"];
    let pod = match bound["kind"].as_str() {
        None => None,
        Some("Pod") => {
            let pod_name = bound["name"].as_str().unwrap_or_default();
            let pod = call
                .scope
                .cache
                .core_object("pods", call.namespace(), pod_name)
                .ok_or_else(|| {
                    ApiError::not_found(krust_api::status::Target {
                        group: "",
                        resource: "pods",
                        name: pod_name,
                    })
                })?;
            if let Some(uid) = bound["uid"].as_str().filter(|u| !u.is_empty())
                && pod["metadata"]["uid"] != uid
            {
                return Err(ApiError::conflict(
                    call.target(&name),
                    &format!(
                        "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
                    ),
                ));
            }
            Some(pod)
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {other}"
            )));
        }
    };
    let answer = call
        .scope
        .tokens
        .token_request(&sa, &request, pod.as_ref())?;
    Ok(response::json(StatusCode::CREATED, &answer))
}
