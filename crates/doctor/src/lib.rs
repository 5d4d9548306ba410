//! `krust doctor`: the troubleshooting table of the architecture, made executable.
//!
//! Given a target (a workload, pod, Service, Ingress, HTTPRoute, node or URL), the
//! doctor walks the chain that target depends on through the API, as an operator would
//! with kubectl — Deployment → ReplicaSet → Pods → scheduling → node → volumes → sandbox
//! → image → containers → readiness → NetworkPolicy → EndpointSlices → Service → DNS →
//! Ingress or Gateway route — and reports each link with its state, the component that
//! owns it and the evidence, ending with the first broken link and the next command to
//! run. Without a target it checks the cluster's own parts. It never reads the store or another component's
//! memory: whatever it knows, `kubectl` could know. With [`Options::probe`] it also
//! tries the data path (DNS, connections, requests) from the machine it runs on.

mod facts;
mod gateway;
pub mod health;
mod ingress;
mod node;
mod pod;
mod policy;
mod probe;
pub mod render;
pub mod report;
mod service;
pub mod target;
pub mod timeline;
mod url;
mod workload;

pub use report::{Link, Owner, Report, State};
pub use target::Target;

/// Why the doctor could not examine a target (not a broken link: those are reported).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{kind} {name:?} not found in namespace {namespace:?}")]
    NotFound {
        kind: &'static str,
        name: String,
        namespace: String,
    },
    #[error("{0}")]
    Target(#[from] target::ParseError),
    #[error("a timeline is of a workload or a pod, not {0}")]
    Timeline(String),
    #[error("asking the apiserver: {0}")]
    Api(#[from] kube::Error),
}

/// Walks the chain of `target` (in `namespace` for namespaced kinds).
pub async fn examine(
    client: &kube::Client,
    namespace: &str,
    target: &Target,
    options: Options,
) -> Result<Report, Error> {
    let ctx = Context {
        client: client.clone(),
        namespace: namespace.to_string(),
        probe: options.probe,
    };
    let links = match target {
        Target::Workload(kind, name) => vec![workload::examine(&ctx, *kind, name).await?],
        Target::Pod(name) => vec![pod::examine_named(&ctx, name).await?],
        Target::Service(name) => vec![service::examine(&ctx, name).await?],
        Target::Ingress(name) => vec![ingress::examine(&ctx, name).await?],
        Target::Route(name) => vec![gateway::examine(&ctx, name).await?],
        Target::Node(name) => vec![node::examine_named(&ctx, name).await?],
        Target::Url(uri) => vec![url::examine(&ctx, uri).await?],
    };
    Ok(Report::new(target.to_string(), links))
}

/// How far the doctor goes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Besides reading the API, connect, resolve and request along the data path
    /// from where the doctor runs (a node).
    pub probe: bool,
}

/// What every walker needs: the client, the namespace of the target, the options.
pub(crate) struct Context {
    pub client: kube::Client,
    pub namespace: String,
    pub probe: bool,
}

impl Context {
    /// The same walk in another namespace.
    pub fn in_namespace(&self, namespace: &str) -> Context {
        Context {
            client: self.client.clone(),
            namespace: namespace.to_string(),
            probe: self.probe,
        }
    }

    pub fn namespaced<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        kube::Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn cluster<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        kube::Api::all(self.client.clone())
    }

    /// The object `name` of kind `K`, or [`Error::NotFound`].
    pub async fn get<K>(&self, kind: &'static str, name: &str) -> Result<K, Error>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        self.namespaced::<K>()
            .get_opt(name)
            .await?
            .ok_or_else(|| Error::NotFound {
                kind,
                name: name.to_string(),
                namespace: self.namespace.clone(),
            })
    }
}
