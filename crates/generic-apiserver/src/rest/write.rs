//! CREATE, UPDATE and PATCH: decode → default → prepare → validate → admit → store, with
//! optimistic concurrency on the object's resourceVersion.

use http::StatusCode;
use krust_api::status::{ApiError, Cause};
use krust_apimachinery::patch::{JsonPatchError, TypeRef, apply_strategic_merge_patch, root_type};
use krust_apimachinery::protobuf::go_order;
use krust_store::{Compare, Revision};
use serde_json::{Value, json};

use super::{Call, Part, now, parse_rv, store_error};
use crate::admission::{Attributes, Operation};
use crate::response::Response;
use crate::validation::{check_annotations, check_generate_name, check_labels, check_name};

/// Who computes a write's managedFields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Record the write as an Update by the call's field manager.
    Record,
    /// Server-side apply has already computed them.
    Applied,
}

/// How many times a patch without a resourceVersion is retried on a write conflict.
const PATCH_RETRIES: usize = 5;

pub async fn create(call: &mut Call<'_>) -> Result<Response, ApiError> {
    let info = call.kind.info;
    let mut obj = call.decode_body((&info.api_version(), info.kind))?;
    obj = call.to_storage(obj).await?;
    let created = create_object(call, obj, Ownership::Record).await?;
    let served = call.to_served(created).await?;
    Ok(call.reply(StatusCode::CREATED, &served))
}

/// Creates an object already decoded into storage form. Shared by POST and by
/// server-side apply of a missing object.
pub async fn create_object(
    call: &Call<'_>,
    mut obj: Value,
    ownership: Ownership,
) -> Result<Value, ApiError> {
    let info = call.kind.info;
    let meta = obj["metadata"]
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata is required"))?;
    // Namespace: the URL's wins; a different one in the body is an error.
    if info.namespaced {
        let url_ns = call.namespace().unwrap_or_default().to_string();
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != url_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(url_ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let name = match meta
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        Some(n) => n.to_string(),
        None => match meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            Some(prefix) => krust_api::names::generate_name(prefix),
            None => {
                return Err(ApiError::invalid(
                    info.kind,
                    info.group,
                    "",
                    vec![Cause::required("metadata.name")],
                ));
            }
        },
    };
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    for f in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(f);
    }
    if call.kind.strategy.tracks_generation() {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    call.kind.strategy.default(&mut obj);
    drop_empty_metadata(&mut obj);
    call.kind.strategy.prepare_for_create(&mut obj);
    call.kind.strategy.record_requester(&mut obj, &call.user);
    if ownership == Ownership::Record {
        call.record_update(Part::Main, None, &mut obj);
    }
    validate(call, &obj, None)?;
    let attrs = Attributes::new(call, Operation::Create, None);
    call.scope.admission.mutate(&attrs, Some(&mut obj)).await?;
    let Some(storage) = call.scope.storage_of(call.kind) else {
        call.scope.admission.validate(&attrs, Some(&obj)).await?;
        return call.put(&name, obj, Compare::Absent).await.map(|(v, _)| v);
    };
    storage.begin_create(call, &mut obj).await?;
    let began = obj.clone();
    let stored = match call.scope.admission.validate(&attrs, Some(&obj)).await {
        Ok(()) => call.put(&name, obj, Compare::Absent).await.map(|(v, _)| v),
        Err(e) => Err(e),
    };
    if stored.is_err() {
        storage.release(call, &began).await;
    }
    stored
}

