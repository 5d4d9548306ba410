//! The review resources: create-only, never stored, each answering a question about
//! identity or access — SelfSubjectAccessReview (`kubectl auth can-i`),
//! SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectRulesReview (`can-i
//! --list`), SelfSubjectReview (`kubectl auth whoami`) and TokenReview.

use http::StatusCode;
use krust_api::status::{ApiError, Cause};
use serde_json::{Value, json};

use super::{Attributes, Decision, ResourceAttributes, Target, decide_fresh};
use crate::auth::{Credentials, User};
use crate::json::strings;
use crate::request::Verb;
use crate::response::Response;
use crate::rest::Call;

/// Serves a create of one of the review kinds.
pub async fn serve(call: &mut Call<'_>) -> Result<Response, ApiError> {
    if call.info.verb != Verb::Create || call.info.name.is_some() {
        return Err(ApiError::method_not_allowed(
            call.info.verb.as_str(),
            call.kind.info.plural,
        ));
    }
    let info = call.kind.info;
    let api_version = info.api_version();
    let mut review = call.decode_body((&api_version, info.kind))?;
    let invalid = |causes: Vec<Cause>| ApiError::invalid(info.kind, info.group, "", causes);
    let status = match info.kind {
        "SelfSubjectAccessReview" => {
            let user = call.user.clone();
            access(call, &user, &review["spec"], None)
                .await
                .map_err(invalid)?
        }
        "SubjectAccessReview" => {
            let spec = &review["spec"];
            let user = subject(spec);
            if user.name.is_empty() && user.groups.is_empty() {
                return Err(invalid(vec![Cause::invalid(
                    "spec.user",
                    &json!(""),
                    "at least one of user or group must be specified",
                )]));
            }
            access(call, &user, spec, None).await.map_err(invalid)?
        }
        "LocalSubjectAccessReview" => {
            let namespace = call.info.namespace.clone().unwrap_or_default();
            review["metadata"]["namespace"] = json!(namespace);
            let spec = &review["spec"];
            access(call, &subject(spec), spec, Some(&namespace))
                .await
                .map_err(invalid)?
        }
        "SelfSubjectRulesReview" => rules(call, review["spec"]["namespace"].as_str()),
        "SelfSubjectReview" => json!({"userInfo": user_info(&call.user)}),
        "TokenReview" => token(call, &review["spec"]),
        other => return Err(ApiError::internal(format!("{other} is not a review kind"))),
    };
    review["status"] = status;
    Ok(call.reply(StatusCode::CREATED, &review))
}

/// The user a (Local)SubjectAccessReview asks about.
fn subject(spec: &Value) -> User {
    User {
        name: spec["user"].as_str().unwrap_or_default().to_string(),
        groups: strings(&spec["groups"]),
    }
}

fn user_info(user: &User) -> Value {
    json!({"username": user.name, "groups": user.groups})
}

/// The status of an access review of `spec` for `user`; `local` is the namespace of a
/// LocalSubjectAccessReview, which must match the attributes'.
async fn access(
    call: &Call<'_>,
    user: &User,
    spec: &Value,
    local: Option<&str>,
) -> Result<Value, Vec<Cause>> {
    let resource = &spec["resourceAttributes"];
    let non_resource = &spec["nonResourceAttributes"];
    fn field<'v>(v: &'v Value, name: &str) -> Option<&'v str> {
        v[name].as_str().filter(|s| !s.is_empty())
    }
    let (verb, target) = match (resource.is_object(), non_resource.is_object()) {
        (true, false) => {
            let namespace = field(resource, "namespace");
            if let Some(local) = local
                && namespace.unwrap_or_default() != local
            {
                return Err(vec![Cause::invalid(
                    "spec.resourceAttributes.namespace",
                    &json!(namespace.unwrap_or_default()),
                    "must match metadata.namespace",
                )]);
            }
            let target = Target::Resource(ResourceAttributes {
                group: field(resource, "group").unwrap_or_default(),
                resource: field(resource, "resource").unwrap_or_default(),
                subresource: field(resource, "subresource"),
                namespace,
                name: field(resource, "name"),
            });
            (field(resource, "verb"), target)
        }
        (false, true) if local.is_none() => {
            let path = field(non_resource, "path").unwrap_or_default();
            (field(non_resource, "verb"), Target::NonResource { path })
        }
        (false, true) => {
            return Err(vec![Cause::invalid(
                "spec.nonResourceAttributes",
                non_resource,
                "disallowed on this kind of request",
            )]);
        }
        _ => {
            return Err(vec![Cause::invalid(
                "spec.resourceAttributes",
                resource,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )]);
        }
    };
    let verb = verb.unwrap_or_default();
    let decision = decide_fresh(call.scope, &Attributes { user, verb, target }).await;
    let mut status = json!({"allowed": decision.allowed()});
    if matches!(decision, Decision::Deny(_)) {
        status["denied"] = json!(true);
    }
    if !decision.reason().is_empty() {
        status["reason"] = json!(decision.reason());
    }
    Ok(status)
}

/// What the caller may do in a namespace, as RBAC grants it.
fn rules(call: &Call<'_>, namespace: Option<&str>) -> Value {
    let namespace = namespace.filter(|ns| !ns.is_empty());
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for rule in call.scope.rbac.rules_for(&call.user, namespace) {
        if rule.non_resource_urls.is_empty() {
            resource_rules.push(json!({
                "verbs": rule.verbs, "apiGroups": rule.api_groups,
                "resources": rule.resources, "resourceNames": rule.resource_names,
            }));
        } else {
            non_resource_rules
                .push(json!({"verbs": rule.verbs, "nonResourceURLs": rule.non_resource_urls}));
        }
    }
    json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": false})
}

/// Whether a bearer token authenticates, and as whom. Tokens are checked for the
/// apiserver's own audience only: a review naming other audiences is answered
/// unauthenticated (upstream accepts tokens for any audience the review names).
fn token(call: &Call<'_>, spec: &Value) -> Value {
    let requested = strings(&spec["audiences"]);
    let token = spec["token"].as_str().unwrap_or_default();
    let creds = Credentials {
        client_cert: None,
        bearer: Some(token),
        audiences: &requested,
    };
    match call.scope.authenticators.authenticate(&creds) {
        Ok(user) if !user.is_anonymous() => {
            // The audiences both the review and the token name (upstream's intersection);
            // without any in the review, the apiserver's own.
            let audiences = if requested.is_empty() {
                vec![crate::tokens::ISSUER.to_string()]
            } else {
                let meant_for = crate::tokens::audiences_of(token);
                requested
                    .into_iter()
                    .filter(|a| meant_for.contains(a))
                    .collect()
            };
            json!({
                "authenticated": true,
                "user": user_info(&user),
                "audiences": audiences,
            })
        }
        _ if !requested.is_empty()
            && !crate::tokens::audiences_of(token)
                .iter()
                .any(|a| requested.contains(a)) =>
        {
            json!({"user": {}, "error": "token audiences is invalid for the target audiences"})
        }
        _ => json!({"user": {}, "error": "invalid bearer token"}),
    }
}
