//! `EndpointSliceController`: the EndpointSlices of every Service with a selector, as
//! upstream's endpointslice controller writes them.
//!
//! A pass over a Service computes the desired endpoints per address family — one per
//! selected pod that has an IP of the family and has not finished, with conditions
//! ready (Ready and not terminating), serving (Ready) and terminating (being deleted),
//! nodeName, zone (the node's `topology.kubernetes.io/zone`), hostname (when the pod's
//! subdomain names the Service) and a targetRef — and groups them by their port set:
//! a named targetPort resolves per pod, so pods can differ. It then [`plan`]s the fewest
//! writes that make the Service's slices hold exactly those endpoints, at most
//! [`MAX_ENDPOINTS_PER_SLICE`] per slice: an endpoint stays in the slice it is in,
//! new ones fill slices that change anyway before slices that would not, then new
//! slices. A Service without endpoints keeps one empty placeholder slice.
//!
//! Slices are named `<service>-<random>`, labelled `kubernetes.io/service-name` and
//! `endpointslice.kubernetes.io/managed-by`, and controlled by the Service (so the
//! garbage collector removes them with it). What this controller wrote but its cache has
//! not shown yet is tracked, and a pass waits for the cache to catch up rather than
//! act on a view that would make it create a slice twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use krust_api::sync::Unpoisoned;
use krust_client::cache::Cache;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{controller_ref, key_of, split_key};
use crate::pods::CachedPod;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};

use krust_client::endpoints::LAST_CHANGE_TRIGGER_TIME;
pub use krust_client::endpoints::SERVICE_NAME_LABEL;
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Upstream's `--max-endpoints-per-slice` default.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// How soon a pass that found the cache behind its own writes looks again.
const CACHE_CATCH_UP: Duration = Duration::from_millis(20);

/// The endpoints of one port set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PortGroup {
    pub ports: Vec<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
}

/// The writes that bring a Service's slices to the desired state.
#[derive(Debug, Default)]
pub struct Plan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<Arc<EndpointSlice>>,
}

/// Identifies an endpoint across passes: the pod it stands for, else its first address.
fn endpoint_key(e: &Endpoint) -> String {
    match &e.target_ref {
        Some(r) if r.uid.is_some() => r.uid.clone().unwrap_or_default(),
        _ => e.addresses.first().cloned().unwrap_or_default(),
    }
}

fn ports_key(ports: &[EndpointPort]) -> String {
    let mut parts: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{}/{}",
                p.name.as_deref().unwrap_or_default(),
                p.protocol.as_deref().unwrap_or("TCP"),
                p.port.unwrap_or_default(),
                p.app_protocol.as_deref().unwrap_or_default()
            )
        })
        .collect();
    parts.sort();
    parts.join(",")
}