/// Empty metadata lists and maps are stored as absent, as upstream's `omitempty` does:
/// a client that patches its last owner reference or finalizer away (`[]`) reads the
/// object back without the field.
fn drop_empty_metadata(obj: &mut Value) {
    let Some(meta) = obj["metadata"].as_object_mut() else {
        return;
    };
    meta.retain(|k, v| {
        let empty = match v {
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        !(empty
            && matches!(
                k.as_str(),
                "ownerReferences" | "finalizers" | "labels" | "annotations" | "managedFields"
            ))
    });
}

/// Metadata checks plus the kind's validation; `old` for updates.
pub fn validate(call: &Call<'_>, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let info = call.kind.info;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let mut errs = Vec::new();
    let rule = call.kind.strategy.name_rule();
    if let Some(prefix) = obj["metadata"]["generateName"]
        .as_str()
        .filter(|p| !p.is_empty())
    {
        check_generate_name(rule, "metadata.generateName", prefix, &mut errs);
    }
    check_name(rule, "metadata.name", name, &mut errs);
    check_labels("metadata.labels", &obj["metadata"]["labels"], &mut errs);
    check_annotations(
        "metadata.annotations",
        &obj["metadata"]["annotations"],
        &mut errs,
    );
    call.kind.strategy.validate(obj, &mut errs);
    match old {
        Some(old) => call.kind.strategy.validate_update_of(
            call.info.subresource.as_deref(),
            obj,
            old,
            &mut errs,
        ),
        None => call.kind.strategy.validate_create(obj, &mut errs),
    }
    if errs.is_empty() {
        for warning in call.kind.strategy.warnings(obj) {
            call.warnings.add(warning);
        }
        Ok(())
    } else {
        Err(ApiError::invalid(info.kind, info.group, name, errs))
    }
}

pub async fn update(call: &mut Call<'_>, part: Part) -> Result<Response, ApiError> {
    let info = call.kind.info;
    let body = call.decode_body((&info.api_version(), info.kind))?;
    let body = call.to_storage(body).await?;
    let name = call.name().to_string();
    let body_name = body["metadata"]["name"].as_str().unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let precondition = match body["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
    {
        Some(rv) => Some(parse_rv(rv)?),
        None => None,
    };
    // Without a resourceVersion the update is unconditional: one that loses a race with
    // another writer (a kubelet's status, say) is made again on the fresh object, as
    // upstream's `GuaranteedUpdate` does.
    const ATTEMPTS: usize = 5;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (old, old_rev) = call.current_for_write(&name, attempt > 1).await?;
        if precondition.is_some_and(|rv| rv != old_rev) {
            return Err(ApiError::stale(call.target(&name)));
        }
        match update_object(call, part, body.clone(), old, old_rev, Ownership::Record).await {
            Err(e) if e.code == 409 && precondition.is_none() && attempt < ATTEMPTS => continue,
            updated => {
                return Ok(call.reply(StatusCode::OK, &call.to_served(updated?).await?));
            }
        }
    }
}

/// Applies an update of `part` from `new` onto `old` (at `old_rev`) and stores it.
pub async fn update_object(
    call: &Call<'_>,
    part: Part,
    mut new: Value,
    old: Value,
    old_rev: Revision,
    ownership: Ownership,
) -> Result<Value, ApiError> {
    let has_status = call.kind.has_status();
    match part {
        Part::Main => {
            if has_status {
                new["status"] = old["status"].clone();
                if old.get("status").is_none() {
                    new.as_object_mut().map(|m| m.remove("status"));
                }
            }
        }
        // A subresource writes one field of the stored object and nothing else.
        Part::Status | Part::Finalize | Part::Approval | Part::EphemeralContainers => {
            let path = part.field().unwrap_or_default();
            let value = at_path(&mut new, path).take();
            new = old.clone();
            *at_path(&mut new, path) = value;
        }
    }
    call.kind.strategy.prepare_for_update(part, &mut new, &old);
    // System-owned metadata comes from the stored object.
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
    ] {
        match old["metadata"].get(f) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                new["metadata"].as_object_mut().map(|m| m.remove(f));
            }
        }
    }
    // What the request brought is defaulted (a new ephemeral container too).
    if matches!(part, Part::Main | Part::EphemeralContainers) {
        call.kind.strategy.default(&mut new);
        drop_empty_metadata(&mut new);
    }
    // As Go holds it, zero values included, like `old` (see `Call::current_for_write`):
    // comparing the two then finds only what the request changed, as upstream's
    // comparisons of Go structs do.
    go_order(&mut new);
    if call.kind.strategy.tracks_generation() && spec_changed(&new, &old, has_status) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        new["metadata"]["generation"] = json!(g);
    }
    if ownership == Ownership::Record {
        call.record_update(part, Some(&old), &mut new);
    }
    new["metadata"]["resourceVersion"] = json!(old_rev.to_string());
    let mut old_cmp = old.clone();
    old_cmp["metadata"]["resourceVersion"] = json!(old_rev.to_string());
    if new == old_cmp {
        // Nothing changed: no write, same resourceVersion, as upstream — unless the
        // stored value is sealed with an older encryption key, which this write renews.
        let key = call.key(call.name());
        if !call.scope.store.stale(&key).await.map_err(store_error)? {
            return Ok(old_cmp);
        }
    }
    validate(call, &new, Some(&old))?;
    let attrs = Attributes::new(call, Operation::Update, Some(&old));
    call.scope.admission.mutate(&attrs, Some(&mut new)).await?;
    if let Some(storage) = call.scope.storage_of(call.kind) {
        storage.begin_update(call, &mut new, &old).await?;
    }
    call.scope.admission.validate(&attrs, Some(&new)).await?;
    let name = call.name().to_string();
    let deleting = new["metadata"]["deletionTimestamp"].is_string();
    let no_finalizers = new["metadata"]["finalizers"]
        .as_array()
        .is_none_or(Vec::is_empty);
    if deleting
        && no_finalizers
        && !call.kind.strategy.holds_deletion(&new)
        && !super::delete::waits_for_grace(&new)
    {
        // The last finalizer went away from an object being deleted: it is gone now.
        return super::delete::remove(call, &name, old_rev)
            .await
            .map(|_| new);
    }
    let (stored, _) = call.put(&name, new, Compare::ModRevision(old_rev)).await?;
    Ok(stored)
}

