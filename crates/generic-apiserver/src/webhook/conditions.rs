//! A webhook's `matchConditions`: CEL expressions over `object`, `oldObject` and
//! `request` (the AdmissionRequest without its objects) that must all be true for the
//! webhook to be called, as upstream evaluates them: any false condition skips the
//! webhook (errors or not); otherwise an error fails the call, which the webhook's
//! failurePolicy then decides. The `authorizer` variable is not offered.

use cel::{Context, Value as Cel};
use serde_json::Value;

use crate::cel::{env, run, to_cel};

/// Whether the webhook is for this request: `Ok(true)` when it has no conditions or
/// all hold, `Ok(false)` when one is false, `Err` when one could not be evaluated.
pub fn hold(
    webhook: &Value,
    object: Option<&Value>,
    old: Option<&Value>,
    request: &Value,
) -> Result<bool, String> {
    let Some(conditions) = webhook["matchConditions"]
        .as_array()
        .filter(|c| !c.is_empty())
    else {
        return Ok(true);
    };
    let env = env();
    let mut context = Context::with_env(env.clone());
    let null = Value::Null;
    context.add_variable_from_value("object", to_cel(None, object.unwrap_or(&null), false));
    context.add_variable_from_value("oldObject", to_cel(None, old.unwrap_or(&null), false));
    context.add_variable_from_value("request", to_cel(None, request, false));
    let mut error = None;
    for condition in conditions {
        let name = condition["name"].as_str().unwrap_or_default();
        let expression = condition["expression"].as_str().unwrap_or_default();
        let outcome = run(&env, expression, &context);
        match outcome {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => return Ok(false),
            Ok(other) => {
                error.get_or_insert(format!(
                    "matchCondition '{name}' did not evaluate to a bool: {other:?}"
                ));
            }
            Err(e) => {
                error.get_or_insert(format!("matchCondition '{name}' failed: {e}"));
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// The problems of a webhook's conditions, as upstream validates a configuration: at
/// most 64, each with a unique name and an expression that compiles.
pub fn validate(conditions: &Value, path: &str, errs: &mut Vec<krust_api::status::Cause>) {
    use krust_api::status::Cause;
    let Some(list) = conditions.as_array() else {
        return;
    };
    if list.len() > 64 {
        errs.push(Cause {
            reason: "FieldValueTooMany",
            message: format!("Too many: {}: must have at most 64 items", list.len()),
            field: path.to_string(),
        });
    }
    let mut names = std::collections::HashSet::new();
    for (i, condition) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match condition["name"].as_str().filter(|n| !n.is_empty()) {
            None => errs.push(Cause::required(format!("{at}.name"))),
            Some(name) if !names.insert(name) => {
                errs.push(Cause::duplicate(format!("{at}.name"), &condition["name"]));
            }
            Some(_) => {}
        }
        check_expression(&condition["expression"], &format!("{at}.expression"), errs);
    }
}

/// The problem of an expression field: missing, or not compiling.
pub fn check_expression(expression: &Value, path: &str, errs: &mut Vec<krust_api::status::Cause>) {
    use krust_api::status::Cause;
    match expression.as_str().filter(|e| !e.trim().is_empty()) {
        None => errs.push(Cause::required(path)),
        Some(source) => {
            if let Err(e) = env().compile(source) {
                errs.push(Cause::invalid(
                    path,
                    expression,
                    format!("compilation failed: {e}"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hook(conditions: Value) -> Value {
        json!({"name": "h", "matchConditions": conditions})
    }

    #[test]
    fn conditions_skip_call_or_fail_as_upstream() {
        let object = json!({"metadata": {"name": "a", "labels": {"check": "yes"}}});
        let request =
            json!({"operation": "CREATE", "namespace": "ns", "userInfo": {"username": "u"}});
        let eval = |c: Value| hold(&hook(c), Some(&object), None, &request);
        assert_eq!(eval(json!([])), Ok(true));
        let checked =
            json!({"name": "checked", "expression": "object.metadata.labels['check'] == 'yes'"});
        let not_system = json!({"name": "ns", "expression": "request.namespace != 'kube-system' && oldObject == null"});
        assert_eq!(eval(json!([checked, not_system])), Ok(true));
        let create_only = json!({"name": "update", "expression": "request.operation == 'UPDATE'"});
        let broken = json!({"name": "broken", "expression": "object.spec.x == 1"});
        assert_eq!(
            eval(json!([broken, create_only])),
            Ok(false),
            "false wins over errors"
        );
        let err = eval(json!([checked, broken])).unwrap_err();
        assert!(err.starts_with("matchCondition 'broken' failed: "), "{err}");
    }

    #[test]
    fn configurations_name_their_bad_conditions() {
        let mut errs = Vec::new();
        let conditions = json!([
            {"name": "a", "expression": "true"},
            {"name": "a", "expression": "object.x >"},
            {"expression": ""}
        ]);
        validate(&conditions, "webhooks[0].matchConditions", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "webhooks[0].matchConditions[1].name",
                "webhooks[0].matchConditions[1].expression",
                "webhooks[0].matchConditions[2].name",
                "webhooks[0].matchConditions[2].expression",
            ]
        );
        assert!(
            errs[1].message.contains("compilation failed"),
            "{}",
            errs[1].message
        );
    }
}
