//! The garbage collector's dependency graph: every object the collector watches, keyed by
//! UID, with edges from owners to their dependents (from `metadata.ownerReferences`).
//!
//! The graph is pure bookkeeping: feeding it an observed object or a deletion returns the
//! work that the change calls for, which the collector then does against the apiserver.
//! An owner that is referenced but has not been observed is a *virtual* node: either
//! its watch is behind or it is gone, which only a live lookup can tell, so creating a
//! virtual node asks for exactly that check.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::intern::Interner;

/// The finalizer that makes the collector orphan an object's dependents first.
pub const ORPHAN: &str = "orphan";
/// The finalizer that makes the collector delete an object's dependents first.
pub const FOREGROUND: &str = "foregroundDeletion";

/// An object's UID, shared by the graph's index, the edges that point at the object and
/// its identity (tens of thousands of pods would otherwise hold several copies each).
pub type Uid = Arc<str>;

/// Where an object lives in the API. A virtual node's namespace is its first
/// dependent's (owners are in the dependent's namespace or cluster-scoped; the collector
/// resolves the scope from discovery when it looks the owner up). API versions, kinds
/// and namespaces are interned by the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: Option<Arc<str>>,
    pub name: Box<str>,
    pub uid: Uid,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Identity {
            api_version,
            kind,
            name,
            uid,
            ..
        } = self;
        match &self.namespace {
            Some(ns) => write!(f, "{api_version}/{kind} {ns}/{name} ({uid})"),
            None => write!(f, "{api_version}/{kind} {name} ({uid})"),
        }
    }
}

/// What an object's deletion state asks of the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Deletion {
    /// Not being deleted, or being deleted with nothing for the collector to do first.
    #[default]
    None,
    /// deletionTimestamp and the `orphan` finalizer: release the dependents first.
    Orphaning,
    /// deletionTimestamp and the `foregroundDeletion` finalizer: delete the dependents
    /// that block it first.
    DeletingDependents,
}

impl Deletion {
    pub fn of(meta: &ObjectMeta) -> Self {
        if meta.deletion_timestamp.is_none() {
            return Deletion::None;
        }
        let has = |f: &str| meta.finalizers.iter().flatten().any(|x| x == f);
        if has(ORPHAN) {
            Deletion::Orphaning
        } else if has(FOREGROUND) {
            Deletion::DeletingDependents
        } else {
            Deletion::None
        }
    }
}

#[derive(Debug)]
pub struct Node {
    pub identity: Identity,
    /// False for a virtual node (referenced as an owner, never seen on a watch).
    pub observed: bool,
    pub owners: Vec<OwnerEdge>,
    pub dependents: HashSet<Uid>,
    pub deletion: Deletion,
}

/// A dependent's reference to one owner, as far as the graph needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerEdge {
    pub uid: Uid,
    /// `blockOwnerDeletion`: a foreground deletion of the owner waits for the dependent.
    pub blocks: bool,
}

/// Work the collector must do, by UID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Decide whether the object should go (its owners are gone or waiting for it), or,
    /// for an object deleting its dependents, whether it may go now; for a virtual node,
    /// whether the owner exists at all.
    AttemptToDelete(String),
    /// Release the object's dependents, then remove its `orphan` finalizer.
    AttemptToOrphan(String),
}

#[derive(Debug, Default)]
pub struct Graph {
    nodes: HashMap<Uid, Node>,
    /// API versions, kinds and namespaces: few distinct values, each stored once.
    interned: Interner<str>,
}

