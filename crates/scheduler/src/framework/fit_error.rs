//! Why a pod fits nowhere: per-node statuses and the upstream-compatible message.
//!
//! The message is what users read in `kubectl describe pod` ("0/3 nodes are
//! available: ..."), and tooling greps for it, so it is reproduced exactly:
//! each distinct reason is counted across nodes, the "count reason" strings are
//! sorted bytewise, and PreFilter / PostFilter messages are appended as
//! " msg." segments.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use super::{Code, Status};

/// The status of every node a cycle rejected, plus one status standing for all
/// nodes not listed (never evaluated because PreFilter ruled them out).
#[derive(Clone, Debug)]
pub struct NodeToStatus {
    statuses: HashMap<String, Status>,
    absent: Status,
}

impl Default for NodeToStatus {
    fn default() -> Self {
        NodeToStatus {
            statuses: HashMap::new(),
            absent: Status::new(Code::UnschedulableAndUnresolvable, Vec::new()),
        }
    }
}

impl NodeToStatus {
    pub fn get(&self, node: &str) -> &Status {
        self.statuses.get(node).unwrap_or(&self.absent)
    }

    pub fn set(&mut self, node: impl Into<String>, status: Status) {
        self.statuses.insert(node.into(), status);
    }

    pub fn set_absent(&mut self, status: Status) {
        self.absent = status;
    }

    pub fn absent(&self) -> &Status {
        &self.absent
    }

    /// Number of nodes with an explicit status.
    pub fn len(&self) -> usize {
        self.statuses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Status)> {
        self.statuses.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// What the scheduling cycle learned while failing to place a pod.
#[derive(Clone, Debug, Default)]
pub struct Diagnosis {
    pub node_to_status: NodeToStatus,
    /// Plugins that rejected at least one node (the queue uses these to decide
    /// which cluster events may make the pod schedulable).
    pub unschedulable_plugins: BTreeSet<&'static str>,
    /// Set when PreFilter rejected the pod outright.
    pub pre_filter_msg: Option<String>,
    /// Set by the PostFilter (preemption) when it could not help.
    pub post_filter_msg: Option<String>,
}

/// The pod fits on no node.
#[derive(Clone, Debug)]
pub struct FitError {
    pub num_all_nodes: usize,
    pub diagnosis: Diagnosis,
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available:", self.num_all_nodes)?;
        let d = &self.diagnosis;
        match &d.pre_filter_msg {
            // PreFilter gave every node the same status; counting it per node
            // would only repeat it.
            Some(msg) => write!(f, " {msg}.")?,
            None => {
                let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                for (_, status) in d.node_to_status.iter() {
                    for reason in status.reasons() {
                        *counts.entry(reason).or_insert(0) += 1;
                    }
                }
                let listed = d.node_to_status.len();
                if listed < self.num_all_nodes {
                    for reason in d.node_to_status.absent().reasons() {
                        *counts.entry(reason).or_insert(0) += self.num_all_nodes - listed;
                    }
                }
                let mut histogram: Vec<String> = counts
                    .iter()
                    .map(|(reason, n)| format!("{n} {reason}"))
                    .collect();
                histogram.sort();
                if !histogram.is_empty() {
                    write!(f, " {}.", histogram.join(", "))?;
                }
            }
        }
        if let Some(msg) = &d.post_filter_msg {
            write!(f, " {msg}.")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit_error(nodes: usize, statuses: &[(&str, Status)]) -> FitError {
        let mut diagnosis = Diagnosis::default();
        for (n, s) in statuses {
            diagnosis.node_to_status.set(*n, s.clone());
        }
        FitError {
            num_all_nodes: nodes,
            diagnosis,
        }
    }

    #[test]
    fn reasons_are_counted_and_sorted_like_upstream() {
        let mut e = fit_error(
            3,
            &[
                (
                    "n1",
                    Status::unresolvable("node(s) had untolerated taint {node-role: x}"),
                ),
                ("n2", Status::unschedulable("Insufficient cpu")),
                ("n3", Status::unschedulable("Insufficient cpu")),
            ],
        );
        assert_eq!(
            e.to_string(),
            "0/3 nodes are available: 1 node(s) had untolerated taint {node-role: x}, 2 Insufficient cpu."
        );
        e.diagnosis.post_filter_msg = Some(
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
                .into(),
        );
        assert_eq!(
            e.to_string(),
            "0/3 nodes are available: 1 node(s) had untolerated taint {node-role: x}, 2 Insufficient cpu. \
             preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
        );
    }

    #[test]
    fn multiple_reasons_per_node_and_bytewise_order() {
        let mut statuses = vec![(
            "a",
            Status::new(
                Code::Unschedulable,
                vec!["Insufficient cpu".into(), "Insufficient memory".into()],
            ),
        )];
        let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        for n in &names {
            statuses.push((
                n.as_str(),
                Status::unresolvable("node(s) were unschedulable"),
            ));
        }
        let e = fit_error(11, &statuses);
        // Bytewise: "1 I..." < "10 n..." because ' ' (0x20) < '0' (0x30).
        assert_eq!(
            e.to_string(),
            "0/11 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 10 node(s) were unschedulable."
        );
    }

    #[test]
    fn prefilter_message_and_absent_nodes() {
        let mut e = fit_error(2, &[]);
        e.diagnosis.pre_filter_msg = Some("pod affinity terms conflict".into());
        assert_eq!(
            e.to_string(),
            "0/2 nodes are available: pod affinity terms conflict."
        );

        let mut e = fit_error(3, &[("n1", Status::unschedulable("Too many pods"))]);
        e.diagnosis.node_to_status.set_absent(Status::unresolvable(
            "node(s) didn't satisfy plugin(s) [NodeAffinity]",
        ));
        assert_eq!(
            e.to_string(),
            "0/3 nodes are available: 1 Too many pods, 2 node(s) didn't satisfy plugin(s) [NodeAffinity]."
        );
    }
}
