//! Pod events for the controllers that own pods (ReplicaSet, DaemonSet, StatefulSet),
//! as upstream's `addPod`/`updatePod`/`deletePod` handlers: a pod's appearance or
//! deletion settles its owner's expectations, and any change sends the owner round
//! again — or, for an orphan, every owner whose selector matches it (one may adopt it).

use std::sync::Arc;

use krust_client::cache::{Cache, Watched};
use krust_client::informer::EventHandler;
use krust_client::queue::WorkQueue;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::expectations::Expectations;
use crate::owner::{controller_of, key_of};
use crate::pods::CachedPod;

pub struct OwnedPodEvents<K> {
    pub owners: Cache<K>,
    pub queue: Arc<WorkQueue>,
    /// The owner kind's expectations; `None` for owners that keep none (StatefulSets:
    /// their pods' fixed names make a repeated write harmless).
    pub expectations: Option<Arc<Expectations>>,
    /// An owner's parsed selector; `None` (unparsable) adopts nothing.
    pub selector: fn(&K) -> Option<Selector>,
}

impl<K> OwnedPodEvents<K>
where
    K: Watched,
{
    /// The owner of kind `K` that controls `pod`, if it is in the cache (same uid).
    pub fn owner_of(&self, pod: &CachedPod) -> Option<Arc<K>> {
        let kind = K::kind(&());
        let r = controller_of(&pod.metadata).filter(|r| r.kind == kind)?;
        let owner = self.owners.get(Some(&pod.metadata.namespace), &r.name)?;
        (owner.uid().as_deref() == Some(r.uid.as_str())).then_some(owner)
    }

    fn deleted(&self, pod: &CachedPod) {
        if let Some(owner) = self.owner_of(pod) {
            let key = key_of(owner.meta());
            if let Some(e) = &self.expectations {
                e.deletion_observed(&key, &key_of(&pod.metadata));
            }
            self.queue.add(key);
        }
    }

    fn enqueue_owner_or_matching(&self, pod: &CachedPod) {
        match self.owner_of(pod) {
            Some(owner) => self.queue.add(key_of(owner.meta())),
            None if controller_of(&pod.metadata).is_none() => {
                let ns = &*pod.metadata.namespace;
                let matching = self.owners.state_filter(|o| {
                    o.meta().namespace.as_deref() == Some(ns)
                        && (self.selector)(o)
                            .is_some_and(|s| !s.selects_all() && s.matches(pod.labels()))
                });
                for owner in matching {
                    self.queue.add(key_of(owner.meta()));
                }
            }
            None => {}
        }
    }
}

impl<K> EventHandler<CachedPod> for OwnedPodEvents<K>
where
    K: Watched,
{
    fn on_apply(&self, old: Option<&CachedPod>, new: &Arc<CachedPod>) {
        let Some(old) = old else {
            if new.metadata.terminating {
                return self.deleted(new);
            }
            if let (Some(owner), Some(e)) = (self.owner_of(new), &self.expectations) {
                e.creation_observed(&key_of(owner.meta()));
            }
            return self.enqueue_owner_or_matching(new);
        };
        if old.metadata.resource_version == new.metadata.resource_version {
            return;
        }
        if new.metadata.terminating && !old.metadata.terminating {
            self.deleted(new);
        }
        // The previous controller (or, for an orphan, the previous matches) must look
        // again when the controller or the labels changed.
        if controller_of(&old.metadata) != controller_of(&new.metadata)
            || old.labels() != new.labels()
        {
            self.enqueue_owner_or_matching(old);
        }
        self.enqueue_owner_or_matching(new);
    }

    fn on_delete(&self, pod: &Arc<CachedPod>) {
        self.deleted(pod);
    }
}
