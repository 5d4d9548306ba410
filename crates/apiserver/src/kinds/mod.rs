//! Per-kind behaviour: the typed codec and the strategy (defaulting, validation, status
//! split, selectable fields, table columns) of every resource in the registry. The REST
//! handlers are generic; everything a kind does differently lives here, as in upstream's
//! `pkg/registry/*/strategy.go`.

pub mod admissionregistration;
mod apiregistration;
mod apps;
mod autoscaling;
mod batch;
mod certificates;
mod coordination;
mod core;
mod disruption_budget;
mod endpoint_slice;
mod event;
pub mod metrics;
mod networking;
mod node;
pub(crate) mod pod;
mod rbac;
mod scheduling;
mod service;
mod service_allocation;
mod storage;
mod volume;

use std::sync::{Arc, OnceLock};

use k8s_openapi::api;
use krust_api::registry;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::allocator::ServiceAllocator;
use crate::rest::scope::StorageMap;
use crate::rest::strategy::{Kind, Schema, Storage, Strategy, decode};

/// The default strategy: no extra defaults or checks, NAME and CREATED AT columns.
struct Plain;
impl Strategy for Plain {}

pub(crate) fn kind<K: DeserializeOwned + Serialize + schemars::JsonSchema + 'static>(
    group: &str,
    plural: &str,
    strategy: &'static dyn Strategy,
) -> Kind {
    let info = registry::RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
        .unwrap_or_else(|| panic!("{plural}.{group} missing from the registry"));
    Kind {
        info,
        decode: &decode::<K>,
        strategy,
        schema: Schema::Typed {
            add: |g| g.subschema_for::<K>(),
            name: || K::schema_name().into_owned(),
        },
        converts: false,
    }
}

/// Every kind krust serves, in registry order: the kinds of each API group come from a
/// function of their own, as upstream's REST storage providers are one per group.
pub fn all() -> &'static [Kind] {
    static KINDS: OnceLock<Vec<Kind>> = OnceLock::new();
    KINDS.get_or_init(|| {
        let groups = [
            core_group(),
            apps_group(),
            admissionregistration_group(),
            apiregistration_group(),
            authentication_group(),
            authorization_group(),
            autoscaling_group(),
            batch_group(),
            certificates_group(),
            coordination_group(),
            discovery_group(),
            events_group(),
            metrics_group(),
            networking_group(),
            node_group(),
            policy_group(),
            rbac_group(),
            scheduling_group(),
            storage_group(),
        ];
        let mut kinds: Vec<Kind> = groups.into_iter().flatten().collect();
        // The first kind of a storage prefix is its storage version.
        for i in 0..kinds.len() {
            let storage = kinds[i].info.storage;
            kinds[i].converts =
                !storage.is_empty() && kinds[..i].iter().any(|k| k.info.storage == storage);
        }
        kinds
    })
}

/// The kinds of the core group (`v1`).
fn core_group() -> Vec<Kind> {
    use api::core::v1 as corev1;
    vec![
        kind::<corev1::Binding>("", "bindings", &Plain),
        kind::<corev1::ComponentStatus>("", "componentstatuses", &core::COMPONENT_STATUS),
        kind::<corev1::ConfigMap>("", "configmaps", &core::CONFIG_MAP),
        kind::<corev1::Endpoints>("", "endpoints", &core::ENDPOINTS),
        kind::<corev1::Event>("", "events", &event::CORE),
        kind::<corev1::LimitRange>("", "limitranges", &core::LIMIT_RANGE),
        kind::<corev1::Namespace>("", "namespaces", &core::NAMESPACE),
        kind::<corev1::Node>("", "nodes", &core::NODE),
        kind::<corev1::PersistentVolumeClaim>(
            "",
            "persistentvolumeclaims",
            &volume::PERSISTENT_VOLUME_CLAIM,
        ),
        kind::<corev1::PersistentVolume>("", "persistentvolumes", &volume::PERSISTENT_VOLUME),
        kind::<corev1::Pod>("", "pods", &pod::POD),
        kind::<corev1::PodTemplate>("", "podtemplates", &pod::POD_TEMPLATE),
        kind::<corev1::ReplicationController>(
            "",
            "replicationcontrollers",
            &apps::REPLICATION_CONTROLLER,
        ),
        kind::<corev1::ResourceQuota>("", "resourcequotas", &core::RESOURCE_QUOTA),
        kind::<corev1::Secret>("", "secrets", &core::SECRET),
        kind::<corev1::ServiceAccount>("", "serviceaccounts", &core::SERVICE_ACCOUNT),
        kind::<corev1::Service>("", "services", &service::SERVICE),
    ]
}

/// The kinds of the apps group.
fn apps_group() -> Vec<Kind> {
    vec![
        kind::<api::apps::v1::ControllerRevision>(
            "apps",
            "controllerrevisions",
            &apps::CONTROLLER_REVISION,
        ),
        kind::<api::apps::v1::DaemonSet>("apps", "daemonsets", &apps::DAEMON_SET),
        kind::<api::apps::v1::Deployment>("apps", "deployments", &apps::DEPLOYMENT),
        kind::<api::apps::v1::ReplicaSet>("apps", "replicasets", &apps::REPLICA_SET),
        kind::<api::apps::v1::StatefulSet>("apps", "statefulsets", &apps::STATEFUL_SET),
    ]
}

