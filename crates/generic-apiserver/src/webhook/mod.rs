//! Admission webhooks (admissionregistration.k8s.io/v1) and, before the validating
//! ones, ValidatingAdmissionPolicies ([`policy`]): mutating webhooks change an
//! object after the built-in mutating plugins, one after another (and once more, for
//! those that ask, when a later one changed it); validating webhooks then judge it, all
//! at once. Each is called with an admission.k8s.io AdmissionReview over HTTPS and its
//! failurePolicy decides what a call that fails means — as upstream's
//! MutatingAdmissionWebhook and ValidatingAdmissionWebhook plugins.

mod admission_policy;
mod conditions;
mod rules;

pub use conditions::{check_expression, validate as validate_match_conditions};

use std::time::Duration;

use base64::Engine;
use krust_api::registry::ResourceInfo;
use krust_api::selector::object_labels;
use krust_api::status::ApiError;
use serde_json::{Value, json};

use rules::Attributes;

pub use crate::admission::Operation;
use crate::outbound;
use crate::rest::Call;
use crate::rest::Kind;

const MUTATING: &str = "/registry/mutatingwebhookconfigurations/";
const VALIDATING: &str = "/registry/validatingwebhookconfigurations/";

/// Upstream's default `timeoutSeconds`.
const DEFAULT_TIMEOUT: u64 = 10;

/// One webhook of a configuration.
struct Hook {
    webhook: Value,
}

impl Hook {
    fn name(&self) -> &str {
        self.webhook["name"].as_str().unwrap_or_default()
    }

    fn fails_open(&self) -> bool {
        self.webhook["failurePolicy"] == "Ignore"
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(
            self.webhook["timeoutSeconds"]
                .as_u64()
                .unwrap_or(DEFAULT_TIMEOUT),
        )
    }
}

