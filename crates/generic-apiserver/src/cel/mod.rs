//! The Common Expression Language as the apiserver evaluates it (the `cel` crate): the
//! environment every expression compiles in — CEL's standard library with the strings
//! and lists extensions and Kubernetes' own libraries ([`library`], [`quantity`], [`network`]) — and objects as
//! CEL values. Used by custom resources'
//! validation rules and admission webhooks' match conditions.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::objects::Map as CelMap;
use cel::{Env, Value as Cel};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::Value;

use crate::schema::{additional, items};

/// Implements CEL's `Val` for a `Copy` Rust type compared by `==`, as the opaque CEL
/// type `$cel` (Kubernetes' quantities, addresses, networks).
macro_rules! opaque {
    ($ty:ty, $cel:expr) => {
        impl cel::common::value::Val for $ty {
            fn get_type(&self) -> &cel::common::types::Type {
                <Self as cel::common::value::Val>::cel_type()
            }
            fn cel_type() -> &'static cel::common::types::Type {
                &$cel
            }
            fn equals(&self, other: &dyn cel::common::value::Val) -> bool {
                other.downcast_ref::<$ty>() == Some(self)
            }
            #[allow(clippy::clone_on_copy)]
            fn clone_as_boxed<'v>(&self) -> Box<dyn cel::common::value::Val + 'v> {
                Box::new(self.clone())
            }
            fn as_any(&self) -> Option<&dyn std::any::Any> {
                Some(self)
            }
        }
        impl cel::common::value::StaticVal for $ty {}
    };
}

mod library;
mod network;
mod quantity;
mod url;

/// Compiles and runs `expression` in `context`: its value, or why it has none.
pub fn run(
    env: &Env,
    expression: &str,
    context: &cel::Context<'_, '_>,
) -> Result<cel::Value, String> {
    env.compile(expression)
        .map_err(|e| e.to_string())
        .and_then(|p| p.execute(context).map_err(|e| e.to_string()))
}

/// The environment, made once (the standard library registers hundreds of overloads).
pub fn env() -> Arc<Env> {
    static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
        let mut env = Env::stdlib();
        // Both extensions declare only new names on a fresh standard library.
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_extension(cel::extensions::lists);
        let _ = env.add_extension(library::extension);
        let _ = env.add_extension(quantity::extension);
        let _ = env.add_extension(network::extension);
        let _ = env.add_extension(url::extension);
        Arc::new(env)
    });
    ENV.clone()
}

/// A string of a schema format CEL has a type for, as that type; `None` leaves it a
/// string (other formats, or a value validation has already refused).
fn formatted(format: &str, text: &str) -> Option<Cel> {
    use base64::Engine;
    Some(match format {
        "date-time" => Cel::Timestamp(chrono::DateTime::parse_from_rfc3339(text).ok()?),
        "date" => {
            let date = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
            Cel::Timestamp(
                date.and_time(chrono::NaiveTime::MIN)
                    .and_utc()
                    .fixed_offset(),
            )
        }
        "duration" => {
            let duration: jiff::SignedDuration = text.parse().ok()?;
            let nanos = i64::try_from(duration.as_nanos()).ok()?;
            Cel::Duration(chrono::Duration::nanoseconds(nanos))
        }
        "byte" => Cel::Bytes(Arc::new(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()?,
        )),
        _ => return None,
    })
}

/// Evaluates an expression without variables: the libraries' tests.
#[cfg(test)]
fn eval(expr: &str) -> Result<cel::Value, String> {
    let env = env();
    let program = env.compile(expr).map_err(|e| e.to_string())?;
    program
        .execute(&cel::Context::with_env(env))
        .map_err(|e| e.to_string())
}

/// A JSON value as CEL sees it, typed by schema `s` where there is one (`number` is a
/// double, `integer` an int, strings of format `date-time` and `date` timestamps, of
/// `duration` durations and of `byte` bytes, as upstream types them); `resource` for
/// the root and embedded resources of a custom kind, whose metadata shows only `name`
/// and `generateName`, as upstream's.
pub fn to_cel(s: Option<&JSONSchemaProps>, v: &Value, resource: bool) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => {
            let double = s.is_some_and(|s| s.type_.as_deref() == Some("number"));
            match (n.as_i64(), n.as_u64()) {
                (Some(i), _) if !double => Cel::Int(i),
                (None, Some(u)) if !double => Cel::UInt(u),
                _ => Cel::Float(n.as_f64().unwrap_or_default()),
            }
        }
        Value::String(text) => s
            .and_then(|s| formatted(s.format.as_deref()?, text))
            .unwrap_or_else(|| Cel::String(Arc::new(text.clone()))),
        Value::Array(list) => {
            let item = s.and_then(items);
            Cel::List(Arc::new(
                list.iter().map(|v| to_cel(item, v, false)).collect(),
            ))
        }
        Value::Object(map) => {
            let fields: HashMap<String, Cel> = map
                .iter()
                .map(|(k, value)| {
                    let value = if resource && k == "metadata" {
                        let shown = ["name", "generateName"]
                            .iter()
                            .filter_map(|f| Some((f.to_string(), value.get(*f)?.clone())))
                            .collect();
                        to_cel(None, &Value::Object(shown), false)
                    } else {
                        let p =
                            s.and_then(|s| s.properties.as_ref()?.get(k).or_else(|| additional(s)));
                        let embedded =
                            p.is_some_and(|p| p.x_kubernetes_embedded_resource == Some(true));
                        to_cel(p, value, embedded)
                    };
                    (k.clone(), value)
                })
                .collect();
            Cel::Map(CelMap::from(fields))
        }
    }
}
