//! CEL validation rules of a definition's schema (`x-kubernetes-validations`), evaluated
//! as upstream's apiextensions-apiserver does, with the `cel` crate:
//! - a rule runs at its schema node with `self` bound to the value there; a field that
//!   is absent is not checked;
//! - a rule that names `oldSelf` is a transition rule: it runs only on an update where
//!   the old object has a value at the same place (object properties, map values, and
//!   the entries of `x-kubernetes-list-type: map` lists by their keys);
//! - a rule that is not true fails with its `messageExpression` (when that evaluates to
//!   a string), else its `message`, else `failed rule: <rule>`, at the node's path plus
//!   the rule's `fieldPath`, as an Invalid (or the rule's `reason`: Forbidden,
//!   Required, Duplicate) error whose value is the node's type; a rule that cannot be
//!   evaluated fails with `<error> evaluating rule: <rule>`.
//!
//! Numbers are typed by the schema (`number` is a double, `integer` an int), the root's
//! and embedded resources' `metadata` show only `name` and `generateName`. The CEL
//! standard library with the strings and lists extensions is available; Kubernetes'
//! own libraries (quantity, url, ip, cidr, regex `find`, `isSorted`...), durations and
//! timestamps are not yet.

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, Env, Program, Value as Cel};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, ValidationRule,
};
use krust_api::status::Cause;
use serde_json::{Value, json};

use crate::cel::{env, to_cel};
use crate::schema::{additional, child, items};

/// The compiled rules (and message expressions) of one schema, by their source text.
pub struct Rules {
    env: Arc<Env>,
    programs: HashMap<String, Program>,
}

/// Calls `f` with every rule of the schema and the path of its node, in the form
/// definition errors name them (`<path>.properties[spec]`).
fn each_rule<'s>(
    s: &'s JSONSchemaProps,
    path: &str,
    f: &mut impl FnMut(&str, usize, &'s ValidationRule),
) {
    for (i, rule) in s.x_kubernetes_validations.iter().flatten().enumerate() {
        f(path, i, rule);
    }
    for (k, p) in s.properties.iter().flatten() {
        each_rule(p, &format!("{path}.properties[{k}]"), f);
    }
    if let Some(item) = items(s) {
        each_rule(item, &format!("{path}.items"), f);
    }
    if let Some(values) = additional(s) {
        each_rule(values, &format!("{path}.additionalProperties"), f);
    }
}

/// The problems of a definition's rules: those that do not compile, at
/// `<path>.x-kubernetes-validations[i].rule` (or `.messageExpression`).
pub fn compile_errors(s: &JSONSchemaProps, path: &str, errs: &mut Vec<Cause>) {
    let env = env();
    each_rule(s, path, &mut |node, i, rule| {
        let at = format!("{node}.x-kubernetes-validations[{i}]");
        let sources = [
            ("rule", Some(&rule.rule)),
            ("messageExpression", rule.message_expression.as_ref()),
        ];
        for (field, source) in sources {
            let Some(source) = source else { continue };
            if let Err(e) = env.compile(source) {
                errs.push(Cause::invalid(
                    format!("{at}.{field}"),
                    &json!(source),
                    format!("compilation failed: {e}"),
                ));
            }
        }
    });
}

impl Rules {
    /// Compiles every rule of `s`; `None` when it has none. Rules that do not compile
    /// (definitions with them are refused) are left out.
    pub fn new(s: &JSONSchemaProps) -> Option<Rules> {
        let env = env();
        let mut programs = HashMap::new();
        each_rule(s, "", &mut |_, _, rule| {
            let sources = std::iter::once(&rule.rule).chain(rule.message_expression.as_ref());
            for source in sources {
                if let Ok(p) = env.compile(source) {
                    programs.insert(source.clone(), p);
                }
            }
        });
        (!programs.is_empty()).then_some(Rules { env, programs })
    }

    /// Checks `v` (at `path`) against the rules of `s` and of the nodes under it: the
    /// plain rules when `old` is `None`, the transition rules against `old` otherwise.
    pub fn check(
        &self,
        s: &JSONSchemaProps,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        errs: &mut Vec<Cause>,
    ) {
        self.check_node(s, v, old, path, path.is_empty(), old.is_some(), errs);
    }

