//! ValidatingAdmissionPolicy: CEL validations run in the apiserver instead of a
//! webhook, as upstream's plugin (which runs before the validating webhooks). Each
//! ValidatingAdmissionPolicyBinding applies its policy where both match — the policy's
//! `matchConstraints` and the binding's `matchResources` (rules, namespaceSelector,
//! objectSelector, excluded rules) — and the policy's `matchConditions` hold; then the
//! policy's `variables` are computed in order and its `validations` run over `object`,
//! `oldObject`, `request`, `params` (the binding's `paramRef`: an object by name,
//! or every one a selector picks, each checked) and `variables`. A failed validation
//! does what the binding's `validationActions` say: Deny refuses the request
//! (`ValidatingAdmissionPolicy 'p' with binding 'b' denied request: <message>`, with the
//! validation's reason, Invalid by default), Warn adds a warning; Audit is recorded in
//! the log only. An expression that cannot be evaluated is a failure decided by the
//! policy's failurePolicy.

use std::collections::HashMap;

use cel::objects::Map as CelMap;
use cel::{Context, Value as Cel};
use krust_api::selector::LabelSelector;
use krust_api::status::ApiError;
use serde_json::{Value, json};

use super::rules::{self, Attributes};
use crate::cel::{env, run, to_cel};
use crate::rest::Call;

pub const POLICIES: &str = "/registry/validatingadmissionpolicies/";
pub const BINDINGS: &str = "/registry/validatingadmissionpolicybindings/";

/// What one validation of a policy concluded.
enum Verdict {
    Pass,
    /// The message and the reason of a validation that did not hold, and its index.
    Fail(String, String, usize),
    /// An expression that could not be evaluated, with why.
    Error(String),
    /// An audit annotation's key and (non-empty) value.
    Annotate(String, String),
}

/// The audit annotation that records validations failed under the Audit action.
const VALIDATION_FAILURE: &str = "validation.policy.admission.k8s.io/validation_failure";

/// The rules and selectors of a policy's `matchConstraints` or a binding's
/// `matchResources`, in a webhook's shape for [`rules::applies`].
fn matches(resources: &Value, a: &Attributes<'_>) -> bool {
    let as_hook = |rules: &Value| {
        json!({"rules": rules, "namespaceSelector": resources["namespaceSelector"],
            "objectSelector": resources["objectSelector"]})
    };
    // A binding's matchResources may name no rules: then every resource it selects.
    let every = json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
        "resources": ["*", "*/*"]}]);
    let rules = match &resources["resourceRules"] {
        Value::Array(r) if !r.is_empty() => &resources["resourceRules"],
        _ => &every,
    };
    let included = rules::applies(&as_hook(rules), a);
    let excluded = resources["excludeResourceRules"]
        .as_array()
        .is_some_and(|r| !r.is_empty())
        && rules::applies(&as_hook(&resources["excludeResourceRules"]), a);
    included && !excluded
}

/// The parameter objects a binding gives its policy: `None` when the policy takes none;
/// an error (upstream's) when its paramKind names no served kind.
fn params(call: &Call<'_>, policy: &Value, binding: &Value) -> Result<Option<Vec<Value>>, String> {
    let kind = &policy["spec"]["paramKind"];
    let (Some(api_version), Some(kind)) = (kind["apiVersion"].as_str(), kind["kind"].as_str())
    else {
        return Ok(None);
    };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    // A built-in kind, or (as usually) a custom one made for the policy's parameters.
    let info = krust_api::registry::find_kind(group, version, kind)
        .or_else(|| Some(call.api.cache.custom.find_kind(group, version, kind)?.info))
        .ok_or_else(|| {
            format!(
                "failed to configure policy: failed to find resource referenced by paramKind: '{api_version}, Kind={kind}'"
            )
        })?;
    let reference = &binding["spec"]["paramRef"];
    let namespace = reference["namespace"]
        .as_str()
        .or_else(|| call.namespace().filter(|_| info.namespaced));
    if let Some(name) = reference["name"].as_str() {
        return Ok(Some(
            call.api
                .cache
                .object(info, namespace, name)
                .into_iter()
                .collect(),
        ));
    }
    let Ok(selector) = LabelSelector::from_label_selector_json(&reference["selector"]) else {
        return Ok(Some(Vec::new()));
    };
    let Some(cache) = call.api.cache.cache(&info.storage_prefix()) else {
        return Ok(Some(Vec::new()));
    };
    let prefix = match namespace {
        Some(ns) if info.namespaced => info.storage_prefix_in(Some(ns)),
        _ => info.storage_prefix(),
    };
    Ok(Some(
        cache
            .list(&prefix)
            .0
            .iter()
            .filter(|o| selector.matches(&o.labels))
            .map(|o| o.value())
            .collect(),
    ))
}

