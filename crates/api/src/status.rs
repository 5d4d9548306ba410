//! `metav1.Status` errors: every failure the API returns carries the upstream HTTP code,
//! reason, message and (for validation) one cause per field.

use serde_json::{Value, json};

/// One invalid field, as in `Status.details.causes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueNotSupported`,
    /// `FieldValueDuplicate`, `FieldValueForbidden`, `FieldValueTooLong`, ...
    pub reason: &'static str,
    pub message: String,
    /// The field path, e.g. `spec.containers[0].name`.
    pub field: String,
}

impl Cause {
    pub fn required(field: impl Into<String>) -> Self {
        Cause {
            reason: "FieldValueRequired",
            message: "Required value".into(),
            field: field.into(),
        }
    }

    /// `Required value: <detail>`, for a field required in a context.
    pub fn required_because(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            message: format!("Required value: {detail}"),
            ..Cause::required(field)
        }
    }

    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl AsRef<str>) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: {}: {}",
                render_value(value),
                detail.as_ref()
            ),
            field: field.into(),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Cause {
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {}: supported values: {}",
                render_value(value),
                list.join(", ")
            ),
            field: field.into(),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Cause {
            reason: "FieldValueDuplicate",
            message: format!("Duplicate value: {}", render_value(value)),
            field: field.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Cause {
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {}", detail.into()),
            field: field.into(),
        }
    }

    /// The upstream one-line form: `spec.replicas: Invalid value: -1: must be ...`.
    pub fn summary(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// A failed API request, rendered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `BadRequest`, ...; empty for a
    /// plain failure without a reason.
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<Details>>,
}

/// `Status.details`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<u32>,
}

/// The resource an error is about: its group, plural resource name and object name.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub name: &'a str,
}

impl<'a> Target<'a> {
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self) -> Details {
        Details {
            name: self.name.to_string(),
            group: self.group.to_string(),
            kind: self.resource.to_string(),
            ..Default::default()
        }
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// Upstream's `NewForbidden(resource, name, err)`: `pods "x" is forbidden: why`,
    /// `pods is forbidden: why` without a name, `forbidden: why` without a resource.
    pub fn forbidden_for(t: Target<'_>, why: &str) -> Self {
        let message = match (t.resource.is_empty(), t.name.is_empty()) {
            (true, true) => format!("forbidden: {why}"),
            (_, true) => format!("{} is forbidden: {why}", t.qualified()),
            _ => format!("{} \"{}\" is forbidden: {why}", t.qualified(), t.name),
        };
        ApiError {
            details: Some(Box::new(t.details())),
            ..Self::forbidden(message)
        }
    }

    pub fn not_found(t: Target<'_>) -> Self {
        ApiError {
            details: Some(Box::new(t.details())),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{}\" not found", t.qualified(), t.name),
            )
        }
    }

    /// A URL that names no resource.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn method_not_allowed(verb: &str, what: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({verb} {what})"
            ),
        )
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn already_exists(t: Target<'_>) -> Self {
        ApiError {
            details: Some(Box::new(t.details())),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{}\" already exists", t.qualified(), t.name),
            )
        }
    }

    pub fn conflict(t: Target<'_>, why: &str) -> Self {
        ApiError {
            details: Some(Box::new(t.details())),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": {why}",
                    t.qualified(),
                    t.name
                ),
            )
        }
    }

    /// The optimistic-concurrency conflict of a stale update.
    pub fn stale(t: Target<'_>) -> Self {
        Self::conflict(
            t,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type})"
            ),
        )
    }

    /// 422 Invalid with one cause per field: `Kind.group "name" is invalid: [causes]`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let kind_group = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let summaries: Vec<String> = causes.iter().map(Cause::summary).collect();
        let joined = if summaries.len() == 1 {
            summaries[0].clone()
        } else {
            format!("[{}]", summaries.join(", "))
        };
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!("{kind_group} \"{name}\" is invalid: {joined}"),
            details: Some(Box::new(Details {
                name: name.to_string(),
                group: group.to_string(),
                kind: kind.to_string(),
                causes,
                retry_after_seconds: None,
            })),
        }
    }

    pub fn too_many_requests(retry_after_seconds: u32) -> Self {
        ApiError {
            details: Some(Box::new(Details {
                retry_after_seconds: Some(retry_after_seconds),
                ..Default::default()
            })),
            ..Self::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// The error as a `metav1.Status` object, its fields in upstream's order (clients
    /// that compare error bodies as text see upstream's text).
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        });
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            let mut details = serde_json::Map::new();
            if !d.name.is_empty() {
                details.insert("name".into(), json!(d.name));
            }
            if !d.group.is_empty() {
                details.insert("group".into(), json!(d.group));
            }
            if !d.kind.is_empty() {
                details.insert("kind".into(), json!(d.kind));
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect();
                details.insert("causes".into(), Value::Array(causes));
            }
            if let Some(secs) = d.retry_after_seconds {
                details.insert("retryAfterSeconds".into(), json!(secs));
            }
            status["details"] = Value::Object(details);
        }
        status["code"] = json!(self.code);
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_upstream_shape() {
        let e = ApiError::not_found(Target {
            group: "apps",
            resource: "deployments",
            name: "web",
        });
        let s = e.to_status();
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["code"], 404);
        assert_eq!(s["details"]["kind"], "deployments");
        assert_eq!(s["details"]["group"], "apps");
        // Upstream's field order, which clients comparing bodies as text rely on.
        assert_eq!(
            s.to_string(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"web\" not found","reason":"NotFound","details":{"name":"web","group":"apps","kind":"deployments"},"code":404}"#
        );
    }

    #[test]
    fn invalid_lists_every_cause() {
        let e = ApiError::invalid(
            "Deployment",
            "apps",
            "web",
            vec![
                Cause::invalid(
                    "spec.replicas",
                    &json!(-1),
                    "must be greater than or equal to 0",
                ),
                Cause::required("spec.selector"),
            ],
        );
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Deployment.apps \"web\" is invalid: [spec.replicas: Invalid value: -1: must be greater than or equal to 0, spec.selector: Required value]"
        );
        assert_eq!(
            e.to_status()["details"]["causes"].as_array().unwrap().len(),
            2
        );
    }
}
