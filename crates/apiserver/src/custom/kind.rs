//! One served version of a CustomResourceDefinition as a [`Kind`]: its registry entry,
//! its codec (pruning by the schema) and its strategy (defaults, validation, status,
//! scale, printer columns, selectable fields, conversion between versions).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionVersion,
    CustomResourceSubresourceScale, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use krust_api::registry::{ResourceInfo, Subresource};
use krust_api::status::Cause;
use krust_apimachinery::apply::CustomSchema;
use serde_json::{Value, json};

use super::columns::JsonPath;
use super::conversion::Webhook;
use super::rules::Rules;
use super::schema;
use crate::rest::strategy::Converter;
use crate::rest::strategy::{Decoder, Kind, Schema, Strategy};
use crate::table::{self, Column};

/// The versions a definition serves, its storage version first (whose storage prefix
/// and field indexer the watch cache uses).
pub fn served_versions(crd: &CustomResourceDefinition) -> Vec<&CustomResourceDefinitionVersion> {
    let mut versions: Vec<&CustomResourceDefinitionVersion> =
        crd.spec.versions.iter().filter(|v| v.served).collect();
    versions.sort_by_key(|v| !v.storage);
    versions
}

/// What makes two versions' kinds the same: the names the definition was accepted
/// with, its scope, the storage version, its conversion, and the version itself.
pub fn identity(
    crd: &CustomResourceDefinition,
    version: &CustomResourceDefinitionVersion,
) -> String {
    json!({
        "group": crd.spec.group,
        "names": crd.status.as_ref().and_then(|s| s.accepted_names.as_ref()),
        "scope": crd.spec.scope,
        "storage": storage_version(crd),
        "conversion": crd.spec.conversion,
        "versions": crd.spec.versions.len(),
        "version": version,
    })
    .to_string()
}

pub fn storage_version(crd: &CustomResourceDefinition) -> &str {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map_or("", |v| v.name.as_str())
}

/// Makes a string live as long as the kind that names it (see [`super::CustomKinds`]).
fn leak(s: impl Into<String>) -> &'static str {
    Box::leak(s.into().into_boxed_str())
}

/// The kind of one served version.
pub fn build(
    crd: &CustomResourceDefinition,
    version: &CustomResourceDefinitionVersion,
) -> &'static Kind {
    let spec = &crd.spec;
    // Served names are the accepted ones (the definition is Established, so they exist).
    let names = crd
        .status
        .as_ref()
        .and_then(|s| s.accepted_names.as_ref())
        .unwrap_or(&spec.names);
    let group = spec.group.as_str();
    let mut subresources = Vec::new();
    let subs = version.subresources.as_ref();
    if subs.is_some_and(|s| s.status.is_some()) {
        subresources.push(Subresource::Status);
    }
    if subs.is_some_and(|s| s.scale.is_some()) {
        subresources.push(Subresource::Scale);
    }
    let strings = |list: &Option<Vec<String>>| -> &'static [&'static str] {
        let v: Vec<&'static str> = list.iter().flatten().map(|s| leak(s.as_str())).collect();
        Box::leak(v.into_boxed_slice())
    };
    let info: &'static ResourceInfo = Box::leak(Box::new(ResourceInfo {
        group: leak(group),
        version: leak(version.name.as_str()),
        kind: leak(names.kind.as_str()),
        plural: leak(names.plural.as_str()),
        singular: leak(
            names
                .singular
                .clone()
                .unwrap_or_else(|| names.kind.to_lowercase()),
        ),
        short_names: strings(&names.short_names),
        categories: strings(&names.categories),
        namespaced: spec.scope == "Namespaced",
        subresources: Box::leak(subresources.into_boxed_slice()),
        storage: leak(format!("{group}/{}", names.plural)),
    }));
    let api_version = format!("{group}/{}", version.name);
    let schema_of = |v: &CustomResourceDefinitionVersion| {
        v.schema.as_ref().and_then(|s| s.open_api_v3_schema.clone())
    };
    let conversion = Webhook::of(crd);
    // Defaulting, validation and the scale subresource see objects in storage form.
    // Converted by a webhook, that is another shape than this version's: they are
    // checked by the storage version's schema (upstream checks the request's version
    // before converting; see docs/status.md). Otherwise only apiVersion differs, and
    // this version's schema is upstream's choice.
    let checked_version = match conversion {
        Some(_) => crd
            .spec
            .versions
            .iter()
            .find(|v| v.storage)
            .unwrap_or(version),
        None => version,
    };
    let checked = schema_of(checked_version);
    let checked_scale = checked_version
        .subresources
        .as_ref()
        .and_then(|s| s.scale.clone());
    let strategy: &'static CustomStrategy = Box::leak(Box::new(CustomStrategy {
        rules: checked.as_ref().and_then(Rules::new),
        checked,
        schema: schema_of(version),
        storage_api_version: format!("{group}/{}", storage_version(crd)),
        api_version,
        columns: columns(version.additional_printer_columns.as_deref()),
        selectable: version
            .selectable_fields
            .iter()
            .flatten()
            .filter_map(|f| {
                let path = JsonPath::parse(&f.json_path).ok()?;
                Some((leak(f.json_path.trim_start_matches('.').to_string()), path))
            })
            .collect(),
        scale: checked_scale.map(ScalePaths::new),
        conversion,
        apply_schema: version
            .schema
            .as_ref()
            .and_then(|s| serde_json::to_value(&s.open_api_v3_schema).ok())
            .filter(|s| !s.is_null())
            .map(|s| CustomSchema::leak(&s)),
    }));
    let decode: Decoder = Box::leak(Box::new(move |v| strategy.decode(v)));
    Box::leak(Box::new(Kind {
        info,
        decode,
        strategy,
        schema: Schema::Custom {
            schema: openapi_schema(version, info),
            name: schema_name(info),
        },
        converts: crd.spec.versions.len() > 1,
    }))
}

