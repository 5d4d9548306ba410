//! Who may do what: RBAC decides every request from Roles and bindings (upstream's
//! bootstrap policy included), kubelets get only what their pods need, reviews answer
//! `kubectl auth can-i` and `whoami`, impersonation is checked, nobody grants what they
//! do not hold, and anonymous clients see only the public endpoints. Identities are
//! exercised through the real kubectl (`--as`, which also tests impersonation) and raw
//! requests with a ServiceAccount's token.

use std::time::Duration;

use crate::common::{Server, wait_for};
use serde_json::{Value, json};

const ROBOT: &str = "system:serviceaccount:team:robot";

/// kubectl as `user` (impersonated by the admin): (succeeded, stdout, stderr).
fn as_user(s: &Server, user: &str, groups: &[&str], args: &[&str]) -> (bool, String, String) {
    let mut all: Vec<String> = vec![format!("--as={user}")];
    all.extend(groups.iter().map(|g| format!("--as-group={g}")));
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = s.kubectl(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// kubectl as the robot ServiceAccount: (succeeded, stdout, stderr).
fn as_robot(s: &Server, args: &[&str]) -> (bool, String, String) {
    as_user(s, ROBOT, &[], args)
}

/// `kubectl auth can-i` as the robot: "yes" or "no".
fn robot_can(s: &Server, args: &[&str]) -> String {
    let mut all = vec!["auth", "can-i"];
    all.extend(args);
    as_robot(s, &all).1
}

fn with_token(s: &Server, token: &str, path: &str, headers: &[&str]) -> (u16, Value) {
    let mut all = vec![format!("Authorization: Bearer {}", token.trim())];
    all.extend(headers.iter().map(|h| h.to_string()));
    s.curl_as(false, "GET", path, &all, None)
}

#[test]
fn rbac_decides_for_service_accounts_as_upstream() {
    let s = Server::start();
    // `view` is aggregated by the controller manager from the aggregate-to-view roles.
    wait_for("view to be aggregated", Duration::from_secs(30), || {
        let view = s.get_json(&["clusterrole", "view"]);
        view["rules"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
            .then_some(())
    });
    s.ok(&["create", "namespace", "team"]);
    s.ok(&["create", "serviceaccount", "robot", "-n", "team"]);

    // The admin may do anything; kubectl auth whoami reads a SelfSubjectReview.
    assert_eq!(s.ok(&["auth", "can-i", "*", "*"]).trim(), "yes");
    let me: Value = serde_json::from_str(&s.ok(&["auth", "whoami", "-o", "json"])).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "admin");
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );

    // Bound to nothing: nothing but discovery and reviews, with upstream's messages.
    assert_eq!(robot_can(&s, &["list", "pods", "-n", "team"]), "no");
    let (ok, _, err) = as_robot(&s, &["get", "pods", "-n", "team"]);
    assert!(!ok);
    assert!(
        err.contains(r#"pods is forbidden: User "system:serviceaccount:team:robot" cannot list resource "pods" in API group "" in the namespace "team""#),
        "{err}"
    );
    let (ok, _, err) = as_robot(&s, &["delete", "node", "n1"]);
    assert!(!ok);
    assert!(
        err.contains(r#"nodes "n1" is forbidden: User "system:serviceaccount:team:robot" cannot delete resource "nodes" in API group "" at the cluster scope"#),
        "{err}"
    );
    assert_eq!(
        as_robot(
            &s,
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}"
            ]
        )
        .1,
        ROBOT
    );

    // Bound to `view` in one namespace: reads there, except Secrets; writes nowhere.
    s.ok(&[
        "create",
        "rolebinding",
        "robot-view",
        "--clusterrole=view",
        "--serviceaccount=team:robot",
        "-n",
        "team",
    ]);
    assert_eq!(robot_can(&s, &["list", "pods", "-n", "team"]), "yes");
    assert_eq!(
        robot_can(&s, &["watch", "deployments.apps", "-n", "team"]),
        "yes"
    );
    assert_eq!(robot_can(&s, &["list", "pods", "-n", "default"]), "no");
    assert_eq!(robot_can(&s, &["get", "secrets", "-n", "team"]), "no");
    assert_eq!(robot_can(&s, &["create", "pods", "-n", "team"]), "no");
    assert_eq!(
        robot_can(&s, &["get", "pods", "--subresource=log", "-n", "team"]),
        "yes"
    );
    let list = as_robot(&s, &["auth", "can-i", "--list", "-n", "team"]).1;
    let pods = list
        .lines()
        .find(|l| l.starts_with("pods "))
        .unwrap_or_else(|| panic!("no pods row in {list}"));
    assert!(pods.contains("[get list watch]"), "{pods}");

    // A label makes a new role part of `view` (ClusterRole aggregation): here one that
    // reads Secrets, which `view` alone does not.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "secret-viewer", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})
        .to_string(),
    );
    wait_for("secrets in view", Duration::from_secs(30), || {
        (robot_can(&s, &["get", "secrets", "-n", "team"]) == "yes").then_some(())
    });
    s.ok(&["delete", "clusterrole", "secret-viewer"]);
    wait_for("secrets out of view", Duration::from_secs(30), || {
        (robot_can(&s, &["get", "secrets", "-n", "team"]) == "no").then_some(())
    });

    // Escalation: allowed to write roles and bindings, the robot still cannot grant
    // more than it holds.
    s.ok(&[
        "create",
        "role",
        "rbac-writer",
        "--verb=create,update",
        "--resource=roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io",
        "-n",
        "team",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "robot-rbac-writer",
        "--role=rbac-writer",
        "--serviceaccount=team:robot",
        "-n",
        "team",
    ]);
    let (ok, _, err) = as_robot(
        &s,
        &[
            "create",
            "role",
            "deleter",
            "--verb=delete",
            "--resource=pods",
            "-n",
            "team",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains(r#"roles.rbac.authorization.k8s.io "deleter" is forbidden: user "system:serviceaccount:team:robot" (groups=["system:serviceaccounts" "system:serviceaccounts:team" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:"#)
            && err.contains(r#"{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}"#),
        "{err}"
    );
    let (ok, _, err) = as_robot(
        &s,
        &[
            "create",
            "role",
            "reader",
            "--verb=get",
            "--resource=pods",
            "-n",
            "team",
        ],
    );
    assert!(ok, "a role within what the robot holds: {err}");
    let (ok, _, err) = as_robot(
        &s,
        &[
            "create",
            "rolebinding",
            "robot-edit",
            "--clusterrole=edit",
            "--serviceaccount=team:robot",
            "-n",
            "team",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("is attempting to grant RBAC permissions not currently held"),
        "{err}"
    );

    // The robot's own token: the same decisions, and no impersonating others.
    let token = s.ok(&["create", "token", "robot", "-n", "team"]);
    assert_eq!(
        with_token(&s, &token, "/api/v1/namespaces/team/pods", &[]).0,
        200
    );
    let (code, err) = with_token(&s, &token, "/api/v1/namespaces/team/secrets/x", &[]);
    assert_eq!(code, 403, "{err}");
    let (code, err) = with_token(
        &s,
        &token,
        "/api/v1/namespaces/team/pods",
        &["Impersonate-User: bob"],
    );
    assert_eq!(code, 403, "{err}");
    assert_eq!(
        err["message"],
        r#"users "bob" is forbidden: User "system:serviceaccount:team:robot" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );

    // A SubjectAccessReview asks on behalf of another user and says which binding allowed.
    let review = s.ok_stdin(
        &["create", "-o", "json", "-f", "-"],
        &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": ROBOT, "groups": ["system:serviceaccounts"],
                "resourceAttributes": {"namespace": "team", "verb": "list", "resource": "pods"}}})
        .to_string(),
    );
    let review: Value = serde_json::from_str(&review).unwrap();
    assert_eq!(review["status"]["allowed"], true, "{review}");
    assert_eq!(
        review["status"]["reason"],
        r#"RBAC: allowed by RoleBinding "robot-view/team" of ClusterRole "view" to ServiceAccount "robot/team""#
    );
}

#[test]
fn anonymous_clients_see_only_public_endpoints() {
    let s = Server::apiserver(&[]);
    for path in ["/healthz", "/livez", "/readyz", "/version"] {
        assert_eq!(s.curl_as(false, "GET", path, &[], None).0, 200, "{path}");
    }
    let (code, status) = s.curl_as(false, "GET", "/api", &[], None);
    assert_eq!(code, 403);
    assert_eq!(
        status,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "forbidden: User \"system:anonymous\" cannot get path \"/api\"",
            "reason": "Forbidden", "details": {}, "code": 403})
    );
    let (code, status) = s.curl_as(false, "GET", "/api/v1/namespaces/default/pods", &[], None);
    assert_eq!(code, 403);
    assert_eq!(
        status["message"],
        r#"pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "default""#
    );
}

