//! Patch metadata of built-in Kubernetes types: for each field that matters to a
//! strategic merge patch, whether it is a nested object or a list, the type of its
//! value (or list items), its `x-kubernetes-patch-strategy` and its
//! `x-kubernetes-patch-merge-key`.
//!
//! The data lives in the generated `table` module beside this one. It lists only the
//! types that hold a list or an annotated field somewhere below them: any other field
//! gets the default treatment (objects merge key by key, lists and scalars are
//! replaced), which needs no metadata.

use super::table::{ROOTS, TYPES};

/// A field's `x-kubernetes-patch-strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchStrategy {
    /// Nothing declared: objects merge key by key, lists are replaced whole.
    Default,
    /// `merge`: lists of objects merge item by item on the merge key, lists of
    /// primitives are unioned.
    Merge,
    /// `replace`: the patch value replaces the field whole, even an object.
    Replace,
    /// `retainKeys`: a client patch drops the keys it does not mention (it says so with
    /// a `$retainKeys` directive, which is what the server acts on).
    RetainKeys,
    /// `merge,retainKeys`: [`Merge`](Self::Merge) for the list, and
    /// [`RetainKeys`](Self::RetainKeys) for each of its items.
    MergeRetainKeys,
}

impl PatchStrategy {
    /// The `x-kubernetes-patch-strategy` value, as OpenAPI documents spell it.
    pub fn extension(self) -> Option<&'static str> {
        match self {
            Self::Default => None,
            Self::Merge => Some("merge"),
            Self::Replace => Some("replace"),
            Self::RetainKeys => Some("retainKeys"),
            Self::MergeRetainKeys => Some("merge,retainKeys"),
        }
    }

    /// Whether lists under this strategy merge rather than being replaced.
    pub fn merges_lists(self) -> bool {
        matches!(self, Self::Merge | Self::MergeRetainKeys)
    }
}

/// Whether a field holds one nested object or a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Object,
    List,
}

/// Patch metadata of one field of a [`TypeMeta`].
#[derive(Debug, PartialEq, Eq)]
pub struct FieldMeta {
    /// The JSON field name.
    pub name: &'static str,
    pub shape: Shape,
    /// Definition name of the object, or of the list items, when that type is in the
    /// table; `None` for primitives and for objects without metadata.
    pub element: Option<&'static str>,
    pub strategy: PatchStrategy,
    /// The key that identifies items of a merging list of objects.
    pub merge_key: Option<&'static str>,
}

impl FieldMeta {
    /// The type of the object, or of each list item, this field holds.
    pub fn value_type(&self) -> TypeRef {
        self.element
            .and_then(TypeRef::named)
            .unwrap_or(TypeRef::UNTYPED)
    }

    /// Declares `strategy: merge` on a list of primitives.
    pub(super) const fn merge(self) -> Self {
        FieldMeta {
            strategy: PatchStrategy::Merge,
            ..self
        }
    }

    /// Declares `strategy: merge` with a merge key on a list of objects.
    pub(super) const fn merge_by(self, key: &'static str) -> Self {
        FieldMeta {
            strategy: PatchStrategy::Merge,
            merge_key: Some(key),
            ..self
        }
    }

    /// Adds `retainKeys` to the declared strategy.
    pub(super) const fn retain_keys(self) -> Self {
        let strategy = match self.strategy {
            PatchStrategy::Merge => PatchStrategy::MergeRetainKeys,
            _ => PatchStrategy::RetainKeys,
        };
        FieldMeta { strategy, ..self }
    }

    /// Declares `strategy: replace`.
    pub(super) const fn replace(self) -> Self {
        FieldMeta {
            strategy: PatchStrategy::Replace,
            ..self
        }
    }
}

/// A nested object of type `ty`.
pub(super) const fn obj(name: &'static str, ty: &'static str) -> FieldMeta {
    FieldMeta {
        name,
        shape: Shape::Object,
        element: Some(ty),
        strategy: PatchStrategy::Default,
        merge_key: None,
    }
}

/// A list whose items carry no metadata (primitives, or plain objects).
pub(super) const fn list(name: &'static str) -> FieldMeta {
    FieldMeta {
        name,
        shape: Shape::List,
        element: None,
        strategy: PatchStrategy::Default,
        merge_key: None,
    }
}

/// A list of objects of type `ty`.
pub(super) const fn list_of(name: &'static str, ty: &'static str) -> FieldMeta {
    FieldMeta {
        element: Some(ty),
        ..list(name)
    }
}

/// The patch metadata of one type, named by its OpenAPI definition name
/// (e.g. `io.k8s.api.core.v1.PodSpec`).
#[derive(Debug, PartialEq, Eq)]
pub struct TypeMeta {
    pub name: &'static str,
    pub fields: &'static [FieldMeta],
}

impl TypeMeta {
    pub(super) const fn new(name: &'static str, fields: &'static [FieldMeta]) -> Self {
        TypeMeta { name, fields }
    }
}

/// The type of a JSON value being patched: a type from the table, or untyped (every
/// field gets the default treatment, as in a JSON merge patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeRef(Option<&'static TypeMeta>);

