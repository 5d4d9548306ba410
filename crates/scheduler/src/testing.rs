//! Builders for real k8s-openapi Pods and Nodes, and harnesses that run one
//! plugin the way the framework would.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerImage, ContainerPort, Node, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, NodeStatus, Pod, PodAffinity,
    PodAffinityTerm, PodAntiAffinity, PodSpec, PodStatus, PreferredSchedulingTerm,
    ResourceRequirements, Taint, Toleration, TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, PodInfo, PreFilterPlugin, PreScorePlugin, ScorePlugin,
    Snapshot, Status,
};

pub struct ContainerBuilder(Container);

pub fn container(name: &str) -> ContainerBuilder {
    ContainerBuilder(Container {
        name: name.into(),
        image: Some("registry.k8s.io/pause:3.10".into()),
        ..Default::default()
    })
}

impl ContainerBuilder {
    pub fn req(mut self, resource: &str, quantity: &str) -> Self {
        self.0
            .resources
            .get_or_insert_with(ResourceRequirements::default)
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert(resource.into(), Quantity(quantity.into()));
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        self.0.image = Some(image.into());
        self
    }

    pub fn host_port(mut self, port: i32) -> Self {
        self.0
            .ports
            .get_or_insert_with(Vec::new)
            .push(ContainerPort {
                container_port: port,
                host_port: Some(port),
                ..Default::default()
            });
        self
    }

    pub fn build(self) -> Container {
        self.0
    }
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([(key.to_string(), value.to_string())].into()),
        match_expressions: None,
    }
}

fn affinity_term(key: &str, value: &str, topology_key: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: Some(selector(key, value)),
        topology_key: topology_key.into(),
        ..Default::default()
    }
}

pub struct PodBuilder(Pod);

