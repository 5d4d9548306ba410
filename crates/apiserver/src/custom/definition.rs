//! The CustomResourceDefinition kind itself: defaults, validation and the status fields
//! the apiserver maintains (upstream's `pkg/registry/customresourcedefinition` and
//! `pkg/apis/apiextensions/validation`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use krust_api::status::Cause;
use serde_json::{Value, json};

use crate::rest::strategy::Strategy;
use crate::validation::{NameRule, check_name, is_dns1123_label};

/// The finalizer that deletes a definition's objects before the definition goes.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

pub struct Definition;
pub static DEFINITION: Definition = Definition;

/// Whether a definition's Established condition is True: its kinds are served.
pub fn established(crd: &CustomResourceDefinition) -> bool {
    condition_true(crd, "Established")
}

pub fn condition_true(crd: &CustomResourceDefinition, ty: &str) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == ty && c.status == "True")
}

/// The storage version's name, if exactly one version is marked so.
fn storage_version(obj: &Value) -> Option<&str> {
    let versions = obj["spec"]["versions"].as_array()?;
    let mut storage = versions.iter().filter(|v| v["storage"] == json!(true));
    let one = storage.next()?;
    storage.next().is_none().then(|| one["name"].as_str())?
}

/// A condition as upstream words them.
pub fn condition(ty: &str, status: bool, reason: &str, message: &str) -> Value {
    json!({
        "type": ty,
        "status": if status { "True" } else { "False" },
        "lastTransitionTime": crate::rest::now(),
        "reason": reason,
        "message": message,
    })
}

/// Sets a condition, keeping its transition time when its status does not change.
pub fn set_condition(obj: &mut Value, new: Value) {
    if !obj["status"]["conditions"].is_array() {
        obj["status"]["conditions"] = json!([]);
    }
    let conditions = obj["status"]["conditions"]
        .as_array_mut()
        .expect("made an array above");
    match conditions.iter_mut().find(|c| c["type"] == new["type"]) {
        Some(old) if old["status"] == new["status"] => {
            old["reason"] = new["reason"].clone();
            old["message"] = new["message"].clone();
        }
        Some(old) => *old = new,
        None => conditions.push(new),
    }
}

impl Strategy for Definition {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Subdomain
    }

    /// A definition not yet marked for deletion holds the delete, which then adds the
    /// cleanup finalizer: its objects go first (upstream does this in the REST delete).
    fn holds_deletion(&self, obj: &Value) -> bool {
        obj["metadata"]["deletionTimestamp"].is_null()
    }

    fn prepare_for_delete(&self, obj: &mut Value) {
        let finalizers = &mut obj["metadata"]["finalizers"];
        if !finalizers.is_array() {
            *finalizers = json!([]);
        }
        let list = finalizers.as_array_mut().expect("made an array above");
        if !list.contains(&json!(CLEANUP_FINALIZER)) {
            list.push(json!(CLEANUP_FINALIZER));
        }
        set_condition(
            obj,
            condition(
                "Terminating",
                true,
                "InstanceDeletionPending",
                "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
            ),
        );
    }

    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        if spec["conversion"].is_null() {
            spec["conversion"] = json!({"strategy": "None"});
        }
        let names = &mut spec["names"];
        if let Some(kind) = names["kind"].as_str().map(str::to_string) {
            if names["singular"].as_str().is_none_or(str::is_empty) {
                names["singular"] = json!(kind.to_lowercase());
            }
            if names["listKind"].as_str().is_none_or(str::is_empty) {
                names["listKind"] = json!(format!("{kind}List"));
            }
        }
    }

    fn prepare_for_create(&self, obj: &mut Value) {
        let stored: Vec<&str> = storage_version(obj).into_iter().collect();
        obj["status"] = json!({
            "conditions": [],
            "acceptedNames": {"kind": "", "plural": ""},
            "storedVersions": stored,
        });
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_definition(obj, errs);
    }

    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        for field in ["group", "scope"] {
            let (a, b) = (&new["spec"][field], &old["spec"][field]);
            // Upstream lets the scope change only while no version has stored objects;
            // krust keeps both fixed, which is what every definition in practice does.
            if a != b {
                errs.push(Cause::invalid(
                    format!("spec.{field}"),
                    a,
                    "field is immutable",
                ));
            }
        }
        let stored: Vec<&str> = new["status"]["storedVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let versions: Vec<&str> = new["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for (i, s) in stored.iter().enumerate() {
            if !versions.contains(s) {
                errs.push(Cause::invalid(
                    format!("status.storedVersions[{i}]"),
                    &json!(s),
                    "must appear in spec.versions",
                ));
            }
        }
    }
}

