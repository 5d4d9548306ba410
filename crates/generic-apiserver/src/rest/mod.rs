//! The generic REST handlers: ONE implementation of every verb for every kind, driven by
//! the registry and the kind's strategy (upstream's `genericregistry.Store`).
//!
//! Reads are served from the watch cache after it has caught up with the store's current
//! revision (so a client always reads its own writes); writes go to the store as single-key
//! transactions guarded by the object's mod revision (optimistic concurrency).

mod delete;
mod duplicates;
mod eviction;
mod read;
pub mod scope;
pub mod strategy;
mod subresource;
mod watch;

pub use watch::frame_bytes;
mod write;
pub(crate) use write::keep_system_metadata;
pub use write::validate;

use bytes::Bytes;
use http::StatusCode;
use krust_api::status::{ApiError, Cause, Target};
use krust_api::sync::Unpoisoned;
use krust_store::{Compare, Op, Revision, StoreError, Txn, TxnResult};
use serde_json::{Value, json};

use crate::auth::User;
use crate::request::{Query, RequestInfo, Verb};
use crate::response::{self, Output, Response};
pub use scope::{Kinds, Scope};
pub use strategy::{Caller, FieldValidation, Kind, Storage};

/// Largest request body accepted, as upstream (3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// A request body as JSON, from JSON, protobuf or YAML as its content type says.
pub fn decode_body(content_type: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type.unwrap_or("application/json");
    let media = ct.split(';').next().unwrap_or_default().trim();
    match media {
        "application/json" | "" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}"))),
        "application/vnd.kubernetes.protobuf" => krust_apimachinery::protobuf::decode(body)
            .map_err(|e| {
                ApiError::bad_request(format!("error decoding protobuf request body: {e}"))
            }),
        "application/yaml" => serde_saphyr::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML request body: {e}"))),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// The 413 for a body over [`MAX_BODY`], in upstream's words.
pub fn body_too_large() -> ApiError {
    ApiError::too_large(format!("Request entity too large: limit is {MAX_BODY}"))
}

/// One resource request, parsed and authenticated.
#[derive(Clone)]
pub struct Call<'a> {
    pub scope: &'a Scope,
    pub kind: &'static Kind,
    pub info: RequestInfo,
    pub query: Query,
    pub output: Output,
    pub user: User,
    pub content_type: Option<String>,
    pub user_agent: Option<String>,
    pub body: Bytes,
    /// Warnings for the `Warning` response header (unknown fields under Warn,
    /// admission), shared by the call's copies.
    pub warnings: Warnings,
    /// Annotations for the request's audit events (PodSecurity's).
    pub audit: crate::audit::Annotations,
}

/// An object `kind` serves in storage form: by the kind's strategy, after the
/// definition's conversion webhook where a custom resource has one.
pub async fn stored_as(scope: &Scope, kind: &Kind, obj: Value) -> Result<Value, ApiError> {
    let obj = match kind.strategy.converter() {
        Some(converter) => {
            let storage = converter.storage_version();
            one(converter
                .convert(&scope.caller(), vec![obj], storage)
                .await?)
        }
        None => obj,
    };
    Ok(kind.strategy.to_storage(obj))
}

/// A stored object as `kind` serves it (the reverse of [`stored_as`]).
pub async fn served_as(scope: &Scope, kind: &Kind, obj: Value) -> Result<Value, ApiError> {
    let obj = match kind.strategy.converter() {
        Some(converter) => {
            let served = kind.info.api_version();
            one(converter
                .convert(&scope.caller(), vec![obj], &served)
                .await?)
        }
        None => obj,
    };
    Ok(kind.strategy.to_served(obj))
}

/// Stored objects in the version `kind` serves: unchanged without a converter (the
/// strategy rewrites `apiVersion` as it encodes), else those in another version
/// converted in one call.
pub async fn served_bytes(
    caller: &Caller,
    kind: &Kind,
    items: Vec<Bytes>,
) -> Result<Vec<Bytes>, ApiError> {
    let Some(converter) = kind.strategy.converter() else {
        return Ok(items);
    };
    let objects: Vec<Value> = items
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap_or(Value::Null))
        .collect();
    let desired = kind.info.api_version();
    if objects
        .iter()
        .all(|o| o["apiVersion"].as_str() == Some(desired.as_str()))
    {
        return Ok(items);
    }
    let converted = converter.convert(caller, objects, &desired).await?;
    Ok(converted
        .iter()
        .map(|o| Bytes::from(serde_json::to_vec(o).unwrap_or_default()))
        .collect())
}