    #[allow(clippy::too_many_arguments)]
    fn check_node(
        &self,
        s: &JSONSchemaProps,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        resource: bool,
        transitions: bool,
        errs: &mut Vec<Cause>,
    ) {
        if v.is_null() {
            return;
        }
        for rule in s.x_kubernetes_validations.iter().flatten() {
            let Some(program) = self.programs.get(&rule.rule) else {
                continue;
            };
            let transition = program.references().has_variable("oldSelf");
            if transition != transitions {
                continue;
            }
            let mut context = Context::with_env(self.env.clone());
            context.add_variable_from_value("self", to_cel(Some(s), v, resource));
            if transition {
                let Some(old) = old.filter(|o| !o.is_null()) else {
                    continue;
                };
                context.add_variable_from_value("oldSelf", to_cel(Some(s), old, resource));
            }
            if let Some(cause) = self.outcome(s, rule, program.execute(&context), &context, path) {
                errs.push(cause);
            }
        }
        match v {
            Value::Object(map) => {
                for (k, value) in map {
                    if resource && k == "metadata" {
                        continue;
                    }
                    let Some(p) = s
                        .properties
                        .as_ref()
                        .and_then(|props| props.get(k))
                        .or_else(|| additional(s))
                    else {
                        continue;
                    };
                    let embedded = p.x_kubernetes_embedded_resource == Some(true);
                    let old = old.and_then(|o| o.get(k));
                    self.check_node(p, value, old, &child(path, k), embedded, transitions, errs);
                }
            }
            Value::Array(list) => {
                let Some(item) = items(s) else { return };
                let embedded = item.x_kubernetes_embedded_resource == Some(true);
                for (i, value) in list.iter().enumerate() {
                    let old = old.and_then(|o| same_entry(s, o, value));
                    self.check_node(
                        item,
                        value,
                        old,
                        &format!("{path}[{i}]"),
                        embedded,
                        transitions,
                        errs,
                    );
                }
            }
            _ => {}
        }
    }

    /// The error of a rule's result, if it failed.
    fn outcome(
        &self,
        s: &JSONSchemaProps,
        rule: &ValidationRule,
        result: Result<Cel, cel::ExecutionError>,
        context: &Context,
        path: &str,
    ) -> Option<Cause> {
        let path = shown(path);
        let type_name = json!(s.type_.as_deref().unwrap_or_default());
        let source = rule.rule.trim();
        match result {
            Ok(Cel::Bool(true)) => None,
            Ok(Cel::Bool(false)) => {
                let message = rule
                    .message_expression
                    .as_ref()
                    .and_then(|m| match self.programs.get(m)?.execute(context) {
                        Ok(Cel::String(text)) if !text.trim().is_empty() => Some(text.to_string()),
                        _ => None,
                    })
                    .or_else(|| rule.message.clone().filter(|m| !m.is_empty()))
                    .unwrap_or_else(|| format!("failed rule: {source}"));
                let field = match rule.field_path.as_deref().filter(|f| !f.is_empty()) {
                    Some(relative) if path == "<nil>" => join("", relative),
                    Some(relative) => join(path, relative),
                    None => path.to_string(),
                };
                Some(match rule.reason.as_deref() {
                    Some("FieldValueForbidden") => Cause::forbidden(field, message),
                    Some("FieldValueRequired") => Cause::required_because(field, &message),
                    Some("FieldValueDuplicate") => Cause::duplicate(field, &type_name),
                    _ => Cause::invalid(field, &type_name, message),
                })
            }
            Ok(other) => Some(Cause::invalid(
                path,
                &type_name,
                format!("rule did not evaluate to a bool: {other:?} evaluating rule: {source}"),
            )),
            Err(e) => Some(Cause::invalid(
                path,
                &type_name,
                format!("{e} evaluating rule: {source}"),
            )),
        }
    }
}

/// How upstream names the root in these errors: Go prints its nil field path so.
pub fn shown(path: &str) -> &str {
    if path.is_empty() { "<nil>" } else { path }
}

/// A rule's `fieldPath` (`.spec.replicas`, `['a.b']`) under the node's path.
fn join(path: &str, relative: &str) -> String {
    let relative = relative.strip_prefix('.').unwrap_or(relative);
    if path.is_empty() || relative.starts_with('[') {
        format!("{path}{relative}")
    } else {
        format!("{path}.{relative}")
    }
}

