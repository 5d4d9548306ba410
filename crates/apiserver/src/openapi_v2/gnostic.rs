//! The Swagger 2.0 JSON document as gnostic's `openapi_v2.Document` protobuf
//! (google/gnostic-models, `openapiv2/OpenAPIv2.proto`): the messages the served document
//! uses, with upstream's field numbers, written by prost's derive, and [`encode`], which
//! fills them from the JSON. Fields the document never sets (JSON references, headers,
//! examples, security, ...) are left out: a decoder skips what is absent.

use prost::Message;
use serde_json::{Map, Value};

/// The JSON keys that the messages below carry as plain fields; the v3 → v2 conversion
/// keeps only these (and `x-` extensions), so the JSON and protobuf forms hold the same
/// data. `Schema`'s structured keys (items, properties, ...) are converted separately.
pub const SCHEMA_KEYS: &[&str] = &[
    "$ref",
    "format",
    "title",
    "description",
    "default",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxProperties",
    "minProperties",
    "required",
    "enum",
    "discriminator",
    "readOnly",
    "example",
];
pub const OPERATION_KEYS: &[&str] = &[
    "tags",
    "summary",
    "description",
    "operationId",
    "produces",
    "consumes",
    "schemes",
    "deprecated",
];
/// The keys of a query parameter, the widest of the non-body parameters.
pub const NON_BODY_KEYS: &[&str] = &[
    "required",
    "in",
    "description",
    "name",
    "allowEmptyValue",
    "type",
    "format",
    "collectionFormat",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "enum",
    "multipleOf",
];
/// The operations a `PathItem` holds.
pub const PATH_ITEM_METHODS: &[&str] =
    &["get", "put", "post", "delete", "options", "head", "patch"];

#[derive(Clone, PartialEq, Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
    #[prost(message, repeated, tag = "16")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(message, repeated, tag = "7")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PathItem {
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "6")]
    pub options: Option<Operation>,
    #[prost(message, optional, tag = "7")]
    pub head: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, repeated, tag = "10")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "2")]
    pub summary: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(bool, tag = "11")]
    pub deprecated: bool,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `ParametersItem{oneof {Parameter parameter = 1; JsonReference _ref = 2}}`: only the
/// first is used, so it is an optional field here.
#[derive(Clone, PartialEq, Message)]
pub struct ParametersItem {
    #[prost(message, optional, tag = "1")]
    pub parameter: Option<Parameter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Parameter {
    #[prost(oneof = "parameter::Oneof", tags = "1, 2")]
    pub oneof: Option<parameter::Oneof>,
}

pub mod parameter {
    // Built once, at startup, to be encoded: the size of a variant does not matter.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        BodyParameter(super::BodyParameter),
        #[prost(message, tag = "2")]
        NonBodyParameter(super::NonBodyParameter),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
    #[prost(message, repeated, tag = "6")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NonBodyParameter {
    #[prost(oneof = "non_body_parameter::Oneof", tags = "1, 2, 3, 4")]
    pub oneof: Option<non_body_parameter::Oneof>,
}

pub mod non_body_parameter {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Header(super::SubSchema),
        #[prost(message, tag = "2")]
        FormData(super::SubSchemaWithEmpty),
        #[prost(message, tag = "3")]
        Query(super::SubSchemaWithEmpty),
        #[prost(message, tag = "4")]
        Path(super::SubSchema),
    }
}

/// `HeaderParameterSubSchema` and `PathParameterSubSchema`, which share their fields.
#[derive(Clone, PartialEq, Message)]
pub struct SubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(string, tag = "6")]
    pub format: String,
    #[prost(string, tag = "8")]
    pub collection_format: String,
    #[prost(message, optional, tag = "9")]
    pub default: Option<Any>,
    #[prost(double, tag = "10")]
    pub maximum: f64,
    #[prost(bool, tag = "11")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "12")]
    pub minimum: f64,
    #[prost(bool, tag = "13")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "14")]
    pub max_length: i64,
    #[prost(int64, tag = "15")]
    pub min_length: i64,
    #[prost(string, tag = "16")]
    pub pattern: String,
    #[prost(int64, tag = "17")]
    pub max_items: i64,
    #[prost(int64, tag = "18")]
    pub min_items: i64,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(double, tag = "21")]
    pub multiple_of: f64,
    #[prost(message, repeated, tag = "22")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `QueryParameterSubSchema` and `FormDataParameterSubSchema`: the same fields with
