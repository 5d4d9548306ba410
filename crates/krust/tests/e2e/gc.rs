//! The garbage collector end to end, with the real kubectl against a real `krust
//! server`: `kubectl delete` of a Deployment with each cascade policy, dependents with
//! several owners, and dependents whose owner never existed.

use std::time::Duration;

use crate::common::{Component, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn deployment(name: &str, replicas: i32) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }
        }
    })
    .to_string()
}

fn items(s: &Server, args: &[&str]) -> Vec<Value> {
    s.get_json(args)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Applies a Deployment and waits for its ReplicaSet and all its pods.
fn deployed(s: &Server, name: &str, replicas: usize) {
    s.ok_stdin(&["apply", "-f", "-"], &deployment(name, replicas as i32));
    let selector = format!("app={name}");
    wait_for("the pods", DEADLINE, || {
        (items(s, &["pods", "-l", &selector]).len() == replicas).then_some(())
    });
    assert_eq!(items(s, &["rs", "-l", &selector]).len(), 1);
}

fn exists(s: &Server, path: &str) -> bool {
    let (code, _) = s.curl("GET", path, None, None);
    assert!(code == 200 || code == 404, "GET {path}: {code}");
    code == 200
}

#[test]
fn deleting_a_deployment_in_the_background_removes_its_replicasets_and_pods() {
    let s = Server::start();
    deployed(&s, "web", 3);
    s.ok(&["delete", "deployment", "web"]);
    wait_for("replicasets and pods gone", DEADLINE, || {
        (items(&s, &["rs,pods", "-l", "app=web"]).is_empty()).then_some(())
    });
}

#[test]
fn cascade_orphan_leaves_the_replicaset_and_pods_without_their_owner() {
    let s = Server::start();
    deployed(&s, "web", 2);
    s.ok(&["delete", "deployment", "web", "--cascade=orphan"]);
    assert!(!exists(
        &s,
        "/apis/apps/v1/namespaces/default/deployments/web"
    ));
    let rss = items(&s, &["rs", "-l", "app=web"]);
    assert_eq!(rss.len(), 1);
    assert!(
        rss[0]["metadata"]["ownerReferences"].is_null(),
        "{:?}",
        rss[0]["metadata"]
    );
    assert!(rss[0]["metadata"]["finalizers"].is_null());
    // The pods keep their ReplicaSet, which keeps them.
    std::thread::sleep(Duration::from_secs(1));
    let pods = items(&s, &["pods", "-l", "app=web"]);
    assert_eq!(pods.len(), 2);
    for p in &pods {
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
    }
}

#[test]
fn cascade_foreground_deletes_the_owner_last() {
    let s = Server::start();
    deployed(&s, "web", 5);
    let rs = items(&s, &["rs", "-l", "app=web"])[0]["metadata"]["name"]
        .as_str()
        .expect("rs name")
        .to_string();
    s.ok(&[
        "delete",
        "deployment",
        "web",
        "--cascade=foreground",
        "--wait=false",
    ]);
    let deploy = "/apis/apps/v1/namespaces/default/deployments/web";
    let replicaset = format!("/apis/apps/v1/namespaces/default/replicasets/{rs}");
    let (_, d) = s.curl("GET", deploy, None, None);
    assert!(d["metadata"]["deletionTimestamp"].is_string(), "{d}");
    // Each level goes only after the level below it: read the owner first, then its
    // dependents; an owner seen gone while a dependent is still there is a violation.
    wait_for("the deployment gone", DEADLINE, || {
        let deploy_exists = exists(&s, deploy);
        let rs_exists = exists(&s, &replicaset);
        let pods = items(&s, &["pods", "-l", "app=web"]).len();
        assert!(
            deploy_exists || !rs_exists,
            "deployment gone before its replicaset"
        );
        assert!(
            rs_exists || pods == 0,
            "replicaset gone before its {pods} pods"
        );
        (!deploy_exists).then_some(())
    });
    assert!(items(&s, &["rs,pods", "-l", "app=web"]).is_empty());
}

fn configmap(s: &Server, name: &str, owners: &[(&str, &str)]) -> String {
    let refs: Vec<Value> = owners
        .iter()
        .map(|(name, uid)| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid}))
        .collect();
    let mut meta = json!({"name": name});
    if !refs.is_empty() {
        meta["ownerReferences"] = json!(refs);
    }
    s.ok_stdin(
        &["create", "-f", "-", "-o", "jsonpath={.metadata.uid}"],
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}).to_string(),
    )
}

#[test]
fn a_dependent_outlives_one_of_two_owners_and_goes_with_the_last() {
    let s = Server::start();
    let a = configmap(&s, "owner-a", &[]);
    let b = configmap(&s, "owner-b", &[]);
    configmap(&s, "dependent", &[("owner-a", &a), ("owner-b", &b)]);
    s.ok(&["delete", "configmap", "owner-a"]);
    wait_for("the dangling reference removed", DEADLINE, || {
        let dep = s.get_json(&["configmap", "dependent"]);
        let refs = dep["metadata"]["ownerReferences"].as_array().cloned()?;
        (refs.len() == 1).then(|| assert_eq!(refs[0]["uid"], b.as_str()))
    });
    s.ok(&["delete", "configmap", "owner-b"]);
    wait_for("the dependent deleted", DEADLINE, || {
        (!exists(&s, "/api/v1/namespaces/default/configmaps/dependent")).then_some(())
    });
}

#[test]
fn dependents_of_owners_that_vanished_while_no_collector_ran_are_deleted_when_one_starts() {
    let s = Server::start_with(&["--disable-controllers"]);
    let owner = configmap(&s, "owner", &[]);
    configmap(&s, "kept", &[("owner", &owner)]);
    configmap(
        &s,
        "orphan",
        &[("missing", "00000000-0000-0000-0000-000000000000")],
    );
    // A reference by name to an object with another UID is dangling too.
    configmap(
        &s,
        "stale",
        &[("owner", "11111111-1111-1111-1111-111111111111")],
    );
    let _cm = Component::controller_manager(&s, 1);
    wait_for("dependents of missing owners deleted", DEADLINE, || {
        (!exists(&s, "/api/v1/namespaces/default/configmaps/orphan")
            && !exists(&s, "/api/v1/namespaces/default/configmaps/stale"))
        .then_some(())
    });
    assert!(exists(&s, "/api/v1/namespaces/default/configmaps/kept"));
}
