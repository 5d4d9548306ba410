//! The two write paths of upstream's field manager around the [`updater`]: what they
//! read from and write to `metadata.managedFields`, the fields nobody owns (`kind`,
//! `metadata.name`, …), the manager that owns what an object held before anybody
//! applied to it, and kubectl's upgrade from client-side apply.

use serde_json::{Map, Value};

use super::managed::{self, MAX_UPDATERS, ManagerId, Managers, Operation, Owned};
use super::path::{PathElement, path_string};
use super::schema::TypeRef;
use super::set::Set;
use super::updater::{self, UpdateError};
use super::{ApplyError, Conflict, Endpoint, Manager, last_applied};

/// Fields nobody owns: set by the server, or naming the object rather than being part
/// of it.
const UNOWNED: &[&[&str]] = &[
    &["apiVersion"],
    &["kind"],
    &["metadata"],
    &["metadata", "name"],
    &["metadata", "namespace"],
    &["metadata", "creationTimestamp"],
    &["metadata", "selfLink"],
    &["metadata", "uid"],
    &["metadata", "clusterName"],
    &["metadata", "generation"],
    &["metadata", "managedFields"],
    &["metadata", "resourceVersion"],
];

/// The updater that owns the fields of an object nobody owned before its first apply.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// Applies `config`, a partial object of the endpoint's kind, onto `live` (`None` when
/// the object does not exist yet) for `manager`. Returns the new object with its
/// `metadata.managedFields`; when the apply changes nothing, that is `live` with the
/// manager's ownership recorded (and no new time).
///
/// Fields of `config` owned by another manager and set to another value are conflicts
/// unless `force`, which takes them from their owners.
pub fn apply(
    endpoint: &Endpoint,
    live: Option<&Value>,
    config: &Value,
    manager: &Manager,
    force: bool,
) -> Result<Value, ApplyError> {
    check_kind(endpoint, config)?;
    if managed_fields(config).is_some_and(|fields| !fields.is_null()) {
        return Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".into(),
        ));
    }
    let ty = TypeRef::of_endpoint(endpoint);
    let api_version = endpoint.api_version();
    let reset = paths(endpoint.reset_fields);
    let mut managers = managed::decode(live.and_then(managed_fields))
        .map_err(|e| ApplyError::Invalid(format!("failed to decode managed fields: {e}")))?;
    let live_object = live.map_or_else(|| Value::Object(Map::new()), without_managed_fields);
    if managers.is_empty() && live.is_some() {
        // Fields set before anybody applied are owned by one updater, so that an apply
        // conflicts with them rather than silently taking them over.
        let id = updater_id(BEFORE_FIRST_APPLY, &api_version, endpoint);
        let start = empty_like(ty, &live_object);
        record(
            ty,
            &start,
            &live_object,
            &mut managers,
            id,
            manager.time,
            &reset,
        )
        .map_err(into_apply_error)?;
    }
    // What the strategy resets is not the configuration's to set.
    let mut effective = without_managed_fields(config);
    for path in endpoint.reset_fields {
        remove_path(&mut effective, path);
    }
    let id = ManagerId {
        manager: manager.name.to_owned(),
        operation: Operation::Apply,
        api_version: None,
        subresource: endpoint.subresource.unwrap_or_default().to_owned(),
    };
    let attempt = |force: bool| -> Result<(Value, Managers), UpdateError> {
        let mut managers = managers.clone();
        let outcome = updater::apply(
            ty,
            &live_object,
            &effective,
            &mut managers,
            &id,
            &api_version,
            force,
            &reset,
        )?;
        disown_unowned(&mut managers, &id);
        if !outcome.changed {
            return Ok((live_object.clone(), managers));
        }
        if let Some(owned) = managers.get_mut(&id) {
            owned.time = Some(manager.time.to_owned());
        }
        Ok((outcome.object, managers))
    };
    let attempted = match attempt(force) {
        Err(UpdateError::Conflicts(conflicts)) if manager.name == last_applied::KUBECTL => {
            // kubectl moving from client-side to server-side apply may take over the
            // fields its last-applied annotation still describes.
            let allowed = last_applied::allowed_conflicts(ty, &live_object, &api_version);
            let remaining = without_allowed(conflicts, allowed.as_ref());
            if remaining.is_empty() {
                attempt(true)
            } else {
                Err(UpdateError::Conflicts(remaining))
            }
        }
        result => result,
    };
    let (mut object, managers) = attempted.map_err(into_apply_error)?;
    if manager.name == last_applied::KUBECTL {
        last_applied::update_annotation(&mut object, config);
    }
    set_managed_fields(&mut object, &managers);
    Ok(object)
}

