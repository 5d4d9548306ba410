//! The resource metrics API's kinds (metrics.k8s.io/v1beta1 NodeMetrics and PodMetrics,
//! metrics-server's types), computed on read by `crate::resource_metrics`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// NodeMetrics (metrics.k8s.io/v1beta1).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeMetrics {
    pub metadata: ObjectMeta,
    pub timestamp: Option<Time>,
    pub window: String,
    pub usage: BTreeMap<String, Quantity>,
}

/// PodMetrics (metrics.k8s.io/v1beta1).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PodMetrics {
    pub metadata: ObjectMeta,
    pub timestamp: Option<Time>,
    pub window: String,
    pub containers: Vec<ContainerMetrics>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ContainerMetrics {
    pub name: String,
    pub usage: BTreeMap<String, Quantity>,
}

/// The schemas OpenAPI publishes (metrics-server's types, written out: schemars'
/// derive is not in the build).
fn usage_schema() -> Schema {
    json_schema!({"type": "object", "additionalProperties": {"type": "string"}})
}

impl JsonSchema for NodeMetrics {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NodeMetrics".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let meta = g.subschema_for::<ObjectMeta>();
        json_schema!({"type": "object", "properties": {
            "metadata": meta, "timestamp": {"type": "string", "format": "date-time"},
            "window": {"type": "string"}, "usage": usage_schema()}})
    }
}

impl JsonSchema for PodMetrics {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PodMetrics".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let meta = g.subschema_for::<ObjectMeta>();
        json_schema!({"type": "object", "properties": {
            "metadata": meta, "timestamp": {"type": "string", "format": "date-time"},
            "window": {"type": "string"},
            "containers": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "usage": usage_schema()}}}}})
    }
}
