//! The admission plugins krust enables, each upstream's plugin of that name.

mod certificates;
mod default_storage_class;
mod default_toleration_seconds;
mod limit_ranger;
mod namespace_lifecycle;
mod node_restriction;
mod pod_security;
mod priority;
mod resource_quota;
mod runtime_class;
mod service_account;
mod storage_object_in_use_protection;
mod webhooks;

use super::{Attributes, Operation, Plugin};

pub use priority::SYSTEM_PRIORITY_CLASSES;

/// The plugins krust enables, in upstream's order (kube-apiserver's
/// `AllOrderedPlugins`): webhooks, policies and ResourceQuota last.
pub fn enabled() -> Vec<Box<dyn Plugin>> {
    vec![
        Box::new(namespace_lifecycle::NamespaceLifecycle),
        Box::new(limit_ranger::LimitRanger),
        Box::new(service_account::ServiceAccount),
        Box::new(node_restriction::NodeRestriction),
        Box::new(pod_security::PodSecurity),
        Box::new(priority::Priority),
        Box::new(default_toleration_seconds::DefaultTolerationSeconds),
        Box::new(default_storage_class::DefaultStorageClass),
        Box::new(storage_object_in_use_protection::StorageObjectInUseProtection),
        Box::new(runtime_class::RuntimeClass),
        Box::new(certificates::CertificateApproval),
        Box::new(certificates::CertificateSigning),
        Box::new(certificates::CertificateSubjectRestriction),
        Box::new(webhooks::MutatingAdmissionWebhook),
        Box::new(webhooks::ValidatingAdmissionPolicy),
        Box::new(webhooks::ValidatingAdmissionWebhook),
        Box::new(resource_quota::ResourceQuota),
    ]
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
        let positions: Vec<usize> = enabled()
            .iter()
            .map(|p| p.name())
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
            enabled().iter().map(|p| p.name()).collect::<Vec<_>>()
        );
    }
}