impl TypeRef {
    /// A value without patch metadata.
    pub const UNTYPED: TypeRef = TypeRef(None);

    /// The table entry for a definition name, if the type carries metadata.
    pub fn named(name: &str) -> Option<TypeRef> {
        TYPES
            .binary_search_by(|meta| meta.name.cmp(name))
            .ok()
            .map(|index| TypeRef(Some(&TYPES[index])))
    }

    /// The definition name, or `None` when untyped.
    pub fn name(self) -> Option<&'static str> {
        self.0.map(|meta| meta.name)
    }

    /// Every field with metadata.
    pub fn fields(self) -> &'static [FieldMeta] {
        self.0.map_or(&[], |meta| meta.fields)
    }

    /// The metadata of a field, if it has any.
    pub fn field(self, name: &str) -> Option<&'static FieldMeta> {
        self.0?.fields.iter().find(|field| field.name == name)
    }
}

/// The root type of a built-in resource kind; `group` is `""` for the core group.
///
/// `None` for kinds not in the table. Upstream refuses strategic merge patches of
/// custom resources (415 Unsupported Media Type) since they have no such metadata; a
/// built-in kind missing here could be patched as [`TypeRef::UNTYPED`] only if none of
/// its fields is annotated.
pub fn root_type(group: &str, version: &str, kind: &str) -> Option<TypeRef> {
    ROOTS
        .iter()
        .find(|(g, v, k, _)| (*g, *v, *k) == (group, version, kind))
        .and_then(|(_, _, _, name)| TypeRef::named(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(ty: &str, name: &str) -> &'static FieldMeta {
        TypeRef::named(ty)
            .unwrap_or_else(|| panic!("{ty} is in the table"))
            .field(name)
            .unwrap_or_else(|| panic!("{ty}.{name} is in the table"))
    }

    #[test]
    fn table_is_sorted_and_its_references_resolve() {
        assert!(TYPES.windows(2).all(|pair| pair[0].name < pair[1].name));
        for ty in TYPES {
            for field in ty.fields {
                if let Some(element) = field.element {
                    assert!(
                        TypeRef::named(element).is_some(),
                        "{}.{} names {element}",
                        ty.name,
                        field.name
                    );
                }
                if field.merge_key.is_some() || field.strategy.merges_lists() {
                    assert_eq!(field.shape, Shape::List, "{}.{}", ty.name, field.name);
                }
            }
        }
    }

    #[test]
    fn every_kind_has_a_root() {
        for (group, version, kind, name) in ROOTS {
            let root = root_type(group, version, kind).unwrap();
            assert_eq!(root.name(), Some(*name));
        }
        let deployment = root_type("apps", "v1", "Deployment").unwrap();
        assert_eq!(deployment.name(), Some("io.k8s.api.apps.v1.Deployment"));
        assert_eq!(root_type("example.com", "v1", "Widget"), None);
        assert_eq!(root_type("", "v1", "Deployment"), None);
    }

    #[test]
    fn known_strategies() {
        let volumes = field("io.k8s.api.core.v1.PodSpec", "volumes");
        assert_eq!(volumes.strategy, PatchStrategy::MergeRetainKeys);
        assert_eq!(volumes.merge_key, Some("name"));
        assert_eq!(
            volumes.value_type().name(),
            Some("io.k8s.api.core.v1.Volume")
        );

        let ports = field("io.k8s.api.core.v1.Container", "ports");
        assert_eq!(
            (ports.strategy, ports.merge_key),
            (PatchStrategy::Merge, Some("containerPort"))
        );
        let ports = field("io.k8s.api.core.v1.ServiceSpec", "ports");
        assert_eq!(ports.merge_key, Some("port"));

        let finalizers = field(
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            "finalizers",
        );
        assert_eq!(
            (finalizers.strategy, finalizers.merge_key),
            (PatchStrategy::Merge, None)
        );
        let owners = field(
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            "ownerReferences",
        );
        assert_eq!(owners.merge_key, Some("uid"));

        let tolerations = field("io.k8s.api.core.v1.PodSpec", "tolerations");
        assert_eq!(
            (tolerations.shape, tolerations.strategy),
            (Shape::List, PatchStrategy::Default)
        );
        let taints = field("io.k8s.api.core.v1.NodeSpec", "taints");
        assert_eq!(taints.strategy, PatchStrategy::Default);

        let strategy = field("io.k8s.api.apps.v1.DeploymentSpec", "strategy");
        assert_eq!(
            (strategy.shape, strategy.strategy),
            (Shape::Object, PatchStrategy::RetainKeys)
        );
        let selector = field("io.k8s.api.policy.v1.PodDisruptionBudgetSpec", "selector");
        assert_eq!(selector.strategy, PatchStrategy::Replace);
    }

    #[test]
    fn fields_without_metadata_are_absent() {
        let pod_spec = TypeRef::named("io.k8s.api.core.v1.PodSpec").unwrap();
        assert_eq!(pod_spec.field("nodeName"), None);
        assert_eq!(TypeRef::UNTYPED.field("containers"), None);
        assert_eq!(TypeRef::named("io.k8s.api.core.v1.NoSuchType"), None);
    }
}
