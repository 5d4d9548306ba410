//! The controller-manager end to end, with the real kubectl against a real `krust
//! server`: Deployments get one ReplicaSet per template and pods with ownerReferences,
//! rollouts stay within maxSurge/maxUnavailable at every moment seen on a watch,
//! `kubectl rollout status|undo`, `kubectl scale`, leader failover between two
//! `krust controller-manager` processes, and ReplicationControllers managed as
//! ReplicaSets.
//!
//! There is no kubelet yet: [`ReadyMarker`] plays one, marking every new pod Running and
//! Ready through the pods/status subresource.

use std::collections::{BTreeMap, HashSet};
use std::io::BufReader;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{Component, KUBECTL, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn deployment(name: &str, replicas: i32, image: &str, strategy: Value) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": strategy,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }
        }
    })
    .to_string()
}

fn rolling(max_surge: i32, max_unavailable: i32) -> Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable}})
}

fn items(s: &Server, args: &[&str]) -> Vec<Value> {
    s.get_json(args)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Live (not terminating) pods of `app`.
fn live_pods(s: &Server, app: &str) -> Vec<Value> {
    items(s, &["pods", "-l", &format!("app={app}")])
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

/// Runs `kubectl get <what> -w --output-watch-events -o json` and calls `on_event` with
/// every (type, object) until dropped.
struct Watch {
    child: Child,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    fn start(
        s: &Server,
        what: &[&str],
        mut on_event: impl FnMut(&str, &Value) + Send + 'static,
    ) -> Watch {
        let mut child = Command::new(KUBECTL)
            .args(["get"])
            .args(what)
            .args(["-w", "--output-watch-events", "-o", "json"])
            .env("KUBECONFIG", s.kubeconfig())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl watch");
        let stdout = child.stdout.take().expect("stdout");
        let thread = std::thread::spawn(move || {
            let events =
                serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>();
            for event in events.map_while(Result::ok) {
                on_event(event["type"].as_str().unwrap_or_default(), &event["object"]);
            }
        });
        Watch {
            child,
            thread: Some(thread),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Plays the kubelet: every pod that appears unready is patched Running and Ready
/// through /status (phase, Ready condition, a ready container status).
struct ReadyMarker {
    _watch: Watch,
}

impl ReadyMarker {
    fn start(s: &Server) -> ReadyMarker {
        Self::for_image(s, None)
    }

    /// Marks ready only the pods whose first container runs `image` (when given).
    fn for_image(s: &Server, image: Option<&str>) -> ReadyMarker {
        let tls = s.data_dir().join("server").join("tls");
        let port = s.port;
        let image = image.map(str::to_string);
        let watch = Watch::start(s, &["pods"], move |kind, pod| {
            if kind == "DELETED" || is_ready(pod) || !pod["metadata"]["deletionTimestamp"].is_null()
            {
                return;
            }
            if image
                .as_ref()
                .is_some_and(|i| pod["spec"]["containers"][0]["image"] != i.as_str())
            {
                return;
            }
            mark_ready(&tls, port, pod);
        });
        ReadyMarker { _watch: watch }
    }
}

fn mark_ready(tls: &std::path::Path, port: u16, pod: &Value) {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true, "started": true,
                   "restartCount": 0, "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let patch = json!({"status": {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": containers,
    }});
    let path = format!(
        "/api/v1/namespaces/{}/pods/{}/status",
        pod["metadata"]["namespace"].as_str().unwrap_or("default"),
        name(pod)
    );
    let _ = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-X",
            "PATCH",
            "-H",
            "Content-Type: application/merge-patch+json",
        ])
        .arg("--cacert")
        .arg(tls.join("ca.crt"))
        .arg("--cert")
        .arg(tls.join("admin.crt"))
        .arg("--key")
        .arg(tls.join("admin.key"))
        .args(["--data-binary", &patch.to_string()])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .status();
}

fn rollout_status(s: &Server, deploy: &str) -> String {
    s.ok(&[
        "rollout",
        "status",
        &format!("deployment/{deploy}"),
        "--timeout=60s",
    ])
}

fn replicasets(s: &Server, app: &str) -> Vec<Value> {
    items(s, &["rs", "-l", &format!("app={app}")])
}

