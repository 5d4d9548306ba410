//! Validation helpers shared by the kinds: names, labels, annotations and common field
//! shapes, with upstream's messages so `kubectl` users see familiar errors.

use krust_api::status::Cause;
use serde_json::Value;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && label_chars(s)
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn label_chars(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Upstream's subdomain: at most 253 characters of dot-separated parts, each with a
/// label's characters — but, unlike a label, of any length (upstream's regex bounds
/// only the whole; `csi-<64 hex digits>` is a valid name).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(label_chars)
}

/// Which rule an object name must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    Subdomain,
    Label,
    /// Path segment names (RBAC objects): anything but `.`/`..` and without `/` or `%`.
    PathSegment,
}

pub fn check_name(rule: NameRule, field: &str, name: &str, errs: &mut Vec<Cause>) {
    check_name_shown(rule, field, name, &Value::String(name.to_string()), errs);
}

/// `metadata.generateName` follows the name rule as a prefix (upstream's
/// `ValidateObjectMeta`): a trailing `-` is allowed, since characters follow it, and
/// path-segment names may be `.` or `..` as a prefix.
pub fn check_generate_name(rule: NameRule, field: &str, prefix: &str, errs: &mut Vec<Cause>) {
    let shown = Value::String(prefix.to_string());
    match rule {
        NameRule::PathSegment if prefix == "." || prefix == ".." => {}
        _ => {
            // Upstream's maskTrailingDash: the dash and the character before it become `a`.
            let masked = match prefix.strip_suffix('-') {
                Some(rest) if !rest.is_empty() => {
                    let mut cut = rest.len() - 1;
                    while !rest.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    format!("{}a", &rest[..cut])
                }
                _ => prefix.to_string(),
            };
            check_name_shown(rule, field, &masked, &shown, errs);
        }
    }
}

fn check_name_shown(rule: NameRule, field: &str, name: &str, v: &Value, errs: &mut Vec<Cause>) {
    match rule {
        NameRule::Subdomain if !is_dns1123_subdomain(name) => {
            errs.push(Cause::invalid(field, v, DNS1123_SUBDOMAIN_MSG));
        }
        NameRule::Label if !is_dns1123_label(name) => {
            errs.push(Cause::invalid(field, v, DNS1123_LABEL_MSG));
        }
        NameRule::PathSegment if name == "." || name == ".." => {
            errs.push(Cause::invalid(field, v, format!("may not be '{name}'")));
        }
        NameRule::PathSegment if name.contains('/') || name.contains('%') => {
            errs.push(Cause::invalid(field, v, "may not contain '/' or '%'"));
        }
        _ => {}
    }
}

/// Whether `key` is a qualified name: a `name` of at most 63 characters with an
/// optional DNS subdomain `prefix/` (label and annotation keys).
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    name_ok && prefix.is_none_or(is_dns1123_subdomain)
}

/// A qualified name (`prefix/name` label or annotation key).
fn check_qualified_name(field: &str, key: &str, errs: &mut Vec<Cause>) {
    if !is_qualified_name(key) {
        errs.push(Cause::invalid(
            field,
            &Value::String(key.to_string()),
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        ));
    }
}

fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

/// Labels at `field` (e.g. `metadata.labels`).
pub fn check_labels(field: &str, labels: &Value, errs: &mut Vec<Cause>) {
    for (k, v) in labels.as_object().into_iter().flatten() {
        check_qualified_name(field, k, errs);
        let s = v.as_str().unwrap_or_default();
        if !is_label_value(s) {
            errs.push(Cause::invalid(
                field,
                v,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            ));
        }
    }
}

/// Annotation keys and the 256 KiB total size limit.
pub fn check_annotations(field: &str, annotations: &Value, errs: &mut Vec<Cause>) {
    let mut total = 0;
    for (k, v) in annotations.as_object().into_iter().flatten() {
        check_qualified_name(field, &k.to_lowercase(), errs);
        total += k.len() + v.as_str().map_or(0, str::len);
    }
    if total > 256 * 1024 {
        errs.push(Cause {
            reason: "FieldValueTooLong",
            message: "Too long: may not be more than 262144 bytes".into(),
            field: field.to_string(),
        });
    }
}

