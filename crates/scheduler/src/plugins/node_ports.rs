//! NodePorts: a pod's `hostPort`s must be free on the node. The node's bound
//! ports are kept as an aggregate in `NodeInfo`, so the check is a few lookups.

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreFilterPlugin, PreFilterResult,
    Snapshot, Status,
};

pub const NAME: &str = "NodePorts";
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

pub struct NodePorts;

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodePorts {
    /// Pods without host ports cannot conflict: skip the filter for them.
    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &PodInfo,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        if pod.host_ports.is_empty() {
            (None, Status::skip())
        } else {
            (None, Status::success())
        }
    }
}

impl FilterPlugin for NodePorts {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if pod
            .host_ports
            .iter()
            .any(|p| node.used_ports().conflicts(p))
        {
            Status::unschedulable(ERR_REASON)
        } else {
            Status::success()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{container, filter_statuses, node, node_with, pod, snapshot};

    #[test]
    fn host_port_conflicts_reject() {
        let snap = snapshot(vec![
            node_with(
                node("busy"),
                vec![pod("web").container(container("c").host_port(8080))],
            ),
            node_with(
                node("free"),
                vec![pod("other").container(container("c").host_port(9090))],
            ),
        ]);
        let wants = pod("p").container(container("c").host_port(8080));
        let statuses = filter_statuses(Some(&NodePorts), &NodePorts, wants, &snap);
        assert_eq!(statuses[0].code(), Code::Unschedulable);
        assert_eq!(statuses[0].reasons(), [ERR_REASON]);
        assert!(statuses[1].is_success());

        let mut state = CycleState::default();
        let no_ports = pod("q").container(container("c")).info();
        assert!(
            NodePorts
                .pre_filter(&mut state, &no_ports, &snap)
                .1
                .is_skip()
        );
    }
}