/// Runs one policy's validations with `params`, then its audit annotations.
fn evaluate(policy: &Value, base: &Context<'_, '_>, params: &Value) -> Vec<Verdict> {
    let env = env();
    let mut context = base.new_inner_scope();
    context.add_variable_from_value("params", to_cel(None, params, false));
    // Variables in order, each seeing those before it.
    let mut variables: HashMap<String, Cel> = HashMap::new();
    let mut verdicts = Vec::new();
    for variable in policy["spec"]["variables"].as_array().into_iter().flatten() {
        let name = variable["name"].as_str().unwrap_or_default().to_string();
        let expression = variable["expression"].as_str().unwrap_or_default();
        context.add_variable_from_value("variables", Cel::Map(CelMap::from(variables.clone())));
        match run(&env, expression, &context) {
            Ok(value) => {
                variables.insert(name, value);
            }
            Err(e) => verdicts.push(Verdict::Error(format!(
                "variable '{name}' could not be computed: {e}"
            ))),
        }
    }
    context.add_variable_from_value("variables", Cel::Map(CelMap::from(variables)));
    for (index, validation) in policy["spec"]["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let expression = validation["expression"].as_str().unwrap_or_default();
        let outcome = run(&env, expression, &context);
        verdicts.push(match outcome {
            Ok(Cel::Bool(true)) => Verdict::Pass,
            Ok(Cel::Bool(false)) => {
                let message = validation["messageExpression"]
                    .as_str()
                    .and_then(|m| match env.compile(m).ok()?.execute(&context) {
                        Ok(Cel::String(text)) if !text.trim().is_empty() => Some(text.to_string()),
                        _ => None,
                    })
                    .or_else(|| validation["message"].as_str().map(String::from))
                    .unwrap_or_else(|| format!("failed expression: {}", expression.trim()));
                let reason = validation["reason"]
                    .as_str()
                    .unwrap_or("Invalid")
                    .to_string();
                Verdict::Fail(message, reason, index)
            }
            Ok(other) => Verdict::Error(format!(
                "expression '{expression}' resulted in a non-bool value: {other:?}"
            )),
            Err(e) => Verdict::Error(format!("expression '{expression}' resulted in error: {e}")),
        });
    }
    // A string is the annotation's value; null or "" leaves it out.
    for annotation in policy["spec"]["auditAnnotations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = annotation["key"].as_str().unwrap_or_default();
        let expression = annotation["valueExpression"].as_str().unwrap_or_default();
        let outcome = run(&env, expression, &context);
        match outcome {
            Ok(Cel::String(value)) if !value.is_empty() => {
                verdicts.push(Verdict::Annotate(key.to_string(), value.to_string()));
            }
            Ok(Cel::String(_) | Cel::Null) => {}
            Ok(other) => verdicts.push(Verdict::Error(format!(
                "valueExpression '{expression}' resulted in unsupported return type: {other:?}"
            ))),
            Err(e) => verdicts.push(Verdict::Error(format!(
                "valueExpression '{expression}' resulted in error: {e}"
            ))),
        }
    }
    verdicts
}

/// The error a Deny gives, with the validation's reason.
fn refusal(reason: &str, message: String) -> ApiError {
    match reason {
        "Forbidden" => ApiError::forbidden(message),
        "Unauthorized" => ApiError::new(401, "Unauthorized", message),
        "RequestEntityTooLarge" => ApiError::too_large(message),
        _ => ApiError::new(422, "Invalid", message),
    }
}

/// Whether any policy is bound (else nothing here needs the request's objects).
pub fn bound(call: &Call<'_>) -> bool {
    call.api
        .cache
        .cache(BINDINGS)
        .is_some_and(|c| !c.list(BINDINGS).0.is_empty())
}

