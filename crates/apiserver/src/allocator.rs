//! ClusterIP and NodePort allocation for Services. Each apiserver picks candidates from
//! an in-memory set (rebuilt from the stored Services at start), and every allocation is
//! also claimed in the store under `/registry/ranges/...` with a create-if-absent
//! transaction, so apiservers sharing one store never hand out the same IP or port.
//! Allocations are released if the write that needed them fails.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use bytes::Bytes;
use krust_api::cidr::Ipv4Cidr;
use krust_api::status::Cause;
use krust_api::sync::Unpoisoned;
use krust_store::{Compare, Op, Store, StoreError, Txn, TxnResult};
use serde_json::{Value, json};

/// The NodePort range, as upstream's default.
pub const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

pub struct ServiceAllocator {
    range: Ipv4Cidr,
    base: u32,
    size: u32,
    ips: Mutex<HashSet<u32>>,
    ports: Mutex<HashSet<u16>>,
}

impl ServiceAllocator {
    pub fn new(range: Ipv4Cidr) -> Self {
        ServiceAllocator {
            range,
            base: u32::from(range.network()),
            size: range.size() as u32,
            ips: Mutex::new(HashSet::new()),
            ports: Mutex::new(HashSet::new()),
        }
    }

    /// The first usable address: the `kubernetes` Service's ClusterIP.
    pub fn first_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1)
    }

    /// The `n`th usable address (the DNS service is the 10th).
    pub fn nth_ip(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.base + n)
    }

    fn contains(&self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        v > self.base && v < self.base + self.size - 1
    }

    /// Marks what an existing Service holds as used.
    pub fn observe(&self, svc: &Value) {
        if let Some(ip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        {
            self.lock_ips().insert(u32::from(ip));
        }
        for p in node_ports(svc) {
            self.lock_ports().insert(p);
        }
    }

    /// Gives a Service its ClusterIP and NodePorts, filling unset ones and checking
    /// requested ones. On error nothing stays allocated.
    pub fn allocate(&self, svc: &mut Value) -> Result<(), Vec<Cause>> {
        let spec = &mut svc["spec"];
        let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
        let mut taken_ip = None;
        if ty != "ExternalName" {
            match spec["clusterIP"].as_str().filter(|s| !s.is_empty()) {
                Some("None") => {
                    spec["clusterIPs"] = json!(["None"]);
                }
                Some(requested) => {
                    let parsed = requested.parse::<Ipv4Addr>().ok();
                    let ip = parsed.filter(|ip| self.contains(*ip)).ok_or_else(|| {
                        vec![Cause::invalid("spec.clusterIPs", &json!([requested]), format!("failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is {}", self.range))]
                    })?;
                    if !self.lock_ips().insert(u32::from(ip)) {
                        return Err(vec![Cause::invalid(
                            "spec.clusterIPs",
                            &json!([requested]),
                            format!(
                                "failed to allocate IP {requested}: provided IP is already allocated"
                            ),
                        )]);
                    }
                    taken_ip = Some(ip);
                    spec["clusterIPs"] = json!([requested]);
                }
                None => {
                    let ip = self.next_ip().ok_or_else(|| {
                        vec![Cause::invalid(
                            "spec.clusterIPs",
                            &json!([]),
                            "failed to allocate a serviceIP: range is full",
                        )]
                    })?;
                    taken_ip = Some(ip);
                    spec["clusterIP"] = json!(ip.to_string());
                    spec["clusterIPs"] = json!([ip.to_string()]);
                }
            }
            spec["ipFamilies"] = json!(["IPv4"]);
            spec["ipFamilyPolicy"] = json!("SingleStack");
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            let mut taken = Vec::new();
            let result = self.allocate_ports(spec, &mut taken);
            if let Err(e) = result {
                let mut ports = self.lock_ports();
                for p in taken {
                    ports.remove(&p);
                }
                drop(ports);
                if let Some(ip) = taken_ip {
                    self.lock_ips().remove(&u32::from(ip));
                }
                return Err(e);
            }
        } else if let Some(spec) = spec.as_object_mut() {
            spec.remove("healthCheckNodePort");
        }
        Ok(())
    }

    fn allocate_ports(&self, spec: &mut Value, taken: &mut Vec<u16>) -> Result<(), Vec<Cause>> {
        for (i, p) in spec["ports"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let n = self.node_port(&p["nodePort"], &format!("spec.ports[{i}].nodePort"))?;
            taken.push(n);
            p["nodePort"] = json!(n);
        }
        if needs_health_check_node_port(spec) {
            let n = self.node_port(&spec["healthCheckNodePort"], "spec.healthCheckNodePort")?;
            taken.push(n);
            spec["healthCheckNodePort"] = json!(n);
        } else if let Some(spec) = spec.as_object_mut() {
            spec.remove("healthCheckNodePort");
        }
        Ok(())
    }

    /// The `requested` node port (checked and taken), or a free one.
    fn node_port(&self, requested: &Value, field: &str) -> Result<u16, Vec<Cause>> {
        let Some(n) = requested.as_u64().filter(|n| *n != 0) else {
            return self
                .next_port()
                .ok_or_else(|| vec![Cause::invalid(field, &json!(0), "range is full")]);
        };
        let Some(n) = u16::try_from(n).ok().filter(|n| NODE_PORTS.contains(n)) else {
            return Err(vec![Cause::invalid(
                field,
                requested,
                "provided port is not in the valid range. The range of valid ports is 30000-32767",
            )]);
        };
        if !self.lock_ports().insert(n) {
            return Err(vec![Cause::invalid(
                field,
                requested,
                "provided port is already allocated",
            )]);
        }
        Ok(n)
    }

    /// Frees what a deleted (or never stored) Service held.
    pub fn release(&self, svc: &Value) {
        if let Some(ip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        {
            self.lock_ips().remove(&u32::from(ip));
        }
        let mut ports = self.lock_ports();
        for p in node_ports(svc) {
            ports.remove(&p);
        }
    }

    fn next_ip(&self) -> Option<Ipv4Addr> {
        let mut ips = self.lock_ips();
        let usable = self.size.saturating_sub(2);
        let start = uuid::Uuid::new_v4().as_u128() as u32 % usable.max(1);
        (0..usable)
            .map(|i| self.base + 1 + (start + i) % usable)
            .find(|ip| ips.insert(*ip))
            .map(Ipv4Addr::from)
    }

    fn next_port(&self) -> Option<u16> {
        let mut ports = self.lock_ports();
        let span = (*NODE_PORTS.end() - *NODE_PORTS.start()) as u32 + 1;
        let start = uuid::Uuid::new_v4().as_u128() as u32 % span;
        (0..span)
            .map(|i| *NODE_PORTS.start() + ((start + i) % span) as u16)
            .find(|p| ports.insert(*p))
    }

    fn lock_ips(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.ips.locked()
    }

    fn lock_ports(&self) -> std::sync::MutexGuard<'_, HashSet<u16>> {
        self.ports.locked()
    }
}

