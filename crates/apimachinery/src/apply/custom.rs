//! The structural schema of a custom resource, from its definition's OpenAPI v3 schema,
//! as upstream's structured-merge-diff reads one: objects with `properties` are
//! structs (atomic with `x-kubernetes-map-type: atomic`), objects with
//! `additionalProperties` are maps of their values' type, `x-kubernetes-list-type`
//! makes a list a set or a map keyed by `x-kubernetes-list-map-keys` (any other list
//! is atomic), and what `x-kubernetes-preserve-unknown-fields` keeps is free-form.
//!
//! A definition's schema is made into one of these once, when its kind is made, and
//! lives as long as the kind (see [`CustomSchema::leak`]).

use serde_json::Value;

use super::schema::Key;

/// A custom resource's structural schema; give it to [`super::Endpoint::schema`].
#[derive(Debug)]
pub struct CustomSchema {
    pub(super) root: Node,
}

/// How a value of one schema node merges.
#[derive(Debug)]
pub(super) enum Node {
    /// A scalar, or a list that is atomic.
    Plain,
    /// Free-form JSON (`x-kubernetes-preserve-unknown-fields` without properties).
    Deduced,
    /// Owned and replaced as a whole (`x-kubernetes-map-type: atomic`).
    Atomic,
    /// `metadata` of the object (or of an embedded resource).
    ObjectMeta,
    /// Declared fields; undeclared ones are free-form when unknown fields are kept.
    Struct {
        fields: Vec<(String, Node)>,
        keeps_unknown: bool,
    },
    /// `additionalProperties`: each key an element of the given type.
    Map(Box<Node>),
    /// `x-kubernetes-list-type: set`.
    Set,
    /// `x-kubernetes-list-type: map`.
    Keyed(&'static [Key], Box<Node>),
}

impl CustomSchema {
    /// The schema of a definition version's `openAPIV3Schema`, made to live as long as
    /// the program (as the custom kind that uses it).
    pub fn leak(schema: &Value) -> &'static CustomSchema {
        let mut root = node(schema);
        // Every object's metadata is ObjectMeta, whatever the schema says of it.
        if let Node::Struct { fields, .. } = &mut root {
            fields.retain(|(name, _)| name != "metadata");
            fields.push(("metadata".into(), Node::ObjectMeta));
        } else {
            root = Node::Struct {
                fields: vec![("metadata".into(), Node::ObjectMeta)],
                keeps_unknown: true,
            };
        }
        Box::leak(Box::new(CustomSchema { root }))
    }
}

fn node(s: &Value) -> Node {
    let keeps_unknown = s["x-kubernetes-preserve-unknown-fields"] == true;
    if s["x-kubernetes-embedded-resource"] == true {
        let mut fields = properties(s);
        fields.retain(|(name, _)| name != "metadata");
        fields.push(("metadata".into(), Node::ObjectMeta));
        return Node::Struct {
            fields,
            keeps_unknown,
        };
    }
    if s["type"] == "array" {
        return match s["x-kubernetes-list-type"].as_str() {
            Some("set") => Node::Set,
            Some("map") => {
                let items = &s["items"];
                let keys: Vec<Key> = s["x-kubernetes-list-map-keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|name| key(name, &items["properties"][name]["default"]))
                    .collect();
                Node::Keyed(Box::leak(keys.into_boxed_slice()), Box::new(node(items)))
            }
            _ => Node::Plain,
        };
    }
    let is_object = s["type"] == "object" || s["properties"].is_object();
    if !is_object {
        return if keeps_unknown && s["type"].is_null() {
            Node::Deduced
        } else {
            Node::Plain
        };
    }
    if s["x-kubernetes-map-type"] == "atomic" {
        return Node::Atomic;
    }
    if s["additionalProperties"].is_object() {
        return Node::Map(Box::new(node(&s["additionalProperties"])));
    }
    if !s["properties"].is_object() && (keeps_unknown || s["additionalProperties"] == true) {
        return Node::Deduced;
    }
    Node::Struct {
        fields: properties(s),
        keeps_unknown,
    }
}

fn properties(s: &Value) -> Vec<(String, Node)> {
    s["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, prop)| (name.clone(), node(prop)))
        .collect()
}

/// A list-map key, with the default its property declares (what an item that omits it
/// is identified by).
fn key(name: &str, default: &Value) -> Key {
    let key = Key::new(Box::leak(name.to_owned().into_boxed_str()));
    match default {
        Value::String(s) => key.or_str(Box::leak(s.clone().into_boxed_str())),
        Value::Number(n) => match n.as_i64() {
            Some(i) => key.or_int(i),
            None => key,
        },
        _ => key,
    }
}
