//! The Gateway API (gateway.networking.k8s.io, standard channel), served by the same
//! proxy as Ingresses: krust installs the API's CRDs and its GatewayClass (`krust`,
//! controller `krust.io/gateway-controller`) at start, opens a listener for every port
//! its Gateways name, routes requests by the HTTPRoutes and GRPCRoutes attached to them
//! ([`table`]), and writes each object's status conditions ([`plan`], [`status`]).

pub mod api;
pub mod plan;
mod status;
pub mod table;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use krust_client::informer::Informer;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::routes::Services;
use crate::serve::{self, Proxy};
use api::{GRPCRoute, Gateway, GatewayClass, HTTPRoute, ReferenceGrant};
use plan::{Protocol, World};

/// The GatewayClass krust registers.
pub const CLASS: &str = "krust";
const MANAGER: &str = "krust-gateway";
const CRDS: &str = include_str!("crds.yaml");

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the Gateway API CRDs: {0}")]
    Definitions(String),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Installs (or updates) the Gateway API CRDs and krust's GatewayClass.
pub async fn install(client: &Client) -> Result<(), Error> {
    let list: Value =
        serde_saphyr::from_str(CRDS).map_err(|e| Error::Definitions(e.to_string()))?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let apply = PatchParams::apply(MANAGER).force();
    for crd in list["items"].as_array().into_iter().flatten() {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        crds.patch(name, &apply, &Patch::Apply(crd)).await?;
    }
    let classes: Api<GatewayClass> = Api::all(client.clone());
    let class = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": CLASS},
        "spec": {"controllerName": plan::CONTROLLER_NAME, "description": "krust's built-in Gateway: the Ingress controller's proxy"},
    });
    classes.patch(CLASS, &apply, &Patch::Apply(&class)).await?;
    Ok(())
}

/// The watches the Gateway objects come from.
pub struct Informers {
    classes: Arc<Informer<GatewayClass>>,
    gateways: Arc<Informer<Gateway>>,
    http_routes: Arc<Informer<HTTPRoute>>,
    grpc_routes: Arc<Informer<GRPCRoute>>,
    grants: Arc<Informer<ReferenceGrant>>,
    namespaces: Arc<Informer<Namespace>>,
}

/// The objects as the caches hold them at one moment.
pub struct Snapshot {
    classes: Vec<Arc<GatewayClass>>,
    gateways: Vec<Arc<Gateway>>,
    http_routes: Vec<Arc<HTTPRoute>>,
    grpc_routes: Vec<Arc<GRPCRoute>>,
    grants: Vec<Arc<ReferenceGrant>>,
    namespaces: Vec<Arc<Namespace>>,
}

impl Informers {
    pub fn new(client: &Client, changed: &Arc<Notify>) -> Informers {
        let all = watcher::Config::default;
        Informers {
            classes: Informer::notifying(client, all(), changed),
            gateways: Informer::notifying(client, all(), changed),
            http_routes: Informer::notifying(client, all(), changed),
            grpc_routes: Informer::notifying(client, all(), changed),
            grants: Informer::notifying(client, all(), changed),
            namespaces: Informer::notifying(client, all(), changed),
        }
    }

    pub async fn run(&self) {
        futures::join!(
            self.classes.clone().run(),
            self.gateways.clone().run(),
            self.http_routes.clone().run(),
            self.grpc_routes.clone().run(),
            self.grants.clone().run(),
            self.namespaces.clone().run(),
        );
    }

    pub async fn wait_until_ready(&self) {
        let (classes, gateways, http_routes, grpc_routes, grants, namespaces) = (
            self.classes.cache(),
            self.gateways.cache(),
            self.http_routes.cache(),
            self.grpc_routes.cache(),
            self.grants.cache(),
            self.namespaces.cache(),
        );
        futures::join!(
            classes.wait_until_ready(),
            gateways.wait_until_ready(),
            http_routes.wait_until_ready(),
            grpc_routes.wait_until_ready(),
            grants.wait_until_ready(),
            namespaces.wait_until_ready(),
        );
    }

    /// Whether every Gateway API cache holds a complete list: routes judged against
    /// Gateways not yet listed would lose their status for a moment.
    pub fn is_ready(&self) -> bool {
        self.classes.cache().is_ready()
            && self.gateways.cache().is_ready()
            && self.http_routes.cache().is_ready()
            && self.grpc_routes.cache().is_ready()
            && self.grants.cache().is_ready()
            && self.namespaces.cache().is_ready()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            classes: self.classes.cache().state(),
            gateways: self.gateways.cache().state(),
            http_routes: self.http_routes.cache().state(),
            grpc_routes: self.grpc_routes.cache().state(),
            grants: self.grants.cache().state(),
            namespaces: self.namespaces.cache().state(),
        }
    }
}