/// Upstream's definition name of a custom kind: the group reversed, the version, the
/// kind (`com.example.stable.v1.CronTab`).
fn schema_name(info: &ResourceInfo) -> String {
    let mut parts: Vec<&str> = info.group.split('.').collect();
    parts.reverse();
    format!("{}.{}.{}", parts.join("."), info.version, info.kind)
}

/// The whole object's OpenAPI schema: the version's, with the fields every object has.
fn openapi_schema(version: &CustomResourceDefinitionVersion, info: &ResourceInfo) -> Value {
    let mut schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    let props = &mut schema["properties"];
    if !props.is_object() {
        *props = json!({});
    }
    props["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
    props["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
    props["metadata"] =
        json!({"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"});
    schema["x-kubernetes-group-version-kind"] =
        json!([{"group": info.group, "kind": info.kind, "version": info.version}]);
    schema
}

/// The printer columns of a version; upstream's AGE when it names none.
fn columns(defs: Option<&[CustomResourceColumnDefinition]>) -> &'static [Column] {
    let Some(defs) = defs.filter(|d| !d.is_empty()) else {
        return table::AGE_ONLY;
    };
    let columns: Vec<Column> = defs
        .iter()
        .filter_map(|d| {
            let path = JsonPath::parse(&d.json_path).ok()?;
            let ty: &'static str = leak(d.type_.as_str());
            let cell: Box<dyn Fn(&Value) -> Value + Send + Sync> =
                Box::new(move |obj| cell(ty, &path.find(obj)));
            Some(Column {
                name: leak(d.name.as_str()),
                ty,
                priority: d.priority.unwrap_or(0),
                description: leak(d.description.clone().unwrap_or_default()),
                cell: Box::leak(cell),
            })
        })
        .collect();
    Box::leak(columns.into_boxed_slice())
}

/// A column's cell from the values its path found, as upstream's table convertor: dates
/// as ages, several values joined by commas, nothing as an empty cell.
fn cell(ty: &str, found: &[&Value]) -> Value {
    match found {
        [] => Value::Null,
        [one] if ty == "date" => json!(table::age(one)),
        [one] => (*one).clone(),
        many => json!(
            many.iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// Where a version's scale subresource reads and writes.
struct ScalePaths {
    spec_replicas: Vec<String>,
    status_replicas: JsonPath,
    selector: Option<JsonPath>,
}

impl ScalePaths {
    fn new(s: CustomResourceSubresourceScale) -> Self {
        let fields = |p: &str| -> Vec<String> {
            p.trim_start_matches('.')
                .split('.')
                .map(str::to_string)
                .collect()
        };
        ScalePaths {
            spec_replicas: fields(&s.spec_replicas_path),
            status_replicas: JsonPath::parse(&s.status_replicas_path)
                .unwrap_or_else(|_| JsonPath::parse(".status.replicas").expect("a valid path")),
            selector: s
                .label_selector_path
                .as_deref()
                .and_then(|p| JsonPath::parse(p).ok()),
        }
    }
}

struct CustomStrategy {
    /// This version's schema: what a request's body is pruned by.
    schema: Option<JSONSchemaProps>,
    /// The schema objects in storage form are defaulted and validated by (see `build`),
    /// and its CEL validation rules, compiled.
    checked: Option<JSONSchemaProps>,
    rules: Option<Rules>,
    /// `group/version` of the served version, and of the one objects are stored in.
    api_version: String,
    storage_api_version: String,
    columns: &'static [Column],
    selectable: Vec<(&'static str, JsonPath)>,
    scale: Option<ScalePaths>,
    conversion: Option<Webhook>,
    /// The schema as server-side apply reads it.
    apply_schema: Option<&'static CustomSchema>,
}

impl CustomStrategy {
    /// Decodes an object: metadata as every object's, the rest pruned to the schema.
    fn decode(&self, mut v: Value) -> Result<(Value, Vec<String>), String> {
        let Some(obj) = v.as_object_mut() else {
            return Err("the object is not a JSON object".into());
        };
        let mut unknown = Vec::new();
        if let Some(meta) = obj.remove("metadata") {
            let (meta, extra) = crate::rest::strategy::decode::<ObjectMeta>(meta)?;
            unknown.extend(extra.into_iter().map(|f| format!("metadata.{f}")));
            obj.insert("metadata".into(), meta);
        }
        if let Some(s) = &self.schema {
            // Upstream reports pruned fields sorted, after metadata's.
            let mut pruned = Vec::new();
            schema::prune(s, &mut v, "", &mut pruned);
            pruned.sort();
            unknown.extend(pruned);
        }
        Ok((v, unknown))
    }
}

/// Whether the schema found a value of the wrong type: rules would then see types they
/// were not written for, and upstream does not run them.
fn blocked(errs: &[Cause]) -> bool {
    errs.iter().any(|e| e.reason == "FieldValueTypeInvalid")
}

impl Strategy for CustomStrategy {
    fn tracks_generation(&self) -> bool {
        true
    }

    /// Transition rules (those naming `oldSelf`) against the old object.
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        if let (Some(s), Some(rules)) = (&self.checked, &self.rules)
            && !blocked(errs)
        {
            rules.check(s, new, Some(old), "", errs);
        }
    }

    fn default(&self, obj: &mut Value) {
        if let Some(s) = &self.checked {
            schema::default(s, obj);
        }
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        if let Some(s) = &self.checked {
            schema::validate(s, obj, "", errs);
            if let Some(rules) = &self.rules {
                if blocked(errs) {
                    errs.push(Cause::invalid(
                        super::rules::shown(""),
                        &Value::Null,
                        "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
                    ));
                } else {
                    rules.check(s, obj, None, "", errs);
                }
            }
        }
        if let Some(scale) = &self.scale {
            let replicas = scale.spec_replicas.iter().fold(obj, |v, f| &v[f.as_str()]);
            if replicas.as_i64().is_some_and(|r| r < 0) {
                errs.push(Cause::invalid(
                    scale.spec_replicas.join("."),
                    replicas,
                    "should be greater than or equal to 0",
                ));
            }
        }
    }

    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        self.selectable
            .iter()
            .map(|(name, path)| {
                let value = path.find(obj).first().map_or_else(String::new, |v| {
                    v.as_str().map_or_else(|| v.to_string(), str::to_string)
                });
                (*name, value)
            })
            .collect()
    }

    fn columns(&self) -> &'static [Column] {
        self.columns
    }

    fn scale(&self, obj: &Value) -> (i64, i64, String) {
        let Some(paths) = &self.scale else {
            return (0, 0, String::new());
        };
        let spec = paths
            .spec_replicas
            .iter()
            .fold(obj, |v, f| &v[f.as_str()])
            .as_i64()
            .unwrap_or(0);
        let status = paths
            .status_replicas
            .find(obj)
            .first()
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        let selector = paths
            .selector
            .as_ref()
            .and_then(|p| {
                p.find(obj)
                    .first()
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        (spec, status, selector)
    }

    fn set_replicas(&self, obj: &mut Value, replicas: i64) {
        let Some(paths) = &self.scale else {
            return;
        };
        let mut target = obj;
        for f in &paths.spec_replicas {
            if !target[f.as_str()].is_object() && f != paths.spec_replicas.last().expect("a path") {
                target[f.as_str()] = json!({});
            }
            target = &mut target[f.as_str()];
        }
        *target = json!(replicas);
    }

    fn to_storage(&self, mut obj: Value) -> Value {
        obj["apiVersion"] = json!(self.storage_api_version);
        obj
    }

    fn to_served(&self, mut obj: Value) -> Value {
        obj["apiVersion"] = json!(self.api_version);
        obj
    }

    fn converter(&self) -> Option<&dyn Converter> {
        self.conversion.as_ref().map(|w| w as &dyn Converter)
    }

    fn apply_schema(&self) -> Option<&'static CustomSchema> {
        self.apply_schema
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition() -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}, "size": {"type": "string"}}},
                        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "selector": {"type": "string"}}}}}},
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}},
                     "additionalPrinterColumns": [{"name": "Size", "type": "string", "jsonPath": ".spec.size"}],
                     "selectableFields": [{"jsonPath": ".spec.size"}]}
                ]
            },
            "status": {"acceptedNames": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]}}
        }))
        .unwrap()
    }

    #[test]
    fn versions_become_kinds_with_the_storage_version_first() {
        let crd = definition();
        let versions = served_versions(&crd);
        assert_eq!(versions[0].name, "v1");
        let v1 = build(&crd, versions[0]);
        assert_eq!(v1.info.storage_prefix(), "/registry/example.com/widgets/");
        assert_eq!(v1.info.short_names, ["wd"]);
        assert!(v1.has_status() && v1.info.has_subresource(Subresource::Scale));
        assert!(v1.converts);
        let beta = build(&crd, versions[1]);
        assert!(!beta.has_status());
        let stored = beta
            .strategy
            .to_storage(json!({"apiVersion": "example.com/v1beta1"}));
        assert_eq!(stored["apiVersion"], "example.com/v1");
        assert_eq!(
            beta.strategy.to_served(stored)["apiVersion"],
            "example.com/v1beta1"
        );
        assert_ne!(identity(&crd, versions[0]), identity(&crd, versions[1]));
    }

    #[test]
    fn the_strategy_prunes_scales_selects_and_prints() {
        let crd = definition();
        let v1 = build(&crd, served_versions(&crd)[0]);
        let (obj, unknown) = (v1.decode)(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "a", "bogus": true},
            "spec": {"replicas": 2, "size": "L", "color": "red"},
            "status": {"replicas": 1, "selector": "app=a"}
        }))
        .unwrap();
        assert_eq!(unknown, ["metadata.bogus", "spec.color"]);
        assert_eq!(v1.strategy.scale(&obj), (2, 1, "app=a".to_string()));
        let mut scaled = obj.clone();
        v1.strategy.set_replicas(&mut scaled, 5);
        assert_eq!(scaled["spec"]["replicas"], 5);
        assert_eq!(v1.strategy.fields(&obj), [("spec.size", "L".to_string())]);
        let columns = v1.strategy.columns();
        assert_eq!(columns[0].name, "Size");
        assert_eq!((columns[0].cell)(&obj), json!("L"));
        let mut errs = Vec::new();
        v1.strategy
            .validate(&json!({"spec": {"replicas": -1}}), &mut errs);
        assert_eq!(errs[0].field, "spec.replicas");
    }
}
