//! JSON values as structured-merge-diff sees them: equality and a total order where
//! integers and floats compare by number, and the two text forms upstream writes values
//! in (Go's `encoding/json`, and `value.ToString` for paths in messages), so that
//! managedFields keys and conflict messages come out byte for byte as upstream's.

use std::cmp::Ordering;
use std::fmt::Write;

use serde_json::{Number, Value};

/// A JSON number as Go decodes it into an `interface{}` holding int64 or float64.
#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

fn num(n: &Number) -> Num {
    match n.as_i64() {
        Some(i) => Num::Int(i),
        None => Num::Float(n.as_f64().unwrap_or(f64::NAN)),
    }
}

fn float(n: Num) -> f64 {
    match n {
        Num::Int(i) => i as f64,
        Num::Float(f) => f,
    }
}

/// Whether two values are equal, `1` and `1.0` included.
pub(super) fn equals(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (num(x), num(y)) {
            (Num::Int(x), Num::Int(y)) => x == y,
            (x, y) => float(x) == float(y),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| equals(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| equals(x, y)))
        }
        _ => a == b,
    }
}

/// Rank of a value's kind in upstream's order: floats and ints (compared by number),
/// strings, bools, lists, maps, null.
fn rank(v: &Value) -> u8 {
    match v {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    }
}

/// The total order of `value.Compare`.
pub(super) fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (num(x), num(y)) {
            (Num::Int(x), Num::Int(y)) => x.cmp(&y),
            (x, y) => float(x).total_cmp(&float(y)),
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .zip(y)
            .map(|(x, y)| compare(x, y))
            .find(|order| order.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => {
            // Keys in lexical order; a map that lacks a key the other has is the
            // greater one at that key, a map that runs out of keys the lesser.
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for (i, key) in keys.into_iter().enumerate() {
                let order = if i == x.len() {
                    Ordering::Less
                } else if i == y.len() {
                    Ordering::Greater
                } else {
                    match (x.get(key), y.get(key)) {
                        (None, _) => Ordering::Greater,
                        (_, None) => Ordering::Less,
                        (Some(x), Some(y)) => compare(x, y),
                    }
                };
                if order.is_ne() {
                    return order;
                }
            }
            Ordering::Equal
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// `v` as Go's `encoding/json` writes it: object keys sorted, `<`, `>` and `&` escaped.
pub(super) fn go_json(v: &Value) -> String {
    let mut out = String::new();
    write_go_json(&mut out, v);
    out
}

fn write_go_json(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match num(n) {
            Num::Int(i) => out.push_str(&i.to_string()),
            Num::Float(f) => out.push_str(&go_float(f, 1e-6, 1e21, false)),
        },
        Value::String(s) => write_go_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_string(out, key);
                out.push(':');
                write_go_json(out, value);
            }
            out.push('}');
        }
    }
}

/// A JSON string literal, HTML-safe like Go's encoder.
pub(super) fn write_go_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float in the shortest form that reads back the same, in exponent notation when
/// `|f| < small` or `|f| >= large`, as Go's `strconv` does for `encoding/json`
/// (exponent without leading zeros) and for `%v` (`go_exponent`: at least two digits).
fn go_float(f: f64, small: f64, large: f64, go_exponent: bool) -> String {
    if f == 0.0 || (f.abs() >= small && f.abs() < large) {
        return format!("{f}");
    }
    let formatted = format!("{f:e}");
    let (mantissa, exponent) = formatted.split_once('e').unwrap_or((&formatted, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let sign = if exponent < 0 { '-' } else { '+' };
    if go_exponent {
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        format!("{mantissa}e{sign}{}", exponent.abs())
    }
}

/// `v` as upstream's `value.ToString` prints it inside a path: strings quoted as Go's
/// `%q` does, floats as `%v`, maps as `key=value` pairs run together.
pub(super) fn go_display(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match num(n) {
            Num::Int(i) => i.to_string(),
            Num::Float(f) => go_float(f, 1e-4, 1e6, true),
        },
        Value::String(s) => go_quote(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_display).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| format!("{key}={}", go_display(value)))
            .collect(),
    }
}

/// A string as Go's `strconv.Quote` writes it.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn numbers_compare_by_value() {
        assert!(equals(&json!(1), &json!(1.0)));
        assert!(equals(&json!({"a": [1, 2.5]}), &json!({"a": [1.0, 2.5]})));
        assert!(!equals(&json!(1), &json!("1")));
        assert_eq!(compare(&json!(2), &json!(10)), Ordering::Less);
        assert_eq!(compare(&json!(1.5), &json!(1)), Ordering::Greater);
    }

    #[test]
    fn kinds_order_as_upstream() {
        let ordered = [
            json!(1),
            json!("a"),
            json!(false),
            json!([1]),
            json!({"a": 1}),
            json!(null),
        ];
        for pair in ordered.windows(2) {
            assert_eq!(compare(&pair[0], &pair[1]), Ordering::Less, "{pair:?}");
        }
        assert_eq!(compare(&json!({"a": 1}), &json!({"b": 1})), Ordering::Less);
        assert_eq!(
            compare(&json!({"a": 1}), &json!({"a": 1, "b": 1})),
            Ordering::Less
        );
        assert_eq!(compare(&json!([1, 2]), &json!([1])), Ordering::Greater);
    }

    #[test]
    fn go_encodings() {
        assert_eq!(
            go_json(&json!({"z": 1, "a": "<&>", "f": 1.5, "n": null})),
            r#"{"a":"\u003c\u0026\u003e","f":1.5,"n":null,"z":1}"#
        );
        assert_eq!(go_json(&json!("a\u{1}\n")), r#""a\u0001\n""#);
        assert_eq!(go_json(&json!(1e21)), "1e+21");
        assert_eq!(go_json(&json!(1e-7)), "1e-7");
        assert_eq!(go_display(&json!("web")), r#""web""#);
        assert_eq!(go_display(&json!(80)), "80");
        assert_eq!(go_display(&json!(1e6)), "1e+06");
        assert_eq!(go_display(&json!(123456.0)), "123456");
        assert_eq!(go_quote("a\"b\u{1}"), r#""a\"b\x01""#);
    }
}