fn validate_definition(obj: &Value, errs: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if name != format!("{plural}.{group}") {
        errs.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(Cause::required("spec.group"));
    } else if !group.contains('.') {
        errs.push(Cause::invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if !group.is_empty() {
        check_name(NameRule::Subdomain, "spec.group", group, errs);
    }
    // A definition may not take over a built-in resource or its storage: its objects
    // would be the built-in ones, and deleting it would delete them.
    let storage = format!("{group}/{plural}");
    if krust_api::registry::RESOURCES
        .iter()
        .any(|r| (r.group == group && r.plural == plural) || r.storage == storage)
    {
        errs.push(Cause::forbidden(
            "spec.names.plural",
            format!("{plural}.{group} is a built-in resource"),
        ));
    }
    if (group == "k8s.io"
        || group.ends_with(".k8s.io")
        || group == "kubernetes.io"
        || group.ends_with(".kubernetes.io"))
        && obj["metadata"]["annotations"]["api-approved.kubernetes.io"]
            .as_str()
            .is_none_or(str::is_empty)
    {
        errs.push(Cause::required_because(
            "metadata.annotations[api-approved.kubernetes.io]",
            "protected groups must have approval annotation \"api-approved.kubernetes.io\"",
        ));
    }
    match spec["scope"].as_str() {
        Some("Cluster" | "Namespaced") => {}
        _ => errs.push(Cause::not_supported(
            "spec.scope",
            &spec["scope"],
            &["Cluster", "Namespaced"],
        )),
    }
    validate_names(names, "spec.names", errs);
    validate_versions(spec, errs);
    validate_conversion(spec, errs);
}

/// `spec.conversion`, with upstream's (internal) field names in its messages.
fn validate_conversion(spec: &Value, errs: &mut Vec<Cause>) {
    let conversion = &spec["conversion"];
    let strategy = &conversion["strategy"];
    let client_config = &conversion["webhook"]["clientConfig"];
    let versions = &conversion["webhook"]["conversionReviewVersions"];
    const CONFIG: &str = "spec.conversion.webhookClientConfig";
    const VERSIONS: &str = "spec.conversion.conversionReviewVersions";
    match strategy.as_str() {
        Some("None") => {
            if !client_config.is_null() {
                errs.push(Cause::forbidden(
                    CONFIG,
                    "should not be set when strategy is not set to Webhook",
                ));
            }
            if !versions.is_null() {
                errs.push(Cause::forbidden(
                    VERSIONS,
                    "should not be set when strategy is not set to Webhook",
                ));
            }
            return;
        }
        Some("Webhook") => {}
        None | Some("") => {
            errs.push(Cause::required("spec.conversion.strategy"));
            return;
        }
        Some(_) => {
            errs.push(Cause::not_supported(
                "spec.conversion.strategy",
                strategy,
                &["None", "Webhook"],
            ));
            return;
        }
    }
    if spec["preserveUnknownFields"] == true {
        errs.push(Cause::invalid(
            "spec.conversion.strategy",
            strategy,
            "must be None if spec.preserveUnknownFields is true",
        ));
    }
    if client_config.is_null() {
        errs.push(Cause::required_because(
            CONFIG,
            "required when strategy is set to Webhook",
        ));
    } else {
        crate::kinds::admissionregistration::check_client_config(client_config, CONFIG, errs);
    }
    let list: Vec<&Value> = versions.as_array().into_iter().flatten().collect();
    if list.is_empty() {
        errs.push(Cause::required(VERSIONS));
        return;
    }
    for (i, v) in list.iter().enumerate() {
        if list[..i].contains(v) {
            errs.push(Cause::invalid(
                format!("{VERSIONS}[{i}]"),
                v,
                "duplicate version",
            ));
        }
    }
    if !list.iter().any(|v| *v == "v1" || *v == "v1beta1") {
        let shown: Vec<String> = list.iter().map(|v| v.to_string()).collect();
        errs.push(Cause {
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: []string{{{}}}: must include at least one of v1, v1beta1",
                shown.join(", ")
            ),
            field: VERSIONS.into(),
        });
    }
}

fn validate_names(names: &Value, path: &str, errs: &mut Vec<Cause>) {
    for field in ["plural", "singular"] {
        match names[field].as_str().unwrap_or_default() {
            "" if field == "plural" => errs.push(Cause::required(format!("{path}.{field}"))),
            "" => {}
            v => check_name(NameRule::Label, &format!("{path}.{field}"), v, errs),
        }
    }
    for (i, short) in names["shortNames"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let short = short.as_str().unwrap_or_default();
        check_name(
            NameRule::Label,
            &format!("{path}.shortNames[{i}]"),
            short,
            errs,
        );
    }
    for field in ["kind", "listKind"] {
        match names[field].as_str().unwrap_or_default() {
            "" if field == "kind" => errs.push(Cause::required(format!("{path}.{field}"))),
            "" => {}
            v if !v.chars().all(|c| c.is_ascii_alphanumeric())
                || !v.starts_with(|c: char| c.is_ascii_alphabetic()) =>
            {
                errs.push(Cause::invalid(
                    format!("{path}.{field}"),
                    &json!(v),
                    "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
                ))
            }
            _ => {}
        }
    }
    if names["kind"].is_string() && names["kind"] == names["listKind"] {
        errs.push(Cause::invalid(
            format!("{path}.listKind"),
            &names["listKind"],
            "kind and listKind may not be the same",
        ));
    }
}

fn validate_versions(spec: &Value, errs: &mut Vec<Cause>) {
    let Some(versions) = spec["versions"].as_array().filter(|v| !v.is_empty()) else {
        errs.push(Cause::invalid(
            "spec.versions",
            &json!(null),
            "must have exactly one version marked as storage version",
        ));
        return;
    };
    let storage = versions
        .iter()
        .filter(|v| v["storage"] == json!(true))
        .count();
    if storage != 1 {
        errs.push(Cause::invalid(
            "spec.versions",
            &Value::Array(versions.clone()),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions.iter().any(|v| v["served"] == json!(true)) {
        errs.push(Cause::invalid(
            "spec.versions",
            &Value::Array(versions.clone()),
            "must have at least one version marked as served",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        let path = format!("spec.versions[{i}]");
        let name = v["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            errs.push(Cause::required(format!("{path}.name")));
        } else if !is_dns1123_label(name) || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            errs.push(Cause::invalid(
                format!("{path}.name"),
                &json!(name),
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            ));
        }
        if versions[..i]
            .iter()
            .any(|earlier| earlier["name"] == v["name"])
        {
            errs.push(Cause::invalid(
                "spec.versions",
                &Value::Array(versions.clone()),
                "must contain unique version names",
            ));
        }
        let schema = &v["schema"]["openAPIV3Schema"];
        if schema.is_null() {
            errs.push(Cause::required_because(
                format!("{path}.schema.openAPIV3Schema"),
                "schemas are required",
            ));
            continue;
        }
        match serde_json::from_value::<JSONSchemaProps>(schema.clone()) {
            Ok(s) => {
                let path = format!("{path}.schema.openAPIV3Schema");
                validate_structural(&s, &path, true, errs);
                super::rules::compile_errors(&s, &path, errs);
            }
            Err(e) => errs.push(Cause::invalid(
                format!("{path}.schema.openAPIV3Schema"),
                &json!("..."),
                e.to_string(),
            )),
        }
        if let Some(columns) = v["additionalPrinterColumns"].as_array() {
            for (j, c) in columns.iter().enumerate() {
                let json_path = c["jsonPath"].as_str().unwrap_or_default();
                if super::columns::JsonPath::parse(json_path).is_err() {
                    errs.push(Cause::invalid(
                        format!("{path}.additionalPrinterColumns[{j}].jsonPath"),
                        &c["jsonPath"],
                        "must be a simple json path",
                    ));
                }
            }
        }
    }
}

/// Upstream's structural-schema rules that matter to pruning and defaulting: every
/// node says its type (unless it preserves unknown fields or is int-or-string), the root
/// is an object.
fn validate_structural(s: &JSONSchemaProps, path: &str, root: bool, errs: &mut Vec<Cause>) {
    let open = s.x_kubernetes_preserve_unknown_fields == Some(true)
        || s.x_kubernetes_int_or_string == Some(true);
    match s.type_.as_deref() {
        None | Some("") if root => errs.push(Cause::required_because(
            format!("{path}.type"),
            "must not be empty at the root",
        )),
        Some(t) if root && t != "object" => errs.push(Cause::invalid(
            format!("{path}.type"),
            &json!(t),
            "must be object at the root",
        )),
        None | Some("") if !open => errs.push(Cause::required_because(
            format!("{path}.type"),
            "must not be empty for specified object fields",
        )),
        _ => {}
    }
    for (k, p) in s.properties.iter().flatten() {
        validate_structural(p, &format!("{path}.properties[{k}]"), false, errs);
    }
    if let Some(
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(item),
    ) = &s.items
    {
        validate_structural(item, &format!("{path}.items"), false, errs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
            }
        })
    }

    fn problems(obj: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        DEFINITION.validate(obj, &mut errs);
        errs.iter().map(Cause::summary).collect()
    }

    #[test]
    fn a_good_definition_passes_and_gets_defaults() {
        let mut obj = crd();
        DEFINITION.default(&mut obj);
        assert_eq!(obj["spec"]["names"]["singular"], "widget");
        assert_eq!(obj["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(obj["spec"]["conversion"]["strategy"], "None");
        assert!(problems(&obj).is_empty(), "{:?}", problems(&obj));
        DEFINITION.prepare_for_create(&mut obj);
        assert_eq!(obj["status"]["storedVersions"], json!(["v1"]));
    }

    #[test]
    fn bad_definitions_say_why_as_upstream() {
        let mut obj = crd();
        DEFINITION.default(&mut obj);
        obj["metadata"]["name"] = json!("widgets");
        obj["spec"]["scope"] = json!("Global");
        obj["spec"]["versions"][0]["storage"] = json!(false);
        obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] =
            json!({"properties": {}});
        assert_eq!(
            problems(&obj),
            [
                "metadata.name: Invalid value: \"widgets\": must be spec.names.plural+\".\"+spec.group",
                "spec.scope: Unsupported value: \"Global\": supported values: \"Cluster\", \"Namespaced\"",
                format!(
                    "spec.versions: Invalid value: {}: must have exactly one version marked as storage version",
                    obj["spec"]["versions"]
                )
                .as_str(),
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
            ]
        );
        obj["spec"]["versions"][0]["schema"] = json!(null);
        assert!(problems(&obj).iter().any(|p| p
            == "spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required"));
    }

    #[test]
    fn built_in_resources_and_protected_groups_cannot_be_taken() {
        let mut obj = crd();
        DEFINITION.default(&mut obj);
        obj["metadata"]["name"] = json!("clusterrolebindings.rbac.authorization.k8s.io");
        obj["spec"]["group"] = json!("rbac.authorization.k8s.io");
        obj["spec"]["names"]["plural"] = json!("clusterrolebindings");
        obj["metadata"]["annotations"] = json!({"api-approved.kubernetes.io": "yes"});
        assert_eq!(
            problems(&obj),
            [
                "spec.names.plural: Forbidden: clusterrolebindings.rbac.authorization.k8s.io is a built-in resource"
            ]
        );
        obj["metadata"]["name"] = json!("widgets.rbac.authorization.k8s.io");
        obj["spec"]["names"]["plural"] = json!("widgets");
        obj["metadata"]["annotations"] = json!(null);
        assert_eq!(
            problems(&obj),
            [
                "metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation \"api-approved.kubernetes.io\""
            ]
        );
    }

    #[test]
    fn deleting_adds_the_cleanup_finalizer_and_terminating() {
        let mut obj = crd();
        assert!(DEFINITION.holds_deletion(&obj));
        DEFINITION.prepare_for_delete(&mut obj);
        assert_eq!(obj["metadata"]["finalizers"], json!([CLEANUP_FINALIZER]));
        assert_eq!(obj["status"]["conditions"][0]["type"], "Terminating");
        obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(!DEFINITION.holds_deletion(&obj));
    }
}