#[test]
fn kubelets_read_only_what_their_pods_use() {
    let s = Server::apiserver(&[]);
    let node =
        |n: &str| -> [String; 2] { [format!("system:node:{n}"), "system:nodes".to_string()] };
    for (pod, node_name, secret) in [("mine", "n1", "s1"), ("theirs", "n2", "s2")] {
        s.ok(&["create", "secret", "generic", secret, "--from-literal=k=v"]);
        s.ok_stdin(
            &["create", "-f", "-"],
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
                "spec": {"nodeName": node_name, "automountServiceAccountToken": false,
                    "volumes": [{"name": "s", "secret": {"secretName": secret}}],
                    "containers": [{"name": "c", "image": "busybox"}]}})
            .to_string(),
        );
    }
    let [user, group] = node("n1");
    let (ok, _, err) = as_user(&s, &user, &[&group], &["get", "secret", "s1"]);
    assert!(ok, "{err}");
    let (ok, _, err) = as_user(&s, &user, &[&group], &["get", "secret", "s2"]);
    assert!(!ok);
    assert!(
        err.contains(r#"secrets "s2" is forbidden: User "system:node:n1" cannot get resource "secrets" in API group "" in the namespace "default": no relationship found between node 'n1' and this object"#),
        "{err}"
    );
    let (ok, _, err) = as_user(&s, &user, &[&group], &["get", "secrets"]);
    assert!(!ok, "listing secrets: {err}");
    // Its own pods' status, not another node's (a kubelet patches status without
    // reading it first, as kubectl would); its own Node only.
    let patch_status = |pod: &str| {
        s.curl_as(
            true,
            "PATCH",
            &format!("/api/v1/namespaces/default/pods/{pod}/status"),
            &[
                format!("Impersonate-User: {user}"),
                format!("Impersonate-Group: {group}"),
                "Content-Type: application/merge-patch+json".into(),
            ],
            Some(br#"{"status":{"phase":"Running"}}"#),
        )
    };
    let (code, pod) = patch_status("mine");
    assert_eq!(code, 200, "{pod}");
    assert_eq!(pod["status"]["phase"], "Running");
    let (code, err) = patch_status("theirs");
    assert_eq!(code, 403, "{err}");
    assert_eq!(
        err["message"],
        r#"pods "theirs" is forbidden: node "n1" can only update status of pods with spec.nodeName set to itself"#
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"}}"#,
    );
    let (ok, _, err) = as_user(&s, &user, &[&group], &["label", "node", "n2", "a=b"]);
    assert!(!ok);
    assert!(
        err.contains(r#"node "n1" is not allowed to modify node "n2""#),
        "{err}"
    );
}

#[test]
fn bootstrap_policy_is_reconciled_at_start_unless_opted_out() {
    let mut s = Server::apiserver(&[]);
    let rules = |s: &Server, name: &str| s.get_json(&["clusterrole", name])["rules"].clone();
    let public = rules(&s, "system:public-info-viewer");
    assert!(public.as_array().is_some_and(|r| !r.is_empty()));
    for role in ["system:public-info-viewer", "system:basic-user"] {
        s.ok(&[
            "patch",
            "clusterrole",
            role,
            "--type=merge",
            "-p",
            r#"{"rules":[]}"#,
        ]);
    }
    s.ok(&[
        "annotate",
        "--overwrite",
        "clusterrole",
        "system:basic-user",
        "rbac.authorization.kubernetes.io/autoupdate=false",
    ]);
    s.restart();
    assert_eq!(
        rules(&s, "system:public-info-viewer"),
        public,
        "rules put back"
    );
    assert!(
        rules(&s, "system:basic-user")
            .as_array()
            .is_none_or(Vec::is_empty),
        "autoupdate=false is left alone"
    );
}
