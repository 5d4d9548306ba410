//! NodeUnschedulable: cordoned nodes (`spec.unschedulable`) take no new pods,
//! unless the pod tolerates the `node.kubernetes.io/unschedulable:NoSchedule` taint.

use k8s_openapi::api::core::v1::Taint;

use crate::framework::{CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, Status};
use crate::selector::tolerates;

pub const NAME: &str = "NodeUnschedulable";
pub const ERR_REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
pub const TAINT_NODE_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for NodeUnschedulable {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let cordoned = node
            .node()
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if !cordoned {
            return Status::success();
        }
        let taint = Taint {
            key: TAINT_NODE_UNSCHEDULABLE.into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        };
        let tolerations = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default();
        if tolerations.iter().any(|t| tolerates(t, &taint)) {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON_UNSCHEDULABLE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{filter_statuses, node, node_with, pod, snapshot};

    #[test]
    fn cordoned_nodes_reject_unless_tolerated() {
        let snap = snapshot(vec![
            node_with(node("open"), vec![]),
            node_with(node("cordoned").unschedulable(), vec![]),
        ]);
        let statuses = filter_statuses(None, &NodeUnschedulable, pod("p"), &snap);
        assert!(statuses[0].is_success());
        assert_eq!(statuses[1].code(), Code::UnschedulableAndUnresolvable);
        assert_eq!(statuses[1].reasons(), [ERR_REASON_UNSCHEDULABLE]);

        let tolerant = pod("p").toleration(TAINT_NODE_UNSCHEDULABLE, "Exists", "", "NoSchedule");
        let statuses = filter_statuses(None, &NodeUnschedulable, tolerant, &snap);
        assert!(statuses.iter().all(Status::is_success));
    }
}