/// Plans the writes for one address type. `existing` are the Service's slices of that
/// type; `template` is a slice carrying the metadata (labels, owner, generateName) and
/// address type every slice must have.
pub fn plan(
    template: &EndpointSlice,
    existing: &[Arc<EndpointSlice>],
    desired: &[PortGroup],
    max_per_slice: usize,
) -> Plan {
    let mut plan = Plan::default();
    let labels = template.metadata.labels.clone();
    let owners = template.metadata.owner_references.clone();
    let mut by_ports: HashMap<String, Vec<Arc<EndpointSlice>>> = HashMap::new();
    for s in existing {
        by_ports
            .entry(ports_key(s.ports.as_deref().unwrap_or_default()))
            .or_default()
            .push(s.clone());
    }
    let mut kept_any = false;
    for group in desired {
        let mut wanted: BTreeMap<String, &Endpoint> = group
            .endpoints
            .iter()
            .map(|e| (endpoint_key(e), e))
            .collect();
        // Slices of this port set, with what stays in them.
        let mut slices: Vec<(Arc<EndpointSlice>, Vec<Endpoint>, bool)> = Vec::new();
        for s in by_ports
            .remove(&ports_key(&group.ports))
            .unwrap_or_default()
        {
            let mut changed = s.metadata.labels != labels || s.metadata.owner_references != owners;
            let mut kept = Vec::new();
            for e in &s.endpoints {
                match wanted.remove(&endpoint_key(e)) {
                    Some(w) => {
                        changed |= w != e;
                        kept.push(w.clone());
                    }
                    None => changed = true,
                }
            }
            slices.push((s, kept, changed));
        }
        // New endpoints go to slices that change anyway, then to any with room.
        let mut rest = wanted.into_values();
        for pass_changed in [true, false] {
            for (_, kept, changed) in slices.iter_mut().filter(|s| s.2 == pass_changed) {
                while kept.len() < max_per_slice {
                    let Some(e) = rest.next() else { break };
                    kept.push(e.clone());
                    *changed = true;
                }
            }
        }
        for (s, kept, changed) in slices {
            if kept.is_empty() {
                plan.delete.push(s);
                continue;
            }
            kept_any = true;
            if changed {
                let mut updated = (*s).clone();
                updated.metadata.labels = labels.clone();
                updated.metadata.owner_references = owners.clone();
                updated.endpoints = kept;
                plan.update.push(updated);
            }
        }
        let rest: Vec<Endpoint> = rest.cloned().collect();
        for chunk in rest.chunks(max_per_slice.max(1)) {
            let mut slice = template.clone();
            slice.ports = Some(group.ports.clone());
            slice.endpoints = chunk.to_vec();
            plan.create.push(slice);
            kept_any = true;
        }
    }
    // Slices of port sets nobody has any more.
    plan.delete.extend(by_ports.into_values().flatten());
    if !kept_any {
        // No endpoints at all: one empty placeholder slice stays (upstream does the
        // same, so that consumers can tell "no endpoints" from "not processed yet").
        let placeholder = |s: &EndpointSlice| {
            s.endpoints.is_empty()
                && s.ports.as_deref().unwrap_or_default().is_empty()
                && s.metadata.labels == labels
        };
        match plan.delete.iter().position(|s| placeholder(s)) {
            Some(i) => {
                plan.delete.remove(i);
            }
            None => match plan.delete.pop() {
                Some(s) => {
                    let mut reused = (*s).clone();
                    reused.metadata.labels = labels.clone();
                    reused.metadata.owner_references = owners.clone();
                    reused.endpoints = Vec::new();
                    reused.ports = None;
                    plan.update.push(reused);
                }
                None if existing.is_empty() => plan.create.push(template.clone()),
                None => {}
            },
        }
    }
    plan
}

/// Writes of this controller that its cache has not shown yet, per Service key.
#[derive(Default)]
struct Tracker {
    pending: Mutex<HashMap<String, Vec<Pending>>>,
}

enum Pending {
    /// Created with this name.
    Created(String),
    /// Updated away from this resourceVersion.
    Updated { name: String, from: String },
    /// Deleted (this UID).
    Deleted { name: String, uid: String },
}

impl Tracker {
    fn note(&self, key: &str, p: Pending) {
        self.pending
            .locked()
            .entry(key.to_string())
            .or_default()
            .push(p);
    }

    /// Drops what the cache has caught up with; true if something is still missing.
    fn behind(&self, key: &str, ns: &str, slices: &Cache<EndpointSlice>) -> bool {
        let mut pending = self.pending.locked();
        let Some(list) = pending.get_mut(key) else {
            return false;
        };
        let cached = |name: &str| slices.get(Some(ns), name);
        list.retain(|p| match p {
            Pending::Created(name) => cached(name).is_none(),
            Pending::Updated { name, from } => cached(name)
                .is_some_and(|s| s.metadata.resource_version.as_deref() == Some(from.as_str())),
            Pending::Deleted { name, uid } => {
                cached(name).is_some_and(|s| s.metadata.uid.as_deref() == Some(uid.as_str()))
            }
        });
        if list.is_empty() {
            pending.remove(key);
            return false;
        }
        true
    }

    fn forget(&self, key: &str) {
        self.pending.locked().remove(key);
    }
}

pub struct EndpointSliceController {
    client: Client,
    services: Cache<Service>,
    pods: Cache<CachedPod>,
    nodes: Cache<Node>,
    slices: Cache<EndpointSlice>,
    tracker: Tracker,
    queue: Arc<WorkQueue>,
}