/// Applies every bound policy to the request; the first Deny refuses it. Failures under
/// the Audit action and the policies' audit annotations go on the request's audit
/// events, refused or not.
pub fn validate(call: &Call<'_>, a: &Attributes<'_>, request: &Value) -> Result<(), ApiError> {
    let mut audited = Vec::new();
    let outcome = apply(call, a, request, &mut audited);
    if !audited.is_empty() {
        call.audit
            .add(VALIDATION_FAILURE, Value::Array(audited).to_string());
    }
    outcome
}

fn apply(
    call: &Call<'_>,
    a: &Attributes<'_>,
    request: &Value,
    audited: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let (Some(policies), Some(bindings)) = (
        call.api.cache.cache(POLICIES),
        call.api.cache.cache(BINDINGS),
    ) else {
        return Ok(());
    };
    let (bindings, _) = bindings.list(BINDINGS);
    if bindings.is_empty() {
        return Ok(());
    }
    let null = Value::Null;
    let mut base = Context::with_env(env());
    base.add_variable_from_value("object", to_cel(None, a.object.unwrap_or(&null), false));
    base.add_variable_from_value(
        "oldObject",
        to_cel(None, a.old_object.unwrap_or(&null), false),
    );
    base.add_variable_from_value("request", to_cel(None, request, false));
    // The first Deny in binding order, answered once every binding has run.
    let mut denial = None;
    for binding in bindings.iter().map(|b| b.value()) {
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let policy_name = binding["spec"]["policyName"].as_str().unwrap_or_default();
        let Some(policy) = policies
            .get(&format!("{POLICIES}{policy_name}"))
            .map(|p| p.value())
        else {
            continue;
        };
        let spec = &policy["spec"];
        let binding_resources = &binding["spec"]["matchResources"];
        if !matches(&spec["matchConstraints"], a)
            || (binding_resources.is_object() && !matches(binding_resources, a))
        {
            continue;
        }
        let fails_open = spec["failurePolicy"] == "Ignore";
        let prefix = format!("ValidatingAdmissionPolicy '{policy_name}' with binding '{name}'");
        let as_conditions = json!({"matchConditions": spec["matchConditions"]});
        match super::conditions::hold(&as_conditions, a.object, a.old_object, request) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) if fails_open => continue,
            Err(e) => return Err(ApiError::forbidden(format!("{prefix} denied request: {e}"))),
        }
        let actions: Vec<&str> = binding["spec"]["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let all_params = match params(call, &policy, &binding) {
            Ok(None) => vec![Value::Null],
            Err(_) if fails_open => continue,
            Err(e) => return Err(ApiError::forbidden(format!("{prefix} denied request: {e}"))),
            Ok(Some(found)) if found.is_empty() => {
                if binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow" {
                    continue;
                }
                return Err(ApiError::forbidden(format!(
                    "{prefix} denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"
                )));
            }
            Ok(Some(found)) => found,
        };
        for params in &all_params {
            for verdict in evaluate(&policy, &base, params) {
                let (message, reason, index) = match verdict {
                    Verdict::Pass => continue,
                    Verdict::Annotate(key, value) => {
                        call.audit.add(format!("{policy_name}/{key}"), value);
                        continue;
                    }
                    Verdict::Error(_) if fails_open => continue,
                    Verdict::Error(e) => (e, "Invalid".to_string(), None),
                    Verdict::Fail(message, reason, index) => (message, reason, Some(index)),
                };
                if actions.contains(&"Warn") {
                    call.warnings
                        .add(format!("Validation failed for {prefix}: {message}"));
                }
                if actions.contains(&"Audit") {
                    let mut failure = json!({"message": message, "policy": policy_name,
                        "binding": name, "validationActions": actions});
                    if let Some(index) = index {
                        failure["expressionIndex"] = json!(index);
                    }
                    audited.push(failure);
                }
                if actions.contains(&"Deny") {
                    // The others still run, for their warnings and audit records.
                    denial.get_or_insert_with(|| {
                        refusal(&reason, format!("{prefix} denied request: {message}"))
                    });
                }
            }
        }
    }
    denial.map_or(Ok(()), Err)
}