/// The webhooks of every configuration under `prefix`, ordered by configuration name
/// and then as listed, as upstream calls them.
fn hooks(call: &Call<'_>, prefix: &str) -> Vec<Hook> {
    let Some(cache) = call.scope.cache.cache(prefix) else {
        return Vec::new();
    };
    let (configs, _) = cache.list(prefix);
    configs
        .iter()
        .flat_map(|c| {
            c.value()["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|webhook| Hook { webhook })
        .collect()
}

/// Webhooks are never called about webhook and policy configurations (a broken webhook
/// must not lock out its own repair), nor for the reviews that store nothing.
fn exempt(call: &Call<'_>) -> bool {
    let info = call.kind.info;
    info.group == "admissionregistration.k8s.io" || info.is_virtual()
}

fn attributes<'a>(
    call: &'a Call<'_>,
    operation: Operation,
    obj: Option<&'a Value>,
    old: Option<&'a Value>,
) -> Attributes<'a> {
    let info = call.kind.info;
    let namespace_labels = if info.namespaced {
        call.namespace().map(|ns| {
            call.scope
                .cache
                .core_object("namespaces", None, ns)
                .map(|n| object_labels(&n))
                .unwrap_or_default()
        })
    } else if info.plural == "namespaces" && info.group.is_empty() {
        obj.or(old).map(object_labels)
    } else {
        None
    };
    Attributes {
        operation: operation.as_str(),
        group: info.group,
        version: info.version,
        resource: info.plural,
        subresource: call.info.subresource.as_deref(),
        name: obj
            .or(old)
            .and_then(|o| o["metadata"]["name"].as_str())
            .or(call.info.name.as_deref())
            .unwrap_or_default(),
        namespaced: info.namespaced,
        namespace_labels,
        object: obj,
        old_object: old,
    }
}

/// Runs the mutating webhooks on `obj` (storage form), keeping what the store owns.
/// Returns whether any changed it.
pub async fn mutate(
    call: &Call<'_>,
    operation: Operation,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<bool, ApiError> {
    if exempt(call) {
        return Ok(false);
    }
    let hooks = hooks(call, MUTATING);
    if hooks.is_empty() {
        return Ok(false);
    }
    let kinds = equivalents(call);
    let mut mutated = Mutated {
        kind: call.kind,
        served: call.to_served(obj.clone()).await?,
        olds: Versions::new(old),
    };
    let mut changes = 0usize;
    // Webhooks that asked to be called again if a later one changes the object, with
    // the number of changes made when they were called.
    let mut reinvoke: Vec<(&Hook, usize)> = Vec::new();
    for hook in &hooks {
        let Some(changed) = mutated.call(call, hook, &kinds, operation, old).await? else {
            continue;
        };
        changes += usize::from(changed);
        if hook.webhook["reinvocationPolicy"] == "IfNeeded" {
            reinvoke.push((hook, changes));
        }
    }
    for (hook, seen) in reinvoke {
        if seen < changes {
            mutated.call(call, hook, &kinds, operation, old).await?;
        }
    }
    let Mutated { kind, served, .. } = mutated;
    if changes > 0 {
        let mutated = crate::rest::stored_as(call.scope, kind, served).await?;
        let before = std::mem::replace(obj, mutated);
        crate::rest::keep_system_metadata(call, obj, &before["metadata"], old);
    }
    Ok(changes > 0)
}

/// The object as the mutating webhooks pass it on: in the version of the last one
/// called (converted only when the next is called in another).
struct Mutated<'o> {
    kind: &'static Kind,
    served: Value,
    olds: Versions<'o>,
}

impl Mutated<'_> {
    /// Calls `hook` if it matches the object as it now is (upstream matches reinvoked
    /// webhooks again too): `None` if it does not, else whether it changed the object.
    async fn call(
        &mut self,
        call: &Call<'_>,
        hook: &Hook,
        kinds: &[&'static Kind],
        operation: Operation,
        old: Option<&Value>,
    ) -> Result<Option<bool>, ApiError> {
        let mut attrs = attributes(call, operation, Some(&self.served), old);
        let Some(target) = invoked_as(&hook.webhook, kinds, &mut attrs) else {
            return Ok(None);
        };
        let served = std::mem::take(&mut self.served);
        self.served = convert(call, self.kind, target, served).await?;
        self.kind = target;
        let old = self.olds.get(call, target).await?;
        if !matched(call, hook, target, operation, Some(&self.served), old)? {
            return Ok(None);
        }
        mutate_once(call, hook, target, operation, &mut self.served, old)
            .await
            .map(Some)
    }
}

/// The kinds a webhook may be called in for this call: its own first, then the other
/// versions of the same resource, those stored with it (autoscaling/v1 and v2 HPAs,
/// core and events.k8s.io events, the versions of a custom resource) that serve the
/// request's subresource, as upstream's equivalent resource mapper lists them.
fn equivalents(call: &Call<'_>) -> Vec<&'static Kind> {
    let own = call.kind;
    let storage = own.info.storage;
    let mut kinds = vec![own];
    if storage.is_empty() {
        return kinds;
    }
    let subresource = call
        .info
        .subresource
        .as_deref()
        .map(krust_api::registry::Subresource::parse);
    kinds.extend(
        call.scope
            .kinds
            .all()
            .into_iter()
            .filter(|k| k.info.storage == storage && !std::ptr::eq(*k, own))
            .filter(|k| match subresource {
                None => true,
                Some(Some(sub)) => k.info.has_subresource(sub),
                Some(None) => false,
            }),
    );
    kinds
}

/// The version a webhook is called in, if any: the request's own when its rules name
/// it; else, under `matchPolicy: Equivalent` (the default), another version of the
/// resource that a rule names — earlier rules first, as upstream honours them.
fn invoked_as(
    webhook: &Value,
    kinds: &[&'static Kind],
    attrs: &mut Attributes<'_>,
) -> Option<&'static Kind> {
    let own = kinds[0];
    if rules::applies(webhook, attrs) {
        return Some(own);
    }
    if webhook["matchPolicy"] == "Exact" || !rules::selected(webhook, attrs) {
        return None;
    }
    let rules = webhook["rules"].as_array().map_or(&[][..], Vec::as_slice);
    let found = rules.iter().find_map(|rule| {
        kinds[1..].iter().copied().find(|kind| {
            attrs.group = kind.info.group;
            attrs.version = kind.info.version;
            attrs.resource = kind.info.plural;
            rules::rule_matches(rule, attrs)
        })
    });
    (attrs.group, attrs.version, attrs.resource) =
        (own.info.group, own.info.version, own.info.plural);
    found
}

/// An object served as `from` in the version `to` serves (itself when they are one).
async fn convert(
    call: &Call<'_>,
    from: &'static Kind,
    to: &'static Kind,
    obj: Value,
) -> Result<Value, ApiError> {
    if std::ptr::eq(from, to) {
        return Ok(obj);
    }
    let stored = crate::rest::stored_as(call.scope, from, obj).await?;
    crate::rest::served_as(call.scope, to, stored).await
}

/// A stored object (if any) in each version webhooks are called in, converted once.
struct Versions<'o> {
    stored: Option<&'o Value>,
    converted: Vec<(&'static Kind, Value)>,
}

impl<'o> Versions<'o> {
    fn new(stored: Option<&'o Value>) -> Self {
        Versions {
            stored,
            converted: Vec::new(),
        }
    }

    /// Converts the object for `kind` unless done before.
    async fn prepare(&mut self, call: &Call<'_>, kind: &'static Kind) -> Result<(), ApiError> {
        let Some(stored) = self.stored else {
            return Ok(());
        };
        if !self.converted.iter().any(|(k, _)| std::ptr::eq(*k, kind)) {
            let served = crate::rest::served_as(call.scope, kind, stored.clone()).await?;
            self.converted.push((kind, served));
        }
        Ok(())
    }

    /// The object as `kind` serves it, once prepared.
    fn find(&self, kind: &'static Kind) -> Option<&Value> {
        self.converted
            .iter()
            .find(|(k, _)| std::ptr::eq(*k, kind))
            .map(|(_, v)| v)
    }

    async fn get(
        &mut self,
        call: &Call<'_>,
        kind: &'static Kind,
    ) -> Result<Option<&Value>, ApiError> {
        self.prepare(call, kind).await?;
        Ok(self.find(kind))
    }
}

/// Calls one mutating webhook and applies its patch. Returns whether it changed the
/// object.
async fn mutate_once(
    call: &Call<'_>,
    hook: &Hook,
    kind: &'static Kind,
    operation: Operation,
    served: &mut Value,
    old: Option<&Value>,
) -> Result<bool, ApiError> {
    let Some(response) = review(call, hook, kind, operation, Some(served), old).await? else {
        return Ok(false);
    };
    let Some(patch) = response["patch"].as_str() else {
        return Ok(false);
    };
    let failed = |why: String| {
        ApiError::internal(format!("failed calling webhook \"{}\": {why}", hook.name()))
    };
    if response["patchType"] != "JSONPatch" {
        return Err(failed(format!(
            "unsupported patch type {}",
            response["patchType"]
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| failed(format!("invalid patch: {e}")))?;
    let ops: json_patch::Patch =
        serde_json::from_slice(&bytes).map_err(|e| failed(format!("invalid patch: {e}")))?;
    let before = served.clone();
    krust_apimachinery::patch::apply_json_patch(served, &ops)
        .map_err(|e| failed(format!("applying the patch: {e}")))?;
    if *served == before {
        return Ok(false);
    }
    // Decoded as a client's body is, as upstream decodes the patched object: fields
    // the kind does not have are dropped (a custom kind's pruned by its schema).
    let (decoded, _) = (kind.decode)(std::mem::take(served))
        .map_err(|e| failed(format!("decoding the patched object: {e}")))?;
    *served = decoded;
    Ok(true)
}

/// Applies the bound ValidatingAdmissionPolicies to the request.
pub async fn apply_policies(
    call: &Call<'_>,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if exempt(call) || !admission_policy::bound(call) {
        return Ok(());
    }
    let (mut objects, mut olds) = prepared(call, obj, old).await?;
    let kinds = equivalents(call);
    admission_policy::validate(call, operation, &kinds, (&mut objects, &mut olds)).await
}

/// The request's objects, in the request's version.
async fn prepared<'o>(
    call: &Call<'_>,
    obj: Option<&'o Value>,
    old: Option<&'o Value>,
) -> Result<(Versions<'o>, Versions<'o>), ApiError> {
    let (mut objects, mut olds) = (Versions::new(obj), Versions::new(old));
    objects.prepare(call, call.kind).await?;
    olds.prepare(call, call.kind).await?;
    Ok((objects, olds))
}

/// Runs the validating webhooks, all at once; the first refusal (in webhook order)
/// refuses the request.
pub async fn validate(
    call: &Call<'_>,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    judge(call, VALIDATING, operation, obj, old).await
}

/// Runs the mutating webhooks for a request that has no object for them to change (a
/// delete; a connect, whose options they see): upstream calls them all the same, so
/// that one may refuse. What they would patch is not applied.
pub async fn consult(
    call: &Call<'_>,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    judge(call, MUTATING, operation, obj, old).await
}

/// Calls the webhooks configured under `prefix` that match, all at once, for their
/// verdicts only.
async fn judge(
    call: &Call<'_>,
    prefix: &str,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if exempt(call) {
        return Ok(());
    }
    let hooks = hooks(call, prefix);
    if hooks.is_empty() {
        return Ok(());
    }
    let (mut objects, mut olds) = prepared(call, obj, old).await?;
    let kinds = equivalents(call);
    let mut chosen = Vec::new();
    for hook in &hooks {
        let mut attrs = attributes(call, operation, obj, old);
        let Some(kind) = invoked_as(&hook.webhook, &kinds, &mut attrs) else {
            continue;
        };
        objects.prepare(call, kind).await?;
        olds.prepare(call, kind).await?;
        if matched(
            call,
            hook,
            kind,
            operation,
            objects.find(kind),
            olds.find(kind),
        )? {
            chosen.push((hook, kind));
        }
    }
    let calls = chosen.into_iter().map(|(h, kind)| {
        review(
            call,
            h,
            kind,
            operation,
            objects.find(kind),
            olds.find(kind),
        )
    });
    for outcome in futures::future::join_all(calls).await {
        outcome?;
    }
    Ok(())
}

/// Whether the webhook's match conditions let it be called; one that cannot be
/// evaluated fails the call, which the failure policy decides.
fn matched(
    call: &Call<'_>,
    hook: &Hook,
    kind: &'static Kind,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<bool, ApiError> {
    let request = bare_request(call, kind, operation);
    match conditions::hold(&hook.webhook, obj, old, &request) {
        Ok(called) => Ok(called),
        Err(why) if hook.fails_open() => {
            tracing::warn!(webhook = %hook.name(), %why, "failed evaluating match conditions; failing open");
            Ok(false)
        }
        Err(why) => Err(ApiError::internal(format!(
            "failed calling webhook \"{}\": failed evaluating match conditions, failing closed: {why}",
            hook.name()
        ))),
    }
}

/// The AdmissionRequest without its objects: CEL's `request`.
fn bare_request(call: &Call<'_>, kind: &'static Kind, operation: Operation) -> Value {
    let mut request = review_request(call, "", kind, operation, None, None);
    if let Some(r) = request.as_object_mut() {
        r.remove("object");
        r.remove("oldObject");
    }
    request
}

/// Sends one AdmissionReview. `Ok(None)`: the call failed and the webhook fails open.
/// A refusal is the error the client gets.
async fn review(
    call: &Call<'_>,
    hook: &Hook,
    kind: &'static Kind,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<Option<Value>, ApiError> {
    let name = hook.name();
    let dry_run = call.dry_run();
    let side_effects = hook.webhook["sideEffects"].as_str().unwrap_or_default();
    if dry_run && !matches!(side_effects, "None" | "NoneOnDryRun") {
        return Err(ApiError::bad_request(format!(
            "admission webhook \"{name}\" has side effects and does not support dry run"
        )));
    }
    let versions = &hook.webhook["admissionReviewVersions"];
    let version = ["v1", "v1beta1"]
        .into_iter()
        .find(|v| versions.as_array().is_some_and(|l| l.contains(&json!(v))));
    let failed = |why: String| -> Result<Option<Value>, ApiError> {
        if hook.fails_open() {
            tracing::warn!(webhook = %name, %why, "failed calling webhook; failing open");
            Ok(None)
        } else {
            Err(ApiError::internal(format!(
                "failed calling webhook \"{name}\": {why}"
            )))
        }
    };
    let Some(version) = version else {
        return failed("webhook does not accept v1 or v1beta1 AdmissionReview".into());
    };
    let uid = uuid::Uuid::new_v4().to_string();
    let request = review_request(call, &uid, kind, operation, obj, old);
    let body = json!({
        "apiVersion": format!("admission.k8s.io/{version}"),
        "kind": "AdmissionReview",
        "request": request,
    });
    let timeout = hook.timeout();
    let target = match outbound::target(&hook.webhook["clientConfig"], timeout, &call.scope.cache) {
        Ok(t) => t,
        Err(e) => return failed(format!("failed to call webhook: {e}")),
    };
    let answer = call
        .scope
        .webhooks
        .post_review(&hook.webhook["clientConfig"], &target, &body, timeout)
        .await;
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            return failed(format!(
                "failed to call webhook: Post \"{}\": {e}",
                target.url
            ));
        }
    };
    let response = &answer["response"];
    if response["uid"].as_str() != Some(uid.as_str()) {
        return failed(format!(
            "received invalid webhook response: expected response.uid=\"{uid}\", got \"{}\"",
            response["uid"].as_str().unwrap_or_default()
        ));
    }
    // Audit annotations go under the webhook's name, as upstream keys them; one whose
    // key is no qualified name is dropped, as upstream drops it.
    for (key, value) in response["auditAnnotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let key = format!("{name}/{key}");
        match value.as_str() {
            Some(value) if crate::validation::is_qualified_name(&key) => {
                call.audit.add(key, value.to_string());
            }
            _ => tracing::warn!(webhook = %name, %key, "dropping an invalid audit annotation"),
        }
    }
    for warning in response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        call.warnings.add(warning.to_string());
    }
    if response["allowed"] != json!(true) {
        return Err(denied(name, &response["status"]));
    }
    Ok(Some(response.clone()))
}

