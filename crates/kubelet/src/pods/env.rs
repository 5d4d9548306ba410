//! A container's environment, as upstream builds it: `envFrom` sources first (ConfigMaps
//! and Secrets, with their prefix), then `env` entries in order — values with `$(VAR)`
//! expanded from what came before, and references to the pod's own fields
//! (`fieldRef`), its container resources (`resourceFieldRef`), ConfigMap and Secret
//! keys. A missing non-optional source is a `CreateContainerConfigError`.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::spec::expand;

/// The keys of a ConfigMap (data and binaryData) or Secret.
pub type Data = BTreeMap<String, Vec<u8>>;

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Why a container's configuration cannot be built (the message the pod shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

/// Reads ConfigMaps and Secrets of the pod's namespace, once per container start, and
/// holds the pod's service-account tokens.
pub struct Sources<'a> {
    pub client: &'a Client,
    pub namespace: String,
    pub tokens: &'a super::tokens::Tokens,
    /// This node's name.
    pub node: &'a str,
    /// The CSI drivers registered on this node.
    pub csi: &'a crate::csi::Drivers,
    /// The kubelet's plugins directory (where CSI volumes are staged).
    pub csi_plugins: std::path::PathBuf,
}

impl Sources<'_> {
    /// What the attacher of a CSI volume says about its attachment to this node: its
    /// publish context once attached, else why not.
    pub async fn attachment(
        &self,
        handle: &str,
        driver: &str,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let name = krust_client::volume::attachment_name(handle, driver, self.node);
        let attachment = Api::<VolumeAttachment>::all(self.client.clone())
            .get_opt(&name)
            .await
            .map_err(|e| ConfigError(format!("getting VolumeAttachment {name}: {e}")))?;
        let status = attachment.as_ref().and_then(|a| a.status.as_ref());
        match status {
            Some(s) if s.attached => Ok(s.attachment_metadata.clone().unwrap_or_default()),
            _ => {
                let why = status
                    .and_then(|s| s.attach_error.as_ref())
                    .and_then(|e| e.message.clone())
                    .unwrap_or_else(|| {
                        format!(
                            "volume attachment {name} is not attached yet (waiting for the external attacher of CSI driver {driver})"
                        )
                    });
                Err(ConfigError(why))
            }
        }
    }

    /// The CSIDriver object of a driver, if there is one.
    pub async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, ConfigError> {
        Api::<CSIDriver>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| ConfigError(format!("getting CSIDriver {name}: {e}")))
    }

    /// The PersistentVolume a claim of the pod's namespace is bound to; `owner`: the
    /// claim must be controlled by that pod (an ephemeral volume's claim).
    pub async fn claimed_volume(
        &self,
        claim: &str,
        owner: Option<&str>,
    ) -> Result<PersistentVolume, ConfigError> {
        let failed = |e: kube::Error| {
            ConfigError(format!(
                "error processing PVC {}/{claim}: {e}",
                self.namespace
            ))
        };
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(claim)
            .await
            .map_err(failed)?
            .ok_or_else(|| ConfigError(format!("persistentvolumeclaim \"{claim}\" not found")))?;
        if let Some(owner) = owner {
            let owned = pvc
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.uid == owner && r.controller == Some(true));
            if !owned {
                return Err(ConfigError(format!(
                    "PVC {}/{claim} was not created for pod (pod is not owner)",
                    self.namespace
                )));
            }
        }
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let volume = pvc
            .spec
            .and_then(|s| s.volume_name)
            .filter(|v| !v.is_empty());
        let Some(volume) = volume.filter(|_| bound) else {
            return Err(ConfigError(format!(
                "error processing PVC {}/{claim}: PVC is not bound",
                self.namespace
            )));
        };
        Api::<PersistentVolume>::all(self.client.clone())
            .get(&volume)
            .await
            .map_err(failed)
    }

    async fn config_map(&self, name: &str) -> Result<Option<Data>, ConfigError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let cm = api
            .get_opt(name)
            .await
            .map_err(|e| ConfigError(format!("reading configmap \"{name}\": {e}")))?;
        Ok(cm.map(|cm| {
            let mut data: Data = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            data.extend(
                cm.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            data
        }))
    }

    async fn secret(&self, name: &str) -> Result<Option<Data>, ConfigError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = api
            .get_opt(name)
            .await
            .map_err(|e| ConfigError(format!("reading secret \"{name}\": {e}")))?;
        Ok(secret.map(|s| {
            let mut data: Data = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            data.extend(
                s.string_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes())),
            );
            data
        }))
    }

    /// A ConfigMap's or Secret's data; `None` when it is missing and optional.
    pub async fn data(
        &self,
        kind: Kind,
        name: &str,
        optional: bool,
    ) -> Result<Option<Data>, ConfigError> {
        let found = match kind {
            Kind::ConfigMap => self.config_map(name).await?,
            Kind::Secret => self.secret(name).await?,
        };
        match found {
            Some(d) => Ok(Some(d)),
            None if optional => Ok(None),
            None => Err(ConfigError(format!("{} \"{name}\" not found", kind.noun()))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// The value of a `fieldRef` path on the pod (the subset upstream allows in env).
pub fn field(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    let key_of = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['").and_then(|r| r.strip_suffix("']")))
            .map(str::to_string)
    };
    if let Some(k) = key_of("metadata.labels") {
        return pod.labels().get(&k).cloned();
    }
    if let Some(k) = key_of("metadata.annotations") {
        return pod.annotations().get(&k).cloned();
    }
    Some(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        _ => return None,
    })
}

/// A `resourceFieldRef` (`limits.cpu`, `requests.memory`, ...), with the divisor.
pub fn resource(container: &Container, resource: &str, divisor: Option<&str>) -> Option<String> {
    let (kind, name) = resource.split_once('.')?;
    let res = container.resources.as_ref();
    let value = match kind {
        "limits" => res
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(name)),
        "requests" => res
            .and_then(|r| r.requests.as_ref())
            .and_then(|l| l.get(name)),
        _ => None,
    };
    let Some(value) = value else {
        // Unset limits report the node's allocatable upstream; requests report 0.
        return Some("0".into());
    };
    match (name, divisor) {
        ("cpu", Some("1m")) => super::spec::quantity_millis(value).map(|m| m.to_string()),
        ("cpu", _) => super::spec::quantity_millis(value).map(|m| ((m + 999) / 1000).to_string()),
        (_, Some(d)) => {
            let d = super::spec::quantity_bytes(
                &k8s_openapi::apimachinery::pkg::api::resource::Quantity(d.into()),
            )?;
            super::spec::quantity_bytes(value).map(|b| ((b + d - 1) / d.max(1)).to_string())
        }
        _ => super::spec::quantity_bytes(value).map(|b| b.to_string()),
    }
}

