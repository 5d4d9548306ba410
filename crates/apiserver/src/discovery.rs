//! API discovery: legacy (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`) and aggregated
//! (apidiscovery.k8s.io/v2, what kubectl asks for first), all generated from the registry.

use krust_api::registry::{self, RESOURCE_VERBS, ResourceInfo};
use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

/// The Content-Type of aggregated discovery documents.
pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
pub const AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// Which aggregated discovery version an Accept header asks for, if any.
pub fn wants_aggregated(accept: Option<&str>) -> Option<&'static str> {
    let accept = accept?;
    for media in accept.split(',') {
        let m = media.replace(' ', "");
        if m.contains("g=apidiscovery.k8s.io") && m.contains("as=APIGroupDiscoveryList") {
            if m.contains("v=v2beta1") {
                return Some(AGGREGATED_V2BETA1);
            }
            if m.contains("v=v2") {
                return Some(AGGREGATED_V2);
            }
        }
        if m.starts_with("application/json") && !m.contains("as=") {
            return None;
        }
    }
    None
}

/// The resources discovery describes: the built-in ones, then those of the custom
/// resource definitions served now (each group's versions by upstream's priority).
pub struct Catalog {
    resources: Vec<&'static ResourceInfo>,
    /// Each storage prefix's storage version: the first resource stored there, built-in
    /// kinds and each definition's versions listing theirs first.
    stored_as: HashMap<&'static str, &'static ResourceInfo>,
    /// Group versions served by aggregated apiservers, with their APIResourceLists.
    remote: BTreeMap<(String, String), Value>,
}

impl Catalog {
    pub fn new(custom: impl IntoIterator<Item = &'static ResourceInfo>) -> Self {
        let mut custom: Vec<&'static ResourceInfo> = custom.into_iter().collect();
        let mut stored_as = HashMap::new();
        for r in registry::RESOURCES.iter().chain(custom.iter().copied()) {
            stored_as.entry(r.storage).or_insert(r);
        }
        custom.sort_by(|a, b| {
            a.group
                .cmp(b.group)
                .then_with(|| registry::version_priority(a.version, b.version))
                .then_with(|| a.plural.cmp(b.plural))
        });
        Catalog {
            resources: registry::RESOURCES.iter().chain(custom).collect(),
            stored_as,
            remote: BTreeMap::new(),
        }
    }

    /// Adds the group versions of aggregated apiservers.
    pub fn with_remote(mut self, remote: BTreeMap<(String, String), Value>) -> Self {
        self.remote = remote;
        self
    }

    /// The groups served here (the legacy core group first), each with its versions.
    pub fn group_versions(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        registry::groups_of(self.resources.iter().copied())
    }

    /// Every group with its versions, the aggregated ones last.
    fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = self
            .group_versions()
            .into_iter()
            .map(|(g, vs)| (g.to_string(), vs.into_iter().map(str::to_string).collect()))
            .collect();
        for (g, v) in self.remote.keys() {
            match out.iter_mut().find(|(name, _)| name == g) {
                Some((_, versions)) if !versions.contains(v) => versions.push(v.clone()),
                Some(_) => {}
                None => out.push((g.clone(), vec![v.clone()])),
            }
        }
        out
    }

    fn resources_in<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'static ResourceInfo> + 'a {
        self.resources
            .iter()
            .copied()
            .filter(move |r| r.group == group && r.version == version)
    }
}

/// `/api`: the legacy group's versions.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

impl Catalog {
    /// `/apis`: every named group with its versions.
    pub fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .into_iter()
            .filter(|(g, _)| !g.is_empty())
            .map(|(g, versions)| group_value(&g, &versions))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }
}

fn group_value(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs[0]})
}

impl Catalog {
    /// `/apis/<group>`: one group.
    pub fn api_group(&self, group: &str) -> Option<Value> {
        let (g, versions) = self
            .groups()
            .into_iter()
            .find(|(g, _)| *g == group && !g.is_empty())?;
        let mut v = group_value(&g, &versions);
        v["kind"] = json!("APIGroup");
        v["apiVersion"] = json!("v1");
        Some(v)
    }

    /// `/api/v1` or `/apis/<group>/<version>`: the resources of one group version.
    pub fn api_resource_list(&self, group: &str, version: &str) -> Option<Value> {
        if let Some(list) = self.remote.get(&(group.to_string(), version.to_string())) {
            return Some(list.clone());
        }
        let mut resources = Vec::new();
        for r in self.resources_in(group, version) {
            let mut entry = json!({
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs_of(r),
            });
            if !r.short_names.is_empty() {
                entry["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                entry["categories"] = json!(r.categories);
            }
            if let Some(hash) = self.storage_version_hash(r) {
                entry["storageVersionHash"] = json!(hash);
            }
            resources.push(entry);
            for sub in r.subresources {
                let mut s = json!({
                    "name": format!("{}/{}", r.plural, sub.name()),
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": sub.kind().map_or(r.kind, |(_, _, k)| k),
                    "verbs": sub.verbs(),
                });
                if let Some((g, v, _)) = sub.kind() {
                    s["group"] = json!(g);
                    s["version"] = json!(v);
                }
                resources.push(s);
            }
        }
        if resources.is_empty() {
            return None;
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
        )
    }
}

impl Catalog {
    /// Upstream's `storageVersionHash`: the first 8 bytes of the SHA-256 of the storage
    /// version's `group/version/kind`, in base64, for resources kept in the store by the
    /// generic registry (not the reviews, bindings, component statuses or metrics).
    fn storage_version_hash(&self, r: &ResourceInfo) -> Option<String> {
        use base64::Engine;
        use sha2::{Digest, Sha256};
        let computed = r.group == crate::resource_metrics::GROUP
            || (r.group.is_empty() && matches!(r.plural, "bindings" | "componentstatuses"));
        if r.is_virtual() || computed {
            return None;
        }
        let stored = self.stored_as.get(r.storage)?;
        let gvk = format!("{}/{}/{}", stored.group, stored.version, stored.kind);
        let digest = Sha256::digest(gvk.as_bytes());
        Some(base64::engine::general_purpose::STANDARD.encode(&digest[..8]))
    }
}

fn verbs_of(r: &ResourceInfo) -> Vec<&'static str> {
    if r.group == crate::resource_metrics::GROUP {
        crate::resource_metrics::VERBS.to_vec()
    } else if r.group.is_empty() && r.plural == "componentstatuses" {
        crate::component_status::VERBS.to_vec()
    } else if r.plural == "bindings" || r.is_virtual() {
        vec!["create"]
    } else {
        RESOURCE_VERBS.to_vec()
    }
}

