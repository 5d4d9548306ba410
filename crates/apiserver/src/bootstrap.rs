//! First-start objects every cluster has: the namespaces default, kube-system, kube-public
//! and kube-node-lease, and the `kubernetes` Service (at the first service IP) with its
//! Endpoints pointing at this apiserver. Created through the REST layer, so they get the
//! same defaulting and validation as anything a user creates.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use bytes::Bytes;
use krust_api::status::ApiError;
use serde_json::{Value, json};

use crate::Api;
use crate::auth::User;
use crate::kinds;
use crate::request::{Query, RequestInfo, Verb};
use crate::response::Output;
use crate::rest::{self, Call};

pub async fn run(api: &Api, service_ip: Ipv4Addr, advertise: IpAddr, port: u16) -> Result<()> {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        ensure(api, "namespaces", None, json!({"metadata": {"name": ns}})).await?;
    }
    ensure(
        api,
        "services",
        Some("default"),
        json!({
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": service_ip.to_string(),
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
        }),
    )
    .await?;
    let endpoints = json!({
        "metadata": {"name": "kubernetes", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": advertise.to_string()}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    upsert(api, "endpoints", Some("default"), endpoints).await?;
    Ok(())
}

fn call<'a>(
    api: &'a Api,
    plural: &str,
    namespace: Option<&str>,
    verb: Verb,
    name: Option<&str>,
    body: &Value,
) -> Result<Call<'a>> {
    let kind = kinds::find("", "v1", plural).context("bootstrap kind missing")?;
    Ok(Call {
        api,
        kind,
        info: RequestInfo {
            verb,
            group: String::new(),
            version: "v1".into(),
            namespace: namespace.map(str::to_string),
            resource: plural.into(),
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
        body: Bytes::from(serde_json::to_vec(body)?),
        warnings: Vec::new(),
    })
}

/// Creates the object unless it exists.
async fn ensure(api: &Api, plural: &str, namespace: Option<&str>, body: Value) -> Result<()> {
    let name = body["metadata"]["name"].as_str().unwrap_or_default();
    let get = call(api, plural, namespace, Verb::Get, Some(name), &Value::Null)?;
    if get.current(name).await.is_ok() {
        return Ok(());
    }
    let c = call(api, plural, namespace, Verb::Create, None, &body)?;
    match rest::serve(c).await {
        Ok(_) => Ok(()),
        Err(ApiError { code: 409, .. }) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("creating {plural}: {e}")),
    }
}

/// Creates the object, or replaces it when it exists (the apiserver's address may change).
async fn upsert(api: &Api, plural: &str, namespace: Option<&str>, body: Value) -> Result<()> {
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    match rest::serve(call(api, plural, namespace, Verb::Create, None, &body)?).await {
        Ok(_) => Ok(()),
        Err(ApiError { code: 409, .. }) => rest::serve(call(
            api,
            plural,
            namespace,
            Verb::Update,
            Some(&name),
            &body,
        )?)
        .await
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("updating {plural}/{name}: {e}")),
        Err(e) => Err(anyhow::anyhow!("creating {plural}: {e}")),
    }
}
