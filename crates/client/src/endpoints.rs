//! Reading EndpointSlices as the Service data plane does (the proxy, the cluster DNS and
//! the Ingress controller): which Service a slice belongs to, and which endpoints serve.

use std::collections::HashMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// When the latest change behind a slice (a pod's or its Service's) happened, set by
/// the EndpointSlice controller on the slices it writes: the start of the network
/// programming latency the proxies measure.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The IPv4 slices of each Service, by (namespace, Service name). Slices without the
/// label belong to no Service.
pub fn ipv4_slices_by_service<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> HashMap<(&'a str, &'a str), Vec<&'a EndpointSlice>> {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for slice in slices {
        let meta = &slice.metadata;
        let (Some(namespace), Some(service)) = (
            meta.namespace.as_deref(),
            meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)),
        ) else {
            continue;
        };
        if slice.address_type == "IPv4" {
            by_service
                .entry((namespace, service.as_str()))
                .or_default()
                .push(slice);
        }
    }
    by_service
}

/// An endpoint's `ready` condition; an absent one means ready, as the API says.
pub fn is_ready(endpoint: &Endpoint) -> bool {
    endpoint
        .conditions
        .as_ref()
        .and_then(|c| c.ready)
        .unwrap_or(true)
}
