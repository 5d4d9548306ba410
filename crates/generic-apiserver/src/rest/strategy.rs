//! The interfaces through which the generic REST handlers meet a kind (upstream's
//! `registry/rest` strategies): its codec, its strategy (defaulting, validation, status
//! split, table columns, ...) and the steps its REST storage adds around the store. The
//! built-in kinds' implementations are in krust-apiserver's `kinds`, custom resources' in
//! its `custom`.

use std::sync::Arc;

use krust_api::registry::ResourceInfo;
use krust_api::status::{ApiError, Cause};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Call;
use crate::table::Column;

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
    fn name_rule(&self) -> crate::validation::NameRule {
        crate::validation::NameRule::Subdomain
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
        crate::table::CREATED_AT
    }

    /// The NAME cell of the server-side table: the object's name, unless the kind's
    /// upstream printer says more (StorageClass: `local-path (default)`).
    fn printed_name(&self, obj: &Value) -> Value {
        obj["metadata"]["name"].clone()
    }

    /// The autoscaling/v1 Scale view of an object (kinds with a `scale` subresource):
    /// desired replicas, current replicas, and the pods' label selector as text.
    fn scale(&self, obj: &Value) -> (i64, i64, String) {
        let selector = crate::table::selector(&obj["spec"]["selector"]);
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

    /// What converts this resource's objects between versions out of process: custom
    /// resources whose definition converts by a webhook; the conversions above then
    /// only rewrite `apiVersion`.
    fn converter(&self) -> Option<&dyn Converter> {
        None
    }

    /// The schema server-side apply merges custom resources by (built-in kinds have
    /// theirs in `krust_apimachinery`).
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

pub fn decode<K: DeserializeOwned + Serialize>(v: Value) -> Result<(Value, Vec<String>), String> {
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

/// What a kind's REST storage does around the store beyond its strategy (upstream's
/// `BeginCreate`, `BeginUpdate` and `AfterDelete` hooks of a registry's REST): the Service
/// registry allocates IPs and ports, RBAC's refuses escalation. The `begin_` steps run
/// between mutating and validating admission, where upstream's store runs them.
#[async_trait::async_trait]
pub trait Storage: Send + Sync {
    async fn begin_create(&self, call: &Call<'_>, obj: &mut Value) -> Result<(), ApiError>;

    async fn begin_update(
        &self,
        call: &Call<'_>,
        new: &mut Value,
        old: &Value,
    ) -> Result<(), ApiError>;

    /// After `obj` left the store, or after a create that began was not stored: gives
    /// back what `begin_create` took.
    async fn release(&self, _call: &Call<'_>, _obj: &Value) {}
}

/// Codecs of the subresource and option kinds that are not resources themselves.
pub fn decode_scale(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<k8s_openapi::api::autoscaling::v1::Scale>(v)
}

pub fn decode_eviction(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<k8s_openapi::api::policy::v1::Eviction>(v)
}

pub fn decode_token_request(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<k8s_openapi::api::authentication::v1::TokenRequest>(v)
}

pub fn decode_delete_options(v: Value) -> Result<(Value, Vec<String>), String> {
    decode::<k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions>(v)
}

/// What a conversion out of process needs of the apiserver: its HTTPS client and the
/// cache that resolves a Service to an endpoint. Cheap to clone into a watch.
#[derive(Clone)]
pub struct Caller {
    pub client: Arc<crate::outbound::Client>,
    pub cache: Arc<crate::watch_cache::WatchCache>,
}

/// Converts a kind's objects between its versions out of process (upstream's webhook
/// converter, which a custom resource's definition may name).
#[async_trait::async_trait]
pub trait Converter: Send + Sync {
    /// `group/version` of the version objects are stored in.
    fn storage_version(&self) -> &str;

    /// `objects` in `desired` (`group/version`), in their order.
    async fn convert(
        &self,
        caller: &Caller,
        objects: Vec<Value>,
        desired: &str,
    ) -> Result<Vec<Value>, ApiError>;
}