fn events(s: &Server, reason: &str) -> Vec<String> {
    items(s, &["events"])
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_deployment_gets_one_replicaset_and_owned_pods_and_completes() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 3, "nginx:1.25", rolling(1, 0)),
    );
    rollout_status(&s, "web");

    let d = s.get_json(&["deployment", "web"]);
    let rss = replicasets(&s, "web");
    assert_eq!(rss.len(), 1, "{rss:?}");
    let rs = &rss[0];
    let hash = rs["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .expect("pod-template-hash label")
        .to_string();
    assert_eq!(name(rs), format!("web-{hash}"));
    assert_eq!(
        rs["spec"]["selector"]["matchLabels"]["pod-template-hash"],
        hash.as_str()
    );
    assert_eq!(
        rs["spec"]["template"]["metadata"]["labels"]["pod-template-hash"],
        hash.as_str()
    );
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "1"
    );
    let owner = &rs["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Deployment"), Some("web"))
    );
    assert_eq!(owner["uid"], d["metadata"]["uid"]);
    assert_eq!(
        (
            owner["controller"].as_bool(),
            owner["blockOwnerDeletion"].as_bool()
        ),
        (Some(true), Some(true))
    );

    let pods = live_pods(&s, "web");
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        let n = name(pod);
        let suffix = n
            .strip_prefix(&format!("web-{hash}-"))
            .unwrap_or_else(|| panic!("pod name {n}"));
        assert_eq!(suffix.len(), 5, "{n}");
        let owner = &pod["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["kind"].as_str(), owner["name"].as_str()),
            (Some("ReplicaSet"), Some(name(rs)))
        );
        assert_eq!(
            (
                owner["controller"].as_bool(),
                owner["blockOwnerDeletion"].as_bool()
            ),
            (Some(true), Some(true))
        );
        assert_eq!(
            pod["metadata"]["labels"]["pod-template-hash"],
            hash.as_str()
        );
    }

    let status = &wait_for("deployment status", DEADLINE, || {
        let d = s.get_json(&["deployment", "web"]);
        (d["status"]["availableReplicas"] == 3).then_some(d)
    })["status"];
    assert_eq!(
        (
            status["replicas"].as_i64(),
            status["updatedReplicas"].as_i64(),
            status["readyReplicas"].as_i64()
        ),
        (Some(3), Some(3), Some(3))
    );
    assert_eq!(status["observedGeneration"], d["metadata"]["generation"]);
    let condition = |t: &str| {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap()
    };
    assert_eq!(condition("Available")["status"], "True");
    assert_eq!(condition("Progressing")["reason"], "NewReplicaSetAvailable");
    let rs_status = &s.get_json(&["rs", name(rs)])["status"];
    assert_eq!(
        (
            rs_status["replicas"].as_i64(),
            rs_status["fullyLabeledReplicas"].as_i64(),
            rs_status["readyReplicas"].as_i64(),
            rs_status["availableReplicas"].as_i64()
        ),
        (Some(3), Some(3), Some(3), Some(3))
    );

    let created = events(&s, "SuccessfulCreate");
    for pod in &pods {
        assert!(
            created.contains(&format!("Created pod: {}", name(pod))),
            "{created:?}"
        );
    }
    assert!(
        events(&s, "ScalingReplicaSet")
            .contains(&format!("Scaled up replica set {} from 0 to 3", name(rs)))
    );
    let described = s.ok(&["describe", "deployment", "web"]);
    assert!(described.contains("NewReplicaSetAvailable"), "{described}");
    assert!(
        described.contains(&format!("Scaled up replica set {} from 0 to 3", name(rs))),
        "kubectl describe lists the deployment's events: {described}"
    );
}

/// What the rollout watches saw: violations of the bounds, and the extremes.
#[derive(Default)]
struct Bounds {
    violations: Vec<String>,
    most_pods: usize,
    fewest_ready: usize,
    most_rs_replicas: i64,
}

