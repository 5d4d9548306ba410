//! The structural schema server-side apply merges and tracks ownership by: for each
//! field, whether it is owned and replaced as a whole (atomic), a struct whose fields are
//! owned one by one, a set of scalars, or a list of objects keyed by some of their
//! fields (`x-kubernetes-list-type: map`).
//!
//! The data of built-in kinds lives in the generated `table` module beside this one. It
//! lists only the types that hold something other than plain fields below them: a field
//! it does not list is [`Ty::Plain`].

use super::custom::Node;
use super::table::{ROOTS, TYPES};

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// The `default` of a list-map key field: the value an item that omits the field is
/// identified by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyDefault {
    Str(&'static str),
    Int(i64),
}

/// A field of the items of a keyed list (`x-kubernetes-list-map-keys`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Key {
    pub name: &'static str,
    pub default: Option<KeyDefault>,
}

impl Key {
    pub(super) const fn new(name: &'static str) -> Self {
        Key {
            name,
            default: None,
        }
    }

    pub(super) const fn or_str(self, default: &'static str) -> Self {
        Key {
            default: Some(KeyDefault::Str(default)),
            ..self
        }
    }

    pub(super) const fn or_int(self, default: i64) -> Self {
        Key {
            default: Some(KeyDefault::Int(default)),
            ..self
        }
    }
}

/// The type of a field as the table declares it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ty {
    /// A scalar, or an object whose fields are all plain, merged and owned field by
    /// field; a list is atomic.
    Plain,
    /// Owned and replaced as a whole: `x-kubernetes-map-type: atomic` on a map or
    /// struct. (An atomic list is [`Plain`](Self::Plain): every list that is not a
    /// set or keyed is atomic.)
    Atomic,
    /// `x-kubernetes-list-type: set`: a list of scalars, each owned on its own.
    Set,
    /// A struct with fields that are not plain, named by its definition.
    Struct(&'static str),
    /// `x-kubernetes-list-type: map`: items identified by their key fields, of the
    /// given type.
    Keyed(&'static [Key], &'static Ty),
}

/// The non-plain fields of one type, named by its OpenAPI definition name.
#[derive(Debug)]
pub(super) struct TypeSchema {
    pub name: &'static str,
    pub fields: &'static [(&'static str, Ty)],
}

