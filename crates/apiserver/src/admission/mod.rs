//! Admission: the last stage before the store, where writes are mutated and checked — as
//! upstream's `admission.Interface`. Each plugin says which requests it handles; the
//! chain runs the mutating half of every plugin that handles the request, in order, then
//! the validating half of each on the object as mutated (upstream's two phases). The
//! order is upstream's (kube-apiserver's ordered plugin list), written once in
//! [`Admission::new`], with upstream's plugin names.
//!
//! What a kind's REST storage does around the store (Service IP allocation, RBAC's
//! escalation check) is not admission: see `rest::Storage`.

mod certificates;
mod default_storage_class;
mod default_toleration_seconds;
mod limit_ranger;
mod namespace_lifecycle;
mod node_restriction;
mod pod_security;
mod priority;
mod resource_quota;
mod service_account;
mod storage_object_in_use_protection;
mod webhooks;

use krust_api::status::{ApiError, Target};
use serde_json::Value;

use crate::rest::Call;

pub use priority::SYSTEM_PRIORITY_CLASSES;
pub use service_account::SERVICE_ACCOUNT_DIR;

/// The operation a request performs on its resource, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    /// The name AdmissionReviews and webhook rules use.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    /// The kind of the options a request of this operation carries.
    pub fn options_kind(self) -> &'static str {
        match self {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        }
    }
}

/// What a plugin sees of a request besides the object it admits (upstream's
/// `admission.Attributes`): the call (resource, subresource, namespace, user, dry run),
/// the operation, and the object as stored before an update or delete.
pub struct Attributes<'r> {
    pub call: &'r Call<'r>,
    pub operation: Operation,
    pub old: Option<&'r Value>,
}

impl<'r> Attributes<'r> {
    pub fn new(call: &'r Call<'r>, operation: Operation, old: Option<&'r Value>) -> Self {
        Attributes {
            call,
            operation,
            old,
        }
    }

    /// Whether the request is for the resource `plural` of `group` (any subresource).
    pub fn is(&self, group: &str, plural: &str) -> bool {
        let info = self.call.kind.info;
        info.group == group && info.plural == plural
    }

    pub fn subresource(&self) -> Option<&str> {
        self.call.info.subresource.as_deref()
    }

    /// A plugin's refusal of the request's object: `<resource> "<name>" is forbidden:
    /// <why>` (upstream's `admission.NewForbidden`).
    pub fn forbidden(&self, name: &str, why: &str) -> ApiError {
        let info = self.call.kind.info;
        ApiError::forbidden_for(
            Target {
                group: info.group,
                resource: info.plural,
                name,
            },
            why,
        )
    }
}

/// One admission plugin (upstream's `admission.Interface`, with its `MutationInterface`
/// and `ValidationInterface` halves). `obj` is the new object on create and update and
/// none on delete; a plugin without a half keeps the default, which admits.
#[async_trait::async_trait]
pub trait Plugin: Send + Sync {
    /// Upstream's name for the plugin.
    fn name(&self) -> &'static str;

    /// Whether the plugin has anything to say about this request.
    fn handles(&self, a: &Attributes<'_>) -> bool;

    /// The mutating half: may change the object, or refuse the request.
    async fn admit(&self, _a: &Attributes<'_>, _obj: Option<&mut Value>) -> Result<(), ApiError> {
        Ok(())
    }

    /// The validating half, on the object as every mutating half left it.
    async fn validate(&self, _a: &Attributes<'_>, _obj: Option<&Value>) -> Result<(), ApiError> {
        Ok(())
    }
}

/// The admission chain.
pub struct Admission {
    plugins: Vec<Box<dyn Plugin>>,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new()
    }
}