#[test]
fn an_image_change_rolls_out_within_max_surge_and_max_unavailable_and_undo_restores_the_old_replicaset()
 {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 3, "nginx:1.25", rolling(1, 0)),
    );
    rollout_status(&s, "web");
    let first_rs = name(&replicasets(&s, "web")[0]).to_string();
    let initial: HashSet<String> = live_pods(&s, "web")
        .iter()
        .map(|p| name(p).to_string())
        .collect();

    // Watch pods and ReplicaSets; check the bounds on every event once the watch has
    // shown the three initial pods.
    let bounds = Arc::new(Mutex::new(Bounds {
        fewest_ready: usize::MAX,
        ..Default::default()
    }));
    let pods: Arc<Mutex<BTreeMap<String, (bool, bool)>>> = Arc::default();
    let primed = Arc::new(Mutex::new(false));
    let pod_watch = {
        let (bounds, pods, primed, initial) = (
            bounds.clone(),
            pods.clone(),
            primed.clone(),
            initial.clone(),
        );
        Watch::start(&s, &["pods", "-l", "app=web"], move |kind, pod| {
            let mut pods = pods.lock().unwrap();
            if kind == "DELETED" {
                pods.remove(name(pod));
            } else {
                pods.insert(
                    name(pod).to_string(),
                    (
                        !pod["metadata"]["deletionTimestamp"].is_null(),
                        is_ready(pod),
                    ),
                );
            }
            let mut primed = primed.lock().unwrap();
            *primed |= initial.iter().all(|n| pods.contains_key(n));
            if !*primed {
                return;
            }
            let live = pods
                .values()
                .filter(|(terminating, _)| !terminating)
                .count();
            let ready = pods
                .values()
                .filter(|(terminating, ready)| !terminating && *ready)
                .count();
            let mut b = bounds.lock().unwrap();
            b.most_pods = b.most_pods.max(live);
            b.fewest_ready = b.fewest_ready.min(ready);
            if live > 4 || ready < 3 {
                b.violations.push(format!(
                    "{kind} {}: {live} pods, {ready} ready: {pods:?}",
                    name(pod)
                ));
            }
        })
    };
    let rs_watch = {
        let bounds = bounds.clone();
        let mut sizes: BTreeMap<String, i64> = BTreeMap::new();
        Watch::start(&s, &["rs", "-l", "app=web"], move |kind, rs| {
            if kind == "DELETED" {
                sizes.remove(name(rs));
            } else {
                sizes.insert(
                    name(rs).to_string(),
                    rs["spec"]["replicas"].as_i64().unwrap_or(0),
                );
            }
            let total: i64 = sizes.values().sum();
            let mut b = bounds.lock().unwrap();
            b.most_rs_replicas = b.most_rs_replicas.max(total);
            if total > 4 {
                b.violations.push(format!(
                    "{kind} {}: replicasets sum to {total}: {sizes:?}",
                    name(rs)
                ));
            }
        })
    };
    wait_for("the pod watch to list the initial pods", DEADLINE, || {
        (*primed.lock().unwrap()).then_some(())
    });

    s.ok(&["set", "image", "deployment/web", "c=nginx:1.26"]);
    let out = rollout_status(&s, "web");
    assert!(out.contains("successfully rolled out"), "{out}");
    drop((pod_watch, rs_watch));
    let b = bounds.lock().unwrap();
    assert!(
        b.violations.is_empty(),
        "bounds violated: {:#?}",
        b.violations
    );
    assert_eq!(b.most_pods, 4, "the rollout used its surge");
    assert_eq!(b.fewest_ready, 3);
    assert_eq!(b.most_rs_replicas, 4);
    drop(b);

    let rss = replicasets(&s, "web");
    assert_eq!(rss.len(), 2);
    let new_rs = rss.iter().find(|rs| name(rs) != first_rs).unwrap();
    assert_eq!(new_rs["spec"]["replicas"], 3);
    assert_eq!(
        new_rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "2"
    );
    assert_eq!(s.get_json(&["rs", &first_rs])["spec"]["replicas"], 0);
    let pods = live_pods(&s, "web");
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.26")
    );
    let scaled = events(&s, "ScalingReplicaSet");
    assert!(
        scaled.contains(&format!("Scaled down replica set {first_rs} from 3 to 2")),
        "{scaled:?}"
    );
    let history = s.ok(&["rollout", "history", "deployment/web"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    // Undo: kubectl copies the first template back; the first ReplicaSet is reused.
    s.ok(&["rollout", "undo", "deployment/web"]);
    rollout_status(&s, "web");
    let rss = replicasets(&s, "web");
    assert_eq!(
        rss.len(),
        2,
        "no third ReplicaSet: {:?}",
        rss.iter().map(name).collect::<Vec<_>>()
    );
    let restored = s.get_json(&["rs", &first_rs]);
    assert_eq!(restored["spec"]["replicas"], 3);
    assert_eq!(
        restored["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "3"
    );
    assert_eq!(
        restored["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"],
        "1"
    );
    let pods = live_pods(&s, "web");
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.25")
    );
    assert!(
        pods.iter()
            .all(|p| p["metadata"]["ownerReferences"][0]["name"] == first_rs.as_str())
    );

    // Undo to a named revision: revision 2's ReplicaSet comes back as revision 4.
    let second_rs = name(new_rs).to_string();
    s.ok(&["rollout", "undo", "deployment/web", "--to-revision=2"]);
    rollout_status(&s, "web");
    let back = s.get_json(&["rs", &second_rs]);
    assert_eq!(back["spec"]["replicas"], 3);
    assert_eq!(
        back["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "4"
    );
    assert_eq!(s.get_json(&["rs", &first_rs])["spec"]["replicas"], 0);
    assert_eq!(replicasets(&s, "web").len(), 2);
    assert_eq!(
        s.get_json(&["deployment", "web"])["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "4"
    );
}

#[test]
fn kubectl_scale_goes_from_3_to_10_to_0() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 3, "nginx:1.25", rolling(1, 0)),
    );
    rollout_status(&s, "web");
    for replicas in [10usize, 0] {
        s.ok(&[
            "scale",
            "deployment",
            "web",
            &format!("--replicas={replicas}"),
        ]);
        rollout_status(&s, "web");
        wait_for(&format!("{replicas} pods"), DEADLINE, || {
            (live_pods(&s, "web").len() == replicas).then_some(())
        });
        let rs = &replicasets(&s, "web")[0];
        assert_eq!(rs["spec"]["replicas"], replicas);
        wait_for("replicaset status", DEADLINE, || {
            let st = &s.get_json(&["rs", name(rs)])["status"];
            (st["replicas"] == replicas
                && st["availableReplicas"].as_u64().unwrap_or(0) as usize == replicas)
                .then_some(())
        });
    }
    let rs = name(&replicasets(&s, "web")[0]).to_string();
    let scaled = events(&s, "ScalingReplicaSet");
    assert!(
        scaled.contains(&format!("Scaled up replica set {rs} from 3 to 10")),
        "{scaled:?}"
    );
    assert!(
        scaled.contains(&format!("Scaled down replica set {rs} from 10 to 0")),
        "{scaled:?}"
    );
    assert_eq!(events(&s, "SuccessfulDelete").len(), 10);
    let d = &s.get_json(&["deployment", "web"])["status"];
    assert_eq!(d["replicas"].as_i64().unwrap_or(0), 0);
}

