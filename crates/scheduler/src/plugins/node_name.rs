//! NodeName: a pod that names its node (`spec.nodeName`) fits only there.

use crate::framework::{CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, Status};

pub const NAME: &str = "NodeName";
pub const ERR_REASON: &str = "node(s) didn't match the requested node name";

pub struct NodeName;

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for NodeName {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        match pod.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(wanted) if !wanted.is_empty() && wanted != node.name() => {
                Status::unresolvable(ERR_REASON)
            }
            _ => Status::success(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{filter_statuses, node, node_with, pod, snapshot};

    #[test]
    fn only_the_named_node_fits() {
        let snap = snapshot(vec![
            node_with(node("a"), vec![]),
            node_with(node("b"), vec![]),
        ]);
        let statuses = filter_statuses(None, &NodeName, pod("p").node_name("b"), &snap);
        assert_eq!(statuses[0].code(), Code::UnschedulableAndUnresolvable);
        assert_eq!(statuses[0].reasons(), [ERR_REASON]);
        assert!(statuses[1].is_success());
        let statuses = filter_statuses(None, &NodeName, pod("p"), &snap);
        assert!(statuses.iter().all(Status::is_success));
    }
}