pub fn pod(name: &str) -> PodBuilder {
    PodBuilder(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus::default()),
    })
}

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.as_mut().expect("builder always has a spec")
    }

    fn affinity(&mut self) -> &mut Affinity {
        self.spec().affinity.get_or_insert_with(Affinity::default)
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.0.metadata.namespace = Some(ns.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn container(mut self, c: ContainerBuilder) -> Self {
        self.spec().containers.push(c.build());
        self
    }

    pub fn init_container(mut self, c: ContainerBuilder) -> Self {
        self.spec()
            .init_containers
            .get_or_insert_with(Vec::new)
            .push(c.build());
        self
    }

    /// Shorthand for one container requesting cpu and memory.
    pub fn req(self, cpu: &str, memory: &str) -> Self {
        self.container(container("main").req("cpu", cpu).req("memory", memory))
    }

    pub fn node_name(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }

    /// Adds a volume given as its JSON form.
    pub fn volume(mut self, volume: serde_json::Value) -> Self {
        let volume = serde_json::from_value(volume).expect("a volume");
        self.spec()
            .volumes
            .get_or_insert_with(Vec::new)
            .push(volume);
        self
    }

    pub fn priority(mut self, p: i32) -> Self {
        self.spec().priority = Some(p);
        self
    }

    pub fn preemption_never(mut self) -> Self {
        self.spec().preemption_policy = Some("Never".into());
        self
    }

    pub fn toleration(mut self, key: &str, operator: &str, value: &str, effect: &str) -> Self {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        self.spec()
            .tolerations
            .get_or_insert_with(Vec::new)
            .push(Toleration {
                key: non_empty(key),
                operator: non_empty(operator),
                value: non_empty(value),
                effect: non_empty(effect),
                toleration_seconds: None,
            });
        self
    }

    pub fn node_selector(mut self, key: &str, value: &str) -> Self {
        self.spec()
            .node_selector
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn required_node_terms(mut self, terms: Vec<NodeSelectorTerm>) -> Self {
        self.affinity()
            .node_affinity
            .get_or_insert_with(NodeAffinity::default)
            .required_during_scheduling_ignored_during_execution = Some(NodeSelector {
            node_selector_terms: terms,
        });
        self
    }

    pub fn preferred_node_term(mut self, weight: i32, term: NodeSelectorTerm) -> Self {
        self.affinity()
            .node_affinity
            .get_or_insert_with(NodeAffinity::default)
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(PreferredSchedulingTerm {
                preference: term,
                weight,
            });
        self
    }

    pub fn pod_affinity_required_term(mut self, term: PodAffinityTerm) -> Self {
        self.affinity()
            .pod_affinity
            .get_or_insert_with(PodAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(term);
        self
    }

    pub fn pod_affinity_required(self, key: &str, value: &str, topology_key: &str) -> Self {
        self.pod_affinity_required_term(affinity_term(key, value, topology_key))
    }

    pub fn pod_anti_affinity_required(
        mut self,
        key: &str,
        value: &str,
        topology_key: &str,
    ) -> Self {
        self.affinity()
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(affinity_term(key, value, topology_key));
        self
    }

    pub fn pod_affinity_preferred(
        mut self,
        weight: i32,
        key: &str,
        value: &str,
        topology_key: &str,
    ) -> Self {
        self.affinity()
            .pod_affinity
            .get_or_insert_with(PodAffinity::default)
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                pod_affinity_term: affinity_term(key, value, topology_key),
                weight,
            });
        self
    }

    pub fn pod_anti_affinity_preferred(
        mut self,
        weight: i32,
        key: &str,
        value: &str,
        topology_key: &str,
    ) -> Self {
        self.affinity()
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                pod_affinity_term: affinity_term(key, value, topology_key),
                weight,
            });
        self
    }

    pub fn spread(
        self,
        max_skew: i32,
        topology_key: &str,
        when: &str,
        key: &str,
        value: &str,
    ) -> Self {
        self.spread_constraint(TopologySpreadConstraint {
            max_skew,
            topology_key: topology_key.into(),
            when_unsatisfiable: when.into(),
            label_selector: Some(selector(key, value)),
            ..Default::default()
        })
    }

    pub fn spread_constraint(mut self, c: TopologySpreadConstraint) -> Self {
        self.spec()
            .topology_spread_constraints
            .get_or_insert_with(Vec::new)
            .push(c);
        self
    }

    pub fn owner(mut self, kind: &str) -> Self {
        self.0.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "owner".into(),
            uid: "owner-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        self
    }

    pub fn start_time(mut self, seconds: i64) -> Self {
        self.0
            .status
            .get_or_insert_with(PodStatus::default)
            .start_time = Some(Time(
            Timestamp::from_second(seconds).expect("valid timestamp"),
        ));
        self
    }

    pub fn nominated(mut self, node: &str) -> Self {
        self.0
            .status
            .get_or_insert_with(PodStatus::default)
            .nominated_node_name = Some(node.into());
        self
    }

    pub fn build(self) -> Pod {
        self.0
    }

    pub fn info(self) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(self.0)))
    }
}

pub struct NodeBuilder(Node);

pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("kubernetes.io/hostname".to_string(), name.to_string())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some([("pods".to_string(), Quantity("110".into()))].into()),
            ..Default::default()
        }),
    })
}

impl NodeBuilder {
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn alloc(mut self, resource: &str, quantity: &str) -> Self {
        self.0
            .status
            .as_mut()
            .expect("builder always has a status")
            .allocatable
            .get_or_insert_with(BTreeMap::new)
            .insert(resource.into(), Quantity(quantity.into()));
        self
    }