/// The AdmissionRequest for a webhook called in `kind`'s version; `requestKind` and
/// `requestResource` say what the client sent.
fn review_request(
    call: &Call<'_>,
    uid: &str,
    kind: &'static Kind,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Value {
    let sub = call
        .info
        .subresource
        .as_deref()
        .and_then(krust_api::registry::Subresource::parse);
    let kind_of = |info: &ResourceInfo| {
        let (group, version, kind) =
            sub.and_then(|s| s.kind())
                .unwrap_or((info.group, info.version, info.kind));
        json!({"group": group, "version": version, "kind": kind})
    };
    let resource_of = |info: &ResourceInfo| json!({"group": info.group, "version": info.version, "resource": info.plural});
    let (info, requested) = (kind.info, call.kind.info);
    let name = obj
        .or(old)
        .and_then(|o| o["metadata"]["name"].as_str())
        .or(call.info.name.as_deref())
        .unwrap_or_default();
    let mut request = json!({
        "uid": uid,
        "kind": kind_of(info),
        "resource": resource_of(info),
        "requestKind": kind_of(requested),
        "requestResource": resource_of(requested),
        "name": name,
        "operation": operation.as_str(),
        "userInfo": {"username": call.user.name, "groups": call.user.groups},
        "object": obj,
        "oldObject": old,
        "dryRun": call.dry_run(),
    });
    if let Some(options) = operation.options_kind() {
        request["options"] = json!({"kind": options, "apiVersion": "meta.k8s.io/v1"});
    }
    if let Some(sub) = &call.info.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if let Some(ns) = call.namespace().filter(|_| info.namespaced) {
        request["namespace"] = json!(ns);
    }
    request
}

