//! Strategy of admissionregistration.k8s.io: Mutating- and ValidatingWebhookConfiguration
//! — upstream's defaults and checks, WEBHOOKS and AGE columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::{NameRule, check_name, each_mut};

pub struct WebhookConfiguration {
    mutating: bool,
}
pub static MUTATING_WEBHOOK_CONFIGURATION: WebhookConfiguration =
    WebhookConfiguration { mutating: true };
pub static VALIDATING_WEBHOOK_CONFIGURATION: WebhookConfiguration =
    WebhookConfiguration { mutating: false };

const OPERATIONS: &[&str] = &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];

fn set_missing(obj: &mut Value, field: &str, value: Value) {
    if obj[field].is_null() {
        obj[field] = value;
    }
}

impl Strategy for WebhookConfiguration {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn default(&self, obj: &mut Value) {
        for hook in each_mut(obj, "/webhooks") {
            set_missing(hook, "failurePolicy", json!("Fail"));
            set_missing(hook, "matchPolicy", json!("Equivalent"));
            set_missing(hook, "namespaceSelector", json!({}));
            set_missing(hook, "objectSelector", json!({}));
            set_missing(hook, "timeoutSeconds", json!(10));
            if self.mutating {
                set_missing(hook, "reinvocationPolicy", json!("Never"));
            }
            if hook["clientConfig"]["service"].is_object() {
                set_missing(&mut hook["clientConfig"]["service"], "port", json!(443));
            }
            for rule in each_mut(hook, "/rules") {
                set_missing(rule, "scope", json!("*"));
            }
        }
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let hooks = obj["webhooks"].as_array().cloned().unwrap_or_default();
        for (i, hook) in hooks.iter().enumerate() {
            validate_webhook(hook, &format!("webhooks[{i}]"), self.mutating, errs);
            if hooks[..i].iter().any(|h| h["name"] == hook["name"]) {
                errs.push(Cause::duplicate(
                    format!("webhooks[{i}].name"),
                    &hook["name"],
                ));
            }
        }
    }

    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Webhooks",
                ty: "integer",
                priority: 0,
                description: "Webhooks indicates the number of webhooks in this configuration.",
                cell: &|o| json!(o["webhooks"].as_array().map_or(0, Vec::len)),
            },
            AGE,
        ];
        C
    }
}

