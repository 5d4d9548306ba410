//! The Service registry's allocation of ClusterIPs and NodePorts (upstream's Service
//! REST storage does it around the store, not admission): a new Service gets what its
//! type needs, an update keeps what was allocated and allocates what a type change now
//! needs, a deleted Service gives its IP and ports back.

use std::sync::Arc;

use krust_api::status::{ApiError, Cause};
use serde_json::Value;

use crate::allocator::{ClaimError, ServiceAllocator, claim, claim_keys, unclaim};
use crate::rest::{Call, Storage};

/// The Service registry's REST storage, allocating from this apiserver's ranges.
pub struct ServiceStorage(pub Arc<ServiceAllocator>);

#[async_trait::async_trait]
impl Storage for ServiceStorage {
    async fn begin_create(&self, call: &Call<'_>, svc: &mut Value) -> Result<(), ApiError> {
        allocate(&self.0, call, svc, None).await
    }

    async fn begin_update(
        &self,
        call: &Call<'_>,
        new: &mut Value,
        old: &Value,
    ) -> Result<(), ApiError> {
        // Keep what was allocated; allocate what a type change now needs.
        if new["spec"]["clusterIP"].as_str().is_none_or(str::is_empty)
            && old["spec"]["type"] != "ExternalName"
        {
            for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                new["spec"][field] = old["spec"][field].clone();
            }
        }
        let needs_ports = matches!(
            new["spec"]["type"].as_str(),
            Some("NodePort" | "LoadBalancer")
        );
        if needs_ports {
            keep_node_ports(new, old);
        }
        if crate::allocator::needs_health_check_node_port(&new["spec"])
            && new["spec"]["healthCheckNodePort"].is_null()
        {
            new["spec"]["healthCheckNodePort"] = old["spec"]["healthCheckNodePort"].clone();
        }
        allocate(&self.0, call, new, Some(old)).await
    }

    async fn release(&self, call: &Call<'_>, svc: &Value) {
        if call.dry_run() {
            return;
        }
        self.0.release(svc);
        let owner = format!(
            "{}/{}",
            svc["metadata"]["namespace"].as_str().unwrap_or_default(),
            svc["metadata"]["name"].as_str().unwrap_or_default()
        );
        if let Err(err) = unclaim(call.scope.store.as_ref(), &owner, &claim_keys(svc)).await {
            tracing::warn!(%err, %owner, "releasing a Service's IP and ports");
        }
    }
}

/// Gives a Service (new, or `old` updated) its ClusterIP and NodePorts, claimed in
/// the store. An auto-assigned IP or port another apiserver took meanwhile is skipped
/// and another picked; a requested one is refused.
async fn allocate(
    services: &ServiceAllocator,
    call: &Call<'_>,
    svc: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let name = svc["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let owner = format!(
        "{}/{name}",
        svc["metadata"]["namespace"].as_str().unwrap_or_default()
    );
    let requested = claim_keys(svc);
    for _ in 0..16 {
        let mut probe = svc.clone();
        if let Some(old) = old {
            services.release(old);
        }
        let allocated = services.allocate(&mut probe);
        if let Some(old) = old {
            services.observe(old);
        }
        allocated.map_err(|causes| ApiError::invalid("Service", "", &name, causes))?;
        if call.dry_run() {
            if old.is_none() {
                services.release(&probe);
            }
            *svc = probe;
            return Ok(());
        }
        let keys = claim_keys(&probe);
        match claim(call.scope.store.as_ref(), &owner, &keys).await {
            Ok(()) => {
                if let Some(old) = old {
                    let dropped: Vec<String> = claim_keys(old)
                        .into_iter()
                        .filter(|k| !keys.contains(k))
                        .collect();
                    services.release(old);
                    services.observe(&probe);
                    unclaim(call.scope.store.as_ref(), &owner, &dropped)
                        .await
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                }
                *svc = probe;
                return Ok(());
            }
            Err(ClaimError::Taken(key)) => {
                services.release(&probe);
                if let Some(old) = old {
                    services.observe(old);
                }
                services.observe_key(&key);
                if requested.contains(&key) {
                    let what = key.rsplit('/').next().unwrap_or_default().to_string();
                    let field = if key.contains("serviceips") {
                        "spec.clusterIPs"
                    } else {
                        "spec.ports"
                    };
                    return Err(ApiError::invalid(
                        "Service",
                        "",
                        &name,
                        vec![Cause::invalid(
                            field,
                            &Value::String(what.clone()),
                            format!(
                                "failed to allocate {what}: provided value is already allocated"
                            ),
                        )],
                    ));
                }
            }
            Err(ClaimError::Store(e)) => {
                services.release(&probe);
                return Err(ApiError::internal(e.to_string()));
            }
        }
    }
    Err(ApiError::internal(
        "could not allocate a ClusterIP or NodePort: every candidate was taken",
    ))
}

/// NodePorts of ports the update leaves unset keep their old values (matched by port).
fn keep_node_ports(new: &mut Value, old: &Value) {
    let old_ports = old["spec"]["ports"].as_array().cloned().unwrap_or_default();
    for p in crate::validation::each_mut(new, "/spec/ports") {
        if p["nodePort"].is_null()
            && let Some(o) = old_ports
                .iter()
                .find(|o| o["port"] == p["port"] && o["protocol"] == p["protocol"])
        {
            p["nodePort"] = o["nodePort"].clone();
        }
    }
}
