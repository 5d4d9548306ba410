//! What the doctor examines: `KIND/NAME` with kubectl's kind names and short names.

use std::fmt;
use std::str::FromStr;

/// A workload kind whose pods the doctor follows through their owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    Job,
}

impl WorkloadKind {
    pub fn resource(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "deployment",
            WorkloadKind::StatefulSet => "statefulset",
            WorkloadKind::DaemonSet => "daemonset",
            WorkloadKind::Job => "job",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Workload(WorkloadKind, String),
    Pod(String),
    Service(String),
    Ingress(String),
    /// A Gateway API HTTPRoute.
    Route(String),
    Node(String),
    /// A URL, resolved as a client's request would be: an Ingress rule's host and
    /// path, a Service's DNS name, a cluster IP or a pod IP.
    Url(http::Uri),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error(
        "a target is KIND/NAME (deploy/web, pod/web-0, svc/web, ingress/web, httproute/web, node/n1), not {0:?}"
    )]
    Shape(String),
    #[error(
        "the doctor examines deployments, statefulsets, daemonsets, jobs, pods, services, ingresses, httproutes and nodes, not {0:?}"
    )]
    Kind(String),
}

impl FromStr for Target {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s.starts_with("http://") || s.starts_with("https://") {
            let uri: http::Uri = s.parse().map_err(|_| ParseError::Shape(s.to_string()))?;
            return match uri.host() {
                Some(_) => Ok(Target::Url(uri)),
                None => Err(ParseError::Shape(s.to_string())),
            };
        }
        let (kind, name) = s
            .split_once('/')
            .filter(|(k, n)| !k.is_empty() && !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| ParseError::Shape(s.to_string()))?;
        let name = name.to_string();
        // kubectl's plural, singular and short names, with an optional group suffix.
        let kind = kind.split('.').next().unwrap_or(kind).to_ascii_lowercase();
        let workload = |k| Ok(Target::Workload(k, name.clone()));
        match kind.as_str() {
            "deploy" | "deployment" | "deployments" => workload(WorkloadKind::Deployment),
            "sts" | "statefulset" | "statefulsets" => workload(WorkloadKind::StatefulSet),
            "ds" | "daemonset" | "daemonsets" => workload(WorkloadKind::DaemonSet),
            "job" | "jobs" => workload(WorkloadKind::Job),
            "po" | "pod" | "pods" => Ok(Target::Pod(name)),
            "svc" | "service" | "services" => Ok(Target::Service(name)),
            "ing" | "ingress" | "ingresses" => Ok(Target::Ingress(name)),
            "httproute" | "httproutes" => Ok(Target::Route(name)),
            "no" | "node" | "nodes" => Ok(Target::Node(name)),
            _ => Err(ParseError::Kind(kind)),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Workload(kind, name) => write!(f, "{}/{name}", kind.resource()),
            Target::Pod(name) => write!(f, "pod/{name}"),
            Target::Service(name) => write!(f, "service/{name}"),
            Target::Ingress(name) => write!(f, "ingress/{name}"),
            Target::Route(name) => write!(f, "httproute/{name}"),
            Target::Node(name) => write!(f, "node/{name}"),
            Target::Url(uri) => write!(f, "{uri}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_names_and_short_names() {
        let deploy = Target::Workload(WorkloadKind::Deployment, "web".into());
        for s in ["deploy/web", "deployment/web", "deployments.apps/web"] {
            assert_eq!(s.parse::<Target>(), Ok(deploy.clone()), "{s}");
        }
        assert_eq!("svc/db".parse(), Ok(Target::Service("db".into())));
        assert_eq!("no/n1".parse(), Ok(Target::Node("n1".into())));
        assert_eq!(deploy.to_string(), "deployment/web");
        let url = "http://shop.example/cart?id=1".parse::<Target>().unwrap();
        assert!(
            matches!(&url, Target::Url(u) if u.host() == Some("shop.example") && u.path() == "/cart")
        );
    }

    #[test]
    fn malformed_targets_are_refused_with_the_shape() {
        for bad in ["web", "pod/", "/web", "pod/a/b"] {
            assert!(
                matches!(bad.parse::<Target>(), Err(ParseError::Shape(_))),
                "{bad}"
            );
        }
        assert_eq!(
            "configmap/x".parse::<Target>(),
            Err(ParseError::Kind("configmap".into()))
        );
    }
}