fn validate_webhook(hook: &Value, path: &str, mutating: bool, errs: &mut Vec<Cause>) {
    let name = hook["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        errs.push(Cause::required(format!("{path}.name")));
    } else {
        check_name(NameRule::Subdomain, &format!("{path}.name"), name, errs);
        if name.split('.').count() < 3 {
            errs.push(Cause::invalid(
                format!("{path}.name"),
                &hook["name"],
                "should be a domain with at least three segments separated by dots",
            ));
        }
    }
    let versions: Vec<&str> = hook["admissionReviewVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !versions.iter().any(|v| *v == "v1" || *v == "v1beta1") {
        errs.push(Cause::required_because(
            format!("{path}.admissionReviewVersions"),
            "must specify one of v1, v1beta1",
        ));
    }
    match hook["sideEffects"].as_str() {
        None => errs.push(Cause::required(format!("{path}.sideEffects"))),
        Some("None" | "NoneOnDryRun") => {}
        Some(_) => errs.push(Cause::not_supported(
            format!("{path}.sideEffects"),
            &hook["sideEffects"],
            &["None", "NoneOnDryRun"],
        )),
    }
    let one_of = |field: &str, allowed: &[&str], errs: &mut Vec<Cause>| {
        if let Some(v) = hook[field].as_str()
            && !allowed.contains(&v)
        {
            errs.push(Cause::not_supported(
                format!("{path}.{field}"),
                &hook[field],
                allowed,
            ));
        }
    };
    one_of("failurePolicy", &["Fail", "Ignore"], errs);
    one_of("matchPolicy", &["Equivalent", "Exact"], errs);
    if mutating {
        one_of("reinvocationPolicy", &["IfNeeded", "Never"], errs);
    }
    if let Some(t) = hook["timeoutSeconds"].as_i64()
        && !(1..=30).contains(&t)
    {
        errs.push(Cause::invalid(
            format!("{path}.timeoutSeconds"),
            &hook["timeoutSeconds"],
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    crate::webhook::validate_match_conditions(
        &hook["matchConditions"],
        &format!("{path}.matchConditions"),
        errs,
    );
    check_client_config(&hook["clientConfig"], &format!("{path}.clientConfig"), errs);
    for (j, rule) in hook["rules"].as_array().into_iter().flatten().enumerate() {
        for (k, op) in rule["operations"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !op.as_str().is_some_and(|o| OPERATIONS.contains(&o)) {
                errs.push(Cause::not_supported(
                    format!("{path}.rules[{j}].operations[{k}]"),
                    op,
                    OPERATIONS,
                ));
            }
        }
        if let Some(scope) = rule["scope"].as_str()
            && !["*", "Cluster", "Namespaced"].contains(&scope)
        {
            errs.push(Cause::not_supported(
                format!("{path}.rules[{j}].scope"),
                &rule["scope"],
                &["*", "Cluster", "Namespaced"],
            ));
        }
    }
}

/// Where a webhook is called (`url`, or a `service`), checked as upstream checks
/// admission and conversion webhooks' client configurations at `path`.
pub fn check_client_config(config: &Value, path: &str, errs: &mut Vec<Cause>) {
    const FORM: &str = "; desired format: https://host[/path]";
    match (config["url"].as_str(), config["service"].is_object()) {
        (Some(_), true) | (None, false) => errs.push(Cause::required_because(
            path,
            "exactly one of url or service is required",
        )),
        (Some(url), false) => {
            let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
            let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
            let url_path = format!("{path}.url");
            if scheme != "https" {
                errs.push(Cause::invalid(
                    &url_path,
                    &json!(scheme),
                    format!("'https' is the only allowed URL scheme{FORM}"),
                ));
            }
            if host.is_empty() {
                errs.push(Cause::invalid(
                    &url_path,
                    &json!(host),
                    format!("host must be specified{FORM}"),
                ));
            }
            if host.contains('@') {
                errs.push(Cause::invalid(
                    &url_path,
                    &json!(host.split('@').next()),
                    "user information is not permitted in the URL",
                ));
            }
            if let Some((_, fragment)) = rest.split_once('#') {
                errs.push(Cause::invalid(
                    &url_path,
                    &json!(fragment),
                    "fragments are not permitted in the URL",
                ));
            }
            if let Some((_, query)) = rest.split_once('?') {
                let query = query.split('#').next().unwrap_or_default();
                errs.push(Cause::invalid(
                    &url_path,
                    &json!(query),
                    "query parameters are not permitted in the URL",
                ));
            }
        }
        (None, true) => {
            for field in ["namespace", "name"] {
                if config["service"][field].as_str().is_none_or(str::is_empty) {
                    errs.push(Cause::required(format!("{path}.service.{field}")));
                }
            }
            if let Some(p) = config["service"]["path"].as_str()
                && !p.starts_with('/')
            {
                errs.push(Cause::invalid(
                    format!("{path}.service.path"),
                    &json!(p),
                    "must start with a '/'",
                ));
            }
        }
    }
}

/// ValidatingAdmissionPolicy: upstream's defaults (failurePolicy Fail, match policy
/// Equivalent, empty selectors) and checks (something to validate, expressions that
/// compile, unique variable names).
pub struct AdmissionPolicy;
pub static VALIDATING_ADMISSION_POLICY: AdmissionPolicy = AdmissionPolicy;

impl Strategy for AdmissionPolicy {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        set_missing(spec, "failurePolicy", json!("Fail"));
        let constraints = &mut spec["matchConstraints"];
        if constraints.is_object() {
            set_missing(constraints, "matchPolicy", json!("Equivalent"));
            set_missing(constraints, "namespaceSelector", json!({}));
            set_missing(constraints, "objectSelector", json!({}));
            for rule in each_mut(constraints, "/resourceRules") {
                set_missing(rule, "scope", json!("*"));
            }
        }
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        let empty = |field: &str| spec[field].as_array().is_none_or(Vec::is_empty);
        if empty("validations") && empty("auditAnnotations") {
            errs.push(Cause::required_because(
                "spec.validations",
                "validations or auditAnnotations must contain at least one item",
            ));
        }
        if spec["matchConstraints"]["resourceRules"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            errs.push(Cause::required("spec.matchConstraints.resourceRules"));
        }
        if let Some(p) = spec["failurePolicy"].as_str()
            && !["Fail", "Ignore"].contains(&p)
        {
            errs.push(Cause::not_supported(
                "spec.failurePolicy",
                &spec["failurePolicy"],
                &["Fail", "Ignore"],
            ));
        }
        crate::webhook::validate_match_conditions(
            &spec["matchConditions"],
            "spec.matchConditions",
            errs,
        );
        let mut names = Vec::new();
        for (field, key) in [("variables", "expression"), ("validations", "expression")] {
            for (i, item) in spec[field].as_array().into_iter().flatten().enumerate() {
                let at = format!("spec.{field}[{i}]");
                if field == "variables" {
                    match item["name"].as_str().filter(|n| !n.is_empty()) {
                        None => errs.push(Cause::required(format!("{at}.name"))),
                        Some(n) if names.contains(&n) => {
                            errs.push(Cause::duplicate(format!("{at}.name"), &item["name"]));
                        }
                        Some(n) => names.push(n),
                    }
                }
                crate::webhook::check_expression(&item[key], &format!("{at}.{key}"), errs);
                if let Some(m) = item["messageExpression"].as_str() {
                    crate::webhook::check_expression(
                        &json!(m),
                        &format!("{at}.messageExpression"),
                        errs,
                    );
                }
            }
        }
    }
}

/// ValidatingAdmissionPolicyBinding: a policy, and at least one known action (Deny
/// and Warn not together).
pub struct AdmissionPolicyBinding;
pub static VALIDATING_ADMISSION_POLICY_BINDING: AdmissionPolicyBinding = AdmissionPolicyBinding;

impl Strategy for AdmissionPolicyBinding {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn default(&self, obj: &mut Value) {
        let reference = &mut obj["spec"]["paramRef"];
        if reference.is_object() {
            set_missing(reference, "parameterNotFoundAction", json!("Deny"));
        }
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        if spec["policyName"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required("spec.policyName"));
        }
        let actions: Vec<&str> = spec["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if actions.is_empty() {
            errs.push(Cause::required("spec.validationActions"));
        }
        for (i, action) in actions.iter().enumerate() {
            if !["Deny", "Warn", "Audit"].contains(action) {
                errs.push(Cause::not_supported(
                    format!("spec.validationActions[{i}]"),
                    &json!(action),
                    &["Audit", "Deny", "Warn"],
                ));
            }
        }
        if actions.contains(&"Deny") && actions.contains(&"Warn") {
            errs.push(Cause::invalid(
                "spec.validationActions",
                &spec["validationActions"],
                "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(obj: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        VALIDATING_WEBHOOK_CONFIGURATION.validate(obj, &mut errs);
        errs.iter().map(Cause::summary).collect()
    }

    #[test]
    fn webhooks_get_upstream_defaults_and_checks() {
        let mut obj = json!({"webhooks": [{
            "name": "pods.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "x", "name": "hook"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
        }]});
        MUTATING_WEBHOOK_CONFIGURATION.default(&mut obj);
        let hook = &obj["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["timeoutSeconds"], 10);
        assert_eq!(hook["reinvocationPolicy"], "Never");
        assert_eq!(hook["clientConfig"]["service"]["port"], 443);
        assert_eq!(hook["rules"][0]["scope"], "*");
        assert!(problems(&obj).is_empty(), "{:?}", problems(&obj));

        let bad = json!({"webhooks": [
            {"name": "short.name", "sideEffects": "Some", "admissionReviewVersions": ["v2"],
             "clientConfig": {"url": "http://example.com/"}, "timeoutSeconds": 60},
            {"name": "short.name", "sideEffects": "None", "admissionReviewVersions": ["v1"],
             "clientConfig": {}}
        ]});
        assert_eq!(
            problems(&bad),
            [
                "webhooks[0].name: Invalid value: \"short.name\": should be a domain with at least three segments separated by dots",
                "webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1",
                "webhooks[0].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
                "webhooks[0].timeoutSeconds: Invalid value: 60: the timeout value must be between 1 and 30 seconds",
                "webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]",
                "webhooks[1].name: Invalid value: \"short.name\": should be a domain with at least three segments separated by dots",
                "webhooks[1].clientConfig: Required value: exactly one of url or service is required",
                "webhooks[1].name: Duplicate value: \"short.name\"",
            ]
        );
    }
}