/// A webhook's refusal as upstream words it: its status code (at least 400), its
/// message after `admission webhook "x" denied the request`.
fn denied(name: &str, status: &Value) -> ApiError {
    let by = format!("admission webhook \"{name}\" denied the request");
    let code = status["code"]
        .as_u64()
        .filter(|c| (400..600).contains(c))
        .unwrap_or(400) as u16;
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{by}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{by}: {r}"),
        _ => format!("{by} without explanation"),
    };
    const REASONS: &[&str] = &[
        "BadRequest",
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Invalid",
        "TooManyRequests",
        "InternalError",
    ];
    let reason = REASONS
        .iter()
        .find(|r| status["reason"].as_str() == Some(**r))
        .copied()
        .unwrap_or("");
    ApiError::new(code, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_read_as_upstream() {
        let e = denied(
            "pods.example.com",
            &json!({"code": 403, "reason": "Forbidden", "message": "no privileged pods"}),
        );
        assert_eq!(e.code, 403);
        assert_eq!(e.reason, "Forbidden");
        assert_eq!(
            e.message,
            "admission webhook \"pods.example.com\" denied the request: no privileged pods"
        );
        let e = denied("x.example.com", &json!({"code": 200}));
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"x.example.com\" denied the request without explanation"
        );
    }
}