/// The kinds of the admissionregistration.k8s.io group.
fn admissionregistration_group() -> Vec<Kind> {
    vec![
        kind::<api::admissionregistration::v1::MutatingWebhookConfiguration>(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            &admissionregistration::MUTATING_WEBHOOK_CONFIGURATION,
        ),
        kind::<api::admissionregistration::v1::ValidatingWebhookConfiguration>(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            &admissionregistration::VALIDATING_WEBHOOK_CONFIGURATION,
        ),
        kind::<api::admissionregistration::v1::ValidatingAdmissionPolicy>(
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            &admissionregistration::VALIDATING_ADMISSION_POLICY,
        ),
        kind::<api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>(
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
            &admissionregistration::VALIDATING_ADMISSION_POLICY_BINDING,
        ),
    ]
}

/// The kinds of the apiregistration.k8s.io group.
fn apiregistration_group() -> Vec<Kind> {
    vec![kind::<
        k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService,
    >(
        "apiregistration.k8s.io",
        "apiservices",
        &apiregistration::API_SERVICE,
    )]
}

/// The kinds of the authentication.k8s.io group.
fn authentication_group() -> Vec<Kind> {
    vec![
        kind::<api::authentication::v1::SelfSubjectReview>(
            "authentication.k8s.io",
            "selfsubjectreviews",
            &Plain,
        ),
        kind::<api::authentication::v1::TokenReview>(
            "authentication.k8s.io",
            "tokenreviews",
            &Plain,
        ),
    ]
}

/// The kinds of the authorization.k8s.io group.
fn authorization_group() -> Vec<Kind> {
    vec![
        kind::<api::authorization::v1::LocalSubjectAccessReview>(
            "authorization.k8s.io",
            "localsubjectaccessreviews",
            &Plain,
        ),
        kind::<api::authorization::v1::SelfSubjectAccessReview>(
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            &Plain,
        ),
        kind::<api::authorization::v1::SelfSubjectRulesReview>(
            "authorization.k8s.io",
            "selfsubjectrulesreviews",
            &Plain,
        ),
        kind::<api::authorization::v1::SubjectAccessReview>(
            "authorization.k8s.io",
            "subjectaccessreviews",
            &Plain,
        ),
    ]
}

/// The kinds of the autoscaling group.
fn autoscaling_group() -> Vec<Kind> {
    vec![
        kind::<api::autoscaling::v2::HorizontalPodAutoscaler>(
            "autoscaling",
            "horizontalpodautoscalers",
            &autoscaling::HPA_V2,
        ),
        Kind {
            info: registry::find("autoscaling", "v1", "horizontalpodautoscalers")
                .expect("autoscaling/v1 in the registry"),
            ..kind::<api::autoscaling::v1::HorizontalPodAutoscaler>(
                "autoscaling",
                "horizontalpodautoscalers",
                &autoscaling::HPA_V1,
            )
        },
    ]
}

/// The kinds of the batch group.
fn batch_group() -> Vec<Kind> {
    vec![
        kind::<api::batch::v1::CronJob>("batch", "cronjobs", &batch::CRON_JOB),
        kind::<api::batch::v1::Job>("batch", "jobs", &batch::JOB),
    ]
}

/// The kinds of the certificates.k8s.io group.
fn certificates_group() -> Vec<Kind> {
    vec![kind::<api::certificates::v1::CertificateSigningRequest>(
        "certificates.k8s.io",
        "certificatesigningrequests",
        &certificates::CERTIFICATE_SIGNING_REQUEST,
    )]
}

/// The kinds of the coordination.k8s.io group.
fn coordination_group() -> Vec<Kind> {
    vec![kind::<api::coordination::v1::Lease>(
        "coordination.k8s.io",
        "leases",
        &coordination::LEASE,
    )]
}

/// The kinds of the discovery.k8s.io group.
fn discovery_group() -> Vec<Kind> {
    vec![kind::<api::discovery::v1::EndpointSlice>(
        "discovery.k8s.io",
        "endpointslices",
        &endpoint_slice::ENDPOINT_SLICE,
    )]
}

/// The kinds of the events.k8s.io group.
fn events_group() -> Vec<Kind> {
    vec![kind::<api::events::v1::Event>(
        "events.k8s.io",
        "events",
        &event::EVENTS_V1,
    )]
}

/// The kinds of the metrics.k8s.io group.
fn metrics_group() -> Vec<Kind> {
    vec![
        kind::<metrics::NodeMetrics>("metrics.k8s.io", "nodes", &Plain),
        kind::<metrics::PodMetrics>("metrics.k8s.io", "pods", &Plain),
    ]
}