/// The one object a conversion of one object gives back.
fn one(mut objects: Vec<Value>) -> Value {
    objects.pop().unwrap_or(Value::Null)
}

/// Warnings any stage of a call may add; the response carries them as `Warning` headers.
#[derive(Clone, Default)]
pub struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    pub fn add(&self, warning: String) {
        self.0.locked().push(warning);
    }

    fn all(&self) -> Vec<String> {
        self.0.locked().clone()
    }
}

/// Routes a call to its verb.
pub async fn serve(mut call: Call<'_>) -> Result<Response, ApiError> {
    if let Some(sub) = call.info.subresource.clone() {
        return subresource::serve(&mut call, &sub).await;
    }
    match call.info.verb {
        Verb::Get => read::get(&call).await,
        Verb::List => read::list(&call).await,
        Verb::Watch => watch::watch(&call).await,
        Verb::Create => write::create(&mut call).await,
        Verb::Update => write::update(&mut call, Part::Main).await,
        Verb::Patch => write::patch(&mut call, Part::Main).await,
        Verb::Delete => delete::delete(&call).await,
        Verb::DeleteCollection => delete::delete_collection(&call).await,
    }
}

/// Which part of an object an update may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Everything but `.status` (for kinds with a status subresource).
    Main,
    /// Only `.status`.
    Status,
    /// Only `spec.finalizers` (namespaces' `/finalize`).
    Finalize,
    /// Only the approval conditions (certificate signing requests' `/approval`).
    Approval,
    /// Only `spec.ephemeralContainers` (pods' `/ephemeralcontainers`).
    EphemeralContainers,
}

impl Part {
    /// The one field a subresource writes, as its path from the object's root; `None`
    /// for the main resource.
    pub fn field(self) -> Option<&'static [&'static str]> {
        match self {
            Part::Main => None,
            Part::Status => Some(&["status"]),
            Part::Finalize => Some(&["spec", "finalizers"]),
            Part::Approval => Some(&["status", "conditions"]),
            Part::EphemeralContainers => Some(&["spec", "ephemeralContainers"]),
        }
    }
}