    /// Shorthand for cpu and memory allocatable.
    pub fn capacity(self, cpu: &str, memory: &str) -> Self {
        self.alloc("cpu", cpu).alloc("memory", memory)
    }

    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.0
            .spec
            .as_mut()
            .expect("builder always has a spec")
            .taints
            .get_or_insert_with(Vec::new)
            .push(Taint {
                key: key.into(),
                value: (!value.is_empty()).then(|| value.into()),
                effect: effect.into(),
                time_added: None,
            });
        self
    }

    pub fn unschedulable(mut self) -> Self {
        self.0
            .spec
            .as_mut()
            .expect("builder always has a spec")
            .unschedulable = Some(true);
        self
    }

    pub fn image(mut self, names: &[&str], size: i64) -> Self {
        self.0
            .status
            .as_mut()
            .expect("builder always has a status")
            .images
            .get_or_insert_with(Vec::new)
            .push(ContainerImage {
                names: Some(names.iter().map(|n| n.to_string()).collect()),
                size_bytes: Some(size),
            });
        self
    }

    pub fn build(self) -> Node {
        self.0
    }
}

/// A node requirement for node selector terms: `(key, operator, values)`.
pub fn term(exprs: &[(&str, &str, &[&str])]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(
            exprs
                .iter()
                .map(|(key, op, values)| NodeSelectorRequirement {
                    key: key.to_string(),
                    operator: op.to_string(),
                    values: Some(values.iter().map(|v| v.to_string()).collect()),
                })
                .collect(),
        ),
        match_fields: None,
    }
}

/// A node selector term on `metadata.name`.
pub fn field_term(op: &str, names: &[&str]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: op.into(),
            values: Some(names.iter().map(|v| v.to_string()).collect()),
        }]),
    }
}

/// A node with pods already placed on it.
pub fn node_with(node: NodeBuilder, pods: Vec<PodBuilder>) -> NodeInfo {
    let node = node.build();
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut info = NodeInfo::new(Arc::new(node));
    for p in pods {
        info.add_pod(p.node_name(&name).info());
    }
    info
}

pub fn snapshot(nodes: Vec<NodeInfo>) -> Snapshot {
    Snapshot::new(nodes.into_iter().map(Arc::new).collect(), HashMap::new())
}

/// Runs PreFilter (when given) and then Filter on every node, as the framework would.
pub fn filter_statuses(
    pre: Option<&dyn PreFilterPlugin>,
    filter: &dyn FilterPlugin,
    pod: PodBuilder,
    snapshot: &Snapshot,
) -> Vec<Status> {
    let pod = PodInfo::new(Arc::new(pod.build()));
    let mut state = CycleState::default();
    if let Some(pre) = pre {
        let (_, status) = pre.pre_filter(&mut state, &pod, snapshot);
        if status.is_skip() {
            return vec![Status::success(); snapshot.num_nodes()];
        }
        if !status.is_success() {
            return vec![status; snapshot.num_nodes()];
        }
    }
    snapshot
        .nodes()
        .iter()
        .map(|n| filter.filter(&state, &pod, n))
        .collect()
}

/// Runs PreScore (when given), Score and NormalizeScore over every node.
/// A skipped PreScore yields all zeros (the framework would not score).
pub fn normalized_scores(
    pre: Option<&dyn PreScorePlugin>,
    score: &dyn ScorePlugin,
    pod: PodBuilder,
    snapshot: &Snapshot,
) -> Vec<i64> {
    let pod = PodInfo::new(Arc::new(pod.build()));
    let nodes: Vec<&NodeInfo> = snapshot.nodes().iter().map(|n| &**n).collect();
    let mut state = CycleState::default();
    if let Some(pre) = pre {
        let status = pre.pre_score(&mut state, &pod, snapshot, &nodes);
        if status.is_skip() {
            return vec![0; nodes.len()];
        }
        assert!(status.is_success(), "PreScore failed: {status}");
    }
    let mut scores: Vec<i64> = nodes
        .iter()
        .map(|n| score.score(&state, &pod, n).expect("score"))
        .collect();
    let status = score.normalize_scores(&state, &pod, &nodes, &mut scores);
    assert!(status.is_success(), "NormalizeScore failed: {status}");
    scores
}
