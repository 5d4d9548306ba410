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
mod discovery;
mod event;
mod networking;
pub(crate) mod pod;
mod policy;
mod rbac;
mod scheduling;
mod service;
mod service_allocation;
mod storage;
pub mod table;
pub mod validation;
mod volume;

use std::sync::OnceLock;

use k8s_openapi::api;
use krust_api::registry::{self, ResourceInfo};
use krust_api::status::Cause;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use table::Column;

/// What a kind does beyond the generic REST semantics. Objects are JSON values that have
/// already been through the kind's typed codec, so field types are known to be right.
pub trait Strategy: Sync {
    /// Whether `metadata.generation` counts spec changes (workloads do; pods and
    /// configmaps do not).
    fn tracks_generation(&self) -> bool {
        false
    }

    /// Whether something besides `metadata.finalizers` still holds a deleted object
    /// (namespaces wait for `spec.finalizers`).
    fn holds_deletion(&self, _obj: &Value) -> bool {
        false
    }

    /// Whether a completed DELETE answers with the deleted object rather than a Success
    /// Status (upstream's `ReturnDeletedObject`, set for pods and services).
    fn returns_deleted_object(&self) -> bool {
        false
    }

    /// The grace period a delete must wait out first (`Some(seconds > 0)`), given the
    /// one the client asked for; `None` deletes at once (or when finalizers allow).
    fn deletion_grace(&self, _obj: &Value, _requested: Option<i64>) -> Option<i64> {
        None
    }

    /// Adjusts an object being marked for deletion (a namespace turns Terminating).
    fn prepare_for_delete(&self, _obj: &mut Value) {}

    /// The rule object names must follow.
    fn name_rule(&self) -> validation::NameRule {
        validation::NameRule::Subdomain
    }

    /// Fills defaults, as upstream's `SetDefaults_*` functions do.
    fn default(&self, _obj: &mut Value) {}

    /// Adjusts a new object before validation (for example clearing status).
    fn prepare_for_create(&self, _obj: &mut Value) {}

    /// Records who created the object, for kinds that say (a certificate signing
    /// request's `spec.username` and `spec.groups`).
    fn record_requester(&self, _obj: &mut Value, _user: &crate::auth::User) {}

    /// Adjusts an update of `part` after the generic split (which took only that part from
    /// `new`): what else that endpoint may not change comes from `old`, as upstream's
    /// `PrepareForUpdate` of each (sub)resource strategy.
    fn prepare_for_update(&self, _part: crate::rest::Part, _new: &mut Value, _old: &Value) {}

    /// Checks a new object; each problem is one cause.
    fn validate(&self, _obj: &Value, _errs: &mut Vec<Cause>) {}

    /// Checks only a new object gets, in addition to [`Strategy::validate`] (fields that
    /// are set through a subresource later).
    fn validate_create(&self, _obj: &Value, _errs: &mut Vec<Cause>) {}

    /// Warnings about a valid object being written (upstream's `WarningsOnCreate` and
    /// `WarningsOnUpdate`), for the `Warning` response header.
    fn warnings(&self, _obj: &Value) -> Vec<String> {
        Vec::new()
    }

    /// Checks an update against the old object (immutable fields and the like), in addition
    /// to [`Strategy::validate`] of the new object.
    fn validate_update(&self, _new: &Value, _old: &Value, _errs: &mut Vec<Cause>) {}

    /// [`Strategy::validate_update`] for kinds whose subresources may change different
    /// things (`None`: the main resource).
    fn validate_update_of(
        &self,
        _subresource: Option<&str>,
        new: &Value,
        old: &Value,
        errs: &mut Vec<Cause>,
    ) {
        self.validate_update(new, old, errs);
    }

