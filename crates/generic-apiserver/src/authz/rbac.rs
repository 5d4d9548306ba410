//! The RBAC authorizer. Roles and bindings are indexed in memory from the watch cache —
//! subjects to the rules their bindings grant, cluster-wide and per namespace — so a
//! decision is a few hash lookups and rule matches, never a store read. The index is
//! rebuilt whole when any of the four RBAC resources changed since it was built: policy
//! changes are rare next to requests.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use krust_api::sync::UnpoisonedRw;
use krust_store::Revision;
use serde::Deserialize;

use super::rules::Rule;
use super::{Attributes, Authorizer, Decision};
use crate::auth::User;
use crate::watch_cache::{ResourceCache, WatchCache};

/// What one binding gives its subjects: a role's rules, and a description of where they
/// come from for review reasons (upstream's wording).
#[derive(Debug, Clone)]
pub struct Grant {
    pub rules: Arc<[Rule]>,
    pub source: Arc<str>,
}

/// Grants by subject: users (service accounts are users) and groups.
#[derive(Debug, Default)]
struct Grants {
    users: HashMap<String, Vec<Grant>>,
    groups: HashMap<String, Vec<Grant>>,
}

impl Grants {
    fn add(&mut self, subject: &Subject, namespace: &str, rules: &Arc<[Rule]>, source: String) {
        let grant = Grant {
            rules: rules.clone(),
            source: Arc::from(format!("{source} to {}", subject.describe())),
        };
        let key = match subject.kind.as_str() {
            "User" => (&mut self.users, subject.name.clone()),
            "Group" => (&mut self.groups, subject.name.clone()),
            "ServiceAccount" => {
                let ns = if subject.namespace.is_empty() {
                    namespace
                } else {
                    &subject.namespace
                };
                (
                    &mut self.users,
                    format!("system:serviceaccount:{ns}:{}", subject.name),
                )
            }
            _ => return,
        };
        key.0.entry(key.1).or_default().push(grant);
    }

    fn for_user<'a>(&'a self, user: &'a User) -> impl Iterator<Item = &'a Grant> + 'a {
        let by_name = self.users.get(&user.name).into_iter().flatten();
        let by_group = user
            .groups
            .iter()
            .filter_map(|g| self.groups.get(g))
            .flatten();
        by_name.chain(by_group)
    }
}

#[derive(Debug, Deserialize)]
struct Subject {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: String,
}

impl Subject {
    fn describe(&self) -> String {
        if self.kind == "ServiceAccount" {
            format!(
                "{} {:?}",
                self.kind,
                format!("{}/{}", self.name, self.namespace)
            )
        } else {
            format!("{} {:?}", self.kind, self.name)
        }
    }
}

#[derive(Debug, Deserialize)]
struct Meta {
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Debug, Deserialize)]
struct RoleObject {
    metadata: Meta,
    #[serde(default)]
    rules: Option<Vec<Rule>>,
}

#[derive(Debug, Deserialize)]
struct RoleRef {
    kind: String,
    name: String,
}

#[derive(Debug, Deserialize)]
struct BindingObject {
    metadata: Meta,
    #[serde(rename = "roleRef")]
    role_ref: RoleRef,
    #[serde(default)]
    subjects: Option<Vec<Subject>>,
}

/// The four RBAC caches, in the order their revisions are recorded.
const PREFIXES: [&str; 4] = [
    "/registry/clusterroles/",
    "/registry/clusterrolebindings/",
    "/registry/roles/",
    "/registry/rolebindings/",
];

/// Everything RBAC decides from, built at one set of cache revisions.
#[derive(Debug, Default)]
struct Index {
    revisions: [Revision; 4],
    cluster: Grants,
    namespaces: HashMap<String, Grants>,
}

/// Every object of one RBAC resource, decoded.
fn decode<T: serde::de::DeserializeOwned>(cache: &ResourceCache) -> impl Iterator<Item = T> {
    cache
        .list(cache.prefix())
        .0
        .into_iter()
        .filter_map(|o| serde_json::from_slice(&o.json).ok())
}

