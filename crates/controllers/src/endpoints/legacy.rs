//! `EndpointsController`: the core/v1 Endpoints object of every Service with a selector,
//! for clients that predate EndpointSlices, as upstream's endpoints controller writes it.
//!
//! Addresses are the selected pods with an IP that have not finished: ready pods under
//! `addresses`, the others under `notReadyAddresses` (all under `addresses` when the
//! Service publishes not-ready addresses; terminating pods only then). Subsets group
//! addresses by resolved port set, sorted, so an unchanged state compares equal and is
//! not written. More than [`MAX_ADDRESSES`] addresses are truncated and the object is
//! annotated as over capacity, as upstream does. When the Service goes, so does its
//! Endpoints object.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use krust_client::cache::Cache;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};
use crate::pods::CachedPod;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};

/// Upstream's cap on the addresses of one Endpoints object.
pub const MAX_ADDRESSES: usize = 1000;
pub const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";

pub struct EndpointsController {
    client: Client,
    services: Cache<Service>,
    pods: Cache<CachedPod>,
    endpoints: Cache<Endpoints>,
    queue: Arc<WorkQueue>,
}

impl EndpointsController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let queue = WorkQueue::new("endpoints");
        let (services, pods) = super::watch_services_and_pods(informers, &queue);
        let endpoints = informers.get::<Endpoints>();
        let controller = Arc::new(EndpointsController {
            client,
            services,
            pods,
            endpoints: endpoints.cache(),
            queue: queue.clone(),
        });
        endpoints.add_handler(Arc::new(EndpointsEvents(queue)));
        controller
    }
}

impl Reconciler for EndpointsController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), ns);
        let current = self.endpoints.get(Some(ns), name);
        let Some(svc) = self.services.get(Some(ns), name) else {
            if let Some(ep) = current {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: ep.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(name, &params).await {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
                    Err(e) => return Err(Error::api("deleting Endpoints", key, e)),
                }
            }
            return Ok(None);
        };
        if super::selector(&svc).is_none() || svc.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let pods = super::selected_pods(&svc, &self.pods);
        let (subsets, truncated) = subsets(&svc, &pods);
        let labels = super::published_labels(&svc, &[]);
        let mut annotations = current
            .as_ref()
            .map(|c| c.annotations().clone())
            .unwrap_or_default();
        if truncated {
            annotations.insert(OVER_CAPACITY.into(), "truncated".into());
        } else {
            annotations.remove(OVER_CAPACITY);
        }
        let desired = Endpoints {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(ns.to_string()),
                labels: Some(labels).filter(|l| !l.is_empty()),
                annotations: Some(annotations).filter(|a| !a.is_empty()),
                resource_version: current.as_ref().and_then(|c| c.resource_version()),
                ..ObjectMeta::default()
            },
            subsets: Some(subsets).filter(|s| !s.is_empty()),
        };
        match current {
            Some(c)
                if c.subsets == desired.subsets
                    && c.metadata.labels == desired.metadata.labels
                    && c.metadata.annotations == desired.metadata.annotations =>
            {
                Ok(None)
            }
            Some(_) => {
                api.replace(name, &PostParams::default(), &desired)
                    .await
                    .map_err(|e| Error::api("updating Endpoints", key, e))?;
                Ok(None)
            }
            None => match api.create(&PostParams::default(), &desired).await {
                Ok(_) => Ok(None),
                // Created since the cache looked: the cache will bring it, and a pass.
                Err(e) if is_status(&e, 409) => Ok(None),
                Err(e) => Err(Error::api("creating Endpoints", key, e)),
            },
        }
    }
}

