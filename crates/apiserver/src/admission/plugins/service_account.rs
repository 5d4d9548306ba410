//! ServiceAccount: a pod runs as an account and gets that account's API credentials.

use krust_api::status::ApiError;
use serde_json::{Value, json};

use super::pod_create;
use crate::admission::{Attributes, Plugin};
use crate::rest::Call;

pub struct ServiceAccount;

#[async_trait::async_trait]
impl Plugin for ServiceAccount {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        pod_create(a)
    }

    async fn admit(&self, a: &Attributes<'_>, pod: Option<&mut Value>) -> Result<(), ApiError> {
        if let Some(pod) = pod {
            service_account(a.call, pod);
        }
        Ok(())
    }
}

/// Where the API credentials volume is mounted, as upstream.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount admission step: a pod without an account gets `default`; a pod
/// without `imagePullSecrets` gets its account's; a pod whose account exists gets the
/// `kube-api-access-<random>` projected volume (a token
/// of 3607 s, the cluster CA from `kube-root-ca.crt`, the namespace) mounted read-only
/// at [`SERVICE_ACCOUNT_DIR`] in every container, unless the pod (or else the account)
/// says `automountServiceAccountToken: false` or a container mounts something there
/// already. Upstream refuses a pod whose account does not exist; krust admits it
/// without the volume, since an apiserver running without the ServiceAccount
/// controller has no `default` accounts.
fn service_account(call: &Call<'_>, pod: &mut Value) {
    if pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string() {
        return;
    }
    let spec = &mut pod["spec"];
    let name = match spec["serviceAccountName"]
        .as_str()
        .filter(|n| !n.is_empty())
    {
        Some(n) => n.to_string(),
        None => {
            spec["serviceAccountName"] = json!("default");
            spec["serviceAccount"] = json!("default");
            "default".to_string()
        }
    };
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let Some(account) = call
        .scope
        .cache
        .core_object("serviceaccounts", Some(ns), &name)
    else {
        return;
    };
    let spec = &mut pod["spec"];
    // The account's pull secrets, for a pod that names none (upstream copies them).
    let named = spec["imagePullSecrets"]
        .as_array()
        .is_some_and(|l| !l.is_empty());
    if let Some(secrets) = account["imagePullSecrets"].as_array()
        && !named
        && !secrets.is_empty()
    {
        spec["imagePullSecrets"] = json!(secrets);
    }
    let automount = spec["automountServiceAccountToken"]
        .as_bool()
        .or(account["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    let lists = ["initContainers", "containers"];
    let mounted = lists
        .iter()
        .filter_map(|l| spec.get(l).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c["volumeMounts"].as_array())
        .flatten()
        .any(|m| m["mountPath"] == SERVICE_ACCOUNT_DIR);
    if !automount || mounted {
        return;
    }
    let volume = format!("kube-api-access-{}", krust_api::names::random_suffix(5));
    let projected = json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}});
    match spec["volumes"].as_array_mut() {
        Some(volumes) => volumes.push(projected),
        None => spec["volumes"] = json!([projected]),
    }
    let mount = json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_DIR});
    for list in lists {
        // `get_mut`, not indexing: indexing a missing key would store a null.
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            match c["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount.clone()),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
    }
}
