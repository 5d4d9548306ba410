//! Walking an OpenAPI v3 schema as CustomResourceDefinitions carry it (upstream's
//! structural schema): what CEL, pruning, defaulting and validation all need.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};

/// The schema of a list's items, if it has one.
pub fn items(s: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match s.items.as_ref()? {
        JSONSchemaPropsOrArray::Schema(one) => Some(one),
        JSONSchemaPropsOrArray::Schemas(many) => many.first(),
    }
}

/// The schema of a map's values, if its values are typed.
pub fn additional(s: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match s.additional_properties.as_ref()? {
        JSONSchemaPropsOrBool::Schema(one) => Some(one),
        JSONSchemaPropsOrBool::Bool(_) => None,
    }
}

/// The path of the field `key` under `path` (`spec.replicas`).
pub fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}
