//! The OpenAPI v2 (Swagger 2.0) document served at `/openapi/v2`, as JSON and as the
//! gnostic `openapi_v2.Document` protobuf (google/gnostic-models, `openapiv2/OpenAPIv2.proto`)
//! that kubectl 1.27 and older fetch. kubectl uses it to learn that PATCH accepts
//! `fieldValidation` (so it leaves validation to the server), for `kubectl explain`, and for
//! strategic-merge-patch metadata.
//!
//! The document is converted from the v3 documents of [`crate::openapi`], so both versions
//! describe the same schemas, paths and extensions. All group versions are merged into one
//! document, as upstream serves v2. [`gnostic`] holds the protobuf messages (prost's
//! derive) and fills them from the JSON, so both forms carry the same data.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::openapi;

mod gnostic;

/// The Content-Type of the protobuf response, as upstream's kube-openapi handler sends it.
/// Clients may also ask for it by its older name, `...spec.v2@v1.0+protobuf` (kubectl 1.27
/// does), but that name is not a valid media type: client-go fails to parse a response
/// labelled with it ("mime: unexpected content after media subtype"), so the reply always
/// carries this one.
pub const PROTOBUF_CONTENT_TYPE: &str =
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// Accept media ranges answered with protobuf.
const PROTOBUF_ACCEPTED: [&str; 2] = [
    PROTOBUF_CONTENT_TYPE,
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
];

const GVK: &str = "x-kubernetes-group-version-kind";

struct Documents {
    json: Bytes,
    protobuf: Bytes,
}

fn documents() -> &'static Documents {
    static DOCS: OnceLock<Documents> = OnceLock::new();
    DOCS.get_or_init(|| {
        let doc = build();
        Documents {
            json: Bytes::from(
                serde_json::to_vec(&doc).expect("a serde_json::Value always serializes"),
            ),
            protobuf: Bytes::from(gnostic::encode(&doc)),
        }
    })
}

/// The Swagger 2.0 document as JSON.
pub fn document_json() -> &'static Bytes {
    &documents().json
}

/// The same document as a gnostic `openapi_v2.Document` protobuf.
pub fn document_protobuf() -> &'static Bytes {
    &documents().protobuf
}

/// The body and Content-Type for a `GET /openapi/v2` with this Accept header: protobuf when
/// any listed media range names the protobuf form (by either name), JSON otherwise.
pub fn negotiate(accept: Option<&str>) -> (Bytes, &'static str) {
    let wants_protobuf = accept.is_some_and(|a| {
        a.split(',').any(|range| {
            let media_type = range.split(';').next().unwrap_or_default().trim();
            PROTOBUF_ACCEPTED.contains(&media_type)
        })
    });
    if wants_protobuf {
        (document_protobuf().clone(), PROTOBUF_CONTENT_TYPE)
    } else {
        (document_json().clone(), "application/json")
    }
}

// ---------------------------------------------------------------------------------------
// v3 → v2 conversion
// ---------------------------------------------------------------------------------------

