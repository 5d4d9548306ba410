//! Network programming latency, as kube-proxy measures it: from the moment a change
//! reached the API (the `endpoints.kubernetes.io/last-change-trigger-time` annotation the
//! EndpointSlice controller writes: the latest pod or Service change behind the slice)
//! to the moment this node's rules carry it.

use std::collections::HashMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use krust_client::endpoints::LAST_CHANGE_TRIGGER_TIME as TRIGGER_TIME;

/// The EndpointSlices seen so far, and the trigger times of changes not yet programmed.
#[derive(Default)]
pub struct Triggers {
    seen: HashMap<(String, String), String>,
    pending: Vec<jiff::Timestamp>,
    primed: bool,
}

impl Triggers {
    /// Notes the slices that changed since the last call. The first call only
    /// remembers: what was there before the proxy started is not a change it programs.
    pub fn observe<'a>(&mut self, slices: impl IntoIterator<Item = &'a EndpointSlice>) {
        let mut seen = HashMap::with_capacity(self.seen.len());
        for slice in slices {
            let meta = &slice.metadata;
            let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
                continue;
            };
            let version = meta.resource_version.clone().unwrap_or_default();
            let key = (ns.clone(), name.clone());
            if self.primed && self.seen.get(&key) != Some(&version) {
                let trigger = meta
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(TRIGGER_TIME))
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                self.pending.extend(trigger);
            }
            seen.insert(key, version);
        }
        self.seen = seen;
        self.primed = true;
    }

    /// Seconds from each pending change to now; nothing is pending afterwards.
    pub fn programmed(&mut self) -> Vec<f64> {
        let now = jiff::Timestamp::now();
        self.pending
            .drain(..)
            .map(|t| (now - t).total(jiff::Unit::Second).unwrap_or(0.0).max(0.0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(name: &str, version: &str, trigger: Option<&str>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                annotations: trigger.map(|t| [(TRIGGER_TIME.to_string(), t.to_string())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Vec::new(),
            ports: None,
        }
    }

    #[test]
    fn only_changes_after_the_first_look_are_timed() {
        let mut t = Triggers::default();
        let an_hour_ago =
            (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600)).to_string();
        t.observe([&slice("a", "1", Some(&an_hour_ago))]);
        assert!(t.programmed().is_empty(), "present at start: not a change");
        t.observe([&slice("a", "1", Some(&an_hour_ago))]);
        assert!(t.programmed().is_empty(), "unchanged");
        let a_second_ago =
            (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1)).to_string();
        t.observe([
            &slice("a", "2", Some(&a_second_ago)),
            &slice("b", "3", None),
        ]);
        let latencies = t.programmed();
        assert_eq!(latencies.len(), 1, "b has no trigger time");
        assert!((1.0..5.0).contains(&latencies[0]), "{latencies:?}");
        assert!(t.programmed().is_empty());
    }
}