impl TypeSchema {
    pub(super) const fn new(name: &'static str, fields: &'static [(&'static str, Ty)]) -> Self {
        TypeSchema { name, fields }
    }
}

/// How a JSON value of some type is walked.
#[derive(Clone, Copy, Debug)]
pub(super) enum TypeRef {
    /// See [`Ty::Plain`]: objects are structs whose every key is a field.
    Plain,
    /// A value of unknown type: objects are maps (each key owned as a whole, besides
    /// what is below it), lists are atomic.
    Deduced,
    /// The root of a kind the table does not know: [`Deduced`](Self::Deduced), but
    /// with `metadata` of type `ObjectMeta`, as every kind has.
    UnknownKind,
    Atomic,
    Set,
    Struct(&'static TypeSchema),
    Keyed(&'static [Key], &'static Ty),
    /// A node of a custom resource's schema (a struct, map or keyed list).
    Custom(&'static Node),
}

/// How values of a [`TypeRef`] that are JSON objects merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MapKind {
    /// Owned and replaced as a whole.
    Atomic,
    /// Each key is a declared field of a struct.
    Struct,
    /// Each key is an element of a map: owned as a whole as well as below.
    Map,
}

/// How the items of a list that is not atomic are identified.
#[derive(Clone, Copy, Debug)]
pub(super) enum ListKind {
    /// By their (scalar) value.
    Set,
    /// By their key fields.
    Keyed(&'static [Key]),
}

impl TypeRef {
    /// The root type of an endpoint's kind: its custom schema's, or the table's.
    pub(super) fn of_endpoint(endpoint: &super::Endpoint) -> TypeRef {
        match endpoint.schema {
            Some(schema) => TypeRef::of_node(&schema.root),
            None => TypeRef::root(endpoint.group, endpoint.version, endpoint.kind),
        }
    }

    /// The root type of a kind; `group` is `""` for the core group.
    pub(super) fn root(group: &str, version: &str, kind: &str) -> TypeRef {
        ROOTS
            .iter()
            .find(|(g, v, k, _)| (*g, *v, *k) == (group, version, kind))
            .and_then(|(_, _, _, name)| named(name))
            .map_or(TypeRef::UnknownKind, TypeRef::Struct)
    }

    /// Whether this is the root of a kind the table knows.
    pub(super) fn is_known_kind(self) -> bool {
        matches!(self, TypeRef::Struct(_))
    }

    fn of_node(node: &'static Node) -> TypeRef {
        match node {
            Node::Plain => TypeRef::Plain,
            Node::Deduced => TypeRef::Deduced,
            Node::Atomic => TypeRef::Atomic,
            Node::Set => TypeRef::Set,
            Node::ObjectMeta => named(OBJECT_META).map_or(TypeRef::Deduced, TypeRef::Struct),
            Node::Struct { .. } | Node::Map(_) | Node::Keyed(..) => TypeRef::Custom(node),
        }
    }

    fn of(ty: &'static Ty) -> TypeRef {
        match ty {
            Ty::Plain => TypeRef::Plain,
            Ty::Atomic => TypeRef::Atomic,
            Ty::Set => TypeRef::Set,
            // The table test checks that every name resolves.
            Ty::Struct(name) => named(name).map_or(TypeRef::Plain, TypeRef::Struct),
            Ty::Keyed(keys, element) => TypeRef::Keyed(keys, element),
        }
    }

    /// The type of the value at key `name` of an object of this type.
    pub(super) fn field(self, name: &str) -> TypeRef {
        match self {
            TypeRef::Struct(schema) => schema
                .fields
                .iter()
                .find(|(field, _)| *field == name)
                .map_or(TypeRef::Plain, |(_, ty)| TypeRef::of(ty)),
            TypeRef::Deduced => TypeRef::Deduced,
            TypeRef::UnknownKind if name == "metadata" => {
                named(OBJECT_META).map_or(TypeRef::Deduced, TypeRef::Struct)
            }
            TypeRef::UnknownKind => TypeRef::Deduced,
            TypeRef::Custom(Node::Struct {
                fields,
                keeps_unknown,
            }) => match fields.iter().find(|(field, _)| field == name) {
                Some((_, node)) => TypeRef::of_node(node),
                None if *keeps_unknown => TypeRef::Deduced,
                None => TypeRef::Plain,
            },
            TypeRef::Custom(Node::Map(element)) => TypeRef::of_node(element),
            TypeRef::Plain
            | TypeRef::Atomic
            | TypeRef::Set
            | TypeRef::Keyed(..)
            | TypeRef::Custom(_) => TypeRef::Plain,
        }
    }

    /// The type of the items of a list of this type.
    pub(super) fn element(self) -> TypeRef {
        match self {
            TypeRef::Keyed(_, element) => TypeRef::of(element),
            TypeRef::Custom(Node::Keyed(_, element)) => TypeRef::of_node(element),
            _ => TypeRef::Plain,
        }
    }

    pub(super) fn map_kind(self) -> MapKind {
        match self {
            TypeRef::Plain | TypeRef::Struct(_) => MapKind::Struct,
            TypeRef::Custom(Node::Struct { .. }) => MapKind::Struct,
            TypeRef::Deduced | TypeRef::UnknownKind => MapKind::Map,
            TypeRef::Custom(Node::Map(_)) => MapKind::Map,
            TypeRef::Custom(_) => MapKind::Atomic,
            // A set or keyed list given an object: a value the schema does not expect,
            // taken whole.
            TypeRef::Atomic | TypeRef::Set | TypeRef::Keyed(..) => MapKind::Atomic,
        }
    }

    /// How the items of a list of this type are identified; `None` when the list is
    /// atomic.
    pub(super) fn list_kind(self) -> Option<ListKind> {
        match self {
            TypeRef::Set => Some(ListKind::Set),
            TypeRef::Keyed(keys, _) => Some(ListKind::Keyed(keys)),
            TypeRef::Custom(Node::Keyed(keys, _)) => Some(ListKind::Keyed(keys)),
            _ => None,
        }
    }
}

fn named(name: &str) -> Option<&'static TypeSchema> {
    TYPES
        .binary_search_by(|schema| schema.name.cmp(name))
        .ok()
        .map(|index| &TYPES[index])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(ty: &str, name: &str) -> TypeRef {
        TypeRef::Struct(named(ty).unwrap()).field(name)
    }

    #[test]
    fn table_is_sorted_and_its_references_resolve() {
        assert!(TYPES.windows(2).all(|pair| pair[0].name < pair[1].name));
        fn check(ty: &Ty, context: &str) {
            match ty {
                Ty::Struct(name) => assert!(named(name).is_some(), "{context} names {name}"),
                Ty::Keyed(keys, element) => {
                    assert!(!keys.is_empty(), "{context}");
                    check(element, context);
                }
                Ty::Plain | Ty::Atomic | Ty::Set => {}
            }
        }
        for schema in TYPES {
            for (name, ty) in schema.fields {
                assert_ne!(*ty, Ty::Plain, "{}.{name} is listed", schema.name);
                check(ty, &format!("{}.{name}", schema.name));
            }
        }
        for (group, version, kind, name) in ROOTS {
            let root = TypeRef::root(group, version, kind);
            assert!(
                matches!(root, TypeRef::Struct(s) if s.name == *name),
                "{kind}"
            );
        }
    }

    #[test]
    fn known_list_and_map_types() {
        let containers = field("io.k8s.api.core.v1.PodSpec", "containers");
        let TypeRef::Keyed(keys, _) = containers else {
            panic!("containers is keyed: {containers:?}")
        };
        assert_eq!(keys, &[Key::new("name").or_str("")]);
        let TypeRef::Keyed(keys, _) = containers.element().field("ports") else {
            panic!("ports is keyed")
        };
        let names: Vec<_> = keys.iter().map(|key| (key.name, key.default)).collect();
        assert_eq!(
            names,
            [
                ("containerPort", Some(KeyDefault::Int(0))),
                ("protocol", Some(KeyDefault::Str("TCP")))
            ]
        );
        let meta = OBJECT_META;
        assert!(matches!(field(meta, "finalizers"), TypeRef::Set));
        assert!(matches!(field(meta, "labels"), TypeRef::Plain));
        let owners = field(meta, "ownerReferences");
        assert!(matches!(
            owners,
            TypeRef::Keyed([Key { name: "uid", .. }], Ty::Atomic)
        ));
        let selector = field("io.k8s.api.apps.v1.DeploymentSpec", "selector");
        assert_eq!(selector.map_kind(), MapKind::Atomic);
        let node_selector = field("io.k8s.api.core.v1.PodSpec", "nodeSelector");
        assert_eq!(node_selector.map_kind(), MapKind::Atomic);
        let tolerations = field("io.k8s.api.core.v1.PodSpec", "tolerations");
        assert!(tolerations.list_kind().is_none());
    }

    #[test]
    fn unknown_kinds_are_deduced_with_typed_metadata() {
        let root = TypeRef::root("example.com", "v1", "Widget");
        assert!(!root.is_known_kind());
        assert_eq!(root.map_kind(), MapKind::Map);
        assert_eq!(root.field("spec").map_kind(), MapKind::Map);
        assert!(root.field("spec").list_kind().is_none());
        assert!(matches!(
            root.field("metadata").field("finalizers"),
            TypeRef::Set
        ));
        assert!(TypeRef::root("apps", "v1", "Deployment").is_known_kind());
    }
}
