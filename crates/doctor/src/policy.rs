//! What the NetworkPolicies of a namespace let into a Service's pods: the verdict the
//! nodes enforce, read from the policies (a packet is admitted when some policy that
//! isolates the pod for ingress has a rule admitting it).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ServicePort};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use krust_client::selector::Selector;
use kube::ResourceExt;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, service};

/// The ingress verdict for the pods a Service sends to (judged on `pod`, one of them),
/// or `None` when no policy isolates them: then every peer may connect.
pub async fn ingress(
    ctx: &Context,
    pod: &Pod,
    ports: &[ServicePort],
) -> Result<Option<Link>, Error> {
    let policies = ctx
        .namespaced::<NetworkPolicy>()
        .list(&Default::default())
        .await?;
    Ok(verdict(&ctx.namespace, &policies.items, pod, ports))
}

fn verdict(
    namespace: &str,
    policies: &[NetworkPolicy],
    pod: &Pod,
    ports: &[ServicePort],
) -> Option<Link> {
    let labels = pod.labels();
    let isolating: Vec<&NetworkPolicy> = (policies.iter())
        .filter(|p| isolates_ingress(p) && selects(p, labels))
        .collect();
    if isolating.is_empty() {
        return None;
    }
    let names: Vec<String> = isolating.iter().map(|p| p.name_any()).collect();
    let names = names.join(", ");
    let next = format!("kubectl describe networkpolicy -n {namespace} {names}");
    let denied = |evidence: String| {
        Some(
            Link::new(
                "network policy",
                Owner::NetworkPolicy,
                State::Broken,
                evidence,
            )
            .next(&next),
        )
    };
    let rules: Vec<&NetworkPolicyIngressRule> = (isolating.iter())
        .flat_map(|p| p.spec.iter().flat_map(|s| s.ingress.iter().flatten()))
        .collect();
    if rules.is_empty() {
        return denied(format!(
            "{names} isolates the pods for ingress and admits nothing: connections from other pods are dropped"
        ));
    }
    let declared = service::declared(pod);
    let closed: Vec<String> = (ports.iter())
        .filter_map(|p| service::target(p, &declared).map(|t| (p, t)))
        .filter(|(p, t)| {
            let protocol = p.protocol.as_deref().unwrap_or("TCP");
            !rules
                .iter()
                .any(|r| admits_port(r, protocol, *t, &declared))
        })
        .map(|(p, t)| format!("{}→{t}", p.port))
        .collect();
    if !closed.is_empty() {
        return denied(format!(
            "{names} isolates the pods and no rule admits the Service's target port {}",
            closed.join(", ")
        ));
    }
    let peers: Vec<String> = rules.iter().map(|r| peers(r)).collect();
    Some(Link::ok(
        "network policy",
        Owner::NetworkPolicy,
        format!("{names} isolates the pods; admitted: {}", peers.join("; ")),
    ))
}

/// Whether a policy isolates the pods it selects for ingress: `policyTypes` says, and
/// without it every policy does (upstream's defaulting).
fn isolates_ingress(policy: &NetworkPolicy) -> bool {
    let types = policy.spec.as_ref().and_then(|s| s.policy_types.as_ref());
    types.is_none_or(|t| t.iter().any(|t| t == "Ingress"))
}

fn selects(policy: &NetworkPolicy, labels: &BTreeMap<String, String>) -> bool {
    // An absent pod selector is an empty one: every pod of the namespace.
    let selector = (policy.spec.as_ref())
        .map(|s| s.pod_selector.clone().unwrap_or_default())
        .unwrap_or_default();
    Selector::parse(Some(&selector)).is_ok_and(|s| s.matches(labels))
}

/// Whether `rule` admits connections to `port` of `protocol` on the pod.
fn admits_port(
    rule: &NetworkPolicyIngressRule,
    protocol: &str,
    port: i32,
    declared: &[(Option<&str>, i32)],
) -> bool {
    let Some(allowed) = rule.ports.as_ref().filter(|p| !p.is_empty()) else {
        return true;
    };
    allowed.iter().any(|p: &NetworkPolicyPort| {
        p.protocol.as_deref().unwrap_or("TCP") == protocol
            && match &p.port {
                None => true,
                Some(IntOrString::Int(n)) => (*n..=p.end_port.unwrap_or(*n)).contains(&port),
                Some(IntOrString::String(name)) => declared
                    .iter()
                    .any(|(n, p)| *n == Some(name.as_str()) && *p == port),
            }
    })
}

/// Who a rule admits, in a few words.
fn peers(rule: &NetworkPolicyIngressRule) -> String {
    let Some(from) = rule.from.as_ref().filter(|f| !f.is_empty()) else {
        return "from anywhere".into();
    };
    let shown: Vec<String> = from
        .iter()
        .map(|peer| {
            let selector = |s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector| {
                let labels: Vec<String> = (s.match_labels.iter().flatten())
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                if labels.is_empty() && s.match_expressions.is_none() {
                    "all".to_string()
                } else if labels.is_empty() {
                    "some".to_string()
                } else {
                    labels.join(",")
                }
            };
            match (&peer.pod_selector, &peer.namespace_selector, &peer.ip_block) {
                (_, _, Some(block)) => format!("addresses {}", block.cidr),
                (Some(p), Some(n), _) => {
                    format!("pods {} in namespaces {}", selector(p), selector(n))
                }
                (Some(p), None, _) => format!("pods {} of this namespace", selector(p)),
                (None, Some(n), _) => format!("namespaces {}", selector(n)),
                (None, None, None) => "nothing".to_string(),
            }
        })
        .collect();
    format!("from {}", shown.join(" or "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(spec: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": spec}))
            .unwrap()
    }

    fn judge(spec: serde_json::Value) -> Option<(State, String)> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}}))
        .unwrap();
        let port: ServicePort =
            serde_json::from_value(json!({"port": 80, "targetPort": "http"})).unwrap();
        verdict("x", &[policy(spec)], &pod, &[port]).map(|l| (l.state, l.evidence))
    }

    #[test]
    fn only_policies_that_select_the_pods_and_isolate_ingress_count() {
        assert!(judge(json!({"podSelector": {"matchLabels": {"app": "db"}}})).is_none());
        assert!(judge(json!({"podSelector": {}, "policyTypes": ["Egress"]})).is_none());
        let (state, evidence) = judge(json!({"podSelector": {}})).unwrap();
        assert_eq!(state, State::Broken);
        assert!(evidence.contains("admits nothing"), "{evidence}");
    }

    #[test]
    fn a_rule_must_admit_the_target_port() {
        let closed = judge(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 9090}]}]}));
        let (state, evidence) = closed.unwrap();
        assert_eq!(state, State::Broken);
        assert!(evidence.contains("target port 80→8080"), "{evidence}");
        for ports in [
            json!([{"port": "http"}]),
            json!([{"port": 8000, "endPort": 8100}]),
            json!([]),
        ] {
            let open = judge(json!({"podSelector": {}, "ingress": [{"ports": ports,
                "from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}));
            let (state, evidence) = open.unwrap();
            assert_eq!(state, State::Ok, "{ports}");
            assert!(
                evidence.contains("pods role=client of this namespace"),
                "{evidence}"
            );
        }
    }
}