/// The store keys recording what a Service holds.
pub fn claim_keys(svc: &Value) -> Vec<String> {
    let mut keys = Vec::new();
    if let Some(ip) = svc["spec"]["clusterIP"]
        .as_str()
        .and_then(|s| s.parse::<Ipv4Addr>().ok())
    {
        keys.push(format!("/registry/ranges/serviceips/{ip}"));
    }
    keys.extend(
        node_ports(svc)
            .into_iter()
            .map(|p| format!("/registry/ranges/servicenodeports/{p}")),
    );
    keys
}

/// Claims `keys` for `owner` (`namespace/name`). Keys the owner already holds are fine;
/// on the first key someone else holds, the claims made here are undone and that key is
/// returned.
pub async fn claim(store: &dyn Store, owner: &str, keys: &[String]) -> Result<(), ClaimError> {
    let mut made = Vec::new();
    for key in keys {
        let txn = Txn {
            key: key.clone(),
            compare: Compare::Absent,
            op: Op::Put(Bytes::from(owner.to_string())),
        };
        match store.txn(txn).await? {
            TxnResult::Succeeded { .. } => made.push(key.clone()),
            TxnResult::Failed {
                current: Some(kv), ..
            } if kv.value == owner.as_bytes() => {}
            TxnResult::Failed { .. } => {
                unclaim(store, owner, &made).await?;
                return Err(ClaimError::Taken(key.clone()));
            }
        }
    }
    Ok(())
}