/// `allowEmptyValue` as field 5, every later one shifted up by one.
#[derive(Clone, PartialEq, Message)]
pub struct SubSchemaWithEmpty {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(bool, tag = "5")]
    pub allow_empty_value: bool,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(string, tag = "7")]
    pub format: String,
    #[prost(string, tag = "9")]
    pub collection_format: String,
    #[prost(message, optional, tag = "10")]
    pub default: Option<Any>,
    #[prost(double, tag = "11")]
    pub maximum: f64,
    #[prost(bool, tag = "12")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "13")]
    pub minimum: f64,
    #[prost(bool, tag = "14")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "15")]
    pub max_length: i64,
    #[prost(int64, tag = "16")]
    pub min_length: i64,
    #[prost(string, tag = "17")]
    pub pattern: String,
    #[prost(int64, tag = "18")]
    pub max_items: i64,
    #[prost(int64, tag = "19")]
    pub min_items: i64,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "21")]
    pub r#enum: Vec<Any>,
    #[prost(double, tag = "22")]
    pub multiple_of: f64,
    #[prost(message, repeated, tag = "23")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

/// `ResponseValue{oneof {Response response = 1; JsonReference json_reference = 2}}`.
#[derive(Clone, PartialEq, Message)]
pub struct ResponseValue {
    #[prost(message, optional, tag = "1")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
    #[prost(message, repeated, tag = "5")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `SchemaItem{oneof {Schema schema = 1; FileSchema file_schema = 2}}`.
#[derive(Clone, PartialEq, Message)]
pub struct SchemaItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "6")]
    pub multiple_of: f64,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(bool, tag = "8")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(bool, tag = "10")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(int64, tag = "17")]
    pub max_properties: i64,
    #[prost(int64, tag = "18")]
    pub min_properties: i64,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(string, tag = "26")]
    pub discriminator: String,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, optional, tag = "30")]
    pub example: Option<Any>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "additional_properties_item::Oneof", tags = "1, 2")]
    pub oneof: Option<additional_properties_item::Oneof>,
}

pub mod additional_properties_item {
    // Built once, at startup, to be encoded: the size of a variant does not matter.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Schema(super::Schema),
        #[prost(bool, tag = "2")]
        Boolean(bool),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

/// `Any{google.protobuf.Any value = 1; string yaml = 2}`: kubectl reads extension values
/// by YAML-decoding `yaml` (JSON is YAML).
#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

// ---------------------------------------------------------------------------------------
// JSON → messages
// ---------------------------------------------------------------------------------------

type Object = Map<String, Value>;

/// The protobuf form of the Swagger 2.0 JSON document `doc`.
pub fn encode(doc: &Value) -> Vec<u8> {
    let empty = Object::new();
    let obj = doc.as_object().unwrap_or(&empty);
    Document {
        swagger: string(obj, "swagger"),
        info: object(obj, "info").map(|info| Info {
            title: string(info, "title"),
            version: string(info, "version"),
            vendor_extension: extensions(info),
        }),
        paths: object(obj, "paths").map(|paths| Paths {
            path: paths
                .iter()
                .filter_map(|(name, item)| {
                    Some(NamedPathItem {
                        name: name.clone(),
                        value: Some(path_item(item.as_object()?)),
                    })
                })
                .collect(),
        }),
        definitions: object(obj, "definitions").map(|defs| Definitions {
            additional_properties: named_schemas(defs),
        }),
        vendor_extension: extensions(obj),
    }
    .encode_to_vec()
}

fn object<'a>(obj: &'a Object, key: &str) -> Option<&'a Object> {
    obj.get(key).and_then(Value::as_object)
}

