//! The scheduler end to end: `krust server` (scheduler in-process) with `krust sim`
//! nodes, driven by the real kubectl — resource fit, taints and tolerations,
//! nodeSelector, anti-affinity, topology spread, preemption by priority, and an
//! unschedulable pod that is placed as soon as a fitting node joins.

use crate::common;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::common::{Component, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// `count` simulated nodes named `<prefix>0..`, waited for.
fn sim(s: &Server, prefix: &str, count: usize, args: &[&str]) -> Component {
    let mut all = vec![
        format!("--nodes={count}"),
        format!("--name-prefix={prefix}"),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let sim = Component::start(s, "sim", &format!("sim-{prefix}"), &all);
    wait_for("simulated nodes", DEADLINE, || {
        let names = s.ok(&["get", "nodes", "-o", "name"]);
        (names.matches(&format!("node/{prefix}")).count() == count).then_some(())
    });
    sim
}

fn create(s: &Server, obj: Value) {
    s.ok_stdin(&["create", "-f", "-"], &obj.to_string());
}

fn pod(name: &str, cpu: &str, spec: Value) -> Value {
    let mut spec_full = json!({"containers": [{"name": "c", "image": "busybox",
        "resources": {"requests": {"cpu": cpu}}}]});
    for (k, v) in spec.as_object().into_iter().flatten() {
        spec_full[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}, "spec": spec_full})
}

fn node_of(s: &Server, pod: &str) -> Option<String> {
    let p = s.get_json(&["pod", pod]);
    p["spec"]["nodeName"].as_str().map(str::to_string)
}

fn running_on(s: &Server, pod: &str) -> String {
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{pod}"),
        "--timeout=30s",
    ]);
    node_of(s, pod).expect("a node")
}

fn scheduled_condition(s: &Server, pod: &str) -> Value {
    let p = s.get_json(&["pod", pod]);
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled")
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn a_deployment_is_scheduled_bound_and_runs_with_scheduled_events() {
    let s = Server::start();
    let _nodes = sim(&s, "n", 3, &[]);
    create(
        &s,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m"}}}]}}}}),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let pods = s.get_json(&["pods", "-l", "app=web"]);
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in pods["items"].as_array().unwrap() {
        let name = p["metadata"]["name"].as_str().unwrap();
        let node = p["spec"]["nodeName"].as_str().expect("bound").to_string();
        *per_node.entry(node.clone()).or_default() += 1;
        let scheduled = wait_for("the Scheduled event", DEADLINE, || {
            let e = s.event_messages(name, "Scheduled");
            (!e.is_empty()).then_some(e)
        });
        assert_eq!(
            scheduled[0],
            format!("Successfully assigned default/{name} to {node}")
        );
        assert_eq!(scheduled_condition(&s, name)["status"], "True");
    }
    // The default spreading of a ReplicaSet's pods uses every node.
    assert_eq!(per_node.len(), 3, "{per_node:?}");
}

#[test]
fn an_unschedulable_pod_says_why_and_is_placed_when_a_fitting_node_joins() {
    let s = Server::start();
    let _small = sim(&s, "small", 2, &["--node-cpu=2"]);
    create(&s, pod("big", "3", json!({})));
    let message = wait_for("FailedScheduling", DEADLINE, || {
        s.event_messages("big", "FailedScheduling")
            .into_iter()
            .next()
    });
    assert!(
        message.starts_with(
            "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 "
        ),
        "{message}"
    );
    let cond = wait_for("PodScheduled=False", DEADLINE, || {
        let c = scheduled_condition(&s, "big");
        (c["status"] == "False").then_some(c)
    });
    assert_eq!(cond["reason"], "Unschedulable");
    assert_eq!(cond["message"], message.as_str());
    // Pods for another scheduler are not ours.
    create(
        &s,
        pod("other", "100m", json!({"schedulerName": "someone-else"})),
    );

    let _big = sim(&s, "big", 1, &["--node-cpu=4"]);
    assert_eq!(running_on(&s, "big"), "big0");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(node_of(&s, "other"), None);
}

#[test]
fn taints_tolerations_node_selectors_and_anti_affinity_steer_pods() {
    let s = Server::start();
    let _tainted = sim(
        &s,
        "gpu",
        1,
        &[
            "--node-taint=dedicated=gpu:NoSchedule",
            "--node-label=kind=gpu",
        ],
    );
    let _plain = sim(&s, "plain", 3, &["--node-label=kind=plain"]);
    create(&s, pod("anywhere", "100m", json!({})));
    assert!(running_on(&s, "anywhere").starts_with("plain"));
    create(
        &s,
        pod(
            "tolerant",
            "100m",
            json!({"nodeSelector": {"kind": "gpu"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}),
        ),
    );
    assert_eq!(running_on(&s, "tolerant"), "gpu0");
    // Required node affinity (here: anything but the plain nodes) steers the same way.
    create(
        &s,
        pod(
            "affine",
            "100m",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "kind", "operator": "NotIn", "values": ["plain"]}]}]}}},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
        ),
    );
    assert_eq!(running_on(&s, "affine"), "gpu0");
    // A nodeSelector for the tainted node without the toleration fits nowhere.
    create(
        &s,
        pod(
            "intolerant",
            "100m",
            json!({"nodeSelector": {"kind": "gpu"}}),
        ),
    );
    let message = wait_for("FailedScheduling", DEADLINE, || {
        s.event_messages("intolerant", "FailedScheduling")
            .into_iter()
            .next()
    });
    assert!(
        message.starts_with("0/4 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 3 node(s) didn't match Pod's node affinity/selector."),
        "{message}"
    );

    // Required anti-affinity on the hostname: one per plain node, the fourth waits.
    let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"group": "spread"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    let mut nodes = HashSet::new();
    for i in 0..4 {
        let mut p = pod(
            &format!("spread{i}"),
            "100m",
            json!({"nodeSelector": {"kind": "plain"}, "affinity": anti}),
        );
        p["metadata"]["labels"]["group"] = json!("spread");
        create(&s, p);
        if i < 3 {
            nodes.insert(running_on(&s, &format!("spread{i}")));
        }
    }
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    let message = wait_for("FailedScheduling", DEADLINE, || {
        s.event_messages("spread3", "FailedScheduling")
            .into_iter()
            .next()
    });
    assert!(
        message.contains("3 node(s) didn't match pod anti-affinity rules"),
        "{message}"
    );
}

