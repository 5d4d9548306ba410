//! OpenAPI v3 documents (`/openapi/v3` and one per group version), generated from the
//! k8s-openapi types' JSON schemas plus the patch metadata of `krust_apimachinery::patch`. kubectl
//! uses them for `explain`, to learn that the server validates fields itself
//! (`fieldValidation` on PATCH operations), and to compute `apply` patches.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use krust_api::registry::{self, ResourceInfo};
use krust_api::sync::Unpoisoned;
use krust_apimachinery::patch::TypeRef;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

struct Documents {
    /// `api/v1` or `apis/<group>/<version>` → (document, content hash).
    by_path: BTreeMap<String, (Bytes, String)>,
}

/// One document with the hash clients cache it by.
fn hashed(doc: &Value) -> (Bytes, String) {
    let bytes = serde_json::to_vec(doc).unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    (Bytes::from(bytes), format!("{:016X}", h.finish()))
}

/// The built-in group versions' documents, made once.
fn documents() -> &'static Documents {
    static DOCS: OnceLock<Documents> = OnceLock::new();
    DOCS.get_or_init(|| {
        let mut by_path = BTreeMap::new();
        for (group, versions) in registry::groups() {
            for version in versions {
                let kinds: Vec<&'static crate::rest::Kind> = crate::built_in_kinds()
                    .filter(|k| k.info.group == group && k.info.version == version)
                    .collect();
                let doc = group_version_document(&kinds);
                by_path.insert(gv_path(group, version), hashed(&doc));
            }
        }
        Documents { by_path }
    })
}

