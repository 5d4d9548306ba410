//! The doctor's findings: a tree of links, each with its state, owner and evidence.

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// How a link of the chain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Ok,
    /// Not there yet, and nothing says it will not get there (a rollout under way).
    Waiting,
    Broken,
}

/// The component to look at when a link breaks: the architecture's troubleshooting
/// table names these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The object as written (a selector or port that matches nothing).
    Manifest,
    Apiserver,
    /// The store behind the apiserver: embedded, or etcd.
    Store,
    /// Admission: PodSecurity, webhooks, policies that refuse writes.
    Admission,
    /// ResourceQuota and LimitRange refusing objects.
    Quota,
    ControllerManager,
    Scheduler,
    /// The node itself: pressure, cordon, taints.
    Node,
    Kubelet,
    /// The image's registry, as the kubelet and containerd reach it.
    Registry,
    /// The pod network: CNI, when a sandbox cannot be made.
    Network,
    /// Volumes: claims, provisioning, mounts.
    Storage,
    /// The containers' own code: exits, failing probes.
    Application,
    /// The cluster DNS.
    Dns,
    /// The Service proxy's rules on the nodes.
    Proxy,
    /// The NetworkPolicies the nodes enforce.
    NetworkPolicy,
    /// The Ingress controller.
    Ingress,
}

/// Written as its label, the same in JSON as in the tree.
impl Serialize for Owner {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

impl Owner {
    pub fn label(self) -> &'static str {
        match self {
            Owner::Manifest => "manifest",
            Owner::Apiserver => "apiserver",
            Owner::Store => "store",
            Owner::Admission => "admission",
            Owner::Quota => "quota",
            Owner::ControllerManager => "controller-manager",
            Owner::Scheduler => "scheduler",
            Owner::Node => "node",
            Owner::Kubelet => "kubelet",
            Owner::Registry => "kubelet/registry",
            Owner::Network => "CNI",
            Owner::Storage => "storage",
            Owner::Application => "application",
            Owner::Dns => "DNS",
            Owner::Proxy => "proxy",
            Owner::NetworkPolicy => "network policy",
            Owner::Ingress => "ingress controller",
        }
    }
}

fn rfc3339<S: serde::Serializer>(at: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => s.collect_str(at),
        None => s.serialize_none(),
    }
}

/// One link of the chain, and the links it depends on.
#[derive(Clone, Debug, Serialize)]
pub struct Link {
    /// What was checked: `deployment/web`, `pod/web-0`, `container app: image`.
    pub subject: String,
    pub state: State,
    pub owner: Owner,
    /// What shows the state: the condition, event, status or missing object.
    pub evidence: String,
    /// Since when it has been so, when the API says.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "rfc3339")]
    pub since: Option<Timestamp>,
    /// The command to run next when the link is not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
}

impl Link {
    pub fn new(
        subject: impl Into<String>,
        owner: Owner,
        state: State,
        evidence: impl Into<String>,
    ) -> Link {
        Link {
            subject: subject.into(),
            state,
            owner,
            evidence: evidence.into(),
            since: None,
            next: None,
            links: Vec::new(),
        }
    }

    pub fn ok(subject: impl Into<String>, owner: Owner, evidence: impl Into<String>) -> Link {
        Link::new(subject, owner, State::Ok, evidence)
    }

    pub fn since(mut self, since: Option<Timestamp>) -> Link {
        self.since = since;
        self
    }

    pub fn next(mut self, command: impl Into<String>) -> Link {
        self.next = Some(command.into());
        self
    }

    pub fn with(mut self, links: Vec<Link>) -> Link {
        self.links = links;
        self
    }

    /// The worst state of this link and those below it.
    pub fn worst(&self) -> State {
        self.links
            .iter()
            .map(Link::worst)
            .fold(self.state, State::max)
    }

    /// The first link, depth first, in `state`: the deepest cause comes before the
    /// links that only suffer from it.
    fn first(&self, state: State) -> Option<&Link> {
        self.links
            .iter()
            .find_map(|l| l.first(state))
            .or((self.state == state).then_some(self))
    }
}

/// Everything found about one target.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub state: State,
    pub links: Vec<Link>,
    /// The first broken link (else the first waiting one), where to look first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<Link>,
}

impl Report {
    pub fn new(target: String, links: Vec<Link>) -> Report {
        let state = links.iter().map(Link::worst).max().unwrap_or(State::Ok);
        let first = [State::Broken, State::Waiting].into_iter().find_map(|s| {
            links.iter().find_map(|l| l.first(s)).map(|l| Link {
                links: Vec::new(),
                ..l.clone()
            })
        });
        Report {
            target,
            state,
            links,
            first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deepest_broken_link_comes_first() {
        let pod = Link::new("pod/web-1", Owner::Kubelet, State::Broken, "not running").with(vec![
            Link::ok("scheduled", Owner::Scheduler, "on n1"),
            Link::new(
                "container web: image",
                Owner::Registry,
                State::Broken,
                "ErrImagePull",
            ),
        ]);
        let deploy = Link::new(
            "deployment/web",
            Owner::ControllerManager,
            State::Waiting,
            "0/1",
        )
        .with(vec![pod]);
        let report = Report::new("deployment/web".into(), vec![deploy]);
        assert_eq!(report.state, State::Broken);
        let first = report.first.unwrap();
        assert_eq!(first.subject, "container web: image");
        assert_eq!(first.owner, Owner::Registry);
    }

    #[test]
    fn a_waiting_link_is_named_when_nothing_is_broken() {
        let report = Report::new(
            "x".into(),
            vec![Link::ok("a", Owner::Apiserver, "").with(vec![Link::new(
                "b",
                Owner::Scheduler,
                State::Waiting,
                "",
            )])],
        );
        assert_eq!(report.state, State::Waiting);
        assert_eq!(report.first.unwrap().subject, "b");
    }
}