#[test]
fn topology_spread_balances_zones() {
    let s = Server::start();
    let _nodes = sim(&s, "z", 4, &["--zones=2"]);
    let spread = json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"group": "zoned"}}}]);
    let mut zones: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..6 {
        let mut p = pod(
            &format!("p{i}"),
            "100m",
            json!({"topologySpreadConstraints": spread}),
        );
        p["metadata"]["labels"]["group"] = json!("zoned");
        create(&s, p);
        let node = running_on(&s, &format!("p{i}"));
        let zone =
            s.get_json(&["node", &node])["metadata"]["labels"]["topology.kubernetes.io/zone"]
                .as_str()
                .unwrap()
                .to_string();
        *zones.entry(zone).or_default() += 1;
        let counts: Vec<usize> = zones.values().copied().collect();
        let (max, min) = (
            *counts.iter().max().unwrap(),
            if counts.len() < 2 {
                0
            } else {
                *counts.iter().min().unwrap()
            },
        );
        assert!(max - min <= 1, "skew above 1 after {i}: {zones:?}");
    }
    assert_eq!(zones.values().copied().collect::<Vec<_>>(), vec![3, 3]);
}

#[test]
fn a_higher_priority_pod_preempts_lower_priority_ones() {
    let s = Server::start();
    let _nodes = sim(&s, "p", 1, &["--node-cpu=2"]);
    create(
        &s,
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "high"}, "value": 1000}),
    );
    create(&s, pod("low1", "1", json!({})));
    create(&s, pod("low2", "1", json!({})));
    running_on(&s, "low1");
    running_on(&s, "low2");
    create(
        &s,
        pod("high", "1500m", json!({"priorityClassName": "high"})),
    );
    assert_eq!(running_on(&s, "high"), "p0");
    // Both low pods had to go (each frees only 1 CPU of the 1.5 needed).
    let remaining = s.ok(&["get", "pods", "-o", "name"]);
    assert!(
        !remaining.contains("low1") && !remaining.contains("low2"),
        "{remaining}"
    );
    let preempted = s.get_json(&["events", "--field-selector", "reason=Preempted"]);
    assert_eq!(
        preempted["items"].as_array().map(Vec::len),
        Some(2),
        "{preempted}"
    );
}

const BIN_PACKING: &str = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
- schedulerName: bin-packer
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: cpu, weight: 1}, {name: memory, weight: 1}]
  plugins:
    score:
      disabled: [{name: PodTopologySpread}, {name: NodeResourcesBalancedAllocation}]
"#;

#[test]
fn of_two_schedulers_one_leads_and_profiles_from_a_config_file_apply() {
    let s = Server::start_with(&["--disable-scheduler"]);
    let _nodes = sim(&s, "m", 3, &["--node-cpu=8"]);
    let config = common::manifest(&s, "scheduler.yaml", BIN_PACKING);
    let args = [
        "--config",
        config.as_str(),
        "--leader-elect-lease-duration=3s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=250ms",
    ];
    let mut schedulers = vec![
        Component::start(&s, "scheduler", "sched1", &args),
        Component::start(&s, "scheduler", "sched2", &args),
    ];
    let leader = wait_for("a leader", DEADLINE, || {
        schedulers.iter().position(Component::leads)
    });
    // The bin-packing profile puts pods on the fullest node that fits.
    let mut nodes = HashSet::new();
    for i in 0..4 {
        create(
            &s,
            pod(
                &format!("packed{i}"),
                "1",
                json!({"schedulerName": "bin-packer"}),
            ),
        );
        nodes.insert(running_on(&s, &format!("packed{i}")));
    }
    assert_eq!(nodes.len(), 1, "bin packing used {nodes:?}");
    let lease = s.get_json(&["lease", "-n", "kube-system", "kube-scheduler"]);
    assert!(lease["spec"]["holderIdentity"].is_string());

    // Kill the leader: the standby takes over and schedules.
    schedulers.remove(leader);
    wait_for("the standby to lead", Duration::from_secs(15), || {
        schedulers[0].leads().then_some(())
    });
    create(&s, pod("after", "1", json!({})));
    running_on(&s, "after");
}

#[test]
fn krust_server_with_simulated_nodes_runs_a_deployment_end_to_end() {
    let s = Server::start_with(&["--sim-nodes=2"]);
    wait_for("two nodes", DEADLINE, || {
        (s.ok(&["get", "nodes", "-o", "name"]).lines().count() == 2).then_some(())
    });
    create(
        &s,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "demo"},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "demo"}},
                "template": {"metadata": {"labels": {"app": "demo"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
    );
    s.ok(&["rollout", "status", "deployment/demo", "--timeout=60s"]);
    let out = s.ok(&["get", "pods", "-o", "wide"]);
    assert_eq!(out.matches("Running").count(), 4, "{out}");
}
