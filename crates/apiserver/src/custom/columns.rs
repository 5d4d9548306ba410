//! The simple JSONPath of additionalPrinterColumns and selectableFields:
//! `.spec.replicas`, `.status.conditions[0].type`,
//! `.status.conditions[?(@.type=="Ready")].status`, `.spec.items[*].name`.

use serde_json::Value;

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    /// `[?(@.key=="value")]`
    Filter {
        key: String,
        value: Value,
    },
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath(Vec<Step>);

impl JsonPath {
    /// Parses `.a.b[0]` (also with the `{...}` braces kubectl users write).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let text = text
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or(text);
        let mut rest = text.strip_prefix('.').unwrap_or(text);
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('[') {
                let end = after
                    .find(']')
                    .ok_or_else(|| format!("unterminated [ in {text}"))?;
                steps.push(bracket(&after[..end])?);
                rest = &after[end + 1..];
                rest = rest.strip_prefix('.').unwrap_or(rest);
            } else {
                let end = rest.find(['.', '[']).unwrap_or(rest.len());
                if end == 0 {
                    return Err(format!("empty field name in {text}"));
                }
                steps.push(Step::Field(rest[..end].to_string()));
                rest = &rest[end..];
                rest = rest.strip_prefix('.').unwrap_or(rest);
            }
        }
        Ok(JsonPath(steps))
    }

    /// Every value the path reaches in `v`.
    pub fn find<'a>(&self, v: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![v];
        for step in &self.0 {
            let mut next = Vec::new();
            for value in current {
                match step {
                    Step::Field(name) => next.extend(value.get(name)),
                    Step::Index(i) => next.extend(value.get(*i)),
                    Step::All => match value {
                        Value::Array(list) => next.extend(list.iter()),
                        Value::Object(map) => next.extend(map.values()),
                        _ => {}
                    },
                    Step::Filter { key, value: want } => {
                        next.extend(
                            value
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter(|item| item.get(key) == Some(want)),
                        );
                    }
                }
            }
            current = next;
        }
        current
    }
}

fn bracket(inner: &str) -> Result<Step, String> {
    let inner = inner.trim();
    if inner == "*" {
        return Ok(Step::All);
    }
    if let Ok(i) = inner.parse() {
        return Ok(Step::Index(i));
    }
    let filter = inner
        .strip_prefix("?(@.")
        .and_then(|f| f.strip_suffix(')'))
        .ok_or_else(|| format!("unsupported JSONPath step [{inner}]"))?;
    let (key, value) = filter
        .split_once("==")
        .ok_or_else(|| format!("unsupported JSONPath filter [{inner}]"))?;
    let value = value.trim();
    let value = match value.strip_prefix(['"', '\'']) {
        Some(quoted) => Value::String(quoted[..quoted.len().saturating_sub(1)].to_string()),
        None => serde_json::from_str(value).map_err(|e| format!("bad filter value: {e}"))?,
    };
    Ok(Step::Filter {
        key: key.trim().to_string(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_reach_fields_indexes_and_filtered_items() {
        let obj = json!({
            "spec": {"replicas": 3, "items": [{"name": "a"}, {"name": "b"}]},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}
        });
        let find = |p: &str| -> Vec<Value> {
            JsonPath::parse(p)
                .unwrap()
                .find(&obj)
                .into_iter()
                .cloned()
                .collect()
        };
        assert_eq!(find(".spec.replicas"), [json!(3)]);
        assert_eq!(find("{.spec.items[1].name}"), [json!("b")]);
        assert_eq!(find(".spec.items[*].name"), [json!("a"), json!("b")]);
        assert_eq!(
            find(r#".status.conditions[?(@.type=="Ready")].status"#),
            [json!("True")]
        );
        assert!(find(".spec.missing").is_empty());
        assert!(JsonPath::parse(".a[?bad]").is_err());
    }
}