impl Index {
    fn build(caches: &[Arc<ResourceCache>; 4]) -> Index {
        let revisions = caches.each_ref().map(|c| c.revision());
        let rules_of = |r: RoleObject| -> Arc<[Rule]> { r.rules.unwrap_or_default().into() };
        let cluster_roles: HashMap<String, Arc<[Rule]>> = decode(&caches[0])
            .map(|r: RoleObject| (r.metadata.name.clone(), rules_of(r)))
            .collect();
        let roles: HashMap<(String, String), Arc<[Rule]>> = decode(&caches[2])
            .map(|r: RoleObject| {
                (
                    (r.metadata.namespace.clone(), r.metadata.name.clone()),
                    rules_of(r),
                )
            })
            .collect();
        let mut index = Index {
            revisions,
            ..Index::default()
        };
        for b in decode::<BindingObject>(&caches[1]) {
            let Some(rules) = cluster_roles.get(&b.role_ref.name) else {
                continue;
            };
            let source = format!(
                "ClusterRoleBinding {:?} of ClusterRole {:?}",
                b.metadata.name, b.role_ref.name
            );
            for s in b.subjects.iter().flatten() {
                index.cluster.add(s, "", rules, source.clone());
            }
        }
        for b in decode::<BindingObject>(&caches[3]) {
            let ns = &b.metadata.namespace;
            let rules = match b.role_ref.kind.as_str() {
                "ClusterRole" => cluster_roles.get(&b.role_ref.name),
                _ => roles.get(&(ns.clone(), b.role_ref.name.clone())),
            };
            let Some(rules) = rules else { continue };
            let source = format!(
                "RoleBinding {:?} of {} {:?}",
                format!("{}/{ns}", b.metadata.name),
                b.role_ref.kind,
                b.role_ref.name
            );
            let grants = index.namespaces.entry(ns.clone()).or_default();
            for s in b.subjects.iter().flatten() {
                grants.add(s, ns, rules, source.clone());
            }
        }
        index
    }

    /// Every grant that applies to `user` in `namespace` (cluster-wide ones always).
    fn grants<'a>(
        &'a self,
        user: &'a User,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = &'a Grant> + 'a {
        let local = namespace
            .and_then(|ns| self.namespaces.get(ns))
            .into_iter()
            .flat_map(move |g| g.for_user(user));
        self.cluster.for_user(user).chain(local)
    }
}

/// RBAC decisions from the watch cache's Roles and bindings.
pub struct Rbac {
    caches: [Arc<ResourceCache>; 4],
    index: RwLock<Arc<Index>>,
}

impl Rbac {
    pub fn new(cache: &WatchCache) -> anyhow::Result<Rbac> {
        let caches = PREFIXES.map(|p| {
            cache
                .cache(p)
                .ok_or_else(|| anyhow::anyhow!("no watch cache for {p}"))
        });
        let [a, b, c, d] = caches;
        let caches = [a?, b?, c?, d?];
        let index = Index::build(&caches);
        Ok(Rbac {
            caches,
            index: RwLock::new(Arc::new(index)),
        })
    }

    /// The revisions of the four RBAC caches now.
    fn revisions(&self) -> [Revision; 4] {
        self.caches.each_ref().map(|c| c.revision())
    }

    /// Whether the caches hold RBAC changes the index has not seen.
    pub fn is_stale(&self) -> bool {
        self.index.read_locked().revisions != self.revisions()
    }

    /// The current index, rebuilt first when RBAC objects changed (one read lock on the
    /// request path; the write lock only to rebuild).
    fn index(&self) -> Arc<Index> {
        let current = self.revisions();
        {
            let index = self.index.read_locked();
            if index.revisions == current {
                return index.clone();
            }
        }
        let mut index = self.index.write_locked();
        if index.revisions != current {
            *index = Arc::new(Index::build(&self.caches));
        }
        index.clone()
    }

    /// The rules `user` holds in `namespace` (cluster-wide grants included), as
    /// SelfSubjectRulesReview and escalation checks need them.
    pub fn rules_for(&self, user: &User, namespace: Option<&str>) -> Vec<Rule> {
        let index = self.index();
        index
            .grants(user, namespace)
            .flat_map(|g| g.rules.iter().cloned())
            .collect()
    }
}

impl Authorizer for Rbac {
    fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let index = self.index();
        for grant in index.grants(attrs.user, attrs.namespace()) {
            if grant.rules.iter().any(|r| r.allows(attrs)) {
                return Decision::Allow(format!("RBAC: allowed by {}", grant.source));
            }
        }
        Decision::NoOpinion(String::new())
    }
}