/// The value at `path` in `obj`, made (null) if missing.
fn at_path<'a>(obj: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(obj, |v, key| &mut v[*key])
}

/// Whether anything but metadata (and status, when it has its own subresource) differs.
/// Puts back in `obj` what the store owns — name, identity, timestamps, generation,
/// resourceVersion — from `before` (its metadata before the mutating webhooks ran), as
/// upstream's store sets them after mutating admission; on an update, a spec the
/// webhooks changed bumps the generation as a client's change would.
pub(crate) fn keep_system_metadata(
    call: &Call<'_>,
    obj: &mut Value,
    before: &Value,
    old: Option<&Value>,
) {
    for f in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match before.get(f) {
            Some(v) => obj["metadata"][f] = v.clone(),
            None => {
                obj["metadata"].as_object_mut().map(|m| m.remove(f));
            }
        }
    }
    // A webhook's patch may leave out a zero value Go would hold.
    go_order(obj);
    if let Some(old) = old
        && call.kind.strategy.tracks_generation()
        && spec_changed(obj, old, call.kind.has_status())
    {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        obj["metadata"]["generation"] = json!(g);
    }
}

fn spec_changed(new: &Value, old: &Value, has_status: bool) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            if has_status {
                m.remove("status");
            }
        }
        v
    };
    strip(new) != strip(old)
}

