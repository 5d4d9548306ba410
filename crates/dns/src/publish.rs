//! How pods reach the cluster DNS: the `kube-system/kube-dns` Service (the cluster IP
//! every pod's resolv.conf names, as upstream's kube-dns/CoreDNS Service) and an
//! EndpointSlice per DNS server pointing at the address it listens on. The Service has
//! no selector, so the EndpointSlice controller leaves it to us; the Service proxy then
//! sends the cluster IP's port 53 to the servers.

use std::net::SocketAddrV4;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::serde_json::json;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

pub const NAMESPACE: &str = "kube-system";
pub const SERVICE: &str = "kube-dns";
const MANAGER: &str = "krust-dns";

/// Creates the Service (with `service_ip`) unless it exists, and applies this server's
/// EndpointSlice, `kube-dns-<instance>`.
pub async fn publish(
    client: &Client,
    service_ip: std::net::Ipv4Addr,
    listen: SocketAddrV4,
    instance: &str,
) -> Result<(), kube::Error> {
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    if services.get_opt(SERVICE).await?.is_none() {
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {
                "k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "krust-dns"}},
            "spec": {"clusterIP": service_ip.to_string(), "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": listen.port()},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": listen.port()}]},
        });
        let created = services
            .patch(
                SERVICE,
                &PatchParams::apply(MANAGER),
                &Patch::Apply(&service),
            )
            .await?;
        tracing::info!(service = %created.name_any(), ip = %service_ip, "cluster DNS service created");
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let name = format!("{SERVICE}-{instance}");
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
            "kubernetes.io/service-name": SERVICE,
            "endpointslice.kubernetes.io/managed-by": MANAGER}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [listen.ip().to_string()],
                       "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [{"name": "dns", "port": listen.port(), "protocol": "UDP"},
                  {"name": "dns-tcp", "port": listen.port(), "protocol": "TCP"}],
    });
    slices
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&slice),
        )
        .await?;
    Ok(())
}