fn build() -> Value {
    let mut paths = Map::new();
    let mut definitions = BTreeMap::new();
    let root = openapi::root(&[]);
    let group_versions = root["paths"]
        .as_object()
        .expect("the v3 root lists its documents under paths");
    for gv in group_versions.keys() {
        let body = openapi::document(gv, &[]).expect("the v3 root lists only served documents");
        let v3: Value = serde_json::from_slice(&body).expect("v3 documents are JSON");
        if let Some(schemas) = v3["components"]["schemas"].as_object() {
            for (name, schema) in schemas {
                if let Value::Object(schema) = schema {
                    merge_definition(&mut definitions, name, schema_v2(schema));
                }
            }
        }
        if let Some(v3_paths) = v3["paths"].as_object() {
            for (path, item) in v3_paths {
                if let Value::Object(item) = item {
                    paths.insert(path.clone(), path_item_v2(path, item));
                }
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": crate::KUBE_VERSION},
        "paths": paths,
        "definitions": definitions,
    })
}

/// Group versions share definitions (`ObjectMeta`, `PodSpec`, ...), but a kind's definition
/// carries its GVK only in its own group version's document, so a repeated definition
/// contributes any GVKs the first copy lacked.
fn merge_definition(defs: &mut BTreeMap<String, Value>, name: &str, schema: Map<String, Value>) {
    match defs.entry(name.to_string()) {
        Entry::Vacant(e) => {
            e.insert(Value::Object(schema));
        }
        Entry::Occupied(mut e) => {
            let (Some(Value::Array(gvks)), Value::Object(existing)) =
                (schema.get(GVK), e.get_mut())
            else {
                return;
            };
            if let Value::Array(list) = existing.entry(GVK).or_insert_with(|| json!([])) {
                for gvk in gvks {
                    if !list.contains(gvk) {
                        list.push(gvk.clone());
                    }
                }
            }
        }
    }
}

/// A v3 schema in v2 form: `$ref`s point into `definitions`, an `allOf` of a single schema
/// (how v3 gives a `$ref` a description) is folded into its parent, int-or-string becomes
/// upstream's `type: string, format: int-or-string`, and keys v2 lacks (`nullable`, `oneOf`,
/// `anyOf`, `not`, ...) are dropped.
fn schema_v2(schema: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in schema {
        match (key.as_str(), value) {
            ("$ref", Value::String(r)) => {
                let name = r.strip_prefix("#/components/schemas/").unwrap_or(r);
                out.insert(key.clone(), json!(format!("#/definitions/{name}")));
            }
            ("allOf", Value::Array(all)) => {
                let all: Vec<Map<String, Value>> = all
                    .iter()
                    .filter_map(Value::as_object)
                    .map(schema_v2)
                    .collect();
                match <[_; 1]>::try_from(all) {
                    Ok([only]) => {
                        for (k, v) in only {
                            out.entry(k).or_insert(v);
                        }
                    }
                    Err(all) => {
                        out.insert(key.clone(), json!(all));
                    }
                }
            }
            ("properties", Value::Object(props)) => {
                let props: Map<String, Value> = props
                    .iter()
                    .filter_map(|(k, v)| {
                        Some((k.clone(), Value::Object(schema_v2(v.as_object()?))))
                    })
                    .collect();
                out.insert(key.clone(), Value::Object(props));
            }
            ("items" | "additionalProperties", Value::Object(sub)) => {
                out.insert(key.clone(), Value::Object(schema_v2(sub)));
            }
            ("items", Value::Array(subs)) => {
                let subs: Vec<Value> = subs
                    .iter()
                    .filter_map(|s| Some(Value::Object(schema_v2(s.as_object()?))))
                    .collect();
                out.insert(key.clone(), Value::Array(subs));
            }
            ("additionalProperties", Value::Bool(_)) | ("type", _) => {
                out.insert(key.clone(), value.clone());
            }
            ("x-kubernetes-int-or-string", Value::Bool(true)) if !schema.contains_key("type") => {
                out.insert("type".into(), json!("string"));
                out.insert("format".into(), json!("int-or-string"));
            }
            (k, _) if k.starts_with("x-") || gnostic::SCHEMA_KEYS.contains(&k) => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    out
}

/// A v3 path item in v2 form. v2 requires every `{param}` of the path template to be
/// declared, so path parameters are added at the path-item level.
fn path_item_v2(path: &str, item: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    for (method, op) in item {
        if let (true, Value::Object(op)) =
            (gnostic::PATH_ITEM_METHODS.contains(&method.as_str()), op)
        {
            out.insert(method.clone(), operation_v2(op));
        }
    }
    let path_params: Vec<Value> = path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            json!({"name": name, "in": "path", "required": true, "type": "string", "uniqueItems": true})
        })
        .collect();
    if !path_params.is_empty() {
        out.insert("parameters".into(), Value::Array(path_params));
    }
    Value::Object(out)
}

fn operation_v2(op: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    let mut params: Vec<Value> = Vec::new();
    let mut produces: Vec<&str> = Vec::new();
    for (key, value) in op {
        match key.as_str() {
            "parameters" => params.extend(
                value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object)
                    .map(parameter_v2),
            ),
            // v2 has one body parameter and lists the accepted media types on the operation.
            "requestBody" => {
                let content = value["content"].as_object();
                let consumes: Vec<&String> = content.into_iter().flat_map(Map::keys).collect();
                let schema = content
                    .and_then(|c| c.values().next())
                    .and_then(|media| media["schema"].as_object())
                    .map(schema_v2)
                    .unwrap_or_default();
                out.insert("consumes".into(), json!(consumes));
                params.push(
                    json!({"name": "body", "in": "body", "required": true, "schema": schema}),
                );
            }
            "responses" => {
                let mut responses = Map::new();
                for (code, response) in value.as_object().into_iter().flatten() {
                    let mut r = Map::new();
                    if let Some(d) = response.get("description") {
                        r.insert("description".into(), d.clone());
                    }
                    let content = response["content"].as_object();
                    for (media, body) in content.into_iter().flatten() {
                        if !produces.contains(&media.as_str()) {
                            produces.push(media);
                        }
                        if let (false, Some(schema)) =
                            (r.contains_key("schema"), body["schema"].as_object())
                        {
                            r.insert("schema".into(), Value::Object(schema_v2(schema)));
                        }
                    }
                    responses.insert(code.clone(), Value::Object(r));
                }
                out.insert(key.clone(), Value::Object(responses));
            }
            k if k.starts_with("x-") || gnostic::OPERATION_KEYS.contains(&k) => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    if !produces.is_empty() {
        out.insert("produces".into(), json!(produces));
    }
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    Value::Object(out)
}

/// A v3 non-body parameter in v2 form: the `schema` keywords move onto the parameter.
fn parameter_v2(param: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    let schema = param.get("schema").and_then(Value::as_object);
    for (key, value) in param.iter().chain(schema.into_iter().flatten()) {
        if key.starts_with("x-") || gnostic::NON_BODY_KEYS.contains(&key.as_str()) {
            out.insert(key.clone(), value.clone());
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protobuf wire-format reader, independent of the encoder above: a message is a list
    /// of (field number, value) pairs. The document has no 32-bit fields, and its 64-bit
    /// ones (doubles) are not inspected.
    enum Wire<'a> {
        Varint(u64),
        Fixed64,
        Bytes(&'a [u8]),
    }

    fn decode(mut buf: &[u8]) -> Vec<(u32, Wire<'_>)> {
        fn varint(buf: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let (&b, rest) = buf.split_first().expect("truncated varint");
                *buf = rest;
                v |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    return v;
                }
            }
            panic!("varint too long")
        }
        let mut out = Vec::new();
        while !buf.is_empty() {
            let key = varint(&mut buf);
            let field = u32::try_from(key >> 3).unwrap();
            let value = match key & 7 {
                0 => Wire::Varint(varint(&mut buf)),
                1 => {
                    buf = &buf[8..];
                    Wire::Fixed64
                }
                2 => {
                    let len = usize::try_from(varint(&mut buf)).unwrap();
                    let (b, rest) = buf.split_at(len);
                    buf = rest;
                    Wire::Bytes(b)
                }
                t => panic!("unexpected wire type {t}"),
            };
            out.push((field, value));
        }
        out
    }

    fn all(buf: &[u8], field: u32) -> Vec<&[u8]> {
        decode(buf)
            .into_iter()
            .filter_map(|(f, v)| match (f == field, v) {
                (true, Wire::Bytes(b)) => Some(b),
                _ => None,
            })
            .collect()
    }

    fn one(buf: &[u8], field: u32) -> &[u8] {
        let found = all(buf, field);
        assert_eq!(found.len(), 1, "field {field}");
        found[0]
    }

    fn string(buf: &[u8], field: u32) -> &str {
        std::str::from_utf8(one(buf, field)).unwrap()
    }

    /// The value of the `Named*` entry (name 1, value 2) called `name` among `field`.
    fn entry<'a>(buf: &'a [u8], field: u32, name: &str) -> &'a [u8] {
        all(buf, field)
            .into_iter()
            .find(|e| string(e, 1) == name)
            .map(|e| one(e, 2))
            .unwrap_or_else(|| panic!("no entry {name}"))
    }

    /// A vendor extension's value, YAML-decoded (our YAML is JSON).
    fn extension(buf: &[u8], field: u32, name: &str) -> Value {
        let any = entry(buf, field, name);
        serde_json::from_str(string(any, 2)).unwrap()
    }

    #[test]
    fn protobuf_document_has_gvks_patch_metadata_and_field_validation() {
        let doc = document_protobuf();
        assert_eq!(string(doc, 1), "2.0");

        let defs = one(doc, 9);
        let deploy = entry(defs, 1, "io.k8s.api.apps.v1.Deployment");
        assert_eq!(
            extension(deploy, 31, GVK),
            json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
        );
        assert_eq!(string(one(deploy, 22), 1), "object");
        let metadata = entry(one(deploy, 25), 1, "metadata");
        assert_eq!(
            string(metadata, 1),
            "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert!(all(metadata, 24).is_empty(), "allOf folded into the $ref");

        let pod_spec = entry(defs, 1, "io.k8s.api.core.v1.PodSpec");
        let containers = entry(one(pod_spec, 25), 1, "containers");
        assert_eq!(
            extension(containers, 31, "x-kubernetes-patch-merge-key"),
            "name"
        );
        assert_eq!(
            extension(containers, 31, "x-kubernetes-patch-strategy"),
            "merge"
        );
        assert_eq!(
            string(one(one(containers, 23), 1), 1),
            "#/definitions/io.k8s.api.core.v1.Container"
        );

        let paths = one(doc, 8);
        let item = entry(
            paths,
            2,
            "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        );
        let patch = one(item, 8);
        assert_eq!(
            extension(patch, 13, GVK),
            json!({"group": "apps", "version": "v1", "kind": "Deployment"})
        );
        assert_eq!(extension(patch, 13, "x-kubernetes-action"), "patch");
        // ParametersItem.parameter → Parameter.non_body_parameter → query sub-schema.
        let queries: Vec<&[u8]> = all(patch, 8)
            .into_iter()
            .flat_map(|item| all(one(item, 1), 2))
            .flat_map(|non_body| all(non_body, 3))
            .collect();
        let field_validation = queries
            .iter()
            .find(|q| string(q, 4) == "fieldValidation")
            .expect("PATCH takes fieldValidation");
        assert_eq!(string(field_validation, 2), "query");
        assert_eq!(string(field_validation, 6), "string");
        // Path parameters sit on the path item, in PathParameterSubSchema (oneof field 4).
        let path_params: Vec<&str> = all(item, 9)
            .into_iter()
            .map(|item| string(one(one(one(item, 1), 2), 4), 4))
            .collect();
        assert_eq!(path_params, ["namespace", "name"]);
        let required = decode(one(one(one(all(item, 9)[0], 1), 2), 4))
            .into_iter()
            .any(|(f, v)| f == 1 && matches!(v, Wire::Varint(1)));
        assert!(required);
    }

    /// kubectl parses every definition with kube-openapi's `proto.NewOpenAPIData`, which
    /// rejects `$ref`s outside `#/definitions/` or to missing definitions, a `$ref` with a
    /// type or properties, and arrays without a single `items` schema.
    #[test]
    fn json_document_is_swagger_2_that_kubectl_can_parse() {
        let doc: Value = serde_json::from_slice(document_json()).unwrap();
        assert_eq!(doc["swagger"], "2.0");
        let defs = doc["definitions"].as_object().unwrap();
        fn check(s: &Value, defs: &Map<String, Value>, at: &str) {
            let Some(s) = s.as_object() else { return };
            if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                let name = r.strip_prefix("#/definitions/").expect(at);
                assert!(defs.contains_key(name), "{at}: dangling {r}");
                assert!(
                    !s.contains_key("type") && !s.contains_key("properties"),
                    "{at}"
                );
            }
            for key in [
                "allOf",
                "anyOf",
                "oneOf",
                "nullable",
                "x-kubernetes-int-or-string",
            ] {
                assert!(!s.contains_key(key), "{at}: {key}");
            }
            if s.get("type") == Some(&json!("array")) {
                assert!(s["items"].is_object(), "{at}: array without items");
            }
            for (name, p) in s
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                check(p, defs, &format!("{at}.{name}"));
            }
            check(&s.get("items").cloned().unwrap_or_default(), defs, at);
            check(
                &s.get("additionalProperties").cloned().unwrap_or_default(),
                defs,
                at,
            );
        }
        for (name, s) in defs {
            check(s, defs, name);
        }
        assert_eq!(
            defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["format"],
            "int-or-string"
        );
        let put = &doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["put"];
        let body = put["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["in"] == "body")
            .unwrap();
        assert_eq!(
            body["schema"]["$ref"],
            "#/definitions/io.k8s.api.core.v1.ConfigMap"
        );
        assert_eq!(
            put["responses"]["200"]["schema"]["$ref"],
            "#/definitions/io.k8s.api.core.v1.ConfigMap"
        );
        assert_eq!(put["consumes"], json!(["application/json"]));
        assert!(!String::from_utf8_lossy(document_json()).contains("#/components/"));
    }

    #[test]
    fn merged_definitions_keep_every_gvk() {
        let mut defs = BTreeMap::new();
        let plain = json!({"type": "object"});
        let with = json!({"type": "object", GVK: [{"group": "", "kind": "A", "version": "v1"}]});
        merge_definition(&mut defs, "A", plain.as_object().unwrap().clone());
        merge_definition(&mut defs, "A", with.as_object().unwrap().clone());
        merge_definition(&mut defs, "A", with.as_object().unwrap().clone());
        assert_eq!(defs["A"], with);
    }

    #[test]
    fn negotiation_follows_the_accept_header() {
        // What kubectl 1.27 sends.
        let (body, ct) = negotiate(Some(
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        ));
        assert_eq!(
            (body, ct),
            (document_protobuf().clone(), PROTOBUF_CONTENT_TYPE)
        );
        let (_, ct) = negotiate(Some(&format!(
            "application/json;q=0.9, {PROTOBUF_CONTENT_TYPE}"
        )));
        assert_eq!(ct, PROTOBUF_CONTENT_TYPE);
        let (body, ct) = negotiate(Some("application/json"));
        assert_eq!((body, ct), (document_json().clone(), "application/json"));
        assert_eq!(negotiate(None).1, "application/json");
    }
}