/// A strategic merge patch whose result does not fit the kind's types, as upstream's
/// unstructured converter refuses it (`cannot restore map from string`), quoting the
/// patch as Go prints it; other decoding errors pass as they are.
fn restore_error(e: ApiError, patch: &Value) -> ApiError {
    let Some(restore) = e
        .message
        .split_once("invalid type: ")
        .and_then(|(_, rest)| rest.split_once(", expected "))
        .and_then(|(found, expected)| {
            let from = match found.split([' ', '`']).next()? {
                "string" => "string",
                "integer" | "unsigned" => "int64",
                "floating" => "float64",
                "boolean" => "bool",
                "sequence" => "slice",
                "map" => "map",
                _ => return None,
            };
            Some(match expected {
                e if e.starts_with("a map") => format!("cannot restore map from {from}"),
                e if e.starts_with("a sequence") => format!("cannot restore slice from {from}"),
                e if e.starts_with("struct ") => format!("cannot restore struct from: {from}"),
                _ => return None,
            })
        })
    else {
        return e;
    };
    ApiError::invalid(
        "",
        "",
        "",
        vec![Cause::invalid("patch", &json!(go_print(patch)), restore)],
    )
}

/// A JSON value as Go's `fmt` prints the `map[string]interface{}` it decodes to
/// (`%+v`): `map[k:v ...]` with sorted keys, `[a b]`, bare strings, `<nil>`.
fn go_print(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            // Go decodes every JSON number to a float64 and prints it with %v.
            Some(f) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_print).collect();
            format!("[{}]", items.join(" "))
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by_key(|(k, _)| k.as_str());
            let entries: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{k}:{}", go_print(v)))
                .collect();
            format!("map[{}]", entries.join(" "))
        }
    }
}

/// The patch formats upstream accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

pub(super) fn patch_type(ct: Option<&str>) -> Result<PatchType, ApiError> {
    let media = ct
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    match media {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other})"
            ),
        )),
    }
}

pub async fn patch(call: &mut Call<'_>, part: Part) -> Result<Response, ApiError> {
    let ty = patch_type(call.content_type.as_deref())?;
    if call.body.len() > super::MAX_BODY {
        return Err(super::body_too_large());
    }
    let patch: Value = match ty {
        PatchType::Apply => serde_saphyr::from_slice(&call.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        _ => serde_json::from_slice(&call.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
    };
    if ty == PatchType::Apply && call.query.get("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::bad_request(
            "PATCH, application/apply-patch+yaml requires fieldManager",
        ));
    }
    let name = call.name().to_string();
    let info = call.kind.info;
    if ty == PatchType::Strategic
        && krust_api::registry::find(info.group, info.version, info.plural).is_none()
    {
        // Custom resources have no patch strategies to merge by, as upstream says.
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    for attempt in 0.. {
        let current = match call.current_for_write(&name, attempt > 0).await {
            Ok(c) => Some(c),
            Err(e) if e.code == 404 && ty == PatchType::Apply && part == Part::Main => None,
            Err(e) => return Err(e),
        };
        let Some((old, old_rev)) = current else {
            // Server-side apply of a missing object creates it.
            let mut obj = server_side_apply(call, part, None, &patch)?;
            // A YAML `metadata: name:x` is a string: refused, as upstream's typed
            // conversion refuses it (found by fuzzing: indexing into it panicked).
            let got = match obj.get("metadata") {
                _ if !obj.is_object() => Some("no object"),
                None | Some(Value::Null | Value::Object(_)) => None,
                Some(Value::String(_)) => Some("string"),
                Some(Value::Array(_)) => Some("list"),
                Some(_) => Some("scalar"),
            };
            if let Some(got) = got {
                return Err(ApiError::bad_request(format!(
                    "failed to create typed patch object ({}, Kind={}): .metadata: expected map, got {got}",
                    info.api_version(),
                    info.kind
                )));
            }
            obj["metadata"]["name"] = json!(name);
            let obj = call.decode_value(obj, (&info.api_version(), info.kind))?;
            let obj = call.to_storage(obj).await?;
            let created = create_object(call, obj, Ownership::Applied).await?;
            return Ok(call.reply(StatusCode::CREATED, &call.to_served(created).await?));
        };
        let mut served_old = call.to_served(old.clone()).await?;
        served_old["metadata"]["resourceVersion"] = json!(old_rev.to_string());
        let patched = match ty {
            PatchType::Apply => server_side_apply(call, part, Some(&served_old), &patch)?,
            _ => apply_patch(
                ty,
                &served_old,
                &patch,
                root_type(info.group, info.version, info.kind).unwrap_or(TypeRef::UNTYPED),
            )?,
        };
        let precondition = patched["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        if precondition
            .as_deref()
            .is_some_and(|rv| rv != old_rev.to_string())
        {
            return Err(ApiError::stale(call.target(&name)));
        }
        if patched["metadata"]["name"].as_str() != Some(name.as_str()) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                patched["metadata"]["name"].as_str().unwrap_or_default()
            )));
        }
        let new = call
            .decode_value(patched, (&info.api_version(), info.kind))
            .map_err(|e| match ty {
                PatchType::Strategic => restore_error(e, &patch),
                _ => e,
            })?;
        let new = call.to_storage(new).await?;
        let ownership = if ty == PatchType::Apply {
            Ownership::Applied
        } else {
            Ownership::Record
        };
        match update_object(call, part, new, old, old_rev, ownership).await {
            Err(e)
                if e.code == 409
                    && e.reason == "Conflict"
                    && patch["metadata"]["resourceVersion"].is_null()
                    && attempt < PATCH_RETRIES =>
            {
                continue;
            }
            Err(e) => return Err(e),
            Ok(updated) => {
                return Ok(call.reply(StatusCode::OK, &call.to_served(updated).await?));
            }
        }
    }
    unreachable!("the retry loop returns")
}

