//! Custom resources: the kinds that CustomResourceDefinitions add, served by the same
//! generic REST handlers, watch cache and admission chain as the built-in kinds
//! (upstream's apiextensions-apiserver, run in-process as in kube-apiserver).
//!
//! The watch cache keeps [`CustomKinds`] in step with the definitions it is fed, so a
//! kind is served from the moment its definition's Established condition is stored, on
//! every apiserver of the cluster alike.

mod columns;
pub mod controller;
pub mod conversion;
pub mod definition;
mod kind;
mod rules;
pub(crate) mod schema;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{OnceLock, RwLock};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use krust_api::sync::UnpoisonedRw;
use serde_json::Value;

use crate::rest::Kind;
use crate::watch_cache::{DynamicKinds, Indexer};

/// Where definitions are stored.
pub const DEFINITIONS: &str = "/registry/apiextensions.k8s.io/customresourcedefinitions/";

/// The kinds of the apiextensions.k8s.io group itself (upstream's apiextensions-apiserver
/// serves them beside the custom resources it adds).
pub fn definition_kinds() -> &'static [Kind] {
    static KINDS: OnceLock<Vec<Kind>> = OnceLock::new();
    KINDS.get_or_init(|| {
        vec![crate::kinds::kind::<CustomResourceDefinition>(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &definition::DEFINITION,
        )]
    })
}

/// The kinds served for CustomResourceDefinitions.
///
/// A request borrows its kind for as long as it runs (a watch, for hours), and every
/// built-in kind is `'static`; so custom kinds are made `'static` too, interned by their
/// definition so that an unchanged definition seen again (status writes, restarts of
/// the feed) reuses its kinds instead of making new ones. Only a changed definition
/// makes new kinds, and definitions change rarely and by administrators.
#[derive(Default)]
pub struct CustomKinds(RwLock<Served>);

#[derive(Default)]
struct Served {
    /// Definition name → the kinds of its served versions, the storage version first.
    by_definition: BTreeMap<String, Vec<&'static Kind>>,
    /// Canonical text of a version's definition → its kind.
    interned: HashMap<String, &'static Kind>,
    /// Definitions being deleted: their kinds take no new objects.
    terminating: BTreeSet<String>,
}

impl CustomKinds {
    /// The kind serving `plural` in `group`/`version`, if a definition serves it.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
        self.0
            .read_locked()
            .by_definition
            .values()
            .flatten()
            .find(|k| k.info.group == group && k.info.version == version && k.info.plural == plural)
            .copied()
    }

    /// The kind named `kind` in `group`/`version`, if a definition serves it.
    pub fn find_kind(&self, group: &str, version: &str, kind: &str) -> Option<&'static Kind> {
        self.0
            .read_locked()
            .by_definition
            .values()
            .flatten()
            .find(|k| k.info.group == group && k.info.version == version && k.info.kind == kind)
            .copied()
    }

    /// Whether the definition of a kind is being deleted (creates are refused then).
    /// On every create: no allocation, and nothing to compare unless a definition is
    /// being deleted.
    pub fn terminating(&self, kind: &Kind) -> bool {
        let (plural, group) = (kind.info.plural, kind.info.group);
        self.0.read_locked().terminating.iter().any(|name| {
            name.strip_suffix(group)
                .and_then(|rest| rest.strip_suffix('.'))
                == Some(plural)
        })
    }

    /// Every served custom kind, grouped by definition.
    pub fn all(&self) -> Vec<&'static Kind> {
        self.0
            .read_locked()
            .by_definition
            .values()
            .flatten()
            .copied()
            .collect()
    }
}

impl DynamicKinds for CustomKinds {
    fn definitions(&self) -> &'static str {
        DEFINITIONS
    }

    /// Takes note of a stored definition: serves its versions once it is Established,
    /// stops serving versions it no longer serves. Returns the storage prefix of its
    /// objects and their field indexer while any version is served.
    fn observe(&self, crd: &Value) -> Option<(String, Indexer)> {
        let name = crd["metadata"]["name"].as_str()?.to_string();
        let parsed: CustomResourceDefinition = match serde_json::from_value(crd.clone()) {
            Ok(c) => c,
            Err(err) => {
                tracing::error!(%name, %err, "undecodable CustomResourceDefinition in store");
                return None;
            }
        };
        if !definition::established(&parsed) {
            self.forget(&name);
            return None;
        }
        let mut served = self.0.write_locked();
        if crd["metadata"]["deletionTimestamp"].is_string() {
            served.terminating.insert(name.clone());
        } else {
            served.terminating.remove(&name);
        }
        let mut kinds = Vec::new();
        for version in kind::served_versions(&parsed) {
            let key = kind::identity(&parsed, version);
            let kind = *served
                .interned
                .entry(key)
                .or_insert_with(|| kind::build(&parsed, version));
            kinds.push(kind);
        }
        let first = *kinds.first()?;
        served.by_definition.insert(name, kinds);
        Some((first.info.storage_prefix(), first.strategy))
    }

    /// Stops serving a deleted definition's kinds.
    fn forget(&self, name: &str) {
        let mut served = self.0.write_locked();
        served.by_definition.remove(name);
        served.terminating.remove(name);
    }
}
