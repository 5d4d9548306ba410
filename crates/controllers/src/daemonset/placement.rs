//! Where a DaemonSet's pods belong, as upstream's `NodeShouldRunDaemonPod`: a node must
//! match the template's `nodeName`, `nodeSelector` and required node affinity, and have
//! no NoSchedule/NoExecute taint the pods do not tolerate — counting the tolerations
//! every daemon pod gets (a node that is not ready, unreachable, under pressure or
//! cordoned still runs its daemons). A pod already running may stay unless a NoExecute
//! taint it does not tolerate appeared. And the pod made for one node: the template,
//! those tolerations, and a required node affinity for that node alone, so that the
//! scheduler binds it there.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use krust_client::selector::{
    NodeSelectorMatcher, find_untolerated_taint, is_do_not_schedule_taint,
};
use kube::ResourceExt;

use crate::history::REVISION_HASH;
use crate::owner::controller_ref;

/// The label upstream still puts on daemon pods: the template generation when the pod
/// was made. Upstream counts template changes only (the
/// `deprecated.daemonset.template.generation` annotation); krust writes
/// `metadata.generation` and decides which pods are current by the revision hash alone.
pub const TEMPLATE_GENERATION: &str = "pod-template-generation";

/// Tolerations every daemon pod gets (upstream's `AddOrUpdateDaemonPodTolerations`).
const DAEMON_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];
/// Added for host-network pods only: they do not need the pod network.
const NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Whether a daemon pod should run on a node, and whether one already there may stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub should_run: bool,
    pub may_stay: bool,
}

/// A DaemonSet's template, made ready for the node checks once per pass.
pub struct Eligibility {
    node_name: Option<String>,
    node_selector: BTreeMap<String, String>,
    affinity: Option<NodeSelectorMatcher>,
    tolerations: Vec<Toleration>,
}

impl Eligibility {
    pub fn new(ds: &DaemonSet) -> Self {
        let spec = template_spec(ds);
        Eligibility {
            node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            affinity: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(NodeSelectorMatcher::parse),
            tolerations: with_daemon_tolerations(spec),
        }
    }

    pub fn placement(&self, node: &Node) -> Placement {
        const NOWHERE: Placement = Placement {
            should_run: false,
            may_stay: false,
        };
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if self.node_name.as_deref().is_some_and(|n| n != name) {
            return NOWHERE;
        }
        let labels = node.metadata.labels.as_ref();
        let selected = self
            .node_selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
        if !selected || self.affinity.as_ref().is_some_and(|a| !a.matches(node)) {
            return NOWHERE;
        }
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default();
        if find_untolerated_taint(taints, &self.tolerations, is_do_not_schedule_taint).is_none() {
            return Placement {
                should_run: true,
                may_stay: true,
            };
        }
        Placement {
            should_run: false,
            may_stay: find_untolerated_taint(taints, &self.tolerations, |t| {
                t.effect == "NoExecute"
            })
            .is_none(),
        }
    }
}

fn template_spec(ds: &DaemonSet) -> &PodSpec {
    static EMPTY: std::sync::LazyLock<PodSpec> = std::sync::LazyLock::new(PodSpec::default);
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .unwrap_or(&EMPTY)
}

/// The template's tolerations plus the daemon ones it lacks.
fn with_daemon_tolerations(spec: &PodSpec) -> Vec<Toleration> {
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    let host_network = spec.host_network == Some(true);
    let extra = DAEMON_TOLERATIONS
        .iter()
        .copied()
        .chain(host_network.then_some((NETWORK_UNAVAILABLE, "NoSchedule")));
    for (key, effect) in extra {
        let wanted = Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Default::default()
        };
        // Upstream replaces a toleration of the same key and effect with its own.
        tolerations
            .retain(|t| !(t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect)));
        tolerations.push(wanted);
    }
    tolerations
}

/// The pod a DaemonSet creates on `node`: labelled with the revision hash and the
/// generation, tolerating the daemon taints, pinned to the node by a required node
/// affinity that replaces the template's (the controller already checked it).
pub fn pod_for_node(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    spec.tolerations = Some(with_daemon_tolerations(&spec));
    let pin = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            ..Default::default()
        }],
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution = Some(pin);
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(REVISION_HASH.into(), hash.into());
    if let Some(generation) = ds.metadata.generation {
        labels.insert(TEMPLATE_GENERATION.into(), generation.to_string());
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(ds)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::{self, json};

    fn ds(spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u", "generation": 3},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec}}
        }))
        .unwrap()
    }

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}
        }))
        .unwrap()
    }

    const RUN: Placement = Placement {
        should_run: true,
        may_stay: true,
    };

    #[test]
    fn nodes_are_chosen_by_selector_affinity_and_taints_with_the_daemon_tolerations() {
        let plain = Eligibility::new(&ds(json!({"containers": []})));
        assert_eq!(plain.placement(&node("a", json!({}), json!([]))), RUN);
        // Cordoned, not ready or under pressure: daemons still run there.
        let troubled = node(
            "b",
            json!({}),
            json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                   {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                   {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}]),
        );
        assert_eq!(plain.placement(&troubled), RUN);
        // A foreign NoSchedule taint keeps new pods off but lets a running one stay; a
        // NoExecute one does neither.
        let tainted = node(
            "c",
            json!({}),
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
        );
        assert_eq!(
            plain.placement(&tainted),
            Placement {
                should_run: false,
                may_stay: true
            }
        );
        let evicting = node(
            "d",
            json!({}),
            json!([{"key": "dedicated", "effect": "NoExecute"}]),
        );
        assert_eq!(
            plain.placement(&evicting),
            Placement {
                should_run: false,
                may_stay: false
            }
        );
        let tolerant = Eligibility::new(&ds(json!({"containers": [],
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]})));
        assert_eq!(tolerant.placement(&tainted), RUN);
        assert_eq!(tolerant.placement(&evicting), RUN);

        let selective = Eligibility::new(&ds(json!({"containers": [],
            "nodeSelector": {"disk": "ssd"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}})));
        assert_eq!(
            selective.placement(&node("e", json!({"disk": "ssd", "zone": "z1"}), json!([]))),
            RUN
        );
        assert!(
            !selective
                .placement(&node("f", json!({"disk": "ssd", "zone": "z2"}), json!([])))
                .should_run
        );
        assert!(
            !selective
                .placement(&node("g", json!({"zone": "z1"}), json!([])))
                .may_stay
        );
    }

    #[test]
    fn a_daemon_pod_is_pinned_to_its_node_and_tolerates_the_daemon_taints() {
        let set = ds(
            json!({"containers": [{"name": "c", "image": "busybox"}], "hostNetwork": true,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}}),
        );
        let pod = pod_for_node(&set, "node-1", "abc");
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
        let labels = pod.labels();
        assert_eq!(labels[REVISION_HASH], "abc");
        assert_eq!(labels[TEMPLATE_GENERATION], "3");
        let spec = pod.spec.unwrap();
        let terms = &spec
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(
            terms[0].match_fields.as_ref().unwrap()[0].values,
            Some(vec!["node-1".to_string()])
        );
        let tolerations = spec.tolerations.unwrap();
        assert_eq!(
            tolerations.len(),
            7,
            "six daemon tolerations and network-unavailable"
        );
        let not_ready: Vec<_> = tolerations
            .iter()
            .filter(|t| t.key.as_deref() == Some("node.kubernetes.io/not-ready"))
            .collect();
        assert_eq!(not_ready.len(), 1);
        assert_eq!(
            not_ready[0].toleration_seconds, None,
            "the daemon toleration replaces the template's"
        );
    }
}