/// The old entry of a map-type list that has the same keys as `new`.
fn same_entry<'o>(s: &JSONSchemaProps, old: &'o Value, new: &Value) -> Option<&'o Value> {
    if s.x_kubernetes_list_type.as_deref() != Some("map") {
        return None;
    }
    let keys = s.x_kubernetes_list_map_keys.as_deref().unwrap_or_default();
    old.as_array()?
        .iter()
        .find(|o| keys.iter().all(|k| o.get(k) == new.get(k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(v: Value) -> JSONSchemaProps {
        serde_json::from_value(v).unwrap()
    }

    fn widget() -> JSONSchemaProps {
        schema(json!({
            "type": "object",
            "properties": {"spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.replicas <= self.maxReplicas",
                     "message": "replicas must not exceed maxReplicas"},
                    {"rule": "self.replicas >= oldSelf.replicas", "reason": "FieldValueForbidden",
                     "messageExpression": "'replicas may not shrink below ' + string(oldSelf.replicas)"},
                    {"rule": "!has(self.mode) || self.mode.startsWith('m')", "fieldPath": ".mode"}
                ],
                "properties": {
                    "replicas": {"type": "integer"},
                    "maxReplicas": {"type": "integer"},
                    "ratio": {"type": "number", "x-kubernetes-validations": [{"rule": "self < 1.0"}]},
                    "mode": {"type": "string"},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": {"type": "string"}, "port": {"type": "integer"}},
                            "x-kubernetes-validations": [{"rule": "self.port == oldSelf.port",
                                "message": "port is immutable"}]}}
                }
            }},
            "x-kubernetes-validations": [{"rule": "self.metadata.name.size() < 10 && !has(self.metadata.uid)"}]
        }))
    }

    fn check(v: Value, old: Option<Value>) -> Vec<String> {
        let s = widget();
        let rules = Rules::new(&s).unwrap();
        let mut errs = Vec::new();
        rules.check(&s, &v, old.as_ref(), "", &mut errs);
        errs.iter().map(Cause::summary).collect()
    }

    #[test]
    fn rules_run_where_they_are_declared_with_upstreams_messages() {
        let ok = json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"replicas": 1, "maxReplicas": 2, "ratio": 0.5}});
        assert!(check(ok, None).is_empty());
        let bad = json!({"metadata": {"name": "a-long-name"},
            "spec": {"replicas": 3, "maxReplicas": 2, "ratio": 2, "mode": "x"}});
        assert_eq!(
            check(bad, None),
            [
                "<nil>: Invalid value: \"object\": failed rule: self.metadata.name.size() < 10 && !has(self.metadata.uid)",
                "spec: Invalid value: \"object\": replicas must not exceed maxReplicas",
                "spec.mode: Invalid value: \"object\": failed rule: !has(self.mode) || self.mode.startsWith('m')",
                "spec.ratio: Invalid value: \"number\": failed rule: self < 1.0",
            ]
        );
        let broken = json!({"metadata": {"name": "w"}, "spec": {"maxReplicas": 2}});
        let errs = check(broken, None);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("spec: Invalid value: \"object\": ")
                && errs[0].ends_with(" evaluating rule: self.replicas <= self.maxReplicas"),
            "{errs:?}"
        );
    }

    /// Strings of the formats CEL types: times compare and add, durations compare,
    /// bytes have a size; the standard library's `timestamp` and `duration` parse.
    #[test]
    fn dates_times_durations_and_bytes_are_typed_by_their_format() {
        let s = schema(json!({"type": "object", "properties": {"spec": {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.start + self.window <= self.end", "message": "window past end"},
            {"rule": "self.end > timestamp('2026-01-01T00:00:00Z')", "message": "too early"},
            {"rule": "self.window >= duration('90s') && self.window.getMinutes() < 120",
                "message": "bad window"},
            {"rule": "self.day.getFullYear() == 2026 && self.day.getDayOfMonth() == 6",
                "message": "bad day"},
            {"rule": "size(self.key) == 3", "message": "bad key"}
        ],
        "properties": {
            "start": {"type": "string", "format": "date-time"},
            "end": {"type": "string", "format": "date-time"},
            "window": {"type": "string", "format": "duration"},
            "day": {"type": "string", "format": "date"},
            "key": {"type": "string", "format": "byte"}
        }}}}));
        let rules = Rules::new(&s).unwrap();
        let check = |spec: Value| {
            let mut errs = Vec::new();
            rules.check(&s, &json!({"spec": spec}), None, "", &mut errs);
            errs.iter().map(Cause::summary).collect::<Vec<_>>()
        };
        let ok = json!({"start": "2026-12-07T10:00:00+01:00", "end": "2026-12-07T11:00:00Z",
            "window": "1h0m0s", "day": "2026-12-07", "key": "AQID"});
        assert_eq!(check(ok), Vec::<String>::new());
        let bad = json!({"start": "2025-12-07T10:00:00Z", "end": "2025-12-07T10:30:00Z",
            "window": "1h30m", "day": "2026-12-06", "key": "AQIDBA=="});
        assert_eq!(
            check(bad),
            [
                "spec: Invalid value: \"object\": window past end",
                "spec: Invalid value: \"object\": too early",
                "spec: Invalid value: \"object\": bad day",
                "spec: Invalid value: \"object\": bad key",
            ]
        );
    }

    #[test]
    fn transition_rules_compare_with_the_same_place_in_the_old_object() {
        let old = json!({"metadata": {"name": "w"}, "spec": {"replicas": 2, "maxReplicas": 5,
            "ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}]}});
        let new = json!({"metadata": {"name": "w"}, "spec": {"replicas": 1, "maxReplicas": 5,
            "ports": [{"name": "b", "port": 3}, {"name": "c", "port": 9}, {"name": "a", "port": 1}]}});
        assert_eq!(
            check(new.clone(), Some(old)),
            [
                "spec: Forbidden: replicas may not shrink below 2",
                "spec.ports[0]: Invalid value: \"object\": port is immutable",
            ]
        );
        assert!(
            check(new, None).is_empty(),
            "no transition rule runs on a create"
        );
    }

    #[test]
    fn rules_that_do_not_compile_are_named_with_their_path() {
        let s = schema(
            json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.a >"}, {"rule": "true", "messageExpression": "'x' +"}]}}}),
        );
        let mut errs = Vec::new();
        compile_errors(&s, "spec.versions[0].schema.openAPIV3Schema", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule",
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].messageExpression",
            ]
        );
        assert!(
            errs[0].message.contains("compilation failed: "),
            "{}",
            errs[0].message
        );
    }
}
