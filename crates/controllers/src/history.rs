//! ControllerRevisions: the pod templates a DaemonSet or StatefulSet has had, as
//! upstream's `controller/history`. Each revision holds the strategic merge patch that
//! puts its template back (`{"spec":{"template":{…,"$patch":"replace"}}}`), which is
//! what `kubectl rollout undo` applies; its name is `<owner>-<hash of that patch>` and
//! `revision` orders them. Pods carry the hash (DaemonSet) or the revision's name
//! (StatefulSet) in the `controller-revision-hash` label.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::serde_json::{self, Value, json};
use krust_client::cache::Cache;
use krust_client::informer::EventHandler;
use krust_client::is_status;
use krust_client::queue::WorkQueue;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, Resource, ResourceExt};

use crate::Error;
use crate::owner::{adopt_patch, controller_of, controller_ref, key_of};

/// The label that ties pods and revisions to a revision.
pub const REVISION_HASH: &str = "controller-revision-hash";

/// Longest owner name kept in a revision's name (upstream's limit leaves room for the
/// hash within 253 characters).
const MAX_PREFIX: usize = 223;

/// The patch a revision stores for `template`.
pub fn template_patch(template: &PodTemplateSpec) -> Value {
    let mut template = serde_json::to_value(template).expect("templates serialize");
    if let Some(t) = template.as_object_mut() {
        t.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": template}})
}

/// The template a revision puts back.
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut template = revision
        .data
        .as_ref()?
        .0
        .get("spec")?
        .get("template")?
        .clone();
    template.as_object_mut()?.remove("$patch");
    serde_json::from_value(template).ok()
}

/// FNV-1 over the patch and the collision count, in the safe alphabet (upstream's
/// `HashControllerRevision`; the JSON bytes are ours, so the values differ from
/// upstream's for the same template, as the pod-template-hash does).
pub fn hash(data: &Value, collision_count: Option<i32>) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h = h.wrapping_mul(0x0100_0193);
            h ^= *b as u32;
        }
    };
    feed(&serde_json::to_vec(data).expect("JSON serializes"));
    if let Some(c) = collision_count {
        feed(c.to_string().as_bytes());
    }
    krust_api::names::safe_encode(h.to_string().bytes())
}

fn revision_name(owner: &str, hash: &str) -> String {
    let mut cut = owner.len().min(MAX_PREFIX);
    while !owner.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{hash}", &owner[..cut])
}

fn data(revision: &ControllerRevision) -> Option<&Value> {
    revision.data.as_ref().map(|d| &d.0)
}

/// The revisions an owner controls, oldest first, after adopting the orphans its
/// selector matches.
pub async fn claim<K: Resource<DynamicType = ()>>(
    client: &Client,
    cache: &Cache<ControllerRevision>,
    owner: &K,
    selector: &Selector,
) -> Result<Vec<Arc<ControllerRevision>>, Error> {
    let ns = owner.meta().namespace.as_deref();
    let uid = owner.uid().unwrap_or_default();
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns.unwrap_or_default());
    let mut owned = Vec::new();
    for rev in cache.state_filter(|r| r.metadata.namespace.as_deref() == ns) {
        match controller_of(&rev.metadata) {
            Some(r) if r.uid == uid => owned.push(rev),
            None if owner.meta().deletion_timestamp.is_none() && selector.matches(rev.labels()) => {
                let patch = adopt_patch(&rev.metadata, owner);
                match api
                    .patch(
                        &rev.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(adopted) => owned.push(Arc::new(adopted)),
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => {
                        return Err(Error::api("adopting revision", key_of(&rev.metadata), e));
                    }
                }
            }
            _ => {}
        }
    }
    owned.sort_by_key(|r| r.revision);
    Ok(owned)
}

