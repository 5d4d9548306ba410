//! Several real nodes on one machine (`scripts/multinode.sh`): a `krust server` without
//! a node of its own, and agents in network namespaces on a shared bridge that join with
//! the server's token. Pods on different nodes reach each other with their own
//! addresses (VXLAN and host-gw), Services answer from every pod and every node (cluster
//! IP, NodePort, LoadBalancer, DNS names), `externalTrafficPolicy: Local` keeps outside
//! traffic on nodes with endpoints, logs and exec reach pods on every node, a lost
//! node's pods move to the others, and NetworkPolicies hold between pods on different
//! nodes. With three servers, each in a namespace of its own, the control plane
//! survives a partition and the loss of each server in turn.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{KUBECTL, TEST_EVICTION_HARD, TEST_IMAGE_GC, free_port, ready_pods, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

/// A cluster started by the harness script, torn down (namespaces, containers, state)
/// on drop.
struct Cluster {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Cluster {
    /// `nodes` agents with `backend`; `name` and `subnet` keep concurrent clusters apart.
    fn up(nodes: usize, backend: &str, name: &str, subnet: &str, cluster_cidr: &str) -> Cluster {
        Self::up_servers(1, nodes, backend, name, subnet, cluster_cidr, "")
    }

    /// `servers` servers (several: each in a namespace with an etcd member, server i
    /// at `<subnet>.(1+i)`) with more flags, and `nodes` agents.
    fn up_servers(
        servers: usize,
        nodes: usize,
        backend: &str,
        name: &str,
        subnet: &str,
        cluster_cidr: &str,
        server_args: &str,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            ("KRUST", env!("CARGO_BIN_EXE_krust").to_string()),
            ("MN_DIR", dir.path().join("cluster").display().to_string()),
            ("MN_NAME", name.to_string()),
            ("MN_SUBNET", subnet.to_string()),
            ("MN_PORT", free_port().to_string()),
            ("MN_BACKEND", backend.to_string()),
            ("MN_CLUSTER_CIDR", cluster_cidr.to_string()),
            (
                "MN_AGENT_ARGS",
                format!("--eviction-hard={TEST_EVICTION_HARD} {TEST_IMAGE_GC}"),
            ),
            ("MN_SERVER_ARGS", server_args.to_string()),
            ("MN_SERVERS", servers.to_string()),
        ];
        let cluster = Cluster { dir, env };
        let out = cluster.script(&["up", &nodes.to_string()]);
        assert!(
            out.status.success(),
            "multinode.sh up: {}{}",
            String::from_utf8_lossy(&out.stderr),
            cluster.logs()
        );
        cluster
    }

    fn script(&self, args: &[&str]) -> std::process::Output {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/multinode.sh");
        Command::new("bash")
            .arg(script)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap()
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("cluster")
    }