#[test]
fn scale_down_gives_up_pods_in_order_of_their_deletion_cost() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 4, "nginx:1.25", rolling(1, 0)),
    );
    rollout_status(&s, "web");
    let pods: Vec<String> = live_pods(&s, "web")
        .iter()
        .map(|p| name(p).to_string())
        .collect();
    assert_eq!(pods.len(), 4);
    // Without costs the four would go newest first; the costs override that.
    let cost = "controller.kubernetes.io/pod-deletion-cost";
    s.ok(&["annotate", "pod", &pods[0], &format!("{cost}=-100")]);
    s.ok(&["annotate", "pod", &pods[1], &format!("{cost}=100")]);
    s.ok(&["annotate", "pod", &pods[2], &format!("{cost}=50")]);
    let left = |replicas: usize| {
        s.ok(&[
            "scale",
            "deployment",
            "web",
            &format!("--replicas={replicas}"),
        ]);
        wait_for(&format!("{replicas} pods"), DEADLINE, || {
            let mut live: Vec<String> = live_pods(&s, "web")
                .iter()
                .map(|p| name(p).to_string())
                .collect();
            live.sort();
            (live.len() == replicas).then_some(live)
        })
    };
    let mut expected = vec![pods[1].clone(), pods[2].clone(), pods[3].clone()];
    expected.sort();
    assert_eq!(left(3), expected, "the pod with cost -100 goes first");
    assert_eq!(left(1), vec![pods[1].clone()], "the costliest pod stays");
}

