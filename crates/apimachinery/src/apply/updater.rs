//! The ownership bookkeeping of structured-merge-diff's `merge.Updater`, on field sets
//! of one API version: who loses which fields when an object changes, what an apply
//! merges and prunes, and the conflicts that stop it.

use serde_json::{Map, Value};

use super::managed::{ManagerId, Managers, Owned};
use super::schema::TypeRef;
use super::set::Set;
use super::typed::{Comparison, Duplicates, Emptied, compare, merge, remove_items, to_field_set};
use super::value::equals;

pub(super) enum UpdateError {
    /// A value the schema cannot index, e.g. a keyed-list item without its keys.
    Invalid(String),
    /// Fields the change would take from other managers, by manager.
    Conflicts(Vec<(ManagerId, Set)>),
}

impl From<String> for UpdateError {
    fn from(message: String) -> Self {
        UpdateError::Invalid(message)
    }
}

/// Moves ownership after `live` became `new`: every manager but `writer` loses the
/// fields that were removed and the fields whose value changed. If some of them own
/// changed fields and `force` is false, nothing moves and those are the conflicts.
/// Fields in `ignored` (and below) do not count. Managers left with nothing are
/// dropped.
fn transfer(
    ty: TypeRef,
    live: &Value,
    new: &Value,
    managers: &mut Managers,
    writer: Option<&ManagerId>,
    force: bool,
    ignored: &Set,
) -> Result<Comparison, UpdateError> {
    let comparison = compare(ty, live, new)?.without(ignored);
    let changed = comparison.changed();
    if !force {
        let conflicts: Vec<(ManagerId, Set)> = managers
            .iter()
            .filter(|(id, _)| Some(*id) != writer)
            .map(|(id, owned)| (id.clone(), owned.set.intersection(&changed)))
            .filter(|(_, conflicts)| !conflicts.is_empty())
            .collect();
        if !conflicts.is_empty() {
            return Err(UpdateError::Conflicts(conflicts));
        }
    }
    for (id, owned) in managers.iter_mut() {
        if Some(id) != writer {
            owned.set = owned
                .set
                .difference(&changed)
                .difference(&comparison.removed);
        }
    }
    managers.retain(|_, owned| !owned.set.is_empty());
    Ok(comparison)
}

/// Records a change made by other means than apply: other managers lose what changed
/// (there are no conflicts), and the returned set is what the writer now owns anew.
pub(super) fn update(
    ty: TypeRef,
    live: &Value,
    new: &Value,
    managers: &mut Managers,
    ignored: &Set,
) -> Result<Set, UpdateError> {
    Ok(transfer(ty, live, new, managers, None, true, ignored)?.changed())
}

/// What an apply made of the object.
pub(super) struct Applied {
    /// The new object.
    pub object: Value,
    /// Whether it differs from the live object.
    pub changed: bool,
}

/// Applies `config` onto `live` for the manager `id`: merges it, makes `id` own
/// exactly the fields of `config`, and removes the fields `id` applied last time but no
/// longer does, unless somebody else owns them.
#[allow(clippy::too_many_arguments)] // the arguments of upstream's Updater.Apply
pub(super) fn apply(
    ty: TypeRef,
    live: &Value,
    config: &Value,
    managers: &mut Managers,
    id: &ManagerId,
    api_version: &str,
    force: bool,
    ignored: &Set,
) -> Result<Applied, UpdateError> {
    let applied = to_field_set(ty, config, Duplicates::Reject)?.recursive_difference(ignored);
    // The live object may hold duplicates (upstream tolerates them in stored objects),
    // but every item needs its keys.
    to_field_set(ty, live, Duplicates::Allow)?;
    let merged = merge(ty, Some(live), Some(config))?.unwrap_or_else(empty);
    let time = managers.get(id).and_then(|owned| owned.time.clone());
    let owned = Owned {
        set: applied,
        api_version: api_version.to_owned(),
        time,
    };
    let (owned_view, object) = match managers.insert(id.clone(), owned) {
        Some(previous) if !previous.set.is_empty() => prune(ty, &merged, managers, &previous.set)?,
        _ => (merged.clone(), merged),
    };
    transfer(ty, live, &owned_view, managers, Some(id), force, ignored)?;
    let changed = !equals(&owned_view, live);
    Ok(Applied { object, changed })
}

/// Removes from `merged` the fields of `last` (what the applier applied last time)
/// that no manager owns any more, the applier's new set included. A removed struct
/// field takes what is below it along, unless somebody owns some of that.
///
/// Returns the result as ownership is computed on (lists left empty are null) and as
/// it is stored (they are gone).
fn prune(
    ty: TypeRef,
    merged: &Value,
    managers: &Managers,
    last: &Set,
) -> Result<(Value, Value), String> {
    let last = last.ensure_named_fields_are_members(ty);
    let owned = managers
        .values()
        .fold(Set::new(), |all, owned| all.union(&owned.set))
        .ensure_named_fields_are_members(ty);
    let fields_of = |value: &Value| -> Result<Set, String> {
        Ok(to_field_set(ty, value, Duplicates::Allow)?.ensure_named_fields_are_members(ty))
    };
    let remove =
        |set: &Set, emptied: Emptied| remove_items(ty, merged, set, emptied).unwrap_or_else(empty);
    let merged_set = fields_of(merged)?;
    let without_last = remove(&last, Emptied::Null);
    // Removing `last` removed too much: only what nobody owns any more may go.
    let unowned = merged_set.difference(&fields_of(&without_last)?.union(&owned));
    let pruned = remove(&unowned, Emptied::Null);
    // Only fields of `last` may go: add back the rest.
    let dangling = merged_set
        .difference(&fields_of(&pruned)?)
        .intersection(&last);
    Ok((
        remove(&dangling, Emptied::Null),
        remove(&dangling, Emptied::Dropped),
    ))
}

fn empty() -> Value {
    Value::Object(Map::new())
}