impl Snapshot {
    pub fn world<'a>(
        &'a self,
        secrets: &'a [Arc<Secret>],
        services: &'a Services<'a>,
        address: std::net::Ipv4Addr,
    ) -> World<'a> {
        World {
            classes: &self.classes,
            gateways: &self.gateways,
            http_routes: &self.http_routes,
            grpc_routes: &self.grpc_routes,
            grants: &self.grants,
            namespaces: &self.namespaces,
            secrets,
            services,
            address,
        }
    }

    /// Writes the statuses of `plan` that differ from the objects' (for routes, the
    /// entries of other controllers' parents are kept).
    pub async fn report(&self, client: &Client, reports: &[plan::Report]) {
        for report in reports {
            let current = self.status_of(report.kind, report.namespace.as_deref(), &report.name);
            let Some(status) = status::merged(&report.status, current) else {
                continue;
            };
            let patch = json!({"status": status});
            let patched = match report.kind {
                "GatewayClass" => {
                    patch_status::<GatewayClass>(client, None, &report.name, &patch).await
                }
                "Gateway" => {
                    patch_status::<Gateway>(
                        client,
                        report.namespace.as_deref(),
                        &report.name,
                        &patch,
                    )
                    .await
                }
                "HTTPRoute" => {
                    patch_status::<HTTPRoute>(
                        client,
                        report.namespace.as_deref(),
                        &report.name,
                        &patch,
                    )
                    .await
                }
                _ => {
                    patch_status::<GRPCRoute>(
                        client,
                        report.namespace.as_deref(),
                        &report.name,
                        &patch,
                    )
                    .await
                }
            };
            if let Err(err) = patched {
                tracing::warn!(kind = report.kind, name = %report.name, error = %err, "updating a Gateway API status failed");
            }
        }
    }

    fn status_of(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<&Value> {
        fn find<
            'a,
            K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
        >(
            list: &'a [Arc<K>],
            namespace: Option<&str>,
            name: &str,
            status: impl Fn(&'a K) -> Option<&'a Value>,
        ) -> Option<&'a Value> {
            list.iter()
                .find(|o| {
                    o.metadata().namespace.as_deref() == namespace
                        && o.metadata().name.as_deref() == Some(name)
                })
                .and_then(|o| status(o))
        }
        match kind {
            "GatewayClass" => find(&self.classes, namespace, name, |o| o.status.as_ref()),
            "Gateway" => find(&self.gateways, namespace, name, |o| o.status.as_ref()),
            "HTTPRoute" => find(&self.http_routes, namespace, name, |o| o.status.as_ref()),
            _ => find(&self.grpc_routes, namespace, name, |o| o.status.as_ref()),
        }
    }
}

async fn patch_status<K>(
    client: &Client,
    namespace: Option<&str>,
    name: &str,
    patch: &Value,
) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// The listeners the Gateways' ports need, beside the Ingress ports: opened when a
/// Gateway names a port, closed when none does any more.
pub struct Ports {
    /// The Ingress ports (HTTP, HTTPS), which Gateway listeners share.
    ingress: (u16, u16),
    open: HashMap<u16, (Protocol, JoinHandle<()>)>,
    failed: HashMap<u16, String>,
}

impl Ports {
    pub fn new(ingress: (u16, u16)) -> Ports {
        Ports {
            ingress,
            open: HashMap::new(),
            failed: HashMap::new(),
        }
    }

    /// Opens the ports `wanted` names and closes the others.
    pub fn sync(
        &mut self,
        wanted: &BTreeMap<u16, Protocol>,
        proxy: &Arc<Proxy>,
        acceptor: &TlsAcceptor,
    ) {
        self.open.retain(|port, (protocol, task)| {
            let keep = wanted.get(port) == Some(protocol);
            if !keep {
                task.abort();
            }
            keep
        });
        self.failed.clear();
        for (&port, &protocol) in wanted {
            if port == self.ingress.0 || port == self.ingress.1 || self.open.contains_key(&port) {
                continue;
            }
            let bound = std::net::TcpListener::bind(("0.0.0.0", port))
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(TcpListener::from_std);
            match bound {
                Ok(listener) => {
                    let tls = (protocol == Protocol::Https).then(|| acceptor.clone());
                    tracing::info!(port, ?protocol, "gateway listener open");
                    let task = tokio::spawn(serve::serve(listener, proxy.clone(), tls));
                    self.open.insert(port, (protocol, task));
                }
                Err(err) => {
                    tracing::warn!(port, error = %err, "opening a gateway listener failed");
                    self.failed
                        .insert(port, format!("port {port} cannot be opened: {err}"));
                }
            }
        }
    }

    /// Whether `port` serves `protocol`, or why not.
    pub fn listening(&self, port: u16, protocol: Protocol) -> Result<(), String> {
        let serves = if port == self.ingress.0 {
            Some(Protocol::Http)
        } else if port == self.ingress.1 {
            Some(Protocol::Https)
        } else if let Some(why) = self.failed.get(&port) {
            return Err(why.clone());
        } else {
            self.open.get(&port).map(|(p, _)| *p)
        };
        match serves {
            Some(p) if p == protocol => Ok(()),
            Some(p) => Err(format!("port {port} serves {p:?}")),
            None => Err(format!("port {port} is not open")),
        }
    }
}

impl Drop for Ports {
    fn drop(&mut self) {
        for (_, task) in self.open.values() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definitions_are_the_five_kinds_of_the_standard_channel() {
        let list: Value = serde_saphyr::from_str(CRDS).unwrap();
        let crds: Vec<CustomResourceDefinition> =
            serde_json::from_value(list["items"].clone()).unwrap();
        let kinds: Vec<(&str, &str)> = crds
            .iter()
            .map(|c| (c.spec.names.kind.as_str(), c.spec.versions[0].name.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("GatewayClass", "v1"),
                ("Gateway", "v1"),
                ("HTTPRoute", "v1"),
                ("GRPCRoute", "v1"),
                ("ReferenceGrant", "v1beta1")
            ]
        );
        // The shared parts came through the anchors.
        let route = &crds[3].spec.versions[0].schema.as_ref().unwrap();
        let spec = &route
            .open_api_v3_schema
            .as_ref()
            .unwrap()
            .properties
            .as_ref()
            .unwrap()["spec"];
        assert!(
            spec.properties.as_ref().unwrap()["parentRefs"]
                .items
                .is_some()
        );
    }
}