/// The Service's subsets, and whether addresses had to be left out.
fn subsets(svc: &Service, pods: &[Arc<CachedPod>]) -> (Vec<EndpointSubset>, bool) {
    let spec = svc.spec.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let family = spec
        .ip_families
        .as_ref()
        .and_then(|f| f.first().cloned())
        .unwrap_or_else(|| "IPv4".into());
    // Port set → (ready, not ready) addresses.
    type Addresses = (Vec<EndpointAddress>, Vec<EndpointAddress>);
    let mut groups: BTreeMap<String, (Vec<EndpointPort>, Addresses)> = BTreeMap::new();
    let mut count = 0;
    let mut truncated = false;
    for pod in pods {
        if !super::should_be_in_endpoints(pod, publish_not_ready) {
            continue;
        }
        let Some(ip) = super::pod_ip(pod, &family) else {
            continue;
        };
        if count == MAX_ADDRESSES {
            truncated = true;
            break;
        }
        count += 1;
        let address = EndpointAddress {
            ip,
            hostname: super::hostname(pod, svc),
            node_name: pod.spec.node_name.as_deref().map(String::from),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some(pod.metadata.namespace.to_string()),
                name: Some(pod.metadata.name.to_string()),
                uid: Some(pod.metadata.uid.to_string()),
                ..ObjectReference::default()
            }),
        };
        let mut ports: Vec<EndpointPort> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|sp| {
                Some(EndpointPort {
                    name: sp.name.clone().filter(|n| !n.is_empty()),
                    port: super::target_port(pod, sp)?,
                    protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    app_protocol: sp.app_protocol.clone(),
                })
            })
            .collect();
        ports.sort_by(|a, b| (&a.name, a.port).cmp(&(&b.name, b.port)));
        let key = subset_key(&ports);
        let (_, (ready, not_ready)) = groups
            .entry(key)
            .or_insert_with(|| (ports, Default::default()));
        if publish_not_ready || crate::pods::is_ready(pod) {
            ready.push(address);
        } else {
            not_ready.push(address);
        }
    }
    let subsets = groups
        .into_values()
        .map(|(ports, (mut ready, mut not_ready))| {
            ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            not_ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            EndpointSubset {
                addresses: Some(ready).filter(|a| !a.is_empty()),
                not_ready_addresses: Some(not_ready).filter(|a| !a.is_empty()),
                ports: Some(ports).filter(|p| !p.is_empty()),
            }
        })
        .collect();
    (subsets, truncated)
}

fn subset_key(ports: &[EndpointPort]) -> String {
    ports
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{}",
                p.name.as_deref().unwrap_or_default(),
                p.protocol.as_deref().unwrap_or_default(),
                p.port
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Queues the Service of the same name when its Endpoints object changes.
struct EndpointsEvents(Arc<WorkQueue>);

impl EventHandler<Endpoints> for EndpointsEvents {
    fn on_apply(&self, _old: Option<&Endpoints>, new: &Arc<Endpoints>) {
        self.0.add(key_of(&new.metadata));
    }
    fn on_delete(&self, obj: &Arc<Endpoints>) {
        self.0.add(key_of(&obj.metadata));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use k8s_openapi::serde_json::{self, json};

    fn pod(name: &str, ip: &str, ready: bool, http_port: i32) -> Arc<CachedPod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
                "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": http_port}]}]},
                "status": {
                    "podIP": ip,
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                },
            }))
            .expect("a pod"),
        )
    }

    fn service(publish_not_ready: bool) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([("app".into(), "web".into())])),
                ports: Some(vec![ServicePort {
                    port: 80,
                    target_port: Some(IntOrString::String("http".into())),
                    ..ServicePort::default()
                }]),
                publish_not_ready_addresses: Some(publish_not_ready),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn addresses_split_by_readiness_and_by_resolved_port() {
        let pods = vec![
            pod("b", "10.0.0.2", true, 8080),
            pod("a", "10.0.0.1", true, 8080),
            pod("c", "10.0.0.3", false, 8080),
            pod("d", "10.0.0.4", true, 9090),
        ];
        let (subsets, truncated) = subsets(&service(false), &pods);
        assert!(!truncated);
        assert_eq!(subsets.len(), 2);
        let s8080 = &subsets[0];
        assert_eq!(s8080.ports.as_ref().unwrap()[0].port, 8080);
        let ips = |a: &Option<Vec<EndpointAddress>>| -> Vec<String> {
            a.iter().flatten().map(|a| a.ip.clone()).collect()
        };
        assert_eq!(ips(&s8080.addresses), vec!["10.0.0.1", "10.0.0.2"]);
        assert_eq!(ips(&s8080.not_ready_addresses), vec!["10.0.0.3"]);
        assert_eq!(ips(&subsets[1].addresses), vec!["10.0.0.4"]);

        // Publishing not-ready addresses puts every pod under `addresses`.
        let (published, _) = super::subsets(&service(true), &pods[..3]);
        assert_eq!(ips(&published[0].addresses).len(), 3);
        assert!(published[0].not_ready_addresses.is_none());
    }

    #[test]
    fn more_than_the_cap_is_truncated() {
        let pods: Vec<Arc<CachedPod>> = (0..MAX_ADDRESSES + 5)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    &format!("10.1.{}.{}", i / 250, i % 250),
                    true,
                    80,
                )
            })
            .collect();
        let (subsets, truncated) = subsets(&service(false), &pods);
        assert!(truncated);
        assert_eq!(
            subsets[0].addresses.as_ref().map(Vec::len),
            Some(MAX_ADDRESSES)
        );
    }
}