#[test]
fn a_replicaset_adopts_matching_orphans_and_releases_pods_that_stop_matching() {
    let s = Server::start();
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 2, "nginx:1.25", rolling(1, 0)),
    );
    let rs = wait_for("replicaset", DEADLINE, || {
        replicasets(&s, "web").into_iter().next()
    });
    let hash = rs["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("2 pods", DEADLINE, || {
        (live_pods(&s, "web").len() == 2).then_some(())
    });

    // A pod that stops matching is released and replaced.
    let first = live_pods(&s, "web")[0].clone();
    let released = name(&first).to_string();
    let released_created = first["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    s.ok(&[
        "label",
        "pod",
        &released,
        "pod-template-hash-",
        "app=other",
        "--overwrite",
    ]);
    wait_for("the relabelled pod released", DEADLINE, || {
        s.get_json(&["pod", &released])["metadata"]["ownerReferences"]
            .as_array()
            .is_none_or(|r| r.is_empty())
            .then_some(())
    });
    wait_for("a replacement", DEADLINE, || {
        (live_pods(&s, "web").len() == 2).then_some(())
    });

    // Giving it its labels back makes it an orphan that matches: it is adopted, and the
    // ReplicaSet, now one pod over, deletes the newest pod.
    s.ok(&[
        "label",
        "pod",
        &released,
        &format!("pod-template-hash={hash}"),
        "app=web",
        "--overwrite",
    ]);
    wait_for("adoption and scale-down", DEADLINE, || {
        let pods = live_pods(&s, "web");
        (pods.len() == 2
            && pods
                .iter()
                .all(|p| p["metadata"]["ownerReferences"][0]["name"] == name(&rs)))
        .then_some(())
    });
    // Newest first is decided on creationTimestamp, which has one-second precision: only
    // when the adopted pod is visibly older must it be the one that stays.
    let created = |p: &serde_json::Value| {
        p["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let pods = live_pods(&s, "web");
    let newest_other = pods
        .iter()
        .filter(|p| name(p) != released)
        .map(created)
        .max()
        .unwrap_or_default();
    if released_created < newest_other {
        assert!(
            pods.iter().any(|p| name(p) == released),
            "the older, adopted pod stays"
        );
    }
}

#[test]
fn of_two_controller_managers_one_is_active_and_the_other_takes_over_when_it_dies() {
    let s = Server::start_with(&["--disable-controllers"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 2, "nginx:1.25", rolling(1, 0)),
    );
    let mut cms = vec![
        Component::controller_manager(&s, 1),
        Component::controller_manager(&s, 2),
    ];
    let leader = wait_for("a leader", DEADLINE, || {
        cms.iter().position(Component::leads)
    });
    wait_for("pods from the leader", DEADLINE, || {
        (live_pods(&s, "web").len() == 2).then_some(())
    });
    let lease = s.get_json(&["lease", "-n", "kube-system", "kube-controller-manager"]);
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 3);
    // The standby stays standby while the leader renews (three renewals seen).
    let mut renewals = HashSet::new();
    wait_for("the leader to renew", DEADLINE, || {
        let spec =
            s.get_json(&["lease", "-n", "kube-system", "kube-controller-manager"])["spec"].clone();
        assert_eq!(spec["holderIdentity"], holder.as_str());
        assert!(!cms[1 - leader].leads(), "both instances active");
        renewals.insert(spec["renewTime"].to_string());
        (renewals.len() >= 3).then_some(())
    });

    // SIGKILL: no chance to release the lease; the standby must wait it out.
    let killed_at = Instant::now();
    cms.remove(leader);
    let standby = &cms[0];
    wait_for("the standby to take over", Duration::from_secs(10), || {
        standby.leads().then_some(())
    });
    let took = killed_at.elapsed();
    assert!(
        took <= Duration::from_millis(3000 + 2 * 250 + 1000),
        "takeover took {took:?}"
    );
    let lease = s.get_json(&["lease", "-n", "kube-system", "kube-controller-manager"]);
    assert_ne!(lease["spec"]["holderIdentity"], holder.as_str());
    assert_eq!(lease["spec"]["leaseTransitions"], 1);

    // The new leader acts.
    s.ok(&["scale", "deployment", "web", "--replicas=4"]);
    wait_for("pods from the new leader", DEADLINE, || {
        (live_pods(&s, "web").len() == 4).then_some(())
    });
}