/// Server-side apply of `config` onto `live` (served form): the merged object with its
/// managedFields, or 409 with one cause per conflicting field.
fn server_side_apply(
    call: &Call<'_>,
    part: Part,
    live: Option<&Value>,
    config: &Value,
) -> Result<Value, ApiError> {
    let manager = call.field_manager();
    let time = now();
    let m = krust_apimachinery::apply::Manager {
        name: &manager,
        time: &time,
    };
    let force = call.query.flag("force");
    krust_apimachinery::apply::apply(&call.endpoint(part), live, config, &m, force).map_err(|e| {
        match e {
            krust_apimachinery::apply::ApplyError::Conflicts(conflicts) => {
                let name = call.name();
                let message =
                    krust_apimachinery::apply::ApplyError::Conflicts(conflicts.clone()).to_string();
                ApiError {
                    details: Some(Box::new(krust_api::status::Details {
                        name: name.to_string(),
                        group: call.kind.info.group.to_string(),
                        kind: call.kind.info.plural.to_string(),
                        causes: conflicts
                            .iter()
                            .map(|c| Cause {
                                reason: "FieldManagerConflict",
                                message: c.message(),
                                field: c.field.clone(),
                            })
                            .collect(),
                        retry_after_seconds: None,
                    })),
                    ..ApiError::new(409, "Conflict", message)
                }
            }
            krust_apimachinery::apply::ApplyError::Invalid(msg) => ApiError::bad_request(msg),
        }
    })
}

/// Applies a JSON, merge or strategic merge patch to `old`, whose type (for strategic
/// merge keys) is `root`.
pub(super) fn apply_patch(
    ty: PatchType,
    old: &Value,
    patch: &Value,
    root: TypeRef,
) -> Result<Value, ApiError> {
    match ty {
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
                ApiError::bad_request(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })?;
            let mut doc = old.clone();
            krust_apimachinery::patch::apply_json_patch(&mut doc, &p).map_err(|e| match e {
                JsonPatchError::TooManyOperations(_) | JsonPatchError::CopyLimit => {
                    ApiError::too_large(e.to_string())
                }
                JsonPatchError::Operation { .. } => ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                ),
            })?;
            Ok(doc)
        }
        PatchType::Merge => {
            let mut doc = old.clone();
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        PatchType::Strategic | PatchType::Apply => apply_strategic_merge_patch(old, patch, root)
            .map_err(|e| ApiError::bad_request(e.to_string())),
    }
}