/// The revision of `template` among `revisions` (oldest first), created if there is
/// none, and made the newest if an older one is brought back (a rollback). Creating
/// may find another revision under the same name: `collision_count` then goes up and
/// the caller must store it in the owner's status.
pub async fn current<K: Resource<DynamicType = ()>>(
    client: &Client,
    owner: &K,
    revisions: &[Arc<ControllerRevision>],
    template: &PodTemplateSpec,
    collision_count: &mut i32,
) -> Result<ControllerRevision, Error> {
    let patch = template_patch(template);
    let newest = revisions.last().map_or(0, |r| r.revision);
    let ns = owner.meta().namespace.clone().unwrap_or_default();
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    if let Some(equal) = revisions.iter().rev().find(|r| data(r) == Some(&patch)) {
        if equal.revision == newest {
            return Ok((**equal).clone());
        }
        let bump = json!({"revision": newest + 1});
        return api
            .patch(
                &equal.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&bump),
            )
            .await
            .map_err(|e| Error::api("updating revision", key_of(&equal.metadata), e));
    }
    let labels: BTreeMap<String, String> = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    loop {
        let hash = hash(&patch, Some(*collision_count));
        let mut labels = labels.clone();
        labels.insert(REVISION_HASH.into(), hash.clone());
        let revision = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(revision_name(&owner.name_any(), &hash)),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                // The owner's annotations (kubectl's change-cause among them) go with
                // the revision, as upstream's StatefulSet and DaemonSet controllers copy
                // them, so that `kubectl rollout history` shows them.
                annotations: owner.meta().annotations.clone(),
                owner_references: Some(vec![controller_ref(owner)]),
                ..Default::default()
            },
            data: Some(RawExtension(patch.clone())),
            revision: newest + 1,
        };
        match api.create(&PostParams::default(), &revision).await {
            Ok(created) => return Ok(created),
            Err(e) if is_status(&e, 409) => {
                let name = revision.name_any();
                let existing = api
                    .get(&name)
                    .await
                    .map_err(|e| Error::api("reading revision", format!("{ns}/{name}"), e))?;
                let ours = controller_of(&existing.metadata)
                    .is_some_and(|r| Some(&r.uid) == owner.uid().as_ref());
                if ours && data(&existing) == Some(&patch) {
                    return Ok(existing);
                }
                *collision_count += 1;
            }
            Err(e) => {
                return Err(Error::api(
                    "creating revision",
                    format!("{ns}/{name}", name = revision.name_any()),
                    e,
                ));
            }
        }
    }
}

/// Deletes the oldest revisions beyond `limit`, except those in `keep` (revisions
/// live pods still run, by the value of their `controller-revision-hash` label or by
/// name) and `current`.
pub async fn truncate(
    client: &Client,
    revisions: &[Arc<ControllerRevision>],
    current: &str,
    keep: &HashSet<&str>,
    limit: usize,
) -> Result<(), Error> {
    let unused: Vec<&Arc<ControllerRevision>> = revisions
        .iter()
        .filter(|r| {
            let name = r.name_any();
            let hash = r.labels().get(REVISION_HASH).map(String::as_str);
            name != current
                && !keep.contains(name.as_str())
                && !hash.is_some_and(|h| keep.contains(h))
        })
        .collect();
    // `revisions` may not hold `current` yet (it was just created).
    let old = revisions.iter().filter(|r| r.name_any() != current).count();
    let excess = old.saturating_sub(limit).min(unused.len());
    for rev in &unused[..excess] {
        let api: Api<ControllerRevision> = Api::namespaced(
            client.clone(),
            rev.metadata.namespace.as_deref().unwrap_or_default(),
        );
        match api.delete(&rev.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(Error::api("deleting revision", key_of(&rev.metadata), e)),
        }
    }
    Ok(())
}

/// Revisions changed by someone else (or deleted) send their owner of `kind` round
/// again.
pub struct RevisionEvents {
    pub kind: &'static str,
    pub queue: Arc<WorkQueue>,
}

impl EventHandler<ControllerRevision> for RevisionEvents {
    fn on_apply(&self, _old: Option<&ControllerRevision>, new: &Arc<ControllerRevision>) {
        self.on_delete(new);
    }
    fn on_delete(&self, rev: &Arc<ControllerRevision>) {
        if let Some(owner) = controller_of(&rev.metadata).filter(|r| r.kind == self.kind) {
            let ns = rev.metadata.namespace.as_deref().unwrap_or_default();
            self.queue.add(format!("{ns}/{}", owner.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_stores_the_patch_that_puts_its_template_back() {
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
        .unwrap();
        let patch = template_patch(&template);
        assert_eq!(patch["spec"]["template"]["$patch"], "replace");
        assert_eq!(
            patch["spec"]["template"]["spec"]["containers"][0]["image"],
            "busybox"
        );
        let rev = ControllerRevision {
            data: Some(RawExtension(patch.clone())),
            ..Default::default()
        };
        assert_eq!(template_of(&rev), Some(template));
        // Stable for one template, different with a collision count or another template.
        assert_eq!(hash(&patch, None), hash(&patch, None));
        assert_ne!(hash(&patch, None), hash(&patch, Some(1)));
        assert!(hash(&patch, Some(0)).len() <= 10);
        assert_eq!(revision_name("web", "abc"), "web-abc");
        assert_eq!(revision_name(&"x".repeat(300), "abc").len(), 227);
    }
}