/// Records in `new.metadata.managedFields` the write of `new` over `old` (`None` for a
/// create) by `manager`: it owns the fields it changed, and the other managers lose
/// them. The managedFields `new` carries, if any, are taken as the record to update
/// (`[]` clears it); else `old`'s are.
///
/// An object that exists without managedFields is left untracked, as upstream does; if
/// a value cannot be indexed (a list item without its keys), `new` gets `old`'s
/// managedFields back.
pub fn record_update(endpoint: &Endpoint, old: Option<&Value>, new: &mut Value, manager: &Manager) {
    let ty = TypeRef::of_endpoint(endpoint);
    let api_version = endpoint.api_version();
    let reset = paths(endpoint.reset_fields);
    let old_fields = old.and_then(managed_fields);
    let decode_old = || managed::decode(old_fields).unwrap_or_default();
    let mut managers = match managed_fields(new) {
        // A subresource writes only some of the object: the record stays the server's.
        _ if endpoint.subresource.is_some() => decode_old(),
        Some(fields) if clears(fields) => Managers::new(),
        fields => match managed::decode(fields) {
            Ok(managers) if !managers.is_empty() => managers,
            _ => decode_old(),
        },
    };
    if let Some(Value::Object(metadata)) = new.get_mut("metadata") {
        metadata.remove("managedFields");
    }
    let old_uid = old
        .and_then(|old| old.pointer("/metadata/uid"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if managers.is_empty() && !old_uid.is_empty() {
        return;
    }
    let old_object = old.map_or_else(|| empty_like(ty, new), without_managed_fields);
    let name = if manager.name.is_empty() {
        "unknown"
    } else {
        manager.name
    };
    let id = updater_id(name, &api_version, endpoint);
    match record(
        ty,
        &old_object,
        new,
        &mut managers,
        id,
        manager.time,
        &reset,
    ) {
        Ok(()) => set_managed_fields(new, &managers),
        Err(_) => {
            if let (Some(fields), Some(Value::Object(metadata))) =
                (old_fields, new.get_mut("metadata"))
            {
                metadata.insert("managedFields".into(), fields.clone());
            }
        }
    }
}

/// The update path proper: the writer `id` owns what changed from `old` to `new`
/// besides what it owned, at time `time`.
fn record(
    ty: TypeRef,
    old: &Value,
    new: &Value,
    managers: &mut Managers,
    id: ManagerId,
    time: &str,
    reset: &Set,
) -> Result<(), UpdateError> {
    let changed = updater::update(ty, old, new, managers, reset)?.difference(&paths(UNOWNED));
    if !changed.is_empty() {
        let set = match managers.get(&id) {
            Some(previous) => changed.union(&previous.set),
            None => changed,
        };
        let api_version = id.api_version.clone().unwrap_or_default();
        let time = Some(time.to_owned());
        managers.insert(
            id,
            Owned {
                set,
                api_version,
                time,
            },
        );
    }
    managed::cap_updaters(managers, MAX_UPDATERS);
    Ok(())
}

fn updater_id(name: &str, api_version: &str, endpoint: &Endpoint) -> ManagerId {
    ManagerId {
        manager: name.to_owned(),
        operation: Operation::Update,
        api_version: Some(api_version.to_owned()),
        subresource: endpoint.subresource.unwrap_or_default().to_owned(),
    }
}

/// Upstream's version check: an apply names the kind and version it is for.
fn check_kind(endpoint: &Endpoint, config: &Value) -> Result<(), ApplyError> {
    let text = |name: &str| config.get(name).and_then(Value::as_str).unwrap_or_default();
    let (group, version) = text("apiVersion")
        .split_once('/')
        .unwrap_or(("", text("apiVersion")));
    let kind = text("kind");
    if (group, version, kind) == (endpoint.group, endpoint.version, endpoint.kind) {
        Ok(())
    } else {
        Err(ApplyError::Invalid(format!(
            "invalid object type: {group}/{version}, Kind={kind}"
        )))
    }
}

fn into_apply_error(error: UpdateError) -> ApplyError {
    match error {
        UpdateError::Invalid(message) => ApplyError::Invalid(message),
        UpdateError::Conflicts(mut conflicts) => {
            conflicts.sort_by_cached_key(|(id, _)| id.identifier());
            let conflicts = conflicts
                .into_iter()
                .flat_map(|(id, set)| {
                    let manager = id.describe();
                    set.paths().into_iter().map(move |path| Conflict {
                        manager: manager.clone(),
                        field: path_string(&path),
                    })
                })
                .collect();
            ApplyError::Conflicts(conflicts)
        }
    }
}

/// The conflicts left once those on `allowed` fields are dropped.
fn without_allowed(
    conflicts: Vec<(ManagerId, Set)>,
    allowed: Option<&Set>,
) -> Vec<(ManagerId, Set)> {
    let Some(allowed) = allowed else {
        return conflicts;
    };
    conflicts
        .into_iter()
        .filter_map(|(id, set)| {
            let mut remaining = Set::new();
            for path in set.paths().iter().filter(|path| !allowed.has(path)) {
                remaining.insert(path);
            }
            (!remaining.is_empty()).then_some((id, remaining))
        })
        .collect()
}

/// Takes the [`UNOWNED`] fields out of `id`'s set, and drops `id` if nothing is left.
fn disown_unowned(managers: &mut Managers, id: &ManagerId) {
    if let Some(owned) = managers.get_mut(id) {
        owned.set = owned.set.difference(&paths(UNOWNED));
        if owned.set.is_empty() {
            managers.remove(id);
        }
    }
}

/// A set of paths of field names.
fn paths(paths: &[&[&str]]) -> Set {
    let mut set = Set::new();
    for path in paths {
        let path: Vec<PathElement> = path
            .iter()
            .map(|name| PathElement::Field((*name).to_owned()))
            .collect();
        set.insert(&path);
    }
    set
}

fn managed_fields(object: &Value) -> Option<&Value> {
    object.get("metadata")?.get("managedFields")
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    remove_path(&mut object, &["metadata", "managedFields"]);
    object
}

fn remove_path(object: &mut Value, path: &[&str]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let parent = parents
        .iter()
        .try_fold(object, |value, name| value.get_mut(*name));
    if let Some(Value::Object(parent)) = parent {
        parent.remove(*last);
    }
}

fn set_managed_fields(object: &mut Value, managers: &Managers) {
    let Value::Object(object) = object else {
        return;
    };
    let encoded = managed::encode(managers);
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(metadata) = metadata {
        match encoded {
            Some(entries) => {
                metadata.insert("managedFields".into(), entries);
            }
            None => {
                metadata.remove("managedFields");
            }
        }
    }
}

/// Whether a request's managedFields ask to clear the record: `[]`, or `[{}]`.
fn clears(fields: &Value) -> bool {
    match fields.as_array().map(Vec::as_slice) {
        Some([]) => true,
        Some([entry]) => entry.as_object().is_some_and(Map::is_empty),
        _ => false,
    }
}

/// The object a create starts from, as far as the structs upstream's typed empty object
/// of a known kind already holds: `metadata`, `spec` and `status`, where `new` has them.
fn empty_like(ty: TypeRef, new: &Value) -> Value {
    let mut empty = Map::new();
    if ty.is_known_kind() {
        for name in ["metadata", "spec", "status"] {
            if new.get(name).is_some_and(Value::is_object) {
                empty.insert(name.into(), Value::Object(Map::new()));
            }
        }
    }
    Value::Object(empty)
}
