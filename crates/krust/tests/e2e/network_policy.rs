//! NetworkPolicy enforced by the node (issue 33, item 2), checked as upstream's
//! network-policy e2e tests do: pods a, b and c in namespaces x, y and z, each serving
//! TCP and UDP on ports 80 and 81; under each set of policies every pod probes every
//! other on both protocols and ports, and the whole matrix must equal what the policies
//! mean — computed here by a closure written from the policy's text, not by krust.
//! The same table runs on one node here and across two (VXLAN) in `multinode`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{Server, wait_for};

mod image;
use serde_json::{Value, json};

/// One probe: from pod (namespace, name) to pod, over a protocol and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Probe {
    from: (&'static str, &'static str),
    to: (&'static str, &'static str),
    protocol: &'static str,
    port: u16,
}

/// kubectl as the cluster's admin: stdout, or a panic saying what failed.
pub(crate) type Kubectl<'a> = &'a (dyn Fn(&[&str]) -> String + Sync);

const IMAGE: &str = "krust.test/netexec:1";
const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PORTS: [u16; 2] = [80, 81];
const PROTOCOLS: [&str; 2] = ["tcp", "udp"];
/// How long a probe waits for an answer: a denied one is dropped, so it takes this long.
const PROBE_MILLIS: u64 = 1000;

/// Builds the pod program's image and imports it into the containerd of each node's
/// data dir.
pub(crate) fn import_image(work: &Path, data_dirs: &[&Path]) {
    let tarball = image::build(work, IMAGE).unwrap_or_else(|e| panic!("{e}"));
    for data in data_dirs {
        let out = crate::common::import_image(data, &tarball);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Applies `objects` (through a file: the runner takes arguments only).
fn apply(kubectl: Kubectl, work: &Path, objects: &[Value]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let file = work.join("objects.json");
    std::fs::write(&file, list.to_string()).unwrap();
    kubectl(&["apply", "-f", file.to_str().unwrap()]);
}

fn pod(namespace: &str, name: &str, node: Option<&str>) -> Value {
    let ports: Vec<Value> = PORTS
        .iter()
        .flat_map(|port| {
            PROTOCOLS.iter().map(move |p| {
                json!({"name": format!("serve-{port}-{p}"), "containerPort": port,
                       "protocol": p.to_uppercase()})
            })
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"pod": name}},
        "spec": {"terminationGracePeriodSeconds": 0, "nodeName": node,
            "containers": [{"name": "netexec", "image": IMAGE,
                "args": ["serve", "80", "81"], "ports": ports}]}})
}

fn policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

/// Every pod's address.
fn addresses(kubectl: Kubectl) -> Addresses {
    let mut out = BTreeMap::new();
    for ns in NAMESPACES {
        for name in PODS {
            let pod: Value =
                serde_json::from_str(&kubectl(&["get", "pod", name, "-n", ns, "-o", "json"]))
                    .unwrap();
            out.insert(
                (ns, name),
                pod["status"]["podIP"].as_str().unwrap().to_string(),
            );
        }
    }
    out
}

type Addresses = BTreeMap<(&'static str, &'static str), String>;