impl Call<'_> {
    pub fn namespace(&self) -> Option<&str> {
        self.info
            .namespace
            .as_deref()
            .filter(|_| self.kind.info.namespaced)
    }

    pub fn name(&self) -> &str {
        self.info.name.as_deref().unwrap_or_default()
    }

    pub fn key(&self, name: &str) -> String {
        self.kind.info.storage_key(self.namespace(), name)
    }

    pub fn target<'b>(&'b self, name: &'b str) -> Target<'b> {
        Target {
            group: self.kind.info.group,
            resource: self.kind.info.plural,
            name,
        }
    }

    /// The field manager of a write: the `fieldManager` parameter, else the user agent up
    /// to its first `/`, as upstream.
    pub fn field_manager(&self) -> String {
        match self.query.get("fieldManager").filter(|m| !m.is_empty()) {
            Some(m) => m.to_string(),
            None => self
                .user_agent
                .as_deref()
                .and_then(|ua| ua.split('/').next())
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// The managed-fields endpoint of this call (kind, version, subresource, and the
    /// fields its strategy resets).
    pub fn endpoint(&self, part: Part) -> krust_apimachinery::apply::Endpoint<'static> {
        let info = self.kind.info;
        let mut e = krust_apimachinery::apply::Endpoint::new(info.group, info.version, info.kind);
        e.schema = self.kind.strategy.apply_schema();
        match part {
            Part::Main if self.kind.has_status() => {
                e.reset_fields = krust_apimachinery::apply::RESET_STATUS
            }
            Part::Main => {}
            Part::Status => {
                e.subresource = Some("status");
                e.reset_fields = &[&["spec"]];
            }
            Part::Finalize => e.subresource = Some("finalize"),
            Part::Approval => e.subresource = Some("approval"),
            Part::EphemeralContainers => e.subresource = Some("ephemeralcontainers"),
        }
        e
    }

    /// Records what a non-apply write changed in managedFields.
    pub fn record_update(&self, part: Part, old: Option<&Value>, new: &mut Value) {
        let manager = self.field_manager();
        let time = now();
        let m = krust_apimachinery::apply::Manager {
            name: &manager,
            time: &time,
        };
        krust_apimachinery::apply::record_update(&self.endpoint(part), old, new, &m);
    }

    pub fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }

    pub fn field_validation(&self) -> Result<FieldValidation, ApiError> {
        match self.query.get("fieldValidation") {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}. Valid values are Ignore, Warn, Strict"
            ))),
        }
    }

    /// Waits until the watch cache has every write the store has acknowledged.
    pub async fn consistent(&self) -> Result<Revision, ApiError> {
        let rev = self
            .scope
            .store
            .current_revision()
            .await
            .map_err(store_error)?;
        self.scope.cache.wait_for(rev).await;
        Ok(rev)
    }

    /// Every object the store holds under `prefix` (any kind), with its revision: for
    /// compare-and-swap writes of objects other than the request's own.
    pub async fn stored(&self, prefix: &str) -> Result<Vec<(Value, Revision)>, ApiError> {
        let listed = self
            .scope
            .store
            .range(krust_store::RangeRequest {
                prefix: prefix.to_string(),
                ..Default::default()
            })
            .await
            .map_err(store_error)?;
        Ok(listed
            .kvs
            .iter()
            .filter_map(|kv| Some((serde_json::from_slice(&kv.value).ok()?, kv.mod_revision)))
            .collect())
    }

    /// The current object from the (consistent) cache, with its revision.
    pub async fn current(&self, name: &str) -> Result<(Value, Revision), ApiError> {
        self.consistent().await?;
        let cache = self.resource_cache()?;
        match cache.get(&self.key(name)) {
            Some(obj) => Ok((self.upgraded(obj.value()).await?, obj.revision)),
            None => Err(ApiError::not_found(self.target(name))),
        }
    }

    /// A stored object in the current storage version, where a custom resource's
    /// conversion webhook must make it so (it was stored before the definition's storage
    /// version changed): a write then merges objects of one shape.
    async fn upgraded(&self, obj: Value) -> Result<Value, ApiError> {
        match self.kind.strategy.converter() {
            Some(converter) if obj["apiVersion"].as_str() != Some(converter.storage_version()) => {
                let caller = self.scope.caller();
                Ok(one(converter
                    .convert(&caller, vec![obj], converter.storage_version())
                    .await?))
            }
            _ => Ok(obj),
        }
    }

    /// The object a write starts from, as Go writes it: the cached one on the first
    /// try; after a lost compare-and-swap the stored one, read from the store itself — a
    /// retry must not wait for the cache to catch up with a busy writer (upstream's
    /// GuaranteedUpdate reads afresh too).
    pub async fn current_for_write(
        &self,
        name: &str,
        retry: bool,
    ) -> Result<(Value, Revision), ApiError> {
        if !retry {
            return self.current(name).await;
        }
        let (kv, _) = self
            .scope
            .store
            .get(&self.key(name), 0)
            .await
            .map_err(store_error)?;
        let kv = kv.ok_or_else(|| ApiError::not_found(self.target(name)))?;
        let mut obj = serde_json::from_slice(&kv.value)
            .map_err(|e| ApiError::internal(format!("decoding the stored object: {e}")))?;
        // As the cache serves it: as Go writes it, zero values included.
        krust_apimachinery::protobuf::go_order(&mut obj);
        Ok((self.upgraded(obj).await?, kv.mod_revision))
    }

    pub fn resource_cache(
        &self,
    ) -> Result<std::sync::Arc<crate::watch_cache::ResourceCache>, ApiError> {
        self.scope
            .cache
            .cache(&self.kind.info.storage_prefix())
            .ok_or_else(|| ApiError::internal(format!("no cache for {}", self.kind.info.plural)))
    }

    /// Parses the request body as JSON (or YAML) into an object of this kind, in the served
    /// version: checks apiVersion/kind, drops unknown fields per `fieldValidation`.
    pub fn decode_body(&mut self, expect_kind: (&str, &str)) -> Result<Value, ApiError> {
        let value = match self.body_value() {
            Err(e) if e.code == 400 => return Err(self.unrecognized(expect_kind.1, &e)),
            result => result?,
        };
        self.decode_value(value, expect_kind)
    }

    /// A body that does not parse, as upstream's handlers say it: the kind expected, the
    /// parser's complaint and the body's first bytes (as text if it looks like JSON, else
    /// in hex).
    fn unrecognized(&self, kind: &str, parse: &ApiError) -> ApiError {
        const SHOWN: usize = 30;
        let json = matches!(
            self.content_type
                .as_deref()
                .map(|c| c.split(';').next().unwrap_or_default().trim()),
            None | Some("application/json" | "")
        );
        if !json {
            return parse.clone();
        }
        let detail = parse
            .message
            .strip_prefix("error decoding request body: ")
            .unwrap_or(&parse.message);
        let head = &self.body[..self.body.len().min(SHOWN)];
        let more = if self.body.len() > SHOWN { " ..." } else { "" };
        let summary = match head.first() {
            None => "<empty>".to_string(),
            Some(b'{') => format!("{}{more}", String::from_utf8_lossy(head)),
            Some(_) => format!("{}{more}", hex(head)),
        };
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {detail} ({summary})"
        ))
    }

    pub fn body_value(&self) -> Result<Value, ApiError> {
        if self.body.len() > MAX_BODY {
            return Err(body_too_large());
        }
        decode_body(self.content_type.as_deref(), &self.body)
    }

    /// Decodes a JSON value through the kind's typed codec.
    pub fn decode_value(
        &mut self,
        mut value: Value,
        (api_version, kind): (&str, &str),
    ) -> Result<Value, ApiError> {
        let Some(obj) = value.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        };
        for (field, want) in [("apiVersion", api_version), ("kind", kind)] {
            match obj.get(field).and_then(Value::as_str) {
                None | Some("") => {
                    obj.insert(field.into(), json!(want));
                }
                Some(got) if got != want && field == "apiVersion" => {
                    return Err(ApiError::bad_request(format!(
                        "the API version in the data ({got}) does not match the expected API version ({want})"
                    )));
                }
                Some(got) if got != want => {
                    return Err(ApiError::bad_request(format!(
                        "the kind in the data ({got}) does not match the expected kind ({want})"
                    )));
                }
                Some(_) => {}
            }
        }
        let (decoded, unknown) = (self.kind_decoder(kind))(value).map_err(|e| {
            ApiError::bad_request(format!("error decoding request body into {kind}: {e}"))
        })?;
        let mut problems: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        let json_body = matches!(
            self.content_type
                .as_deref()
                .map(|c| c.split(';').next().unwrap_or_default().trim()),
            None | Some("application/json" | "")
        );
        if json_body
            && self.field_validation()? != FieldValidation::Ignore
            && self.info.verb != crate::request::Verb::Patch
        {
            problems.extend(
                duplicates::duplicate_fields(&self.body)
                    .into_iter()
                    .map(|f| format!("duplicate field \"{f}\"")),
            );
        }
        if !problems.is_empty() {
            match self.field_validation()? {
                FieldValidation::Strict if self.info.verb == crate::request::Verb::Patch => {
                    // Upstream names the patched object as the invalid value.
                    return Err(ApiError::invalid(
                        "",
                        "",
                        "",
                        vec![Cause::invalid(
                            "patch",
                            &Value::String(decoded.to_string()),
                            format!("strict decoding error: {}", problems.join(", ")),
                        )],
                    ));
                }
                FieldValidation::Strict => {
                    let version = api_version.rsplit('/').next().unwrap_or(api_version);
                    return Err(ApiError::bad_request(format!(
                        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                        problems.join(", ")
                    )));
                }
                FieldValidation::Warn => problems.into_iter().for_each(|p| self.warnings.add(p)),
                FieldValidation::Ignore => {}
            }
        }
        Ok(decoded)
    }

    fn kind_decoder(&self, kind: &str) -> crate::rest::strategy::Decoder {
        match kind {
            "Scale" => &strategy::decode_scale,
            "Binding" => self
                .scope
                .kind("", "v1", "bindings")
                .map_or(self.kind.decode, |k| k.decode),
            "Eviction" => &strategy::decode_eviction,
            "TokenRequest" => &strategy::decode_token_request,
            "DeleteOptions" => &strategy::decode_delete_options,
            _ => self.kind.decode,
        }
    }

    /// Writes `obj` (with its resourceVersion stripped) under `compare`. Returns the stored
    /// object with its new resourceVersion.
    pub async fn put(
        &self,
        name: &str,
        mut obj: Value,
        compare: Compare,
    ) -> Result<(Value, Revision), ApiError> {
        if let Some(meta) = obj["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        // `obj` is already in storage form: every caller converts on decode.
        let bytes =
            Bytes::from(serde_json::to_vec(&obj).map_err(|e| ApiError::internal(e.to_string()))?);
        if self.dry_run() {
            return Ok((obj, 0));
        }
        let result = self
            .scope
            .store
            .txn(Txn {
                key: self.key(name),
                compare,
                op: Op::Put(bytes),
            })
            .await
            .map_err(store_error)?;
        match result {
            TxnResult::Succeeded { revision, .. } => {
                obj["metadata"]["resourceVersion"] = json!(revision.to_string());
                krust_apimachinery::protobuf::go_order(&mut obj);
                Ok((obj, revision))
            }
            TxnResult::Failed { current: None, .. } if compare != Compare::Absent => {
                Err(ApiError::not_found(self.target(name)))
            }
            TxnResult::Failed { .. } if compare == Compare::Absent => {
                Err(ApiError::already_exists(self.target(name)))
            }
            TxnResult::Failed { .. } => Err(ApiError::stale(self.target(name))),
        }
    }

    /// An object of the served version in storage form: by the kind's strategy, after
    /// the definition's conversion webhook where a custom resource has one.
    pub async fn to_storage(&self, obj: Value) -> Result<Value, ApiError> {
        stored_as(self.scope, self.kind, obj).await
    }

    /// A stored object in the served version (the reverse of [`Call::to_storage`]).
    pub async fn to_served(&self, obj: Value) -> Result<Value, ApiError> {
        served_as(self.scope, self.kind, obj).await
    }

    /// Stored objects as this call returns them: in the served version where the
    /// definition's conversion webhook must convert them (metadata alone needs none).
    pub async fn served_bytes(&self, items: Vec<Bytes>) -> Result<Vec<Bytes>, ApiError> {
        if matches!(self.output, Output::Metadata(_)) {
            return Ok(items);
        }
        served_bytes(&self.scope.caller(), self.kind, items).await
    }

    /// Responds with one object, adding any warnings.
    pub fn reply(&self, code: StatusCode, obj: &Value) -> Response {
        // `obj` is already in the served version: encode without converting again.
        let resp = match self.output {
            Output::Json | Output::Protobuf => self.output.encode(code, obj),
            _ => {
                let bytes = Bytes::from(serde_json::to_vec(obj).unwrap_or_default());
                response::object(self.kind, self.output, code, &bytes)
            }
        };
        self.with_warnings(resp)
    }

    /// The verb of a request to a resource computed on read (get and list only), or
    /// upstream's 405 for any other.
    pub fn read_only_verb(&self) -> Result<crate::request::Verb, ApiError> {
        use crate::request::Verb;
        match self.info.verb {
            verb @ (Verb::Get | Verb::List) => Ok(verb),
            verb => Err(ApiError::method_not_allowed(
                verb.as_str(),
                self.kind.info.plural,
            )),
        }
    }

    /// Adds this call's warnings to a response as `Warning` headers.
    pub fn with_warnings(&self, mut resp: Response) -> Response {
        for w in &self.warnings.all() {
            if let Ok(v) =
                http::HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "\\\"")))
            {
                resp.headers_mut().append(http::header::WARNING, v);
            }
        }
        resp
    }
}

pub fn store_error(err: StoreError) -> ApiError {
    match err {
        StoreError::Compacted {
            requested,
            compacted,
        } => ApiError::gone(format!(
            "The resourceVersion for the provided list is too old. (requested {requested}, compacted {compacted})"
        )),
        StoreError::FutureRevision { requested, current } => ApiError::timeout(format!(
            "Too large resource version: {requested}, current: {current}"
        )),
        other => ApiError::internal(other.to_string()),
    }
}

/// Parses a resourceVersion string.
pub fn parse_rv(rv: &str) -> Result<Revision, ApiError> {
    rv.parse::<Revision>()
        .ok()
        .filter(|r| *r >= 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid resource version: {rv:?}")))
}

/// The RFC 3339 timestamp of now, as metav1.Time serialises (second precision).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Bytes as lowercase hex, as Go's `hex.EncodeToString`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