impl EndpointSliceController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let queue = WorkQueue::new("endpointslice");
        let (services, pods) = super::watch_services_and_pods(informers, &queue);
        let nodes = informers.get::<Node>();
        let slices = informers.get::<EndpointSlice>();
        let controller = Arc::new(EndpointSliceController {
            client,
            services,
            pods,
            nodes: nodes.cache(),
            slices: slices.cache(),
            tracker: Tracker::default(),
            queue: queue.clone(),
        });
        slices.add_handler(Arc::new(SliceEvents(queue)));
        controller
    }
}

impl Reconciler for EndpointSliceController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(svc) = self.services.get(Some(ns), name) else {
            // The garbage collector removes the slices of a deleted Service.
            self.tracker.forget(key);
            return Ok(None);
        };
        if super::selector(&svc).is_none() || svc.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        if self.tracker.behind(key, ns, &self.slices) {
            return Ok(Some(CACHE_CATCH_UP));
        }
        let pods = super::selected_pods(&svc, &self.pods);
        let ours: Vec<Arc<EndpointSlice>> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(ns)
                    && s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
                    && s.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
            })
            .collect();
        let families = svc
            .spec
            .as_ref()
            .and_then(|s| s.ip_families.clone())
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| vec!["IPv4".into()]);
        let mut writes = Plan::default();
        for family in &families {
            let existing: Vec<Arc<EndpointSlice>> = ours
                .iter()
                .filter(|s| &s.address_type == family)
                .cloned()
                .collect();
            let desired = self.desired(&svc, &pods, family);
            let p = plan(
                &template(&svc, family),
                &existing,
                &desired,
                MAX_ENDPOINTS_PER_SLICE,
            );
            writes.create.extend(p.create);
            writes.update.extend(p.update);
            writes.delete.extend(p.delete);
        }
        // Slices of a family the Service no longer has.
        writes.delete.extend(
            ours.iter()
                .filter(|s| !families.contains(&s.address_type))
                .cloned(),
        );
        if let Some(at) = trigger_time(&svc, &pods) {
            let at = at.to_string();
            for slice in writes.create.iter_mut().chain(writes.update.iter_mut()) {
                slice
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(LAST_CHANGE_TRIGGER_TIME.into(), at.clone());
            }
        }
        self.write(key, ns, writes).await?;
        Ok(None)
    }
}

/// The latest change behind a Service's endpoints that this controller can date: the
/// Service's creation, a selected pod's creation or its becoming ready. (Upstream's
/// tracker also dates a pod's becoming unready; the pod cache keeps no time for that.)
fn trigger_time(svc: &Service, pods: &[Arc<CachedPod>]) -> Option<jiff::Timestamp> {
    let service = svc.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let pods = pods.iter().filter_map(|p| {
        let ready = crate::pods::ready_since(p).flatten();
        ready.max(p.metadata.creation_timestamp)
    });
    service.into_iter().chain(pods).max()
}