/// A required non-empty string at `pointer`; reports `field` when missing.
pub fn require_str<'a>(
    obj: &'a Value,
    pointer: &str,
    field: &str,
    errs: &mut Vec<Cause>,
) -> Option<&'a str> {
    match obj.pointer(pointer).and_then(Value::as_str) {
        Some(s) if !s.is_empty() => Some(s),
        _ => {
            errs.push(Cause::required(field));
            None
        }
    }
}

/// A non-negative integer at `pointer`, if present.
pub fn non_negative(obj: &Value, pointer: &str, field: &str, errs: &mut Vec<Cause>) {
    if let Some(v) = obj.pointer(pointer)
        && v.as_i64().is_some_and(|n| n < 0)
    {
        errs.push(Cause::invalid(
            field,
            v,
            "must be greater than or equal to 0",
        ));
    }
}

/// A field that may not change on update.
pub fn immutable(new: &Value, old: &Value, pointer: &str, field: &str, errs: &mut Vec<Cause>) {
    let n = new.pointer(pointer).unwrap_or(&Value::Null);
    let o = old.pointer(pointer).unwrap_or(&Value::Null);
    if n != o {
        errs.push(Cause::invalid(field, n, "field is immutable"));
    }
}

/// The items of the array at `pointer`, mutably; nothing when it is absent. (Indexing a
/// `Value` mutably would insert a `null` for a missing key, which then gets stored.)
pub fn each_mut<'a>(v: &'a mut Value, pointer: &str) -> impl Iterator<Item = &'a mut Value> {
    v.pointer_mut(pointer)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// Sets `pointer` to `value` when it is absent or null, creating parent objects.
pub fn set_default(obj: &mut Value, pointer: &str, value: Value) {
    if obj.pointer(pointer).is_some_and(|v| !v.is_null()) {
        return;
    }
    let mut cur = obj;
    let parts: Vec<String> = pointer
        .trim_start_matches('/')
        .split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Default::default());
        }
        let map = cur.as_object_mut().expect("made an object above");
        if i == parts.len() - 1 {
            map.insert(part.clone(), value);
            return;
        }
        cur = map
            .entry(part.clone())
            .or_insert_with(|| Value::Object(Default::default()));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subdomain_parts_are_bounded_only_by_the_whole_name() {
        assert!(super::is_dns1123_subdomain(&format!(
            "csi-{}",
            "a".repeat(64)
        )));
        assert!(super::is_dns1123_subdomain(&"a".repeat(253)));
        assert!(!super::is_dns1123_subdomain(&"a".repeat(254)));
        assert!(!super::is_dns1123_subdomain("a..b"));
        assert!(!super::is_dns1123_subdomain(""));
        assert!(!super::is_dns1123_label(&"a".repeat(64)));
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(is_dns1123_label("web-1"));
        assert!(!is_dns1123_label("Web"));
        assert!(!is_dns1123_label("-a"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("a..b"));
        let mut errs = vec![];
        check_name(NameRule::Subdomain, "metadata.name", "Bad_Name", &mut errs);
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0]
                .message
                .starts_with("Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain")
        );
    }

    #[test]
    fn labels_and_defaults() {
        let mut errs = vec![];
        check_labels(
            "metadata.labels",
            &json!({"app": "web", "example.com/x": "y", "bad key": "v", "k": "-bad"}),
            &mut errs,
        );
        assert_eq!(errs.len(), 2);
        let mut obj = json!({"spec": {}});
        set_default(&mut obj, "/spec/strategy/type", json!("RollingUpdate"));
        set_default(&mut obj, "/spec/strategy/type", json!("Recreate"));
        assert_eq!(obj["spec"]["strategy"]["type"], "RollingUpdate");
    }
}