/// The container's environment, in order.
pub async fn environment(
    sources: &Sources<'_>,
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(c), _) => (Kind::ConfigMap, c.name.clone(), c.optional.unwrap_or(false)),
            (_, Some(s)) => (Kind::Secret, s.name.clone(), s.optional.unwrap_or(false)),
            _ => continue,
        };
        if let Some(data) = sources.data(kind, &name, optional).await? {
            for (k, v) in data {
                set(&mut env, format!("{prefix}{k}"), text(&v));
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => Some(expand(v, &known_from(&env))),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field(pod, &f.field_path, pod_ip, host_ip)
                } else if let Some(r) = &from.resource_field_ref {
                    resource(
                        container,
                        &r.resource,
                        r.divisor.as_ref().map(|d| d.0.as_str()),
                    )
                } else if let Some(k) = &from.config_map_key_ref {
                    key(
                        sources,
                        Kind::ConfigMap,
                        &k.name,
                        &k.key,
                        k.optional.unwrap_or(false),
                    )
                    .await?
                } else if let Some(k) = &from.secret_key_ref {
                    key(
                        sources,
                        Kind::Secret,
                        &k.name,
                        &k.key,
                        k.optional.unwrap_or(false),
                    )
                    .await?
                } else {
                    None
                }
            }
            (None, None) => Some(String::new()),
        };
        if let Some(value) = value {
            set(&mut env, var.name.clone(), value);
        }
    }
    Ok(env)
}

/// Sets a variable; a later definition replaces an earlier one in place of order.
fn set(env: &mut Vec<(String, String)>, name: String, value: String) {
    env.retain(|(n, _)| *n != name);
    env.push((name, value));
}

fn known_from(env: &[(String, String)]) -> HashMap<String, String> {
    env.iter().cloned().collect()
}

async fn key(
    sources: &Sources<'_>,
    kind: Kind,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, ConfigError> {
    let Some(data) = sources.data(kind, name, optional).await? else {
        return Ok(None);
    };
    match data.get(key) {
        Some(v) => Ok(Some(text(v))),
        None if optional => Ok(None),
        None => Err(ConfigError(format!(
            "couldn't find key {key} in {} {}/{name}",
            match kind {
                Kind::ConfigMap => "ConfigMap",
                Kind::Secret => "Secret",
            },
            sources.namespace
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::json;

    #[test]
    fn field_refs_read_the_pod() {
        let pod: Pod = k8s_openapi::serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": []}
        }))
        .unwrap();
        assert_eq!(field(&pod, "metadata.name", "", "").as_deref(), Some("p"));
        assert_eq!(
            field(&pod, "metadata.labels['app']", "", "").as_deref(),
            Some("web")
        );
        assert_eq!(field(&pod, "spec.nodeName", "", "").as_deref(), Some("n1"));
        assert_eq!(
            field(&pod, "status.podIP", "10.0.0.1", "").as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(field(&pod, "spec.bogus", "", ""), None);
    }

    #[test]
    fn resource_refs_use_the_divisor() {
        let c: Container = k8s_openapi::serde_json::from_value(json!({
            "name": "c", "resources": {"limits": {"cpu": "1500m", "memory": "64Mi"}}
        }))
        .unwrap();
        assert_eq!(resource(&c, "limits.cpu", None).as_deref(), Some("2"));
        assert_eq!(
            resource(&c, "limits.cpu", Some("1m")).as_deref(),
            Some("1500")
        );
        assert_eq!(
            resource(&c, "limits.memory", Some("1Mi")).as_deref(),
            Some("64")
        );
        assert_eq!(
            resource(&c, "limits.memory", None).as_deref(),
            Some("67108864")
        );
    }
}