#[test]
fn recreate_removes_every_old_pod_before_the_first_new_one() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 3, "nginx:1.25", json!({"type": "Recreate"})),
    );
    rollout_status(&s, "web");
    let old_hash = replicasets(&s, "web")[0]["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap()
        .to_string();

    // Live pods by template hash, checked on every pod event.
    let mixed = Arc::new(Mutex::new(Vec::new()));
    let live: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let watch = {
        let (mixed, live) = (mixed.clone(), live.clone());
        Watch::start(&s, &["pods", "-l", "app=web"], move |kind, pod| {
            let mut live = live.lock().unwrap();
            if kind == "DELETED" || !pod["metadata"]["deletionTimestamp"].is_null() {
                live.remove(name(pod));
            } else {
                let hash = pod["metadata"]["labels"]["pod-template-hash"]
                    .as_str()
                    .unwrap_or_default();
                live.insert(name(pod).to_string(), hash.to_string());
            }
            let hashes: HashSet<&String> = live.values().collect();
            if hashes.len() > 1 {
                mixed.lock().unwrap().push(format!("{live:?}"));
            }
        })
    };
    wait_for("the watch to list the pods", DEADLINE, || {
        (live.lock().unwrap().len() == 3).then_some(())
    });
    s.ok(&["set", "image", "deployment/web", "c=nginx:1.26"]);
    rollout_status(&s, "web");
    drop(watch);
    assert!(
        mixed.lock().unwrap().is_empty(),
        "old and new pods together: {:?}",
        mixed.lock().unwrap()
    );
    let pods = live_pods(&s, "web");
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| p["metadata"]["labels"]["pod-template-hash"] != old_hash.as_str())
    );
}

#[test]
fn a_paused_deployment_does_not_roll_out_until_resumed_and_restart_rolls_out_again() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment("web", 2, "nginx:1.25", rolling(1, 0)),
    );
    rollout_status(&s, "web");
    s.ok(&["rollout", "pause", "deployment/web"]);
    s.ok(&["set", "image", "deployment/web", "c=nginx:1.26"]);
    // The controller has seen the new generation and reports the pause...
    wait_for("the pause to be observed", DEADLINE, || {
        let d = s.get_json(&["deployment", "web"]);
        let paused = d["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["reason"] == "DeploymentPaused");
        (paused && d["status"]["observedGeneration"] == d["metadata"]["generation"]).then_some(())
    });
    // ...and has not started a new ReplicaSet.
    assert_eq!(replicasets(&s, "web").len(), 1);
    s.ok(&["rollout", "resume", "deployment/web"]);
    rollout_status(&s, "web");
    assert_eq!(replicasets(&s, "web").len(), 2);
    assert!(
        live_pods(&s, "web")
            .iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.26")
    );

    s.ok(&["rollout", "restart", "deployment/web"]);
    rollout_status(&s, "web");
    let rss = replicasets(&s, "web");
    assert_eq!(
        rss.len(),
        3,
        "restart makes a new template, hence a new ReplicaSet"
    );
    let newest = rss
        .iter()
        .max_by_key(|rs| {
            rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                .as_str()
                .unwrap_or("0")
                .parse::<i32>()
                .unwrap()
        })
        .unwrap();
    assert!(
        newest["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
            .is_string()
    );
    assert_eq!(newest["status"]["readyReplicas"], 2);
}

#[test]
fn a_rollout_without_progress_exceeds_its_deadline_and_rollout_status_fails() {
    let s = Server::start();
    let mut manifest: Value =
        serde_json::from_str(&deployment("web", 2, "nginx:1.25", rolling(1, 0))).unwrap();
    manifest["spec"]["progressDeadlineSeconds"] = json!(2);
    s.ok_stdin(&["apply", "-f", "-"], &manifest.to_string());
    // No pod ever becomes ready.
    let err = s.fails(&["rollout", "status", "deployment/web", "--timeout=30s"]);
    assert!(err.contains("exceeded its progress deadline"), "{err}");
    let d = s.get_json(&["deployment", "web"]);
    let progressing = d["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Progressing")
        .unwrap()
        .clone();
    assert_eq!(
        (
            progressing["status"].as_str(),
            progressing["reason"].as_str()
        ),
        (Some("False"), Some("ProgressDeadlineExceeded"))
    );
}

#[test]
fn ready_pods_become_available_only_after_min_ready_seconds() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    let mut manifest: Value =
        serde_json::from_str(&deployment("web", 2, "nginx:1.25", rolling(1, 0))).unwrap();
    manifest["spec"]["minReadySeconds"] = json!(3);
    s.ok_stdin(&["apply", "-f", "-"], &manifest.to_string());
    let rs = wait_for("replicaset", DEADLINE, || {
        replicasets(&s, "web").into_iter().next()
    });
    assert_eq!(
        rs["spec"]["minReadySeconds"], 3,
        "copied from the Deployment"
    );
    let status = wait_for("both pods ready", DEADLINE, || {
        let st = s.get_json(&["rs", name(&rs)])["status"].clone();
        (st["readyReplicas"] == 2).then_some(st)
    });
    let ready_at = Instant::now();
    assert_eq!(
        status["availableReplicas"].as_i64().unwrap_or(0),
        0,
        "ready, not yet available: {status}"
    );
    rollout_status(&s, "web");
    let waited = ready_at.elapsed();
    assert_eq!(
        s.get_json(&["rs", name(&rs)])["status"]["availableReplicas"],
        2
    );
    // Ready times have one-second precision (up to 1 s early) and the test saw the pods
    // ready up to a poll late: availability comes at least 1 s after that.
    assert!(
        waited >= Duration::from_secs(1),
        "available after {waited:?}"
    );
}