impl Catalog {
    /// The aggregated discovery document for `/api` (legacy) or `/apis` (named groups).
    pub fn aggregated(&self, legacy: bool, api_version: &str) -> Value {
        let items: Vec<Value> = self.groups()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == legacy)
        .map(|(g, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| {
                    if let Some(list) = self.remote.get(&(g.clone(), v.clone())) {
                        return json!({"version": v, "resources": remote_resources(list), "freshness": "Current"});
                    }
                    let resources: Vec<Value> = self.resources_in(&g, v)
                        .map(|r| {
                            let mut e = json!({
                                "resource": r.plural,
                                "responseKind": {"group": "", "version": "", "kind": r.kind},
                                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": r.singular,
                                "verbs": verbs_of(r),
                            });
                            if !r.short_names.is_empty() {
                                e["shortNames"] = json!(r.short_names);
                            }
                            if !r.categories.is_empty() {
                                e["categories"] = json!(r.categories);
                            }
                            let subs: Vec<Value> = r
                                .subresources
                                .iter()
                                .map(|s| {
                                    let (sg, sv, sk) = s.kind().unwrap_or(("", "", r.kind));
                                    json!({"subresource": s.name(), "responseKind": {"group": sg, "version": sv, "kind": sk}, "verbs": s.verbs()})
                                })
                                .collect();
                            if !subs.is_empty() {
                                e["subresources"] = Value::Array(subs);
                            }
                            e
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": vs})
        })
        .collect();
        json!({"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items})
    }
}

/// An aggregated apiserver's APIResourceList in aggregated discovery's form: each
/// resource with its subresources.
fn remote_resources(list: &Value) -> Vec<Value> {
    let entries = list["resources"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<Value> = Vec::new();
    for e in entries
        .iter()
        .filter(|e| !e["name"].as_str().unwrap_or("/").contains('/'))
    {
        let mut r = json!({
            "resource": e["name"],
            "responseKind": {"group": "", "version": "", "kind": e["kind"]},
            "scope": if e["namespaced"] == json!(true) { "Namespaced" } else { "Cluster" },
            "singularResource": e["singularName"],
            "verbs": e["verbs"],
        });
        for field in ["shortNames", "categories"] {
            if e[field].is_array() {
                r[field] = e[field].clone();
            }
        }
        out.push(r);
    }
    for e in &entries {
        let Some((parent, sub)) = e["name"].as_str().and_then(|n| n.split_once('/')) else {
            continue;
        };
        if let Some(r) = out.iter_mut().find(|r| r["resource"] == parent) {
            let entry = json!({"subresource": sub, "responseKind": {"group": e["group"].as_str().unwrap_or_default(), "version": e["version"].as_str().unwrap_or_default(), "kind": e["kind"]}, "verbs": e["verbs"]});
            match r["subresources"].as_array_mut() {
                Some(subs) => subs.push(entry),
                None => r["subresources"] = json!([entry]),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_version_hashes_are_upstreams() {
        let catalog = Catalog::new([]);
        let hash = |group: &str, version: &str, plural: &str| {
            let list = catalog.api_resource_list(group, version).unwrap();
            let entry = list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == plural)
                .unwrap()
                .clone();
            entry["storageVersionHash"].clone()
        };
        // As kube-apiserver 1.33 publishes them.
        assert_eq!(hash("", "v1", "configmaps"), "qFsyl6wFWjQ=");
        assert_eq!(hash("apps", "v1", "deployments"), "8aSe+NMegvE=");
        assert_eq!(hash("", "v1", "pods"), "xPOwRZ+Yhw8=");
        // Events of both groups are stored as core events.
        assert_eq!(
            hash("events.k8s.io", "v1", "events"),
            hash("", "v1", "events")
        );
        assert_eq!(hash("", "v1", "bindings"), Value::Null);
    }

    #[test]
    fn discovery_lists_pods_and_deployments() {
        let catalog = Catalog::new([]);
        let core = catalog.api_resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"pods")
                && names.contains(&"pods/status")
                && names.contains(&"pods/binding")
                && names.contains(&"pods/exec")
                && names.contains(&"serviceaccounts/token")
        );
        let apps = catalog.api_resource_list("apps", "v1").unwrap();
        let scale = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .unwrap();
        assert_eq!(scale["group"], "autoscaling");
        assert!(catalog.api_resource_list("nope", "v1").is_none());
        let agg = catalog.aggregated(false, "apidiscovery.k8s.io/v2");
        assert!(
            agg["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["metadata"]["name"] == "apps")
        );
        assert_eq!(
            wants_aggregated(Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
            )),
            Some(AGGREGATED_V2)
        );
        assert_eq!(wants_aggregated(Some("application/json, */*")), None);
    }
}
