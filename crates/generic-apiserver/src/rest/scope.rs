//! What a request handler may use (upstream's `RequestScope` and the generic registry
//! store behind it): the store and its watch cache, the served kinds and their REST
//! storage, the admission chain, authentication and authorization, and the clients a
//! write may call out with. The assembled server owns more (listeners, aggregation,
//! the kubelet client, metrics scraping) and hands each handler only this.

use std::collections::HashMap;
use std::sync::Arc;

use krust_store::Store;

use super::strategy::{Caller, Kind, Storage};
use crate::admission::Admission;
use crate::auth::Authenticators;
use crate::authz::{Authorizers, rbac::Rbac};
use crate::metrics::Metrics;
use crate::outbound;
use crate::tokens::TokenIssuer;
use crate::watch_cache::WatchCache;

/// Looks kinds up by what requests name (upstream's RESTMapper over the served groups):
/// the built-in kinds and those CustomResourceDefinitions add. The assembled server
/// implements it; the generic layer knows no particular kind.
pub trait Kinds: Send + Sync {
    /// The kind serving `plural` in `group`/`version`.
    fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Kind>;

    /// The custom kind named `kind` in `group`/`version` (built-in kinds are in
    /// `krust_api::registry`).
    fn find_custom_kind(&self, group: &str, version: &str, kind: &str) -> Option<&'static Kind>;

    /// Every kind served now: the built-in ones, then the custom ones.
    fn all(&self) -> Vec<&'static Kind>;
}

/// A resource's REST storage steps, keyed by API group and plural name (upstream's
/// storage map of an API group, filled when the server is assembled).
pub type StorageMap = HashMap<(&'static str, &'static str), Arc<dyn Storage>>;

pub struct Scope {
    pub store: Arc<dyn Store>,
    pub cache: Arc<WatchCache>,
    pub kinds: Arc<dyn Kinds>,
    pub storage: StorageMap,
    pub admission: Admission,
    pub authenticators: Authenticators,
    /// The authorization chain: `system:masters`, the node authorizer, then RBAC.
    pub authorizers: Authorizers,
    pub rbac: Arc<Rbac>,
    pub metrics: Arc<Metrics>,
    /// Issues service-account tokens (the TokenRequest subresource).
    pub tokens: Arc<TokenIssuer>,
    /// The HTTPS client of admission and conversion webhooks.
    pub webhooks: Arc<outbound::Client>,
}

impl Scope {
    /// The kind serving `plural` in `group`/`version`, built in or custom.
    pub fn kind(&self, group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
        self.kinds.find(group, version, plural)
    }

    /// The REST storage steps of `kind`'s resource, if it has any.
    pub fn storage_of(&self, kind: &Kind) -> Option<&dyn Storage> {
        self.storage
            .get(&(kind.info.group, kind.info.plural))
            .map(|s| s.as_ref())
    }

    /// What a conversion webhook call needs of this scope.
    pub fn caller(&self) -> Caller {
        Caller {
            client: self.webhooks.clone(),
            cache: self.cache.clone(),
        }
    }
}