    fn logs(&self) -> String {
        let mut all = String::new();
        for entry in std::fs::read_dir(self.state())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                all += &format!("\n--- {}\n", path.display());
                all += &tail.into_iter().rev().collect::<Vec<_>>().join("\n");
            }
        }
        all
    }

    /// kubectl as the admin: its output, or a panic with the cluster's logs.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new(KUBECTL)
            .args(args)
            .env("KUBECONFIG", self.state().join("kubeconfig"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command in node `n`'s network namespace.
    fn on_node(&self, n: usize, args: &[&str]) -> String {
        let name = &self.env.iter().find(|(k, _)| *k == "MN_NAME").unwrap().1;
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{name}-n{n}"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(pod, node, pod IP)` of the pods labelled `app=<app>`, once `count` are Ready.
    fn ready_pods(&self, app: &str, count: usize) -> Vec<(String, String, String)> {
        wait_for("the pods Ready", DEADLINE, || {
            let pods = self.ready_pods_now(app);
            (pods.len() == count).then_some(pods)
        })
    }

    /// The pods labelled `app=<app>` that are Ready now and not terminating (those
    /// that Services send new connections to).
    fn ready_pods_now(&self, app: &str) -> Vec<(String, String, String)> {
        let raw = self.kubectl(&["get", "pods", "-l", &format!("app={app}"), "-o", "json"]);
        let Ok(pods) = serde_json::from_str::<serde_json::Value>(&raw) else {
            return Vec::new();
        };
        ready_pods(&pods)
            .into_iter()
            .map(|p| {
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                (
                    s(&p["metadata"]["name"]),
                    s(&p["spec"]["nodeName"]),
                    s(&p["status"]["podIP"]),
                )
            })
            .collect()
    }

    /// Waits until `count` pods are Ready, none of them on `node`.
    fn ready_pods_without(
        &self,
        app: &str,
        count: usize,
        node: &str,
    ) -> Vec<(String, String, String)> {
        wait_for("the pods Ready elsewhere", DEADLINE, || {
            let pods = self.ready_pods_now(app);
            (pods.len() == count && pods.iter().all(|(_, n, _)| n != node)).then_some(pods)
        })
    }

    /// `wget` from inside `pod`: the body, or "" on failure.
    fn fetch_from(&self, pod: &str, url: &str) -> String {
        let out = Command::new(KUBECTL)
            .args(["exec", pod, "--", "timeout", "5", "wget", "-qO-", url])
            .env("KUBECONFIG", self.state().join("kubeconfig"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.script(&["down"]);
    }
}

/// A DaemonSet (one pod per node) serving its pod's name on 8080 and logging every
/// client's address, behind a NodePort Service.
const WEB: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: busybox
        command: ["sh", "-c", "hostname > /tmp/index.html; exec httpd -f -v -p 8080 -h /tmp"]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

#[test]
fn three_nodes_over_vxlan_serve_pods_services_and_dns_from_every_node() {
    let c = Cluster::up(3, "vxlan", "kmv", "10.99.21", "10.77.0.0/16");
    let manifest = c.dir.path().join("web.yaml");
    std::fs::write(&manifest, WEB).unwrap();
    c.kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    let pods = c.ready_pods("web", 3);
    let mut nodes: Vec<&str> = pods.iter().map(|(_, node, _)| node.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n3"], "one pod per node");

    // Pod to pod across nodes, with the client's own address on the server's side.
    for (client, _, client_ip) in &pods {
        for (server, _, server_ip) in &pods {
            let body = c.fetch_from(client, &format!("http://{server_ip}:8080/"));
            assert_eq!(&body, server, "{client} → {server}{}", c.logs());
        }
        for (server, _, _) in &pods {
            let log = c.kubectl(&["logs", server]);
            assert!(
                log.contains(client_ip.as_str()),
                "{server} saw {client_ip}: {log}"
            );
        }
    }

    // The Service by name (cluster DNS on the server, reached from every node) and its
    // cluster IP answer from every pod; every node's own address answers the NodePort
    // and every node reaches the cluster IP.
    let names: Vec<&str> = pods.iter().map(|(name, _, _)| name.as_str()).collect();
    for (client, _, _) in &pods {
        for url in ["http://web/", "http://web.default.svc.cluster.local/"] {
            let body = wait_for("the Service by name", DEADLINE, || {
                Some(c.fetch_from(client, url)).filter(|b| !b.is_empty())
            });
            assert!(names.contains(&body.as_str()), "{client} {url}: {body:?}");
        }
    }
    let cluster_ip = c.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let node_port = c.kubectl(&[
        "get",
        "svc",
        "web",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    for n in 1..=3 {
        let body = c.on_node(
            n,
            &["curl", "-s", "-m", "5", &format!("http://{cluster_ip}/")],
        );
        assert!(
            names.contains(&body.trim()),
            "node n{n} → {cluster_ip}: {body:?}"
        );
        let node_ip = format!("10.99.21.{}", 10 + n);
        let out = Command::new("curl")
            .args(["-s", "-m", "5", &format!("http://{node_ip}:{node_port}/")])
            .output()
            .unwrap();
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(names.contains(&body.trim()), "NodePort on n{n}: {body:?}");
    }

    // As a LoadBalancer, the Service gets every node's address (ServiceLB) and answers
    // its own port on each.
    c.kubectl(&[
        "patch",
        "svc",
        "web",
        "-p",
        r#"{"spec":{"type":"LoadBalancer"}}"#,
    ]);
    let ingress = wait_for("load balancer addresses", DEADLINE, || {
        let ips = c.kubectl(&[
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[*].ip}",
        ]);
        (ips.split_whitespace().count() == 3).then_some(ips)
    });
    assert_eq!(ingress, "10.99.21.11 10.99.21.12 10.99.21.13");
    for ip in ingress.split_whitespace() {
        let body = wait_for("the load balancer port", DEADLINE, || {
            let out = Command::new("curl")
                .args(["-s", "-m", "5", &format!("http://{ip}:80/")])
                .output()
                .ok()?;
            let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!body.is_empty()).then_some(body)
        });
        assert!(
            names.contains(&body.as_str()),
            "LoadBalancer on {ip}: {body:?}"
        );
    }

    // logs and exec reach the kubelet of every node.
    for (pod, _, _) in &pods {
        assert_eq!(c.kubectl(&["exec", pod, "--", "hostname"]).trim(), pod);
    }
    let vxlan = c.on_node(1, &["ip", "-d", "link", "show", "flannel.1"]);
    assert!(
        vxlan.contains("vxlan id 1") && vxlan.contains("dstport 8472"),
        "{vxlan}"
    );
    assert!(vxlan.contains("mtu 1450"), "{vxlan}");
}

#[test]
fn two_nodes_over_host_gw_route_pods_through_each_others_address() {
    let c = Cluster::up(2, "host-gw", "kmh", "10.99.22", "10.78.0.0/16");
    let manifest = c.dir.path().join("web.yaml");
    std::fs::write(&manifest, WEB).unwrap();
    c.kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    let pods = c.ready_pods("web", 2);
    let (a, b) = (&pods[0], &pods[1]);
    assert_ne!(a.1, b.1);
    assert_eq!(c.fetch_from(&a.0, &format!("http://{}:8080/", b.2)), b.0);
    assert_eq!(c.fetch_from(&b.0, &format!("http://{}:8080/", a.2)), a.0);
    let routes = c.on_node(1, &["ip", "route", "show", "proto", "75"]);
    assert!(routes.contains("via 10.99.22.12"), "{routes}");
    assert!(
        c.on_node(1, &["ip", "link", "show", "flannel.1"])
            .is_empty()
    );

    // `externalTrafficPolicy: Local`: only the node with the endpoint answers from
    // outside, and its pod sees the client's own address; the health check port says
    // which node that is; pods still reach the Service through any node.
    c.kubectl(&["label", "pod", &a.0, "solo=yes"]);
    let solo = c.dir.path().join("solo.yaml");
    std::fs::write(&solo, SOLO).unwrap();
    c.kubectl(&["apply", "-f", solo.to_str().unwrap()]);
    let jsonpath =
        |path: &str| c.kubectl(&["get", "svc", "solo", "-o", &format!("jsonpath={path}")]);
    let (node_port, health_port) = (
        jsonpath("{.spec.ports[0].nodePort}"),
        jsonpath("{.spec.healthCheckNodePort}"),
    );
    let ip_of = |node: &str| format!("10.99.22.{}", 10 + node[1..].parse::<u8>().unwrap());
    let (here, elsewhere) = (ip_of(&a.1), ip_of(&b.1));
    // The body and status code, or curl's exit code (28: timed out, 7: refused).
    let curl_status = |url: &str| {
        let out = Command::new("curl")
            .args(["-s", "-m", "3", "-w", "\n%{http_code}", url])
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            out.status.code(),
        )
    };
    let curl = |url: &str| curl_status(url).0;
    let answered = wait_for("the local endpoint answering", DEADLINE, || {
        let body = curl(&format!("http://{here}:{node_port}/"));
        body.starts_with(&a.0).then_some(body)
    });
    assert!(answered.ends_with("200"), "{answered}");
    let log = c.kubectl(&["logs", &a.0]);
    assert!(
        log.contains("10.99.22.1]:"),
        "the client's address kept: {log}"
    );
    let healthy = curl(&format!("http://{here}:{health_port}/"));
    assert!(
        healthy.contains(r#""localEndpoints":1"#) && healthy.ends_with("200"),
        "{healthy}"
    );
    // The other node's proxy follows the Service on its own time: nothing listens
    // there until it has.
    let unhealthy = wait_for("the other node's health check port", DEADLINE, || {
        let body = curl(&format!("http://{elsewhere}:{health_port}/"));
        body.ends_with("503").then_some(body)
    });
    assert!(unhealthy.contains(r#""localEndpoints":0"#), "{unhealthy}");
    // Dropped, not refused: the client times out (curl's 28) instead of a reset (7).
    let dropped = wait_for("the node port dropped elsewhere", DEADLINE, || {
        let (body, code) = curl_status(&format!("http://{elsewhere}:{node_port}/"));
        (code == Some(28)).then_some(body)
    });
    assert_eq!(dropped, "\n000", "no endpoint on {elsewhere}: dropped");
    assert_eq!(
        c.fetch_from(&b.0, &format!("http://{elsewhere}:{node_port}/")),
        a.0,
        "a pod reaches the Service through a node without endpoints"
    );
}

/// A LoadBalancer Service for the pod labelled `solo=yes`, keeping external traffic on
/// its node.
const SOLO: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: solo}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: web, solo: "yes"}
  ports: [{port: 8081, targetPort: 8080}]
"#;

/// Three replicas spread over the nodes, tolerating a lost node for 5 s (not 300).
const SPREAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: spread}
spec:
  replicas: 3
  selector: {matchLabels: {app: spread}}
  template:
    metadata: {labels: {app: spread}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway,
         labelSelector: {matchLabels: {app: spread}}}
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: busybox
        command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#;

#[test]
fn lost_nodes_become_unknown_and_their_pods_move_to_the_others() {
    let grace = Duration::from_secs(15);
    let c = Cluster::up_servers(
        1,
        3,
        "host-gw",
        "kml",
        "10.99.23",
        "10.79.0.0/16",
        "--node-monitor-grace-period=15s --node-monitor-period=1s --node-eviction-rate=10",
    );
    let manifest = c.dir.path().join("spread.yaml");
    std::fs::write(&manifest, SPREAD).unwrap();
    c.kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    let pods = c.ready_pods("spread", 3);
    let lost_pod = pods
        .iter()
        .find(|(_, node, _)| node == "n3")
        .expect("a pod on n3")
        .0
        .clone();

    // An agent killed outright (the grace period must exceed the kubelet's 10 s Lease
    // renewal): its node goes Unknown within the grace period plus 10 s, gets the unreachable NoExecute taint, and
    // its pod is evicted once its 5 s toleration runs out and replaced elsewhere.
    let pid = std::fs::read_to_string(c.state().join("n3.pid")).unwrap();
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    let node_status = |node: &str| -> serde_json::Value {
        serde_json::from_str(&c.kubectl(&["get", "node", node, "-o", "json"])).unwrap()
    };
    let ready_of = |node: &serde_json::Value| {
        node["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
            .unwrap_or_default()
    };
    wait_for("n3 Unknown", grace + Duration::from_secs(10), || {
        (ready_of(&node_status("n3"))["status"] == "Unknown").then_some(())
    });
    let detected = killed.elapsed();
    let n3 = node_status("n3");
    assert_eq!(ready_of(&n3)["reason"], "NodeStatusUnknown");
    assert_eq!(
        ready_of(&n3)["message"],
        "Kubelet stopped posting node status."
    );
    wait_for("the unreachable NoExecute taint", DEADLINE, || {
        node_status("n3")["spec"]["taints"]
            .as_array()?
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/unreachable" && t["effect"] == "NoExecute")
            .then_some(())
    });
    let events = c.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=n3",
    ]);
    assert!(events.contains("NodeNotReady"), "{events}");
    let replaced = c.ready_pods_without("spread", 3, "n3");
    assert!(!replaced.iter().any(|(name, _, _)| *name == lost_pod));
    let evicted: serde_json::Value =
        serde_json::from_str(&c.kubectl(&["get", "pod", &lost_pod, "-o", "json"])).unwrap();
    assert!(evicted["metadata"]["deletionTimestamp"].is_string());
    let condition = |ty: &str| {
        let conditions = evicted["status"]["conditions"].as_array().unwrap();
        let found = conditions.iter().find(|c| c["type"] == ty);
        found.cloned().unwrap_or_default()
    };
    assert_eq!(
        condition("DisruptionTarget")["reason"],
        "DeletionByTaintManager",
        "{evicted}"
    );
    // Marked not ready when its node went Unknown, as upstream's MarkPodsNotReady does.
    assert_eq!(condition("Ready")["status"], "False", "{evicted}");
    eprintln!("node failure detected in {detected:?} (grace {grace:?})");

    // A node cut off from the network is handled the same; when it comes back, its old
    // pods are stopped, and at no moment do more than 3 pods serve (Ready and not
    // terminating).
    let before: Vec<String> = c
        .ready_pods("spread", 3)
        .into_iter()
        .filter(|(_, node, _)| node == "n2")
        .map(|(name, _, _)| name)
        .collect();
    assert!(!before.is_empty(), "a pod on n2");
    Command::new("ip")
        .args(["link", "set", "kmln2", "down"])
        .status()
        .unwrap();
    let too_many = std::sync::Mutex::new(None);
    let watch_ready = || {
        let ready = c.ready_pods_now("spread");
        if ready.len() > 3 {
            let pods = c.kubectl(&["get", "pods", "-o", "wide"]);
            *too_many.lock().unwrap() = Some(format!("{ready:?}\n{pods}"));
        }
    };
    wait_for("n2 Unknown", grace + Duration::from_secs(10), || {
        watch_ready();
        (ready_of(&node_status("n2"))["status"] == "Unknown").then_some(())
    });
    wait_for("n2's pod replaced", DEADLINE, || {
        watch_ready();
        let now = c.ready_pods_now("spread");
        (now.len() == 3 && now.iter().all(|(_, node, _)| node == "n1")).then_some(())
    });
    Command::new("ip")
        .args(["link", "set", "kmln2", "up"])
        .status()
        .unwrap();
    wait_for("n2 Ready again and its old pods gone", DEADLINE, || {
        watch_ready();
        let back = ready_of(&node_status("n2"))["status"] == "True";
        let gone = before.iter().all(|pod| {
            Command::new(KUBECTL)
                .args(["get", "pod", pod])
                .env("KUBECONFIG", c.state().join("kubeconfig"))
                .output()
                .is_ok_and(|o| !o.status.success())
        });
        (back && gone).then_some(())
    });
    let too_many = too_many.lock().unwrap().take();
    if let Some(state) = too_many {
        panic!("more than 3 pods served at once: {state}");
    }
    // The node lifecycle controller takes the taint off at its next look at the node
    // (every 5 s, as upstream's), which may come after the Ready condition is seen.
    wait_for(
        "the NoExecute taint off n2, which is back",
        DEADLINE,
        || {
            let taints = node_status("n2")["spec"]["taints"].clone();
            (!taints.to_string().contains("NoExecute")).then_some(())
        },
    );
}

/// The network policy truth table (`network_policy`) with the pods spread over two
/// nodes: each node judges what its own pods send and receive, whatever node the peer
/// is on and however the nodes are joined.
fn network_policies_across_two_nodes(backend: &str, name: &str, subnet: &str, cluster_cidr: &str) {
    let c = Cluster::up(2, backend, name, subnet, cluster_cidr);
    let data_dirs = [c.state().join("n1"), c.state().join("n2")];
    let data_dirs: Vec<&std::path::Path> = data_dirs.iter().map(PathBuf::as_path).collect();
    crate::network_policy::import_image(c.dir.path(), &data_dirs);
    let kubectl = |args: &[&str]| c.kubectl(args);
    crate::network_policy::truth_table(&kubectl, c.dir.path(), &["n1", "n2"], cluster_cidr);
}

#[test]
fn network_policies_hold_between_pods_on_two_nodes_over_vxlan() {
    network_policies_across_two_nodes("vxlan", "kmp", "10.99.24", "10.53.0.0/16");
}

/// Over host-gw the packets between nodes are plain routed ones.
#[test]
fn network_policies_hold_between_pods_on_two_nodes_over_host_gw() {
    network_policies_across_two_nodes("host-gw", "kmq", "10.99.25", "10.54.0.0/16");
}

/// kubectl through server `i` of a highly available cluster.
fn kubectl_via(c: &Cluster, i: usize, args: &[&str]) -> std::process::Output {
    Command::new(KUBECTL)
        .args(args)
        .arg("--request-timeout=10s")
        .env("KUBECONFIG", c.state().join(format!("kubeconfig-{i}")))
        .output()
        .unwrap()
}

/// Three servers in their own namespaces (each with an etcd member) and an agent: a
/// server cut off by the network and each server's machine lost in turn (its member and
/// server SIGKILLed), under a write load through the others. Writes go on, the agent
/// goes on through the servers left, no acknowledged write is lost, and each server
/// comes back with what was written without it.
#[test]
fn a_highly_available_control_plane_survives_a_partition_and_losing_each_server() {
    let c = Cluster::up_servers(3, 1, "vxlan", "kha", "10.99.26", "10.50.0.0/16", "");
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let down = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let state = c.state();
    let writer = {
        let (acked, down, stop) = (acked.clone(), down.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Through a server that is up: the one after the server down, if any.
                let via = down.load(std::sync::atomic::Ordering::Relaxed) % 3 + 1;
                let name = format!("w{i}");
                let out = Command::new(KUBECTL)
                    .args(["create", "configmap", &name, "--request-timeout=10s"])
                    .env("KUBECONFIG", state.join(format!("kubeconfig-{via}")))
                    .output()
                    .unwrap();
                if out.status.success() {
                    acked.lock().unwrap().push(name);
                }
                i += 1;
            }
        })
    };
    let newest = || acked.lock().unwrap().last().cloned();
    // Server `i` serves the newest acknowledged write, within `DEADLINE`.
    let serves_newest = |i: usize| {
        wait_for(
            &format!("server {i} serves the newest write"),
            DEADLINE,
            || {
                let name = newest()?;
                kubectl_via(&c, i, &["get", "configmap", &name])
                    .status
                    .success()
                    .then_some(())
            },
        )
    };

    // Server 1, which the agent joined, is cut off.
    let script = |args: &[&str]| {
        let out = c.script(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    down.store(1, std::sync::atomic::Ordering::Relaxed);
    script(&["partition", "1"]);
    let before = acked.lock().unwrap().len();
    wait_for("writes through the others", DEADLINE, || {
        (acked.lock().unwrap().len() > before + 5).then_some(())
    });
    // The agent goes on through the others: a new pod runs on it.
    let run = kubectl_via(
        &c,
        2,
        &["run", "p1", "--image=busybox", "--", "sleep", "3600"],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    wait_for("p1 running on n1 through servers 2 and 3", DEADLINE, || {
        let out = kubectl_via(&c, 3, &["get", "pod", "p1", "-o", "json"]);
        let pod: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let ready = pod["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(())
    });
    script(&["heal", "1"]);
    serves_newest(1);

    // Each server's machine lost in turn, and back.
    for i in 1..=3 {
        down.store(i, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(1));
        script(&["kill", &i.to_string()]);
        let before = acked.lock().unwrap().len();
        wait_for(&format!("writes without server {i}"), DEADLINE, || {
            (acked.lock().unwrap().len() > before + 5).then_some(())
        });
        script(&["start", &i.to_string()]);
        serves_newest(i);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();

    // No acknowledged write was lost.
    let listed = kubectl_via(&c, 2, &["get", "configmaps", "-o", "name"]);
    let stored = String::from_utf8_lossy(&listed.stdout).into_owned();
    let acked = acked.lock().unwrap();
    let lost: Vec<&String> = acked
        .iter()
        .filter(|name| !stored.lines().any(|l| l == format!("configmap/{name}")))
        .collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    kubectl_via(
        &c,
        2,
        &["delete", "pod", "p1", "--grace-period=0", "--timeout=60s"],
    );
}