#[test]
fn scaling_in_the_middle_of_a_rollout_shares_the_change_in_proportion() {
    let s = Server::start();
    // Pods of the new image never become ready, so the rollout stops half way.
    let _ready = ReadyMarker::for_image(&s, Some("nginx:1.25"));
    s.ok_stdin(
        &["apply", "-f", "-"],
        &deployment(
            "web",
            10,
            "nginx:1.25",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
        ),
    );
    rollout_status(&s, "web");
    let old_rs = name(&replicasets(&s, "web")[0]).to_string();
    s.ok(&["set", "image", "deployment/web", "c=nginx:1.26"]);
    let sizes = |s: &Server| -> (i64, i64) {
        let rss = replicasets(s, "web");
        let size = |old: bool| {
            rss.iter()
                .filter(|rs| (name(rs) == old_rs) == old)
                .map(|rs| rs["spec"]["replicas"].as_i64().unwrap_or(0))
                .sum()
        };
        (size(true), size(false))
    };
    // 13 pods allowed (10 + 25 % rounded up), at most 2 of the 10 unavailable (25 %
    // rounded down): old 8, new 5, stuck.
    wait_for("the rollout to stop at old 8 / new 5", DEADLINE, || {
        (sizes(&s) == (8, 5)).then_some(())
    });
    s.ok(&["scale", "deployment", "web", "--replicas=20"]);
    // 25 allowed (20 + 25 % surge): 12 more, shared 8:5.
    wait_for("old 15 / new 10", DEADLINE, || {
        (sizes(&s) == (15, 10)).then_some(())
    });
    wait_for("25 pods", DEADLINE, || {
        (live_pods(&s, "web").len() == 25).then_some(())
    });
    // The old ReplicaSet created 17 pods (10, then 7 more): nine events of their own,
    // then one combined event counting the other eight, as client-go correlates them.
    let selector = format!("involvedObject.name={old_rs},reason=SuccessfulCreate");
    wait_for("the combined event", DEADLINE, || {
        let events = s.get_json(&["events", "--field-selector", &selector]);
        let items = events["items"].as_array()?;
        let counts: i64 = items.iter().filter_map(|e| e["count"].as_i64()).sum();
        let combined = items.iter().find(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("(combined from similar events): Created pod: web-"))
        })?;
        (items.len() == 10 && counts == 17 && combined["count"] == 8).then_some(())
    });
}

