//! Server-side apply (`PATCH` with `application/apply-patch+yaml`) and the field
//! ownership records (`metadata.managedFields`) of every write, with the semantics of
//! upstream's `k8s.io/apimachinery/pkg/util/managedfields` over
//! `sigs.k8s.io/structured-merge-diff`. Pure functions over JSON values:
//!
//! - [`apply`] merges an applied configuration (a partial object) onto the live object:
//!   its fields are set, the fields its manager applied last time and no longer does
//!   are removed unless another manager owns them, and the manager comes to own exactly
//!   the fields of the configuration. Changing a field another manager owns is a
//!   conflict, unless forced (the owner then loses it); setting it to the value it has
//!   is not, the field becomes shared.
//! - [`record_update`] records what any other write (create, update, patch) changed:
//!   its manager owns the changed fields, and the other managers lose them.
//!
//! How values merge and are owned follows the structural schema of built-in kinds
//! (`schema`): objects field by field, `x-kubernetes-list-type: map` lists item by item
//! on their keys, sets value by value, and atomic lists, maps and structs as a whole.
//! Custom resources merge by their definition's schema ([`CustomSchema`]). Kinds no
//! schema describes merge as free-form JSON: objects key by key, lists atomic, and
//! `metadata` as `ObjectMeta`.
//!
//! Also as upstream: an object written before anybody applied to it has its fields
//! owned by the updater `before-first-apply`; at most 10 updaters are kept, older ones
//! merged into `ancient-changes`; a manager named `kubectl` may take over the fields
//! its client-side `last-applied-configuration` annotation describes, and keeps that
//! annotation in step.
//!
//! Left out, or done differently:
//! - Conversion between API versions: every entry is read as if in the endpoint's
//!   version, and schema changes between atomic and granular are not reconciled.
//! - A create is compared with an empty object that holds `metadata`, `spec` and
//!   `status` only, where upstream's typed empty object holds every non-pointer struct:
//!   an updater's record of a create may mark (`".": {}`) a few more structs as its own,
//!   e.g. `spec.template`.
//! - Where pruning empties an object that somebody still owns, it is left `{}`; an
//!   emptied list goes. Upstream leaves null and the typed object turns that into
//!   `{}` or nothing depending on the Go type.
//! - Only list keys and duplicates are validated, not scalar types or unknown fields.

mod custom;
mod field_manager;
mod last_applied;
mod managed;
mod path;
mod schema;
mod set;
#[rustfmt::skip]
mod table;
mod typed;
mod updater;
mod value;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use thiserror::Error;

pub use custom::CustomSchema;
pub use field_manager::{apply, record_update};

/// [`Endpoint::reset_fields`] of the main resource of a kind with a status subresource.
pub const RESET_STATUS: &[&[&str]] = &[&["status"]];

/// Where a write goes: a kind at the version the request names, maybe a subresource.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint<'a> {
    /// `""` for the core group.
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
    /// E.g. `Some("status")`: ownership through a subresource is recorded apart.
    pub subresource: Option<&'a str>,
    /// The fields the endpoint's strategy resets (upstream's `GetResetFields`), as paths
    /// of field names: [`RESET_STATUS`] for the main resource of a kind with a status
    /// subresource, e.g. `&[&["spec"], &["metadata", "labels"]]` for a status
    /// subresource. Nobody gains or loses ownership of them, and an apply leaves them
    /// as they are in the live object.
    pub reset_fields: &'a [&'a [&'a str]],
    /// A custom resource's schema; `None` for built-in kinds (the generated table's)
    /// and free-form kinds.
    pub schema: Option<&'static CustomSchema>,
}

impl<'a> Endpoint<'a> {
    /// The main resource, with no reset fields.
    pub const fn new(group: &'a str, version: &'a str, kind: &'a str) -> Self {
        Endpoint {
            group,
            version,
            kind,
            subresource: None,
            reset_fields: &[],
            schema: None,
        }
    }

    /// `group/version`, or `version` for the core group.
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Who writes, and when.
#[derive(Clone, Copy, Debug)]
pub struct Manager<'a> {
    /// The field manager: the `fieldManager` parameter (required for an apply), else
    /// the client's user agent up to the first `/`; `""` is recorded as `unknown`.
    pub name: &'a str,
    /// Now, in RFC 3339 (`2024-05-01T12:00:00Z`): the manager's entry gets this time
    /// when the write changes the object.
    pub time: &'a str,
}

/// A field an apply would take from another manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The owner as upstream names it: `"kubectl"` for an applier,
    /// `"kube-controller-manager" using apps/v1` for an updater, with
    /// ` with subresource "status"` after the name for a subresource.
    pub manager: String,
    /// The field, e.g. `.spec.replicas` or
    /// `.spec.template.spec.containers[name="web"].image`.
    pub field: String,
}

impl Conflict {
    /// The message of the conflict's `StatusCause` (reason `FieldManagerConflict`,
    /// field [`field`](Self::field)): `conflict with "x" using apps/v1`.
    pub fn message(&self) -> String {
        format!("conflict with {}", self.manager)
    }
}

/// Why an apply was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ApplyError {
    /// Fields owned by other managers would change; upstream answers 409 Conflict with
    /// this message and a cause per conflict.
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The configuration is not one of this endpoint's kind, sets `managedFields`, or
    /// has list items without keys or with duplicate keys; or the live object's
    /// managedFields cannot be read.
    #[error("{0}")]
    Invalid(String),
}

/// Upstream's message: `Apply failed with 1 conflict: conflict with "x": .spec.replicas`,
/// or for several, the fields listed under each manager.
fn conflicts_message(conflicts: &[Conflict]) -> String {
    if let [conflict] = conflicts {
        return format!(
            "Apply failed with 1 conflict: {}: {}",
            conflict.message(),
            conflict.field
        );
    }
    let mut lines = Vec::new();
    let mut manager = None;
    for conflict in conflicts {
        if manager != Some(&conflict.manager) {
            manager = Some(&conflict.manager);
            lines.push(format!("conflicts with {}:", conflict.manager));
        }
        lines.push(format!("- {}", conflict.field));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}