/// The kinds of the networking.k8s.io group.
fn networking_group() -> Vec<Kind> {
    vec![
        kind::<api::networking::v1::IngressClass>(
            "networking.k8s.io",
            "ingressclasses",
            &networking::INGRESS_CLASS,
        ),
        kind::<api::networking::v1::Ingress>(
            "networking.k8s.io",
            "ingresses",
            &networking::INGRESS,
        ),
        kind::<api::networking::v1::NetworkPolicy>(
            "networking.k8s.io",
            "networkpolicies",
            &networking::NETWORK_POLICY,
        ),
    ]
}

/// The kinds of the policy group.
fn policy_group() -> Vec<Kind> {
    vec![kind::<api::policy::v1::PodDisruptionBudget>(
        "policy",
        "poddisruptionbudgets",
        &disruption_budget::PDB,
    )]
}

/// The kinds of the rbac.authorization.k8s.io group.
fn rbac_group() -> Vec<Kind> {
    vec![
        kind::<api::rbac::v1::ClusterRoleBinding>(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            &rbac::ROLE_BINDING,
        ),
        kind::<api::rbac::v1::ClusterRole>(
            "rbac.authorization.k8s.io",
            "clusterroles",
            &rbac::ROLE,
        ),
        kind::<api::rbac::v1::RoleBinding>(
            "rbac.authorization.k8s.io",
            "rolebindings",
            &rbac::ROLE_BINDING,
        ),
        kind::<api::rbac::v1::Role>("rbac.authorization.k8s.io", "roles", &rbac::ROLE),
    ]
}

/// The kinds of the node.k8s.io group.
fn node_group() -> Vec<Kind> {
    vec![kind::<api::node::v1::RuntimeClass>(
        "node.k8s.io",
        "runtimeclasses",
        &node::RUNTIME_CLASS,
    )]
}

/// The kinds of the scheduling.k8s.io group.
fn scheduling_group() -> Vec<Kind> {
    vec![kind::<api::scheduling::v1::PriorityClass>(
        "scheduling.k8s.io",
        "priorityclasses",
        &scheduling::PRIORITY_CLASS,
    )]
}

/// The kinds of the storage.k8s.io group.
fn storage_group() -> Vec<Kind> {
    vec![
        kind::<api::storage::v1::CSIDriver>("storage.k8s.io", "csidrivers", &storage::CSI_DRIVER),
        kind::<api::storage::v1::CSINode>("storage.k8s.io", "csinodes", &storage::CSI_NODE),
        kind::<api::storage::v1::CSIStorageCapacity>(
            "storage.k8s.io",
            "csistoragecapacities",
            &storage::CSI_STORAGE_CAPACITY,
        ),
        kind::<api::storage::v1::StorageClass>(
            "storage.k8s.io",
            "storageclasses",
            &storage::STORAGE_CLASS,
        ),
        kind::<api::storage::v1::VolumeAttachment>(
            "storage.k8s.io",
            "volumeattachments",
            &storage::VOLUME_ATTACHMENT,
        ),
    ]
}

/// The kind serving `plural` in `group`/`version`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
    all()
        .iter()
        .find(|k| k.info.group == group && k.info.version == version && k.info.plural == plural)
}

/// The REST storage steps of the resources that have any, for an apiserver whose
/// Services allocate from `services` (upstream's storage providers, built per server).
pub fn storage(services: Arc<ServiceAllocator>) -> StorageMap {
    let rbac: Arc<dyn Storage> = Arc::new(rbac::EscalationCheck);
    let mut map = StorageMap::new();
    map.insert(
        ("", "services"),
        Arc::new(service_allocation::ServiceStorage(services)),
    );
    for plural in [
        "roles",
        "rolebindings",
        "clusterroles",
        "clusterrolebindings",
    ] {
        map.insert(("rbac.authorization.k8s.io", plural), rbac.clone());
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_storage_entry_names_a_served_kind() {
        let storage = storage(Arc::new(ServiceAllocator::new(
            "10.43.0.0/16".parse().unwrap(),
        )));
        assert_eq!(storage.len(), 5);
        for (group, plural) in storage.keys() {
            assert!(
                all()
                    .iter()
                    .any(|k| k.info.group == *group && k.info.plural == *plural),
                "{group}/{plural} has storage steps but no kind"
            );
        }
    }

    #[test]
    fn only_versions_stored_as_another_convert() {
        let converting: Vec<String> = all()
            .iter()
            .filter(|k| k.converts)
            .map(|k| format!("{}/{} {}", k.info.group, k.info.version, k.info.plural))
            .collect();
        assert_eq!(
            converting,
            [
                "autoscaling/v1 horizontalpodautoscalers",
                "events.k8s.io/v1 events"
            ]
        );
    }

    #[test]
    fn decode_drops_and_reports_unknown_fields() {
        let k = find("", "v1", "configmaps").unwrap();
        let (v, unknown) = (k.decode)(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "bogus": 1},
            "data": {"k": "v"}, "extra": true
        }))
        .unwrap();
        assert_eq!(v["data"]["k"], "v");
        assert!(v.get("extra").is_none());
        assert_eq!(
            unknown,
            vec!["metadata.bogus".to_string(), "extra".to_string()]
        );
        let err = (k.decode)(serde_json::json!({"metadata": {"name": 5}})).unwrap_err();
        assert!(err.contains("invalid type"), "{err}");
    }
}