    /// The values of the kind's selectable fields beyond metadata.name/namespace.
    fn fields(&self, _obj: &Value) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// The server-side table columns after NAME (see [`table`]).
    fn columns(&self) -> &'static [Column] {
        table::CREATED_AT
    }

    /// The autoscaling/v1 Scale view of an object (kinds with a `scale` subresource):
    /// desired replicas, current replicas, and the pods' label selector as text.
    fn scale(&self, obj: &Value) -> (i64, i64, String) {
        let selector = table::selector(&obj["spec"]["selector"]);
        (
            obj["spec"]["replicas"].as_i64().unwrap_or(0),
            obj["status"]["replicas"].as_i64().unwrap_or(0),
            selector
                .as_str()
                .filter(|s| *s != "<none>")
                .unwrap_or_default()
                .to_string(),
        )
    }

    /// Sets the desired replicas, as a write of the `scale` subresource does.
    fn set_replicas(&self, obj: &mut Value, replicas: i64) {
        obj["spec"]["replicas"] = serde_json::json!(replicas);
    }

    /// Converts an object of this resource's version into its storage form, and back. Only
    /// resources whose storage is shared with another version (events.k8s.io events) need
    /// this.
    fn to_storage(&self, obj: Value) -> Value {
        obj
    }
    fn to_served(&self, obj: Value) -> Value {
        obj
    }

    /// The webhook that converts this resource's objects between versions, for custom
    /// resources whose definition converts by one; the conversions above then only
    /// rewrite `apiVersion`.
    fn conversion_webhook(&self) -> Option<&crate::custom::conversion::Webhook> {
        None
    }

    /// The schema server-side apply merges custom resources by (built-in kinds have
    /// theirs in `krust_apimachinery`).
    /// The kind's REST storage steps around the store, if it has any.
    fn storage(&self) -> Option<&'static dyn crate::rest::Storage> {
        None
    }
    fn apply_schema(&self) -> Option<&'static krust_apimachinery::apply::CustomSchema> {
        None
    }
}

/// Field validation strictness (`fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Decodes a JSON object through the kind's typed representation: drops unknown fields and
/// reports their paths, and rejects wrongly typed values.
pub type Decoder = &'static (dyn Fn(Value) -> Result<(Value, Vec<String>), String> + Send + Sync);

/// One resource with its codec and strategy.
pub struct Kind {
    pub info: &'static ResourceInfo,
    pub decode: Decoder,
    pub strategy: &'static dyn Strategy,
    /// The kind's OpenAPI schema.
    pub schema: Schema,
    /// Objects are stored in another version of the resource (events.k8s.io's events
    /// are core events, autoscaling/v1's HPAs are v2's) and convert on the way in and
    /// out. Set once in [`all`]: every object served reads it.
    pub converts: bool,
}

/// Where a kind's OpenAPI schema comes from.
pub enum Schema {
    /// A k8s-openapi type's: `add` puts it (and everything it refers to) in a generator,
    /// under the definition name `name` (`io.k8s.api.core.v1.Pod`).
    Typed {
        add: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
        name: fn() -> String,
    },
    /// A custom resource's, from its definition: the OpenAPI v3 schema of the whole
    /// object, and its definition name (`com.example.stable.v1.CronTab`, as upstream).
    Custom { schema: Value, name: String },
}

impl Kind {
    pub fn has_status(&self) -> bool {
        self.info
            .has_subresource(krust_api::registry::Subresource::Status)
    }
}

pub(crate) fn decode<K: DeserializeOwned + Serialize>(
    v: Value,
) -> Result<(Value, Vec<String>), String> {
    let mut unknown = Vec::new();
    let typed: K = serde_ignored::deserialize(v, |path| unknown.push(field_path(&path)))
        .map_err(|e| e.to_string())?;
    let out = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    Ok((out, unknown))
}