impl Graph {
    pub fn node(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Dependents whose reference to `uid` has `blockOwnerDeletion: true`: a foreground
    /// deletion of `uid` waits for these.
    pub fn blocking_dependents(&self, uid: &str) -> Vec<String> {
        let Some(node) = self.nodes.get(uid) else {
            return Vec::new();
        };
        node.dependents
            .iter()
            .filter(|d| {
                self.nodes
                    .get(*d)
                    .is_some_and(|dep| dep.owners.iter().any(|r| &*r.uid == uid && r.blocks))
            })
            .map(|d| d.to_string())
            .collect()
    }

    /// UIDs of the observed objects of one kind (to find those that vanished while a
    /// watch was down).
    pub fn observed_of(&self, api_version: &str, kind: &str) -> Vec<String> {
        self.nodes
            .values()
            .filter(|n| {
                n.observed && &*n.identity.api_version == api_version && &*n.identity.kind == kind
            })
            .map(|n| n.identity.uid.to_string())
            .collect()
    }

    /// The shared UID of a node, or a new one for an object not in the graph.
    fn uid(&self, uid: &str) -> Uid {
        self.nodes
            .get_key_value(uid)
            .map_or_else(|| Arc::from(uid), |(k, _)| k.clone())
    }

    /// An object of `api_version`/`kind` was added or changed.
    pub fn observe(&mut self, api_version: &str, kind: &str, meta: &ObjectMeta) -> Vec<Work> {
        let Some(uid) = meta.uid.as_deref() else {
            return Vec::new();
        };
        let uid = self.uid(uid);
        let namespace = meta.namespace.as_deref().map(|ns| self.interned.intern(ns));
        let identity = Identity {
            api_version: self.interned.intern(api_version),
            kind: self.interned.intern(kind),
            namespace: namespace.clone(),
            name: meta.name.as_deref().unwrap_or_default().into(),
            uid: uid.clone(),
        };
        let refs = meta.owner_references.as_deref().unwrap_or_default();
        let owners: Vec<OwnerEdge> = refs
            .iter()
            .map(|r| OwnerEdge {
                uid: self.uid(&r.uid),
                blocks: r.block_owner_deletion == Some(true),
            })
            .collect();
        let deletion = Deletion::of(meta);
        let mut work = Vec::new();
        let (old_owners, old_deletion) = match self.nodes.get_mut(&uid) {
            Some(node) => {
                let old_owners = std::mem::replace(&mut node.owners, owners.clone());
                let old_deletion = std::mem::replace(&mut node.deletion, deletion);
                node.identity = identity;
                node.observed = true;
                (old_owners, old_deletion)
            }
            None => {
                self.nodes.insert(
                    uid.clone(),
                    Node {
                        identity,
                        observed: true,
                        owners: owners.clone(),
                        dependents: HashSet::new(),
                        deletion,
                    },
                );
                (Vec::new(), Deletion::None)
            }
        };

        // Owner edges that appeared, disappeared or changed whether they block.
        let mut needs_check = false;
        for (owner, r) in owners.iter().zip(refs) {
            let old = old_owners.iter().find(|o| o.uid == owner.uid);
            if old == Some(owner) {
                continue;
            }
            if !self.nodes.contains_key(&owner.uid) {
                // Not seen (yet): find out whether it exists.
                work.push(Work::AttemptToDelete(owner.uid.to_string()));
                let identity = Identity {
                    api_version: self.interned.intern(r.api_version.as_str()),
                    kind: self.interned.intern(r.kind.as_str()),
                    namespace: namespace.clone(),
                    name: r.name.as_str().into(),
                    uid: owner.uid.clone(),
                };
                self.nodes.insert(
                    owner.uid.clone(),
                    Node {
                        identity,
                        observed: false,
                        owners: Vec::new(),
                        dependents: HashSet::new(),
                        deletion: Deletion::None,
                    },
                );
            }
            let owner_node = self.nodes.get_mut(&owner.uid).expect("inserted above");
            owner_node.dependents.insert(uid.clone());
            // A new dependent of an owner in foreground deletion must go too, and the
            // owner must now wait for it. (A virtual owner's check queues its
            // dependents if it turns out to be gone.)
            if owner_node.deletion == Deletion::DeletingDependents {
                needs_check = true;
                work.push(Work::AttemptToDelete(owner.uid.to_string()));
            }
        }
        for gone in old_owners
            .iter()
            .filter(|o| !owners.iter().any(|n| n.uid == o.uid))
        {
            work.extend(self.unlink(&gone.uid, &uid));
        }
        if needs_check {
            work.push(Work::AttemptToDelete(uid.to_string()));
        }

        if deletion != old_deletion {
            match deletion {
                Deletion::Orphaning => work.push(Work::AttemptToOrphan(uid.to_string())),
                Deletion::DeletingDependents => {
                    let node = &self.nodes[&uid];
                    work.extend(
                        node.dependents
                            .iter()
                            .map(|d| Work::AttemptToDelete(d.to_string())),
                    );
                    work.push(Work::AttemptToDelete(uid.to_string()));
                }
                Deletion::None => {}
            }
        }
        work
    }

    /// An object is gone (deleted, or found missing by a live lookup).
    pub fn forget(&mut self, uid: &str) -> Vec<Work> {
        let Some(node) = self.nodes.remove(uid) else {
            return Vec::new();
        };
        let mut work: Vec<Work> = node
            .dependents
            .iter()
            .map(|d| Work::AttemptToDelete(d.to_string()))
            .collect();
        for owner in &node.owners {
            work.extend(self.unlink(&owner.uid, uid));
        }
        work
    }

    /// Removes the edge owner → dependent. An owner deleting its dependents is looked at
    /// again (it may be free to go); a virtual owner nobody references is dropped.
    fn unlink(&mut self, owner_uid: &str, dependent_uid: &str) -> Vec<Work> {
        let Some(owner) = self.nodes.get_mut(owner_uid) else {
            return Vec::new();
        };
        owner.dependents.remove(dependent_uid);
        if !owner.observed && owner.dependents.is_empty() {
            self.nodes.remove(owner_uid);
            return Vec::new();
        }
        if owner.deletion == Deletion::DeletingDependents {
            return vec![Work::AttemptToDelete(owner_uid.to_string())];
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn owner_ref(uid: &str, block: bool) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("rs-{uid}"),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(block),
        }
    }

    fn meta(uid: &str, owners: &[OwnerReference]) -> ObjectMeta {
        ObjectMeta {
            name: Some(format!("pod-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            owner_references: Some(owners.to_vec()),
            ..ObjectMeta::default()
        }
    }

    /// Observes a pod.
    fn pod(g: &mut Graph, meta: &ObjectMeta) -> Vec<Work> {
        g.observe("v1", "Pod", meta)
    }

    fn deleting(mut meta: ObjectMeta, finalizer: &str) -> ObjectMeta {
        meta.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        meta.finalizers = Some(vec![finalizer.into()]);
        meta
    }

    #[test]
    fn an_unseen_owner_is_virtual_and_checked() {
        let mut g = Graph::default();
        let m = meta("p1", &[owner_ref("rs1", true)]);
        let work = pod(&mut g, &m);
        assert_eq!(work, vec![Work::AttemptToDelete("rs1".into())]);
        let owner = g.node("rs1").unwrap();
        assert!(!owner.observed);
        assert_eq!(owner.identity.namespace.as_deref(), Some("default"));
        assert_eq!(
            (&*owner.identity.kind, &*owner.identity.name),
            ("ReplicaSet", "rs-rs1")
        );
        assert!(owner.dependents.contains("p1"));
        // The pod's edge and the owner's index share one UID.
        let edge = &g.node("p1").unwrap().owners[0];
        assert!(Arc::ptr_eq(&edge.uid, &owner.identity.uid));
    }

    #[test]
    fn a_seen_owner_gives_no_work_and_its_deletion_queues_dependents() {
        let mut g = Graph::default();
        let rs_meta = meta("rs1", &[]);
        assert!(pod(&mut g, &rs_meta).is_empty());
        let m = meta("p1", &[owner_ref("rs1", true)]);
        assert!(pod(&mut g, &m).is_empty());
        // Seeing the same object again changes nothing.
        assert!(pod(&mut g, &m).is_empty());
        assert_eq!(g.forget("rs1"), vec![Work::AttemptToDelete("p1".into())]);
        assert!(g.node("rs1").is_none());
    }

    #[test]
    fn a_virtual_owner_without_dependents_is_dropped() {
        let mut g = Graph::default();
        pod(&mut g, &meta("p1", &[owner_ref("rs1", true)]));
        pod(&mut g, &meta("p1", &[]));
        assert!(g.node("rs1").is_none());
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn orphan_and_foreground_transitions_ask_for_work_once() {
        let mut g = Graph::default();
        let rs_meta = meta("rs1", &[]);
        pod(&mut g, &rs_meta);
        pod(&mut g, &meta("p1", &[owner_ref("rs1", true)]));

        let orphaning = deleting(rs_meta.clone(), ORPHAN);
        assert_eq!(
            pod(&mut g, &orphaning),
            vec![Work::AttemptToOrphan("rs1".into())]
        );
        assert!(pod(&mut g, &orphaning).is_empty());

        let mut g = Graph::default();
        pod(&mut g, &rs_meta);
        pod(&mut g, &meta("p1", &[owner_ref("rs1", true)]));
        let fg = deleting(rs_meta, FOREGROUND);
        assert_eq!(
            pod(&mut g, &fg),
            vec![
                Work::AttemptToDelete("p1".into()),
                Work::AttemptToDelete("rs1".into())
            ]
        );
        assert_eq!(g.blocking_dependents("rs1"), vec!["p1".to_string()]);
        // The dependent going away wakes the owner.
        assert_eq!(g.forget("p1"), vec![Work::AttemptToDelete("rs1".into())]);
        assert!(g.blocking_dependents("rs1").is_empty());
    }

    #[test]
    fn only_blocking_references_block() {
        let mut g = Graph::default();
        g.observe("apps/v1", "ReplicaSet", &meta("rs1", &[]));
        pod(&mut g, &meta("a", &[owner_ref("rs1", true)]));
        pod(&mut g, &meta("b", &[owner_ref("rs1", false)]));
        assert_eq!(g.blocking_dependents("rs1"), vec!["a".to_string()]);
        assert_eq!(g.observed_of("v1", "Pod").len(), 2);
    }
}
