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

use super::rules::Attributes;
use super::{Operation, Versions};
use crate::cel::{env, run, to_cel};
use crate::rest::Call;
use crate::rest::Kind;

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

/// The version in which a policy's `matchConstraints` or a binding's `matchResources`
/// select the request, if they do (upstream's matcher): excluded rules first; no rules
/// select every resource, in the request's version; under `matchPolicy: Equivalent`
/// (the default) the rules may name another version of the resource, as a webhook's.
fn matched_as(
    resources: &Value,
    kinds: &[&'static Kind],
    a: &mut Attributes<'_>,
) -> Option<&'static Kind> {
    let as_hook = |rules: &Value| {
        json!({"rules": rules, "namespaceSelector": resources["namespaceSelector"],
            "objectSelector": resources["objectSelector"], "matchPolicy": resources["matchPolicy"]})
    };
    let excluded = &resources["excludeResourceRules"];
    if excluded.as_array().is_some_and(|r| !r.is_empty())
        && super::invoked_as(&as_hook(excluded), kinds, a).is_some()
    {
        return None;
    }
    let every = json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
        "resources": ["*", "*/*"]}]);
    let rules = match &resources["resourceRules"] {
        Value::Array(r) if !r.is_empty() => &resources["resourceRules"],
        _ => &every,
    };
    super::invoked_as(&as_hook(rules), kinds, a)
}

/// A binding that applies to the request, its policy, and the version the policy sees
/// the request in (its `matchConstraints` decide).
struct Applicable {
    binding: Value,
    policy: Value,
    kind: &'static Kind,
}

fn applicable(call: &Call<'_>, kinds: &[&'static Kind], a: &mut Attributes<'_>) -> Vec<Applicable> {
    let (Some(policies), Some(bindings)) = (
        call.scope.cache.cache(POLICIES),
        call.scope.cache.cache(BINDINGS),
    ) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for binding in bindings.list(BINDINGS).0.iter().map(|b| b.value()) {
        let policy_name = binding["spec"]["policyName"].as_str().unwrap_or_default();
        let Some(policy) = policies
            .get(&format!("{POLICIES}{policy_name}"))
            .map(|p| p.value())
        else {
            continue;
        };
        let Some(kind) = matched_as(&policy["spec"]["matchConstraints"], kinds, a) else {
            continue;
        };
        let resources = &binding["spec"]["matchResources"];
        if resources.is_object() && matched_as(resources, kinds, a).is_none() {
            continue;
        }
        found.push(Applicable {
            binding,
            policy,
            kind,
        });
    }
    found
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
        .or_else(|| Some(call.scope.kinds.find_custom_kind(group, version, kind)?.info))
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
            call.scope
                .cache
                .object(info, namespace, name)
                .into_iter()
                .collect(),
        ));
    }
    let Ok(selector) = LabelSelector::from_label_selector_json(&reference["selector"]) else {
        return Ok(Some(Vec::new()));
    };
    let Some(cache) = call.scope.cache.cache(&info.storage_prefix()) else {
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
    call.scope
        .cache
        .cache(BINDINGS)
        .is_some_and(|c| !c.list(BINDINGS).0.is_empty())
}

/// Applies every bound policy to the request, each in the version it asks for; the first
/// Deny refuses it. Failures under the Audit action and the policies' audit annotations
/// go on the request's audit events, refused or not. `kinds`: the versions the request
/// may be seen in (its own first); `objects` and `olds` hold the request's objects,
/// prepared in the request's version.
pub async fn validate(
    call: &Call<'_>,
    operation: Operation,
    kinds: &[&'static Kind],
    (objects, olds): (&mut Versions<'_>, &mut Versions<'_>),
) -> Result<(), ApiError> {
    let chosen = {
        let object = objects.find(call.kind);
        let mut a = super::attributes(call, operation, object, olds.find(call.kind));
        applicable(call, kinds, &mut a)
    };
    for c in &chosen {
        objects.prepare(call, c.kind).await?;
        olds.prepare(call, c.kind).await?;
    }
    let mut audited = Vec::new();
    let outcome = apply(call, operation, &chosen, objects, olds, &mut audited);
    if !audited.is_empty() {
        call.audit
            .add(VALIDATION_FAILURE, Value::Array(audited).to_string());
    }
    outcome
}

/// What the expressions of policies applied in one version see but their params.
struct Scope {
    kind: &'static Kind,
    request: Value,
    context: Context<'static, 'static>,
}

fn apply(
    call: &Call<'_>,
    operation: Operation,
    chosen: &[Applicable],
    objects: &Versions<'_>,
    olds: &Versions<'_>,
    audited: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let null = Value::Null;
    let mut scopes: Vec<Scope> = Vec::new();
    // The first Deny in binding order, answered once every binding has run.
    let mut denial = None;
    for Applicable {
        binding,
        policy,
        kind,
    } in chosen
    {
        let (object, old) = (objects.find(kind), olds.find(kind));
        if !scopes.iter().any(|s| std::ptr::eq(s.kind, *kind)) {
            let mut context = Context::with_env(env());
            context.add_variable_from_value("object", to_cel(None, object.unwrap_or(&null), false));
            context.add_variable_from_value("oldObject", to_cel(None, old.unwrap_or(&null), false));
            let request = super::bare_request(call, kind, operation);
            context.add_variable_from_value("request", to_cel(None, &request, false));
            scopes.push(Scope {
                kind,
                request,
                context,
            });
        }
        let scope = scopes
            .iter()
            .find(|s| std::ptr::eq(s.kind, *kind))
            .expect("made above");
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let policy_name = binding["spec"]["policyName"].as_str().unwrap_or_default();
        let spec = &policy["spec"];
        let fails_open = spec["failurePolicy"] == "Ignore";
        let prefix = format!("ValidatingAdmissionPolicy '{policy_name}' with binding '{name}'");
        let as_conditions = json!({"matchConditions": spec["matchConditions"]});
        match super::conditions::hold(&as_conditions, object, old, &scope.request) {
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
        let all_params = match params(call, policy, binding) {
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
            for verdict in evaluate(policy, &scope.context, params) {
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
