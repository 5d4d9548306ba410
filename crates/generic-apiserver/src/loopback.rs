//! The apiserver's own writes (bootstrap objects, its identity lease, the `kubernetes`
//! endpoints) go through the same REST layer as any client's, so they get the same
//! defaulting, validation, admission and managedFields, as upstream's loopback client.

use bytes::Bytes;
use krust_api::status::ApiError;
use serde_json::Value;

use crate::auth::User;
use crate::request::{Query, RequestInfo, Verb};
use crate::response::Output;
use crate::rest::Scope;
use crate::rest::{self, Call};

/// A resource addressed by group, version and plural name.
#[derive(Clone, Copy)]
pub struct Resource<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub plural: &'a str,
    pub namespace: Option<&'a str>,
}

impl<'a> Resource<'a> {
    pub const fn core(plural: &'a str, namespace: Option<&'a str>) -> Self {
        Resource {
            group: "",
            version: "v1",
            plural,
            namespace,
        }
    }
}

/// Calls the REST layer as the apiserver itself (`system:apiserver`, field manager
/// `kube-apiserver`).
pub struct Loopback<'a> {
    pub scope: &'a Scope,
}

impl<'a> Loopback<'a> {
    fn call(
        &self,
        r: Resource<'_>,
        verb: Verb,
        name: Option<&str>,
        body: &Value,
    ) -> Result<Call<'a>, ApiError> {
        let kind = self
            .scope
            .kind(r.group, r.version, r.plural)
            .ok_or_else(|| ApiError::internal(format!("unknown resource {}", r.plural)))?;
        Ok(Call {
            scope: self.scope,
            kind,
            info: RequestInfo {
                verb,
                group: r.group.to_string(),
                version: r.version.to_string(),
                namespace: r.namespace.map(str::to_string),
                resource: r.plural.to_string(),
                name: name.map(str::to_string),
                subresource: None,
            },
            query: Query::default(),
            output: Output::Json,
            user: User {
                name: "system:apiserver".into(),
                groups: vec!["system:masters".into()],
            },
            content_type: Some("application/json".into()),
            user_agent: Some("kube-apiserver".into()),
            body: if body.is_null() {
                Bytes::new()
            } else {
                Bytes::from(body.to_string())
            },
            warnings: Default::default(),
            audit: Default::default(),
        })
    }

    async fn send(&self, call: Call<'_>) -> Result<Value, ApiError> {
        let resp = rest::serve(call).await?;
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(e.to_string()))
    }

    pub async fn get(&self, r: Resource<'_>, name: &str) -> Result<Value, ApiError> {
        self.send(self.call(r, Verb::Get, Some(name), &Value::Null)?)
            .await
    }

    pub async fn list(
        &self,
        r: Resource<'_>,
        label_selector: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let mut call = self.call(r, Verb::List, None, &Value::Null)?;
        call.query = Query::parse(Some(&format!("labelSelector={label_selector}")));
        let list = self.send(call).await?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    pub async fn create(&self, r: Resource<'_>, body: &Value) -> Result<Value, ApiError> {
        self.send(self.call(r, Verb::Create, None, body)?).await
    }

    pub async fn update(&self, r: Resource<'_>, body: &Value) -> Result<Value, ApiError> {
        let name = body["metadata"]["name"].as_str().unwrap_or_default();
        self.send(self.call(r, Verb::Update, Some(name), body)?)
            .await
    }

    /// Replaces the object's status (its `status` subresource).
    pub async fn update_status(&self, r: Resource<'_>, body: &Value) -> Result<Value, ApiError> {
        let name = body["metadata"]["name"].as_str().unwrap_or_default();
        let mut call = self.call(r, Verb::Update, Some(name), body)?;
        call.info.subresource = Some("status".into());
        self.send(call).await
    }

    /// Deletes every object of the resource (in every namespace when `r` names none).
    pub async fn delete_all(&self, r: Resource<'_>) -> Result<(), ApiError> {
        self.send(self.call(r, Verb::DeleteCollection, None, &Value::Null)?)
            .await
            .map(|_| ())
    }

    pub async fn delete(&self, r: Resource<'_>, name: &str) -> Result<(), ApiError> {
        self.send(self.call(r, Verb::Delete, Some(name), &Value::Null)?)
            .await
            .map(|_| ())
    }

    /// Deletes the object only if it is still at `resource_version` (409 Conflict if not).
    pub async fn delete_unchanged(
        &self,
        r: Resource<'_>,
        name: &str,
        resource_version: &str,
    ) -> Result<(), ApiError> {
        let options = serde_json::json!({
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"resourceVersion": resource_version},
        });
        self.send(self.call(r, Verb::Delete, Some(name), &options)?)
            .await
            .map(|_| ())
    }

    /// Creates the object unless one of that name exists.
    pub async fn ensure(&self, r: Resource<'_>, body: &Value) -> Result<(), ApiError> {
        let name = body["metadata"]["name"].as_str().unwrap_or_default();
        match self.get(r, name).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => match self.create(r, body).await {
                Ok(_) => Ok(()),
                Err(e) if e.code == 409 => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Makes the object's spec-like content equal `body` (create or replace), writing
    /// nothing when it already is.
    pub async fn upsert(&self, r: Resource<'_>, body: &Value) -> Result<(), ApiError> {
        let name = body["metadata"]["name"].as_str().unwrap_or_default();
        match self.get(r, name).await {
            Ok(mut current) => {
                let mut desired = current.clone();
                for (k, v) in body
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| *k != "metadata")
                {
                    desired[k] = v.clone();
                }
                if let Some(labels) = body["metadata"].get("labels") {
                    desired["metadata"]["labels"] = labels.clone();
                }
                if desired == current {
                    return Ok(());
                }
                current = desired;
                self.update(r, &current).await.map(|_| ())
            }
            Err(e) if e.code == 404 => self.create(r, body).await.map(|_| ()),
            Err(e) => Err(e),
        }
    }
}
