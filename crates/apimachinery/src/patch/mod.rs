//! Strategic merge patch, the patch format of `kubectl apply`, `edit`, `label`,
//! `annotate`, `scale`, `set image` and `kubectl patch` by default: [`meta`] holds the
//! per-type patch metadata of built-in kinds, [`strategic_merge`] applies a patch.

mod json;
pub mod meta;
pub mod strategic_merge;
#[rustfmt::skip]
mod table;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use json::{JsonPatchError, apply_json_patch};
pub use meta::{FieldMeta, PatchStrategy, Shape, TypeMeta, TypeRef, root_type};
pub use strategic_merge::{PatchError, apply_strategic_merge_patch};