/// A field path as upstream prints it in unknown-field errors: `spec.containers[0].foo`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let p = field_path(parent);
            if p.is_empty() {
                key.clone()
            } else {
                format!("{p}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// The default strategy: no extra defaults or checks, NAME and CREATED AT columns.
struct Plain;
impl Strategy for Plain {}

fn kind<K: DeserializeOwned + Serialize + schemars::JsonSchema + 'static>(
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

/// Every kind krust serves, in registry order.
pub fn all() -> &'static [Kind] {
    static KINDS: OnceLock<Vec<Kind>> = OnceLock::new();
    KINDS.get_or_init(|| {
        use api::core::v1 as corev1;
        let mut kinds = vec![
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
            kind::<api::apps::v1::ControllerRevision>(
                "apps",
                "controllerrevisions",
                &apps::CONTROLLER_REVISION,
            ),
            kind::<api::apps::v1::DaemonSet>("apps", "daemonsets", &apps::DAEMON_SET),
            kind::<api::apps::v1::Deployment>("apps", "deployments", &apps::DEPLOYMENT),
            kind::<api::apps::v1::ReplicaSet>("apps", "replicasets", &apps::REPLICA_SET),
            kind::<api::apps::v1::StatefulSet>("apps", "statefulsets", &apps::STATEFUL_SET),
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
            kind::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>(
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                &crate::custom::definition::DEFINITION,
            ),
            kind::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>(
                "apiregistration.k8s.io",
                "apiservices",
                &apiregistration::API_SERVICE,
            ),
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
            kind::<api::batch::v1::CronJob>("batch", "cronjobs", &batch::CRON_JOB),
            kind::<api::batch::v1::Job>("batch", "jobs", &batch::JOB),
            kind::<api::certificates::v1::CertificateSigningRequest>(
                "certificates.k8s.io",
                "certificatesigningrequests",
                &certificates::CERTIFICATE_SIGNING_REQUEST,
            ),
            kind::<api::coordination::v1::Lease>(
                "coordination.k8s.io",
                "leases",
                &coordination::LEASE,
            ),
            kind::<api::discovery::v1::EndpointSlice>(
                "discovery.k8s.io",
                "endpointslices",
                &discovery::ENDPOINT_SLICE,
            ),
            kind::<api::events::v1::Event>("events.k8s.io", "events", &event::EVENTS_V1),
            kind::<crate::resource_metrics::NodeMetrics>("metrics.k8s.io", "nodes", &Plain),
            kind::<crate::resource_metrics::PodMetrics>("metrics.k8s.io", "pods", &Plain),
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
            kind::<api::policy::v1::PodDisruptionBudget>(
                "policy",
                "poddisruptionbudgets",
                &policy::PDB,
            ),
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
            kind::<api::scheduling::v1::PriorityClass>(
                "scheduling.k8s.io",
                "priorityclasses",
                &scheduling::PRIORITY_CLASS,
            ),
            kind::<api::storage::v1::CSIDriver>(
                "storage.k8s.io",
                "csidrivers",
                &storage::CSI_DRIVER,
            ),
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
        ];
        // The first kind of a storage prefix is its storage version ([`for_storage`]).
        for i in 0..kinds.len() {
            let storage = kinds[i].info.storage;
            kinds[i].converts =
                !storage.is_empty() && kinds[..i].iter().any(|k| k.info.storage == storage);
        }
        kinds
    })
}

/// The kind serving `plural` in `group`/`version`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
    all()
        .iter()
        .find(|k| k.info.group == group && k.info.version == version && k.info.plural == plural)
}

/// The kind whose objects live under a storage prefix, preferring the storage version
/// (core events over events.k8s.io events).
pub fn for_storage(storage: &str) -> Option<&'static Kind> {
    all().iter().find(|k| k.info.storage == storage)
}

/// Codecs of the subresource and option kinds that are not resources themselves.
pub fn decode_scale(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<api::autoscaling::v1::Scale>(v)
}

pub fn decode_eviction(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<api::policy::v1::Eviction>(v)
}

pub fn decode_token_request(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<api::authentication::v1::TokenRequest>(v)
}

pub fn decode_delete_options(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions>(v)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn every_registry_entry_has_a_kind() {
        for r in registry::RESOURCES {
            assert!(find(r.group, r.version, r.plural).is_some(), "{}", r.plural);
        }
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