impl Admission {
    /// The plugins krust enables, in upstream's order (kube-apiserver's
    /// `AllOrderedPlugins`): webhooks, policies and ResourceQuota last.
    pub fn new() -> Self {
        let plugins: Vec<Box<dyn Plugin>> = vec![
            Box::new(namespace_lifecycle::NamespaceLifecycle),
            Box::new(limit_ranger::LimitRanger),
            Box::new(service_account::ServiceAccount),
            Box::new(node_restriction::NodeRestriction),
            Box::new(pod_security::PodSecurity),
            Box::new(priority::Priority),
            Box::new(default_toleration_seconds::DefaultTolerationSeconds),
            Box::new(default_storage_class::DefaultStorageClass),
            Box::new(storage_object_in_use_protection::StorageObjectInUseProtection),
            Box::new(certificates::CertificateApproval),
            Box::new(certificates::CertificateSigning),
            Box::new(certificates::CertificateSubjectRestriction),
            Box::new(webhooks::MutatingAdmissionWebhook),
            Box::new(webhooks::ValidatingAdmissionPolicy),
            Box::new(webhooks::ValidatingAdmissionWebhook),
            Box::new(resource_quota::ResourceQuota),
        ];
        Admission { plugins }
    }

    /// The enabled plugins' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.plugins.iter().map(|p| p.name())
    }

    /// The mutating phase: every handling plugin's mutating half, in order.
    pub async fn mutate(
        &self,
        a: &Attributes<'_>,
        mut obj: Option<&mut Value>,
    ) -> Result<(), ApiError> {
        for plugin in self.plugins.iter().filter(|p| p.handles(a)) {
            plugin.admit(a, obj.as_deref_mut()).await?;
        }
        Ok(())
    }

    /// The validating phase: every handling plugin's validating half, in order; the first
    /// refusal refuses the request.
    pub async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        for plugin in self.plugins.iter().filter(|p| p.handles(a)) {
            plugin.validate(a, obj).await?;
        }
        Ok(())
    }

    /// Both phases, for a request whose REST storage does nothing between them (a delete).
    pub async fn admit(
        &self,
        a: &Attributes<'_>,
        mut obj: Option<&mut Value>,
    ) -> Result<(), ApiError> {
        self.mutate(a, obj.as_deref_mut()).await?;
        self.validate(a, obj.as_deref()).await
    }
}

/// Whether `obj` is a pod being created: what most of the built-in plugins look at.
fn pod_create(a: &Attributes<'_>) -> bool {
    a.operation == Operation::Create && a.is("", "pods")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-apiserver 1.33's `AllOrderedPlugins`, the order every plugin runs in.
    const UPSTREAM_ORDER: &[&str] = &[
        "AlwaysAdmit",
        "NamespaceAutoProvision",
        "NamespaceLifecycle",
        "NamespaceExists",
        "LimitPodHardAntiAffinityTopology",
        "LimitRanger",
        "ServiceAccount",
        "NodeRestriction",
        "TaintNodesByCondition",
        "AlwaysPullImages",
        "ImagePolicyWebhook",
        "PodSecurity",
        "PodNodeSelector",
        "Priority",
        "DefaultTolerationSeconds",
        "PodTolerationRestriction",
        "EventRateLimit",
        "ExtendedResourceToleration",
        "DefaultStorageClass",
        "StorageObjectInUseProtection",
        "OwnerReferencesPermissionEnforcement",
        "PersistentVolumeClaimResize",
        "RuntimeClass",
        "CertificateApproval",
        "CertificateSigning",
        "ClusterTrustBundleAttest",
        "CertificateSubjectRestriction",
        "DefaultIngressClass",
        "DenyServiceExternalIPs",
        "PodTopologyLabels",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionWebhook",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionWebhook",
        "ResourceQuota",
        "AlwaysDeny",
    ];

    #[test]
    fn plugins_are_upstreams_in_upstreams_order() {
        let positions: Vec<usize> = Admission::new()
            .names()
            .map(|name| {
                UPSTREAM_ORDER
                    .iter()
                    .position(|u| *u == name)
                    .unwrap_or_else(|| panic!("{name} is not an upstream plugin"))
            })
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "out of upstream's order: {:?}",
            Admission::new().names().collect::<Vec<_>>()
        );
    }
}