/// Every probe of the matrix and whether it got through, each pod probing all at once.
fn matrix(kubectl: Kubectl, ips: &Addresses) -> BTreeMap<Probe, bool> {
    let sources: Vec<(&'static str, &'static str)> = ips.keys().copied().collect();
    std::thread::scope(|scope| {
        let runs: Vec<_> = sources
            .iter()
            .map(|&from| {
                scope.spawn(move || {
                    let mut args = vec![
                        "exec".to_string(),
                        "-n".into(),
                        from.0.into(),
                        from.1.into(),
                        "--".into(),
                        "/netexec".into(),
                        "probe".into(),
                        PROBE_MILLIS.to_string(),
                    ];
                    let mut wanted = BTreeMap::new();
                    for (&to, ip) in ips {
                        for protocol in PROTOCOLS {
                            for port in PORTS {
                                let target = format!("{protocol}:{ip}:{port}");
                                args.push(target.clone());
                                wanted.insert(
                                    target,
                                    Probe {
                                        from,
                                        to,
                                        protocol,
                                        port,
                                    },
                                );
                            }
                        }
                    }
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let out = kubectl(&args);
                    let mut results = BTreeMap::new();
                    for line in out.lines() {
                        let (target, verdict) = line.split_once(' ').expect("TARGET VERDICT");
                        results.insert(wanted[target].clone(), verdict == "ok");
                    }
                    assert_eq!(results.len(), wanted.len(), "{out}");
                    results
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    })
}

/// Waits until the matrix is what `allowed` says (policies take effect asynchronously),
/// or fails listing every probe that differs.
fn expect(kubectl: Kubectl, ips: &Addresses, case: &str, allowed: &dyn Fn(&Probe) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = matrix(kubectl, ips);
        let wrong: Vec<String> = got
            .iter()
            .filter(|(probe, ok)| {
                // A pod reaching itself never leaves it: always allowed.
                let expected = probe.from == probe.to || allowed(probe);
                **ok != expected
            })
            .map(|(p, ok)| {
                format!(
                    "{}/{} -> {}/{} {}/{}: {}",
                    p.from.0,
                    p.from.1,
                    p.to.0,
                    p.to.1,
                    p.protocol,
                    p.port,
                    if *ok { "allowed" } else { "denied" }
                )
            })
            .collect();
        if wrong.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{case}: {} probes differ from what the policies mean:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn delete_policies(kubectl: Kubectl) {
    for ns in NAMESPACES {
        kubectl(&["delete", "networkpolicy", "--all", "-n", ns]);
    }
}

#[test]
fn network_policies_allow_exactly_what_they_say_on_one_node() {
    let work = tempfile::tempdir().unwrap();
    let s = Server::with_agent(&["--cluster-cidr=10.52.0.0/16"]);
    import_image(work.path(), &[&s.data_dir()]);
    let kubectl = |args: &[&str]| s.ok(args);
    truth_table(&kubectl, work.path(), &[], "10.52.0.0/16");
}

/// Namespaces x, y, z with pods a, b, c each (placed on `nodes` in turn, or by the
/// scheduler when none are named), then every policy set and its matrix; the pod
/// range `cluster_cidr` is what an address block names.
pub(crate) fn truth_table(kubectl: Kubectl, work: &Path, nodes: &[&str], cluster_cidr: &str) {
    let namespaces: Vec<Value> = NAMESPACES
        .iter()
        .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"ns": ns}}}))
        .collect();
    apply(kubectl, work, &namespaces);
    for ns in NAMESPACES {
        wait_for(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            || {
                serde_json::from_str::<Value>(&kubectl(&[
                    "get",
                    "serviceaccounts",
                    "-n",
                    ns,
                    "-o",
                    "json",
                ]))
                .ok()
                .filter(|list| list["items"].as_array().is_some_and(|i| !i.is_empty()))
            },
        );
    }
    let mut placement = nodes.iter().cycle();
    let pods: Vec<Value> = NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |name| (ns, name)))
        .map(|(ns, name)| pod(ns, name, placement.next().copied()))
        .collect();
    apply(kubectl, work, &pods);
    for ns in NAMESPACES {
        kubectl(&[
            "wait",
            "--for=condition=Ready",
            "pod",
            "--all",
            "-n",
            ns,
            "--timeout=90s",
        ]);
    }
    let ips = addresses(kubectl);
    let apply = |objects: &[Value]| apply(kubectl, work, objects);
    let expect =
        |case: &str, allowed: &dyn Fn(&Probe) -> bool| expect(kubectl, &ips, case, allowed);
    let delete_policies = || delete_policies(kubectl);
    let xa = ("x", "a");

    expect("no policy", &|_| true);

    // Default deny of ingress in x: nothing reaches x's pods; x's pods reach out.
    apply(&[policy(
        "x",
        "deny-ingress",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    )]);
    expect("deny all ingress in x", &|p| p.to.0 != "x");
    delete_policies();

    // x/a admits x/b only (a pod selector: the policy's own namespace).
    apply(&[policy(
        "x",
        "from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    expect("x/a from x/b", &|p| p.to != xa || p.from == ("x", "b"));
    delete_policies();

    // x/a admits every pod of namespace y (a namespace selector alone).
    apply(&[policy(
        "x",
        "from-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    )]);
    expect("x/a from namespace y", &|p| p.to != xa || p.from.0 == "y");
    delete_policies();

    // Both selectors in one peer: pods c of namespaces y and z, nothing else.
    apply(&[policy(
        "x",
        "from-c-of-y-z",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]},
                                "podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
    )]);
    expect("x/a from pod c of y and z", &|p| {
        p.to != xa || (p.from.1 == "c" && p.from.0 != "x")
    });
    delete_policies();

    // Ports: x/a admits anyone on TCP 80 and on its port named serve-81-udp.
    apply(&[policy(
        "x",
        "ports",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"ports": [{"port": 80}, {"protocol": "UDP", "port": "serve-81-udp"}]}]}),
    )]);
    expect("x/a on tcp/80 and the port named serve-81-udp", &|p| {
        p.to != xa || (p.protocol, p.port) == ("tcp", 80) || (p.protocol, p.port) == ("udp", 81)
    });
    delete_policies();

    // Egress: y/b reaches only namespace z, on TCP 80 to 81 (endPort). What comes to
    // y/b is not judged: the policy is of type Egress only.
    apply(&[policy(
        "y",
        "b-out",
        json!({"podSelector": {"matchLabels": {"pod": "b"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}],
                    "ports": [{"protocol": "TCP", "port": 80, "endPort": 81}]}]}),
    )]);
    expect("y/b out to z on tcp 80-81", &|p| {
        p.from != ("y", "b") || (p.to.0 == "z" && p.protocol == "tcp")
    });
    delete_policies();

    // Egress to a named port, resolved on each destination: y/b to UDP serve-80-udp only.
    apply(&[policy(
        "y",
        "b-out-named",
        json!({"podSelector": {"matchLabels": {"pod": "b"}},
        "policyTypes": ["Egress"],
        "egress": [{"ports": [{"protocol": "UDP", "port": "serve-80-udp"}]}]}),
    )]);
    expect("y/b out to udp serve-80-udp", &|p| {
        p.from != ("y", "b") || (p.protocol, p.port) == ("udp", 80)
    });
    delete_policies();

    // Address blocks: x's pods admit the whole pod range except y/a's address.
    let ya = ips[&("y", "a")].clone();
    apply(&[policy(
        "x",
        "block",
        json!({"podSelector": {},
        "ingress": [{"from": [{"ipBlock": {"cidr": cluster_cidr, "except": [format!("{ya}/32")]}}]}]}),
    )]);
    expect("x from the pod range except y/a", &|p| {
        p.to.0 != "x" || p.from != ("y", "a")
    });

    // Two policies selecting one pod: what either allows. x/a also admits the pods a
    // of namespace y.
    apply(&[policy(
        "x",
        "a-of-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    )]);
    expect("x from all but y/a, and x/a from y/a", &|p| {
        p.to.0 != "x" || p.from != ("y", "a") || p.to == xa
    });
    delete_policies();

    // A policy that applies to a pod once its labels change: x/a admits pods labelled
    // pod=b anywhere; z/c becomes one.
    apply(&[policy(
        "x",
        "from-any-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    kubectl(&["label", "pod", "c", "-n", "z", "pod=b", "--overwrite"]);
    expect("x/a from pods b anywhere, z/c relabelled b", &|p| {
        p.to != xa || p.from.1 == "b" || p.from == ("z", "c")
    });
    delete_policies();
    expect("policies deleted", &|_| true);

    for ns in NAMESPACES {
        kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
}