/// The objects of the array at `key`.
fn objects<'a>(obj: &'a Object, key: &str) -> impl Iterator<Item = &'a Object> {
    obj.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn string(obj: &Object, key: &str) -> String {
    obj.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn strings(obj: &Object, key: &str) -> Vec<String> {
    match obj.get(key) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

fn boolean(obj: &Object, key: &str) -> bool {
    obj.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn int(obj: &Object, key: &str) -> i64 {
    obj.get(key).and_then(Value::as_i64).unwrap_or(0)
}

fn double(obj: &Object, key: &str) -> f64 {
    obj.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn any(value: &Value) -> Any {
    Any {
        yaml: value.to_string(),
    }
}

fn any_at(obj: &Object, key: &str) -> Option<Any> {
    obj.get(key).map(any)
}

fn anys(obj: &Object, key: &str) -> Vec<Any> {
    obj.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(any)
        .collect()
}

/// The `x-` keys of an object as `NamedAny` vendor extensions.
fn extensions(obj: &Object) -> Vec<NamedAny> {
    obj.iter()
        .filter(|(key, _)| key.starts_with("x-"))
        .map(|(name, value)| NamedAny {
            name: name.clone(),
            value: Some(any(value)),
        })
        .collect()
}

fn named_schemas(obj: &Object) -> Vec<NamedSchema> {
    obj.iter()
        .filter_map(|(name, s)| {
            Some(NamedSchema {
                name: name.clone(),
                value: Some(schema(s.as_object()?)),
            })
        })
        .collect()
}

fn path_item(item: &Object) -> PathItem {
    let op = |method: &str| object(item, method).map(operation);
    PathItem {
        get: op("get"),
        put: op("put"),
        post: op("post"),
        delete: op("delete"),
        options: op("options"),
        head: op("head"),
        patch: op("patch"),
        parameters: objects(item, "parameters").map(parameters_item).collect(),
        vendor_extension: extensions(item),
    }
}

fn operation(op: &Object) -> Operation {
    Operation {
        tags: strings(op, "tags"),
        summary: string(op, "summary"),
        description: string(op, "description"),
        operation_id: string(op, "operationId"),
        produces: strings(op, "produces"),
        consumes: strings(op, "consumes"),
        parameters: objects(op, "parameters").map(parameters_item).collect(),
        responses: object(op, "responses").map(|codes| Responses {
            response_code: codes
                .iter()
                .filter_map(|(code, r)| {
                    let r = r.as_object()?;
                    let response = Response {
                        description: string(r, "description"),
                        schema: object(r, "schema").map(|s| SchemaItem {
                            schema: Some(schema(s)),
                        }),
                        vendor_extension: extensions(r),
                    };
                    Some(NamedResponseValue {
                        name: code.clone(),
                        value: Some(ResponseValue {
                            response: Some(response),
                        }),
                    })
                })
                .collect(),
        }),
        schemes: strings(op, "schemes"),
        deprecated: boolean(op, "deprecated"),
        vendor_extension: extensions(op),
    }
}

fn parameters_item(p: &Object) -> ParametersItem {
    let oneof = if p.get("in").and_then(Value::as_str) == Some("body") {
        parameter::Oneof::BodyParameter(BodyParameter {
            description: string(p, "description"),
            name: string(p, "name"),
            r#in: string(p, "in"),
            required: boolean(p, "required"),
            schema: object(p, "schema").map(schema),
            vendor_extension: extensions(p),
        })
    } else {
        use non_body_parameter::Oneof::*;
        let sub = sub_schema(p);
        let located = match p.get("in").and_then(Value::as_str) {
            Some("header") => Header(sub),
            Some("path") => Path(sub),
            Some("formData") => FormData(sub.allowing_empty(p)),
            // `query`, the only other non-body location v2 has.
            _ => Query(sub.allowing_empty(p)),
        };
        parameter::Oneof::NonBodyParameter(NonBodyParameter {
            oneof: Some(located),
        })
    };
    ParametersItem {
        parameter: Some(Parameter { oneof: Some(oneof) }),
    }
}

fn sub_schema(p: &Object) -> SubSchema {
    SubSchema {
        required: boolean(p, "required"),
        r#in: string(p, "in"),
        description: string(p, "description"),
        name: string(p, "name"),
        r#type: string(p, "type"),
        format: string(p, "format"),
        collection_format: string(p, "collectionFormat"),
        default: any_at(p, "default"),
        maximum: double(p, "maximum"),
        exclusive_maximum: boolean(p, "exclusiveMaximum"),
        minimum: double(p, "minimum"),
        exclusive_minimum: boolean(p, "exclusiveMinimum"),
        max_length: int(p, "maxLength"),
        min_length: int(p, "minLength"),
        pattern: string(p, "pattern"),
        max_items: int(p, "maxItems"),
        min_items: int(p, "minItems"),
        unique_items: boolean(p, "uniqueItems"),
        r#enum: anys(p, "enum"),
        multiple_of: double(p, "multipleOf"),
        vendor_extension: extensions(p),
    }
}

impl SubSchema {
    /// The query/formData form: the same fields, plus `allowEmptyValue`.
    fn allowing_empty(self, p: &Object) -> SubSchemaWithEmpty {
        SubSchemaWithEmpty {
            required: self.required,
            r#in: self.r#in,
            description: self.description,
            name: self.name,
            allow_empty_value: boolean(p, "allowEmptyValue"),
            r#type: self.r#type,
            format: self.format,
            collection_format: self.collection_format,
            default: self.default,
            maximum: self.maximum,
            exclusive_maximum: self.exclusive_maximum,
            minimum: self.minimum,
            exclusive_minimum: self.exclusive_minimum,
            max_length: self.max_length,
            min_length: self.min_length,
            pattern: self.pattern,
            max_items: self.max_items,
            min_items: self.min_items,
            unique_items: self.unique_items,
            r#enum: self.r#enum,
            multiple_of: self.multiple_of,
            vendor_extension: self.vendor_extension,
        }
    }
}

fn schema(s: &Object) -> Schema {
    use additional_properties_item::Oneof;
    Schema {
        r#ref: string(s, "$ref"),
        format: string(s, "format"),
        title: string(s, "title"),
        description: string(s, "description"),
        default: any_at(s, "default"),
        multiple_of: double(s, "multipleOf"),
        maximum: double(s, "maximum"),
        exclusive_maximum: boolean(s, "exclusiveMaximum"),
        minimum: double(s, "minimum"),
        exclusive_minimum: boolean(s, "exclusiveMinimum"),
        max_length: int(s, "maxLength"),
        min_length: int(s, "minLength"),
        pattern: string(s, "pattern"),
        max_items: int(s, "maxItems"),
        min_items: int(s, "minItems"),
        unique_items: boolean(s, "uniqueItems"),
        max_properties: int(s, "maxProperties"),
        min_properties: int(s, "minProperties"),
        required: strings(s, "required"),
        r#enum: anys(s, "enum"),
        additional_properties: match s.get("additionalProperties") {
            Some(Value::Object(sub)) => Some(Oneof::Schema(schema(sub))),
            Some(Value::Bool(b)) => Some(Oneof::Boolean(*b)),
            _ => None,
        }
        .map(|oneof| Box::new(AdditionalPropertiesItem { oneof: Some(oneof) })),
        // v2 allows a type or a list of types.
        r#type: s.get("type").map(|t| TypeItem {
            value: match t {
                Value::String(t) => vec![t.clone()],
                _ => strings(s, "type"),
            },
        }),
        // One schema, or a tuple of them.
        items: s.get("items").map(|items| ItemsItem {
            schema: match items {
                Value::Object(sub) => vec![schema(sub)],
                _ => objects(s, "items").map(schema).collect(),
            },
        }),
        all_of: objects(s, "allOf").map(schema).collect(),
        properties: object(s, "properties").map(|props| Properties {
            additional_properties: named_schemas(props),
        }),
        discriminator: string(s, "discriminator"),
        read_only: boolean(s, "readOnly"),
        example: any_at(s, "example"),
        vendor_extension: extensions(s),
    }
}