/// Drops `owner`'s claims on `keys` (claims held by someone else stay).
pub async fn unclaim(store: &dyn Store, owner: &str, keys: &[String]) -> Result<(), ClaimError> {
    for key in keys {
        let (current, _) = store.get(key, 0).await?;
        if let Some(kv) = current.filter(|kv| kv.value == owner.as_bytes()) {
            store
                .txn(Txn {
                    key: key.clone(),
                    compare: Compare::ModRevision(kv.mod_revision),
                    op: Op::Delete,
                })
                .await?;
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("{0} is held by another Service")]
    Taken(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceAllocator {
    /// Marks the IP or port a claim key names as used here (another apiserver has it).
    pub fn observe_key(&self, key: &str) {
        let Some((kind, value)) = key.rsplit_once('/') else {
            return;
        };
        if kind.ends_with("serviceips") {
            if let Ok(ip) = value.parse::<Ipv4Addr>() {
                self.lock_ips().insert(u32::from(ip));
            }
        } else if let Ok(port) = value.parse::<u16>() {
            self.lock_ports().insert(port);
        }
    }
}

/// The node ports a Service holds: its ports' and its health check's.
fn node_ports(svc: &Value) -> Vec<u16> {
    svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| &p["nodePort"])
        .chain(std::iter::once(&svc["spec"]["healthCheckNodePort"]))
        .filter_map(|n| n.as_u64().map(|n| n as u16))
        .collect()
}

/// A LoadBalancer Service whose external traffic stays on nodes with endpoints gets a
/// port where each node's proxy answers whether it has any (for the load balancer's
/// health checks).
pub fn needs_health_check_node_port(spec: &Value) -> bool {
    spec["type"] == "LoadBalancer" && spec["externalTrafficPolicy"] == "Local"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn claims_are_exclusive_per_owner_and_released_only_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = krust_store::embedded::EmbeddedStore::open(dir.path().join("s.redb")).unwrap();
        let svc = json!({"spec": {"clusterIP": "10.43.0.9", "ports": [{"nodePort": 30001}]}});
        let keys = claim_keys(&svc);
        assert_eq!(
            keys,
            [
                "/registry/ranges/serviceips/10.43.0.9",
                "/registry/ranges/servicenodeports/30001"
            ]
        );
        claim(&store, "ns/a", &keys).await.unwrap();
        claim(&store, "ns/a", &keys).await.unwrap();
        // Another owner wanting the port (but a free IP) gets nothing at all.
        let other = vec![
            "/registry/ranges/serviceips/10.43.0.10".to_string(),
            keys[1].clone(),
        ];
        match claim(&store, "ns/b", &other).await {
            Err(ClaimError::Taken(k)) => assert_eq!(k, keys[1]),
            r => panic!("{r:?}"),
        }
        assert!(
            store.get(&other[0], 0).await.unwrap().0.is_none(),
            "partial claim undone"
        );
        unclaim(&store, "ns/b", &keys).await.unwrap();
        assert!(
            store.get(&keys[0], 0).await.unwrap().0.is_some(),
            "only the owner releases"
        );
        unclaim(&store, "ns/a", &keys).await.unwrap();
        claim(&store, "ns/b", &other).await.unwrap();
    }

    #[test]
    fn allocates_unique_ips_and_ports() {
        let a = ServiceAllocator::new("10.43.0.0/16".parse().unwrap());
        assert_eq!(a.first_ip().to_string(), "10.43.0.1");
        let mut s1 = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let mut s2 = json!({"spec": {"type": "ClusterIP", "clusterIP": "10.43.0.10", "ports": [{"port": 53}]}});
        a.allocate(&mut s1).unwrap();
        a.allocate(&mut s2).unwrap();
        assert_ne!(s1["spec"]["clusterIP"], s2["spec"]["clusterIP"]);
        assert!(
            NODE_PORTS.contains(&(s1["spec"]["ports"][0]["nodePort"].as_u64().unwrap() as u16))
        );
        let mut dup = json!({"spec": {"clusterIP": "10.43.0.10", "ports": [{"port": 1}]}});
        let err = a.allocate(&mut dup).unwrap_err();
        assert!(err[0].message.contains("already allocated"));
        a.release(&s2);
        a.allocate(&mut dup).unwrap();
        let mut outside = json!({"spec": {"clusterIP": "192.168.0.1"}});
        assert!(a.allocate(&mut outside).is_err());
    }

    #[test]
    fn local_load_balancers_get_a_health_check_node_port_held_like_the_others() {
        let a = ServiceAllocator::new("10.43.0.0/16".parse().unwrap());
        let mut lb = json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                                     "ports": [{"port": 80}]}});
        a.allocate(&mut lb).unwrap();
        let health = lb["spec"]["healthCheckNodePort"].as_u64().unwrap() as u16;
        assert!(NODE_PORTS.contains(&health));
        assert_ne!(lb["spec"]["ports"][0]["nodePort"], health);
        assert!(claim_keys(&lb).contains(&format!("/registry/ranges/servicenodeports/{health}")));
        let mut taken =
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": health}]}});
        let err = a.allocate(&mut taken).unwrap_err();
        assert!(
            err[0]
                .message
                .ends_with("provided port is already allocated")
        );
        a.release(&lb);
        a.allocate(&mut taken).unwrap();

        let mut cluster = json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Cluster",
                                          "healthCheckNodePort": 31999, "ports": [{"port": 80}]}});
        a.allocate(&mut cluster).unwrap();
        assert!(cluster["spec"].get("healthCheckNodePort").is_none());
        let mut bad = json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                                      "healthCheckNodePort": 80, "ports": [{"port": 80}]}});
        let err = a.allocate(&mut bad).unwrap_err();
        assert_eq!(err[0].field, "spec.healthCheckNodePort");
    }
}
