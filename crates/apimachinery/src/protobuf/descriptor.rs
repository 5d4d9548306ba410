//! The shape of the descriptor table: for each protobuf message, its fields with their
//! number, JSON name, cardinality, value kind and Go JSON presence rule. The data lives
//! in the generated `table` module; this module owns the types and the lookups.

use super::table::KINDS;

/// A protobuf message of the Kubernetes API, as the decoder needs to know it.
pub(super) struct Message {
    /// Short proto name (`core.v1.Pod`), the root of error paths.
    pub name: &'static str,
    /// Sorted by field number.
    pub fields: &'static [Field],
}

impl Message {
    pub(super) const fn new(name: &'static str, fields: &'static [Field]) -> Self {
        Message { name, fields }
    }

    /// The field with this number and its index in [`Self::fields`]; unknown numbers
    /// are `None` (protobuf readers skip fields they do not know).
    pub(super) fn field(&self, number: u64) -> Option<(usize, &'static Field)> {
        let index = self
            .fields
            .binary_search_by_key(&number, |f| u64::from(f.number))
            .ok()?;
        Some((index, &self.fields[index]))
    }
}

/// One field of a [`Message`].
pub(super) struct Field {
    pub number: u32,
    /// The JSON name; empty for a Go struct embedded with `json:",inline"`, whose fields
    /// are merged into the parent object.
    pub name: &'static str,
    /// Position of the field in its Go struct: encoding/json writes fields in that order,
    /// which is not always field-number order.
    pub order: u8,
    pub shape: Shape,
    /// The kind of the value, of each list item, or of each map value.
    pub kind: Kind,
    pub presence: Presence,
}

impl Field {
    pub(super) const fn new(
        number: u32,
        name: &'static str,
        order: u8,
        shape: Shape,
        kind: Kind,
        presence: Presence,
    ) -> Self {
        Field {
            number,
            name,
            order,
            shape,
            kind,
            presence,
        }
    }
}

/// Cardinality of a field.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    One,
    /// `repeated`: a JSON array.
    List,
    /// `map<string, kind>`: a JSON object (every map in the API has string keys).
    Map,
}

/// What a value decodes to.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    /// `string`: a JSON string.
    Str,
    Bool,
    I32,
    I64,
    /// `bytes` (a Go `[]byte`): a base64 JSON string.
    Bytes,
    /// Anything encoded as a nested message.
    Obj(Obj),
}

/// A value encoded as a nested message.
#[derive(Clone, Copy)]
pub(super) enum Obj {
    /// A message of the table: a JSON object.
    Msg(&'static Message),
    /// The types below have a custom JSON form in Go; see the `wellknown` module.
    Quantity,
    IntOrString,
    Time,
    MicroTime,
    FieldsV1,
    RawExtension,
    /// A message wrapping a Go named `[]string` (`ExtraValue`).
    StringList,
}

/// When a field appears in the JSON, following Go's encoding/json on the Go struct
/// field. Needed because gogo-protobuf writes every non-pointer field, zero or not, and
/// absent fields decode to the Go zero value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Presence {
    /// A pointer with `omitempty`: written when set, even to a zero value.
    Ptr,
    /// A pointer without `omitempty`: `null` when unset.
    PtrNull,
    /// A value with `omitempty`: left out when zero (or an empty list or map).
    Omit,
    /// A value without `omitempty`, or a struct (which encoding/json never omits): always
    /// written, as the zero value (`null` for a nil list or map) when absent.
    Keep,
}

/// The message for a kind. `DeleteOptions` is registered in every group version, and
/// client-go typed clients stamp it with their own group version (`apps/v1`), so any
/// apiVersion maps to the meta/v1 type.
pub(super) fn message_for_kind(api_version: &str, kind: &str) -> Option<&'static Message> {
    let find = |api_version: &str| {
        KINDS
            .binary_search_by(|&(v, k, _)| (v, k).cmp(&(api_version, kind)))
            .ok()
            .map(|index| KINDS[index].2)
    };
    match find(api_version) {
        None if kind == "DeleteOptions" => find("meta.k8s.io/v1"),
        found => found,
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::KINDS;
    use super::*;

    /// Every message reachable from the kinds, each once.
    fn reachable() -> Vec<&'static Message> {
        let mut seen: Vec<&'static Message> = Vec::new();
        let mut pending: Vec<&'static Message> = KINDS.iter().map(|k| k.2).collect();
        while let Some(message) = pending.pop() {
            if seen.iter().any(|m| std::ptr::eq(*m, message)) {
                continue;
            }
            seen.push(message);
            for field in message.fields {
                if let Kind::Obj(Obj::Msg(nested)) = field.kind {
                    pending.push(nested);
                }
            }
        }
        seen
    }

    #[test]
    fn kinds_are_sorted_for_binary_search() {
        assert!(
            KINDS
                .windows(2)
                .all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1))
        );
    }

    #[test]
    fn fields_are_sorted_by_number_and_orders_are_unique() {
        let messages = reachable();
        assert!(messages.len() > 200, "{} messages", messages.len());
        for message in messages {
            let fields = message.fields;
            assert!(
                fields.windows(2).all(|w| w[0].number < w[1].number),
                "{}",
                message.name
            );
            let mut orders: Vec<u8> = fields.iter().map(|f| f.order).collect();
            orders.sort_unstable();
            orders.dedup();
            assert_eq!(orders.len(), fields.len(), "{}", message.name);
        }
    }

    #[test]
    fn looks_up_kinds_and_delete_options_in_any_group() {
        let name = |v, k| message_for_kind(v, k).map(|m| m.name);
        assert_eq!(name("v1", "Pod"), Some("core.v1.Pod"));
        assert_eq!(name("v1", "Event"), Some("core.v1.Event"));
        assert_eq!(name("events.k8s.io/v1", "Event"), Some("events.v1.Event"));
        assert_eq!(name("apps/v1", "Deployment"), Some("apps.v1.Deployment"));
        assert_eq!(
            name("apps/v1", "DeleteOptions"),
            Some("meta.v1.DeleteOptions")
        );
        assert_eq!(name("v1", "DeleteOptions"), Some("meta.v1.DeleteOptions"));
        assert_eq!(name("apps/v1", "Pod"), None);
        assert_eq!(name("v1", "Deployment"), None);
    }

    #[test]
    fn json_names_follow_the_go_tags() {
        let field = |m: &Message, n| m.field(n).map(|(_, f)| f.name);
        let nested = |m: &Message, n| match m.field(n).map(|(_, f)| f.kind) {
            Some(Kind::Obj(Obj::Msg(nested))) => nested,
            _ => panic!("{}: field {n} is not a message", m.name),
        };
        let meta = nested(message_for_kind("v1", "Pod").unwrap(), 1);
        assert_eq!(field(meta, 2), Some("generateName"));
        let class = message_for_kind("networking.k8s.io/v1", "IngressClass").unwrap();
        let params = nested(nested(class, 2), 2);
        // The proto field is `aPIGroup`; JSON follows the Go tag.
        assert_eq!(field(params, 1), Some("apiGroup"));
    }
}