#[test]
fn old_replicasets_beyond_revision_history_limit_are_deleted() {
    let s = Server::start();
    let _ready = ReadyMarker::start(&s);
    let mut manifest: Value =
        serde_json::from_str(&deployment("web", 1, "nginx:1.0", rolling(1, 0))).unwrap();
    manifest["spec"]["revisionHistoryLimit"] = json!(1);
    s.ok_stdin(&["apply", "-f", "-"], &manifest.to_string());
    rollout_status(&s, "web");
    for image in ["nginx:1.1", "nginx:1.2", "nginx:1.3"] {
        s.ok(&["set", "image", "deployment/web", &format!("c={image}")]);
        rollout_status(&s, "web");
    }
    let revisions = || -> Vec<String> {
        let mut r: Vec<String> = replicasets(&s, "web")
            .iter()
            .map(|rs| {
                rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        r.sort();
        r
    };
    wait_for("only the current and one old revision", DEADLINE, || {
        (revisions() == ["3", "4"]).then_some(())
    });
}

fn node(name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).to_string()
}

fn pod_cidr(s: &Server, node: &str) -> Option<String> {
    let n = s.get_json(&["node", node]);
    let cidr = n["spec"]["podCIDR"].as_str()?.to_string();
    assert_eq!(n["spec"]["podCIDRs"], json!([cidr]));
    Some(cidr)
}

#[test]
fn every_node_gets_its_own_pod_range_until_the_cluster_cidr_runs_out() {
    let s = Server::start_with(&["--cluster-cidr=10.99.0.0/23"]);
    // A node registered with a range keeps it, and it is not handed out again.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0"},
            "spec": {"podCIDR": "10.99.0.0/24", "podCIDRs": ["10.99.0.0/24"]}})
        .to_string(),
    );
    s.ok_stdin(&["create", "-f", "-"], &node("n1"));
    let first = wait_for("n1's range", DEADLINE, || pod_cidr(&s, "n1"));
    assert_eq!(first, "10.99.1.0/24");
    // The /23 holds two /24s: the next node waits, with an event saying why.
    s.ok_stdin(&["create", "-f", "-"], &node("n2"));
    wait_for("CIDRNotAvailable", DEADLINE, || {
        let events = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "reason=CIDRNotAvailable",
            "-o",
            "name",
        ]);
        (!events.trim().is_empty()).then_some(())
    });
    assert_eq!(pod_cidr(&s, "n2"), None);
    // A deleted node's range goes to the waiting one.
    s.ok(&["delete", "node", "n1"]);
    let reused = wait_for("n2's range", DEADLINE, || pod_cidr(&s, "n2"));
    assert_eq!(reused, "10.99.1.0/24");
    assert_eq!(pod_cidr(&s, "n0").as_deref(), Some("10.99.0.0/24"));
}

#[test]
fn a_replication_controller_is_managed_like_a_replicaset() {
    let s = Server::start();
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=1"]);
    // kubectl sends core objects as protobuf.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "legacy"},
            "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "legacy"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
        .to_string(),
    );
    let rc = s.get_json(&["rc", "legacy"]);
    assert_eq!(
        rc["spec"]["selector"],
        json!({"app": "legacy"}),
        "defaulted from the template"
    );
    assert_eq!(rc["metadata"]["labels"], json!({"app": "legacy"}));
    wait_for("3 ready replicas", DEADLINE, || {
        (s.get_json(&["rc", "legacy"])["status"]["readyReplicas"] == 3).then_some(())
    });
    let pods = live_pods(&s, "legacy");
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        let owner = &pod["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "ReplicationController");
        assert_eq!(owner["uid"], rc["metadata"]["uid"]);
    }
    let table = s.ok(&["get", "rc", "legacy", "-o", "wide"]);
    assert!(
        table.contains("app=legacy") && table.contains("DESIRED"),
        "{table}"
    );

    // Through the scale subresource, and with an orphan that matches adopted.
    s.ok(&["scale", "rc", "legacy", "--replicas=5"]);
    wait_for("5 ready replicas", DEADLINE, || {
        let rc = s.get_json(&["rc", "legacy"]);
        (rc["status"]["readyReplicas"] == 5 && rc["status"]["observedGeneration"] == 2)
            .then_some(())
    });
    let scale: Value = serde_json::from_str(&s.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/replicationcontrollers/legacy/scale",
    ]))
    .unwrap();
    assert_eq!(scale["status"]["selector"], "app=legacy");
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "labels": {"app": "legacy"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        .to_string(),
    );
    // Adopted, the set is one over: the newest, least ready pod goes — usually the
    // stray itself.
    wait_for(
        "the stray pod adopted and one pod too many deleted",
        DEADLINE,
        || {
            let pods = live_pods(&s, "legacy");
            let stray_owned = pods.iter().any(|p| {
                name(p) == "stray"
                    && p["metadata"]["ownerReferences"][0]["kind"] == "ReplicationController"
            });
            let stray_deleted =
                events(&s, "SuccessfulDelete").contains(&"Deleted pod: stray".to_string());
            (pods.len() == 5 && (stray_owned || stray_deleted)).then_some(())
        },
    );

    // Deleting it takes its pods along.
    s.ok(&["delete", "rc", "legacy", "--wait=true"]);
    wait_for("no pods left", DEADLINE, || {
        live_pods(&s, "legacy").is_empty().then_some(())
    });
}