/// The documents of the custom kinds served now. Definitions change, so they are made
/// again whenever the set of kinds differs from the last one's (custom kinds are
/// interned: the same definition is the same kind, so their addresses identify it);
/// operators' schemas run to megabytes, which kubectl asks for on every `apply`.
fn custom_documents(custom: &[&'static crate::rest::Kind]) -> Arc<Documents> {
    type Cached = Option<(Vec<usize>, Arc<Documents>)>;
    static LAST: Mutex<Cached> = Mutex::new(None);
    let key: Vec<usize> = custom
        .iter()
        .map(|k| std::ptr::from_ref::<crate::rest::Kind>(k) as usize)
        .collect();
    if let Some((last, docs)) = &*LAST.locked()
        && *last == key
    {
        return docs.clone();
    }
    let docs = Arc::new(build_custom_documents(custom));
    *LAST.locked() = Some((key, docs.clone()));
    docs
}

fn build_custom_documents(custom: &[&'static crate::rest::Kind]) -> Documents {
    let mut by_gv: BTreeMap<String, Vec<&'static crate::rest::Kind>> = BTreeMap::new();
    for k in custom {
        by_gv
            .entry(gv_path(k.info.group, k.info.version))
            .or_default()
            .push(k);
    }
    let by_path = by_gv
        .into_iter()
        .map(|(path, kinds)| (path, hashed(&group_version_document(&kinds))))
        .collect();
    Documents { by_path }
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group version's document is.
pub fn root(custom: &[&'static crate::rest::Kind]) -> Value {
    let custom = custom_documents(custom);
    let paths: Map<String, Value> = documents()
        .by_path
        .iter()
        .chain(custom.by_path.iter())
        .map(|(path, (_, hash))| {
            (
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
            )
        })
        .collect();
    json!({"paths": paths})
}

/// `/openapi/v3/<path>`: one group version's document.
pub fn document(path: &str, custom: &[&'static crate::rest::Kind]) -> Option<Bytes> {
    if let Some((b, _)) = documents().by_path.get(path) {
        return Some(b.clone());
    }
    custom_documents(custom)
        .by_path
        .get(path)
        .map(|(b, _)| b.clone())
}

/// The document of one group version's kinds.
fn group_version_document(resources: &[&'static crate::rest::Kind]) -> Value {
    let mut generator = SchemaSettings::openapi3()
        .with(|s| s.meta_schema = None)
        .into_generator();
    let mut custom = Vec::new();
    for k in resources {
        match &k.schema {
            crate::rest::strategy::Schema::Typed { add, .. } => {
                add(&mut generator);
            }
            crate::rest::strategy::Schema::Custom { schema, name } => {
                generator
                    .subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>();
                custom.push((name.clone(), schema.clone()));
            }
        }
    }
    let mut schemas = generator.take_definitions(true);
    for k in resources {
        if let crate::rest::strategy::Schema::Typed { name, .. } = &k.schema
            && let Some(Value::Object(schema)) = schemas.get_mut(&name())
        {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": k.info.group, "kind": k.info.kind, "version": k.info.version}]),
            );
        }
    }
    for (name, schema) in schemas.iter_mut() {
        add_patch_extensions(name, schema);
    }
    schemas.extend(custom);
    let mut paths = Map::new();
    for k in resources {
        let (name, strategic) = match &k.schema {
            crate::rest::strategy::Schema::Typed { name, .. } => (name(), true),
            // Custom resources take no strategic merge patches (kubectl then sends merge
            // patches, as it does to upstream).
            crate::rest::strategy::Schema::Custom { name, .. } => (name.clone(), false),
        };
        add_paths(&mut paths, k.info, &name, strategic);
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": crate::KUBE_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// Marks each property with its `x-kubernetes-patch-strategy` / `-merge-key`.
fn add_patch_extensions(name: &str, schema: &mut Value) {
    let Some(ty) = TypeRef::named(name) else {
        return;
    };
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for field in ty.fields() {
        let Some(prop) = props.get_mut(field.name).and_then(Value::as_object_mut) else {
            continue;
        };
        if let Some(strategy) = field.strategy.extension() {
            prop.insert("x-kubernetes-patch-strategy".into(), json!(strategy));
        }
        if let Some(key) = field.merge_key {
            prop.insert("x-kubernetes-patch-merge-key".into(), json!(key));
        }
    }
}

fn param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params(patch: bool) -> Vec<Value> {
    let mut p = vec![
        param(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
        ),
        param(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        param(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict",
        ),
    ];
    if patch {
        p.push(json!({"name": "force", "in": "query", "description": "Force is going to \"force\" Apply requests.", "schema": {"type": "boolean", "uniqueItems": true}}));
    }
    p
}

fn add_paths(paths: &mut Map<String, Value>, r: &ResourceInfo, schema_name: &str, strategic: bool) {
    let prefix = format!("/{}", gv_path(r.group, r.version));
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let reference = json!({"$ref": format!("#/components/schemas/{schema_name}")});
    let body = json!({"content": {"application/json": {"schema": reference}}});
    let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
    let op = |action: &str, id: &str, params: Vec<Value>| {
        let mut o = json!({
            "operationId": format!("{action}{}", id),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "responses": ok,
        });
        if !params.is_empty() {
            o["parameters"] = Value::Array(params);
        }
        o
    };
    let ns_part = if r.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    let collection = format!("{prefix}{ns_part}/{}", r.plural);
    let mut create = op("post", r.kind, write_params(false));
    create["requestBody"] = body.clone();
    paths.insert(collection.clone(), json!({"get": op("list", r.kind, vec![]), "post": create, "delete": op("deletecollection", r.kind, vec![])}));
    let item = format!("{collection}/{{name}}");
    let mut put = op("put", r.kind, write_params(false));
    put["requestBody"] = body.clone();
    let mut patch = op("patch", r.kind, write_params(true));
    let mut patch_types = json!({
        "application/json-patch+json": {"schema": {"type": "object"}},
        "application/merge-patch+json": {"schema": {"type": "object"}},
        "application/apply-patch+yaml": {"schema": {"type": "object"}},
    });
    if strategic {
        patch_types["application/strategic-merge-patch+json"] =
            json!({"schema": {"type": "object"}});
    }
    patch["requestBody"] = json!({"content": patch_types});
    paths.insert(item.clone(), json!({"get": op("get", r.kind, vec![]), "put": put, "patch": patch, "delete": op("delete", r.kind, vec![])}));
    if r.has_subresource(registry::Subresource::Status) {
        let mut put = op("put", &format!("{}Status", r.kind), write_params(false));
        put["requestBody"] = body;
        paths.insert(format!("{item}/status"), json!({"get": op("get", &format!("{}Status", r.kind), vec![]), "put": put, "patch": op("patch", &format!("{}Status", r.kind), write_params(true))}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_carry_gvk_patch_metadata_and_field_validation() {
        let root = root(&[]);
        let url = root["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="));
        let doc: Value = serde_json::from_slice(&document("apis/apps/v1", &[]).unwrap()).unwrap();
        let deploy = &doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            deploy["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
        let spec =
            &doc["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(spec["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(spec["x-kubernetes-patch-strategy"], "merge");
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "Deployment"
        );
    }
}