impl EndpointSliceController {
    fn desired(&self, svc: &Service, pods: &[Arc<CachedPod>], family: &str) -> Vec<PortGroup> {
        let publish_not_ready = svc
            .spec
            .as_ref()
            .and_then(|s| s.publish_not_ready_addresses)
            .unwrap_or(false);
        let svc_ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        let mut groups: BTreeMap<String, PortGroup> = BTreeMap::new();
        let mut sorted: Vec<&Arc<CachedPod>> = pods.iter().collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for pod in sorted {
            if !super::should_be_in_endpoints(pod, true) {
                continue;
            }
            let Some(ip) = super::pod_ip(pod, family) else {
                continue;
            };
            let ports: Vec<EndpointPort> = svc_ports
                .iter()
                .filter_map(|sp| {
                    Some(EndpointPort {
                        name: Some(sp.name.clone().unwrap_or_default()),
                        port: Some(super::target_port(pod, sp)?),
                        protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                        app_protocol: sp.app_protocol.clone(),
                    })
                })
                .collect();
            let ready = crate::pods::is_ready(pod);
            let terminating = pod.metadata.terminating;
            let node_name = pod.spec.node_name.as_deref().map(String::from);
            let zone = node_name.as_ref().and_then(|n| {
                self.nodes
                    .get(None, n)
                    .and_then(|node| node.labels().get(ZONE_LABEL).cloned())
            });
            let endpoint = Endpoint {
                addresses: vec![ip],
                conditions: Some(EndpointConditions {
                    ready: Some(publish_not_ready || (ready && !terminating)),
                    serving: Some(publish_not_ready || ready),
                    terminating: Some(terminating),
                }),
                hostname: super::hostname(pod, svc),
                node_name,
                zone,
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    namespace: Some(pod.metadata.namespace.to_string()),
                    name: Some(pod.metadata.name.to_string()),
                    uid: Some(pod.metadata.uid.to_string()),
                    ..ObjectReference::default()
                }),
                ..Endpoint::default()
            };
            let group = groups.entry(ports_key(&ports)).or_default();
            group.ports = ports;
            group.endpoints.push(endpoint);
        }
        groups.into_values().collect()
    }

    async fn write(&self, key: &str, ns: &str, plan: Plan) -> Result<(), Error> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        for slice in plan.create {
            let created = api
                .create(&PostParams::default(), &slice)
                .await
                .map_err(|e| Error::api("creating EndpointSlice for", key, e))?;
            self.tracker.note(key, Pending::Created(created.name_any()));
        }
        for slice in plan.update {
            let name = slice.name_any();
            let from = slice.metadata.resource_version.clone().unwrap_or_default();
            api.replace(&name, &PostParams::default(), &slice)
                .await
                .map_err(|e| Error::api("updating EndpointSlice", format!("{ns}/{name}"), e))?;
            self.tracker.note(key, Pending::Updated { name, from });
        }
        for slice in plan.delete {
            let name = slice.name_any();
            let uid = slice.uid().unwrap_or_default();
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => self.tracker.note(key, Pending::Deleted { name, uid }),
                Err(e) if is_status(&e, 404) => {}
                Err(e) => {
                    return Err(Error::api(
                        "deleting EndpointSlice",
                        format!("{ns}/{name}"),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What every slice of the Service for this address type carries.
fn template(svc: &Service, family: &str) -> EndpointSlice {
    let name = svc.name_any();
    // generateName must leave room for the random suffix within 63 characters.
    let prefix: String = name.chars().take(57).collect();
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            namespace: svc.namespace(),
            labels: Some(super::published_labels(
                svc,
                &[(SERVICE_NAME_LABEL, &name), (MANAGED_BY_LABEL, MANAGED_BY)],
            )),
            owner_references: Some(vec![controller_ref(svc)]),
            ..ObjectMeta::default()
        },
        address_type: family.to_string(),
        endpoints: Vec::new(),
        ports: None,
    }
}

/// Queues the Service whose slice changed (someone may have edited or deleted it).
struct SliceEvents(Arc<WorkQueue>);

impl SliceEvents {
    fn enqueue(&self, s: &EndpointSlice) {
        if s.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
            return;
        }
        if let Some(svc) = s.labels().get(SERVICE_NAME_LABEL) {
            let meta = ObjectMeta {
                namespace: s.namespace(),
                name: Some(svc.clone()),
                ..ObjectMeta::default()
            };
            self.0.add(key_of(&meta));
        }
    }
}

impl EventHandler<EndpointSlice> for SliceEvents {
    fn on_apply(&self, _old: Option<&EndpointSlice>, new: &Arc<EndpointSlice>) {
        self.enqueue(new);
    }
    fn on_delete(&self, obj: &Arc<EndpointSlice>) {
        self.enqueue(obj);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(uid: &str, ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec![format!("10.0.0.{}", uid.len())],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            target_ref: Some(ObjectReference {
                uid: Some(uid.into()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    fn port(n: i32) -> EndpointPort {
        EndpointPort {
            name: Some(String::new()),
            port: Some(n),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }
    }

    fn template() -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                generate_name: Some("web-".into()),
                labels: Some(BTreeMap::from([(SERVICE_NAME_LABEL.into(), "web".into())])),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: Vec::new(),
            ports: None,
        }
    }

    fn existing(
        name: &str,
        ports: Vec<EndpointPort>,
        endpoints: Vec<Endpoint>,
    ) -> Arc<EndpointSlice> {
        let mut s = template();
        s.metadata.name = Some(name.into());
        s.ports = Some(ports);
        s.endpoints = endpoints;
        Arc::new(s)
    }

    fn uids(n: usize) -> Vec<Endpoint> {
        (0..n)
            .map(|i| endpoint(&format!("pod-{i:04}"), true))
            .collect()
    }

    #[test]
    fn endpoints_are_split_into_slices_of_at_most_the_maximum() {
        let group = PortGroup {
            ports: vec![port(80)],
            endpoints: uids(250),
        };
        let p = plan(&template(), &[], &[group], 100);
        let sizes: Vec<usize> = p.create.iter().map(|s| s.endpoints.len()).collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        assert!(p.update.is_empty() && p.delete.is_empty());
    }

    #[test]
    fn an_unchanged_slice_is_not_written_and_a_changed_one_is_updated_in_place() {
        let eps = uids(3);
        let current = existing("web-a", vec![port(80)], eps.clone());
        let group = PortGroup {
            ports: vec![port(80)],
            endpoints: eps.clone(),
        };
        let p = plan(&template(), std::slice::from_ref(&current), &[group], 100);
        assert!(p.create.is_empty() && p.update.is_empty() && p.delete.is_empty());

        // One pod turns unready, one goes away, one is new.
        let mut changed = eps.clone();
        changed[0] = endpoint("pod-0000", false);
        changed.remove(1);
        changed.push(endpoint("pod-new", true));
        let group = PortGroup {
            ports: vec![port(80)],
            endpoints: changed,
        };
        let p = plan(&template(), &[current], &[group], 100);
        assert!(p.create.is_empty() && p.delete.is_empty());
        assert_eq!(p.update.len(), 1);
        let names: Vec<String> = p.update[0].endpoints.iter().map(endpoint_key).collect();
        assert_eq!(names, vec!["pod-0000", "pod-0002", "pod-new"]);
        assert_eq!(
            p.update[0].endpoints[0].conditions.as_ref().unwrap().ready,
            Some(false)
        );
    }

    #[test]
    fn new_endpoints_fill_a_slice_that_changes_anyway_before_an_untouched_one() {
        let full = existing("full", vec![port(80)], uids(2));
        let mut others = uids(4);
        others.drain(..2);
        let changing = existing("changing", vec![port(80)], others.clone());
        // "changing" loses pod-0003; a new pod arrives.
        let mut want = uids(3);
        want.push(endpoint("pod-new", true));
        let group = PortGroup {
            ports: vec![port(80)],
            endpoints: want,
        };
        let p = plan(&template(), &[full, changing], &[group], 3);
        assert_eq!(p.update.len(), 1);
        assert_eq!(p.update[0].metadata.name.as_deref(), Some("changing"));
        assert_eq!(p.update[0].endpoints.len(), 2);
        assert!(p.create.is_empty());
    }

    #[test]
    fn a_port_change_replaces_slices_and_no_endpoints_leave_a_placeholder() {
        let old = existing("old", vec![port(80)], uids(2));
        let group = PortGroup {
            ports: vec![port(8080)],
            endpoints: uids(2),
        };
        let p = plan(&template(), std::slice::from_ref(&old), &[group], 100);
        assert_eq!(p.create.len(), 1);
        assert_eq!(p.create[0].ports, Some(vec![port(8080)]));
        assert_eq!(p.delete.len(), 1);

        // Nothing selected: the old slice is emptied into the placeholder.
        let p = plan(&template(), &[old], &[], 100);
        assert!(p.create.is_empty() && p.delete.is_empty());
        assert_eq!(p.update.len(), 1);
        assert!(p.update[0].endpoints.is_empty());
        assert_eq!(p.update[0].ports, None);

        // No slices and nothing selected: a placeholder is created, once.
        let p = plan(&template(), &[], &[], 100);
        assert_eq!(p.create.len(), 1);
        let placeholder = existing("ph", Vec::new(), Vec::new());
        let p = plan(&template(), &[placeholder], &[], 100);
        assert!(p.create.is_empty() && p.update.is_empty() && p.delete.is_empty());
    }
}
