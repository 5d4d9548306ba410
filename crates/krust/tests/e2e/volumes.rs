//! PersistentVolumes and claims through the real kubectl.
//!
//! On a real node (containerd + runc): a claim binds to the volume that fits it, a pod
//! writes through the claim into the volume's directory and a second pod reads it back,
//! a claim in use is kept (Terminating) until its pod is gone, and its volume is then
//! Released; a bound volume is kept until its claim goes; a volume of the built-in CSI
//! driver is published into its pod and unpublished after it, and one is provisioned
//! for a claim of the built-in `local-path` class on the node its pod goes to (and
//! deleted with the claim); a StatefulSet's pods keep their provisioned data when
//! deleted; data survives restarts of its pod, of krust and of containerd; generic
//! ephemeral volumes are made and removed with their pod; validation, printer columns
//! and the default storage class. A third-party driver (in the test process) registers
//! through the kubelet's plugin registry, is attached through VolumeAttachments, and
//! has its volumes staged once per node and published per pod; inline `csi:` volumes,
//! fsGroup ownership, and the node's capacity keeping an oversized claim's pod pending.
//!
//! On simulated nodes: a StatefulSet's claim templates become one claim per pod, and
//! claims of a WaitForFirstConsumer class are bound with the node the scheduler picks —
//! each pod lands on the node of its local volume.

mod staged_driver;

use std::time::Duration;

use crate::common::{Component, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);

fn phase(s: &Server, kind: &str, name: &str) -> String {
    s.get_json(&[kind, name])["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn volume(name: &str, size: &str, class: &str, source: Value) -> String {
    let mut spec = json!({"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": class});
    for (k, v) in source.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

fn claim(name: &str, size: &str, class: Option<&str>) -> String {
    let mut spec = json!({"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}}});
    if let Some(class) = class {
        spec["storageClassName"] = json!(class);
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": spec})
    .to_string()
}

fn pod_with_claim(name: &str, claim: &str, command: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", command],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}})
    .to_string()
}

#[test]
fn claims_bind_to_volumes_pods_keep_data_and_claims_in_use_are_protected() {
    let s = Server::with_agent(&["--cluster-cidr=10.88.0.0/16"]);
    let host_dir = s.data_dir().join("pv-data");

    // Validation: upstream's causes, and nothing stored.
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "bad"},
            "spec": {"accessModes": ["ReadWriteOnce", "Sometimes"], "hostPath": {"path": "/x"},
                "nfs": {"server": "nfs", "path": "/"}}})
        .to_string(),
    );
    for expected in [
        "spec.capacity: Required value",
        "spec.accessModes: Unsupported value: \"Sometimes\"",
        "spec.nfs: Forbidden: may not specify more than 1 volume type",
    ] {
        assert!(err.contains(expected), "{expected} in {err}");
    }
    let err = s.fails_stdin(&["create", "-f", "-"], &claim("bad", "0", None));
    assert!(
        err.contains(
            "spec.resources.requests[storage]: Invalid value: \"0\": must be greater than zero"
        ),
        "{err}"
    );
    assert!(
        s.ok(&["get", "pv,pvc", "-A", "-o", "name"])
            .trim()
            .is_empty()
    );

    // The smallest volume that fits wins; both halves of the binding are written.
    let host =
        json!({"hostPath": {"path": host_dir.display().to_string(), "type": "DirectoryOrCreate"}});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &volume(
            "big",
            "10Gi",
            "manual",
            json!({"hostPath": {"path": "/nonexistent"}}),
        ),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &volume("small", "1Gi", "manual", host),
    );
    wait_for("volumes Available", DEADLINE, || {
        (phase(&s, "pv", "small") == "Available" && phase(&s, "pv", "big") == "Available")
            .then_some(())
    });
    s.ok_stdin(
        &["apply", "-f", "-"],
        &claim("data", "500Mi", Some("manual")),
    );
    wait_for("claim Bound", DEADLINE, || {
        (phase(&s, "pvc", "data") == "Bound" && phase(&s, "pv", "small") == "Bound").then_some(())
    });
    let pvc = s.get_json(&["pvc", "data"]);
    assert_eq!(pvc["spec"]["volumeName"], "small");
    assert_eq!(pvc["status"]["capacity"]["storage"], "1Gi");
    assert_eq!(
        pvc["metadata"]["finalizers"],
        json!(["kubernetes.io/pvc-protection"])
    );
    let pv = s.get_json(&["pv", "small"]);
    assert_eq!(pv["spec"]["claimRef"]["uid"], pvc["metadata"]["uid"]);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    let table = s.ok(&["get", "pv", "small"]);
    assert!(table.starts_with("NAME"), "{table}");
    for cell in [
        "1Gi",
        "RWO",
        "Retain",
        "Bound",
        "default/data",
        "manual",
        "<unset>",
    ] {
        assert!(table.contains(cell), "{cell} in {table}");
    }
    let table = s.ok(&["get", "pvc", "data"]);
    for cell in ["Bound", "small", "1Gi", "RWO", "manual"] {
        assert!(table.contains(cell), "{cell} in {table}");
    }

    // Data written through the claim lands in the volume and outlives the pod.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim("writer", "data", "echo kept > /data/file"),
    );
    wait_for("writer done", DEADLINE, || {
        (phase(&s, "pod", "writer") == "Succeeded").then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(host_dir.join("file")).unwrap(),
        "kept\n"
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim("reader", "data", "cat /data/file; sleep 3600"),
    );
    wait_for("reader logs the data", DEADLINE, || {
        (s.kubectl(&["logs", "reader"]).stdout == b"kept\n").then_some(())
    });

    // A claim in use stays until its pod is gone; then its volume is Released.
    s.ok(&["delete", "pvc", "data", "--wait=false"]);
    std::thread::sleep(Duration::from_secs(2));
    let table = s.ok(&["get", "pvc", "data"]);
    assert!(table.contains("Terminating"), "{table}");
    s.ok(&["delete", "pod", "reader", "writer", "--grace-period=1"]);
    wait_for("claim gone", DEADLINE, || {
        s.kubectl(&["get", "pvc", "data"])
            .status
            .code()
            .filter(|c| *c != 0)
    });
    wait_for("volume Released", DEADLINE, || {
        (phase(&s, "pv", "small") == "Released").then_some(())
    });
    assert!(host_dir.join("file").exists(), "Retain keeps the data");

    // A bound volume is kept (pv-protection) until its claim lets go.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &claim("large", "5Gi", Some("manual")),
    );
    wait_for("large claim Bound to big", DEADLINE, || {
        (phase(&s, "pv", "big") == "Bound").then_some(())
    });
    s.ok(&["delete", "pv", "big", "--wait=false"]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(s.ok(&["get", "pv", "big"]).contains("Terminating"));
    s.ok(&["delete", "pvc", "large"]);
    wait_for("volume gone once released", DEADLINE, || {
        s.kubectl(&["get", "pv", "big"])
            .status
            .code()
            .filter(|c| *c != 0)
    });

    // A CSI volume of the built-in driver: published into the pod by the driver (a bind
    // mount of its directory under the node's storage root), unpublished when the pod
    // goes.
    let csi = json!({"csi": {"driver": "local.csi.krust.io", "volumeHandle": "handmade"}});
    s.ok_stdin(&["apply", "-f", "-"], &volume("by-csi", "1Gi", "csi", csi));
    s.ok_stdin(
        &["apply", "-f", "-"],
        &claim("csi-data", "1Gi", Some("csi")),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim(
            "csi-writer",
            "csi-data",
            "echo through-csi > /data/file; sleep 3600",
        ),
    );
    let stored = s.data_dir().join("storage/handmade/file");
    wait_for("the file in the driver's directory", DEADLINE, || {
        std::fs::read_to_string(&stored)
            .ok()
            .filter(|c| c == "through-csi\n")
    });
    let published = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.contains("kubernetes.io~csi/by-csi/mount"))
    };
    assert!(published(), "the volume is bind-mounted for the pod");
    s.ok(&["delete", "pod", "csi-writer", "--grace-period=1"]);
    wait_for("unpublished", DEADLINE, || (!published()).then_some(()));
    assert!(stored.exists(), "the data stays with the volume");

    // The built-in driver is registered: the CSIDriver object and the node's CSINode.
    let driver = s.get_json(&["csidriver", "local.csi.krust.io"]);
    assert_eq!(driver["spec"]["attachRequired"], false);
    let node_name = s.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    let csi_node = wait_for("the node's CSINode", DEADLINE, || {
        let out = s.kubectl(&["get", "csinode", &node_name, "-o", "json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
    });
    assert_eq!(
        csi_node["spec"]["drivers"],
        json!([{"name": "local.csi.krust.io", "nodeID": node_name,
            "topologyKeys": ["kubernetes.io/hostname"]}])
    );
    assert!(s.ok(&["get", "csinode"]).contains(&node_name));

    // Dynamic provisioning: a claim of the built-in `local-path` class (created at start,
    // the default, WaitForFirstConsumer) gets a volume made on the node its pod was
    // scheduled to; deleting the claim deletes the volume and its data.
    let class = s.get_json(&["storageclass", "local-path"]);
    assert_eq!(class["provisioner"], "local.csi.krust.io");
    assert_eq!(class["volumeBindingMode"], "WaitForFirstConsumer");
    s.ok_stdin(
        &["apply", "-f", "-"],
        &claim("dynamic", "64Mi", Some("local-path")),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim("dyn-writer", "dynamic", "echo provisioned > /data/file"),
    );
    wait_for("dyn-writer done", DEADLINE, || {
        (phase(&s, "pod", "dyn-writer") == "Succeeded").then_some(())
    });
    let pvc = s.get_json(&["pvc", "dynamic"]);
    let uid = pvc["metadata"]["uid"].as_str().unwrap();
    let volume_name = format!("pvc-{uid}");
    assert_eq!(pvc["spec"]["volumeName"], volume_name.as_str(), "{pvc}");
    let pv = s.get_json(&["pv", &volume_name]);
    assert_eq!(pv["spec"]["csi"]["driver"], "local.csi.krust.io");
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    let node = s.get_json(&["pod", "dyn-writer"])["spec"]["nodeName"].clone();
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
            [0],
        node
    );
    let data = s.data_dir().join("storage").join(&volume_name).join("file");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "provisioned\n");
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=dynamic",
    ]);
    assert!(events.contains("ProvisioningSucceeded"), "{events}");
    s.ok(&["delete", "pod", "dyn-writer"]);
    s.ok(&["delete", "pvc", "dynamic"]);
    wait_for("the provisioned volume deleted", DEADLINE, || {
        s.kubectl(&["get", "pv", &volume_name])
            .status
            .code()
            .filter(|c| *c != 0)
    });
    assert!(!data.exists(), "its directory removed");

    // The default class goes to claims that name none.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "standard",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "example.com/none", "volumeBindingMode": "Immediate"})
        .to_string(),
    );
    // Printed as upstream's printer does.
    let classes = s.ok(&["get", "storageclass", "standard"]);
    assert!(
        classes.contains("standard (default)   example.com/none"),
        "{classes}"
    );
    s.ok_stdin(&["apply", "-f", "-"], &claim("defaulted", "1Gi", None));
    assert_eq!(
        s.get_json(&["pvc", "defaulted"])["spec"]["storageClassName"],
        "standard"
    );
    // Nothing provisions for example.com/none: the claim waits, and says why.
    wait_for("the provisioner named on the claim", DEADLINE, || {
        let pvc = s.get_json(&["pvc", "defaulted"]);
        (pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"]
            == "example.com/none")
            .then_some(())
    });
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=defaulted",
    ]);
    assert!(
        events.contains("ExternalProvisioning") && events.contains("example.com/none"),
        "{events}"
    );
    assert_eq!(phase(&s, "pvc", "defaulted"), "Pending");
}

#[test]
fn statefulset_claims_and_local_volumes_bound_with_the_scheduled_node() {
    let s = Server::start();
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=2"]);
    wait_for("two nodes", DEADLINE, || {
        let out = s.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == 2).then_some(())
    });
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer"})
        .to_string(),
    );
    // One local volume per node; each names its node in its affinity.
    for node in ["sim-node-0", "sim-node-1"] {
        let affinity = json!({"local": {"path": "/mnt/disk"}, "nodeAffinity": {"required": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                "operator": "In", "values": [node]}]}]}}});
        s.ok_stdin(
            &["apply", "-f", "-"],
            &volume(&format!("disk-{node}"), "5Gi", "local", affinity),
        );
    }
    // A claim made while no class is the default gets the default once there is one
    // (upstream's retroactive default StorageClass).
    s.ok_stdin(&["apply", "-f", "-"], &claim("early-bird", "1Gi", None));
    assert!(s.get_json(&["pvc", "early-bird"])["spec"]["storageClassName"].is_null());
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "late-default",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "example.com/none"})
        .to_string(),
    );
    wait_for("the default class set on the claim", DEADLINE, || {
        (s.get_json(&["pvc", "early-bird"])["spec"]["storageClassName"] == "late-default")
            .then_some(())
    });
    // A class, once set, is not changed.
    let err = s.fails(&[
        "patch",
        "pvc",
        "early-bird",
        "-p",
        r#"{"spec":{"storageClassName":"other"}}"#,
    ]);
    assert!(err.contains("spec is immutable after creation"), "{err}");
    s.ok(&["delete", "pvc", "early-bird"]);
    s.ok(&["delete", "storageclass", "late-default"]);

    // A pod whose claim does not exist is unschedulable, and says so.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim("orphan", "nope", "true"),
    );
    let message = wait_for("FailedScheduling", DEADLINE, || {
        s.event_messages("orphan", "FailedScheduling")
            .into_iter()
            .next()
    });
    assert!(
        message.contains("persistentvolumeclaim \"nope\" not found"),
        "{message}"
    );
    s.ok(&["delete", "pod", "orphan"]);

    // A claim of the class binds only once a pod uses it.
    s.ok_stdin(&["apply", "-f", "-"], &claim("early", "1Gi", Some("local")));
    wait_for("WaitForFirstConsumer event", DEADLINE, || {
        let events = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=early",
        ]);
        events.contains("WaitForFirstConsumer").then_some(())
    });
    assert_eq!(phase(&s, "pvc", "early"), "Pending");
    s.ok(&["delete", "pvc", "early"]);

    let set = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "db"}},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}},
                "containers": [{"name": "c", "image": "busybox",
                    "volumeMounts": [{"name": "www", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "www", "labels": {"tier": "disk"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                    "resources": {"requests": {"storage": "1Gi"}}}}]}});
    s.ok_stdin(&["apply", "-f", "-"], &set.to_string());
    s.ok(&["rollout", "status", "statefulset/db", "--timeout=60s"]);
    for ordinal in 0..2 {
        let claim_name = format!("www-db-{ordinal}");
        let pvc = wait_for("claim bound", DEADLINE, || {
            let pvc = s.get_json(&["pvc", &claim_name]);
            (pvc["status"]["phase"] == "Bound").then_some(pvc)
        });
        assert_eq!(
            pvc["metadata"]["labels"],
            json!({"app": "db", "tier": "disk"})
        );
        assert_eq!(pvc["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
        let pod = s.get_json(&["pod", &format!("db-{ordinal}")]);
        let node = pod["spec"]["nodeName"].as_str().unwrap();
        // The pod runs where its volume is.
        assert_eq!(pvc["spec"]["volumeName"], format!("disk-{node}"), "{pvc}");
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            claim_name.as_str()
        );
    }
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=db",
    ]);
    assert!(
        events.contains("create Claim www-db-0 Pod db-0 in StatefulSet db success"),
        "{events}"
    );
    // A third replica finds no free volume on any node.
    s.ok(&["scale", "statefulset/db", "--replicas=3"]);
    wait_for("db-2 unschedulable", DEADLINE, || {
        let events = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=db-2",
        ]);
        events.contains("FailedScheduling").then_some(())
    });
    assert_eq!(phase(&s, "pvc", "www-db-2"), "Pending");

    // whenDeleted: Delete — the claims go with the set.
    s.ok(&[
        "delete",
        "statefulset",
        "db",
        "--wait=true",
        "--timeout=60s",
    ]);
    wait_for("claims deleted with the set", DEADLINE, || {
        s.ok(&["get", "pvc", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
}

#[test]
fn provisioned_data_survives_restarts_of_its_pod_and_of_krust() {
    let mut s = Server::with_agent(&["--cluster-cidr=10.89.0.0/16"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &claim("kept", "64Mi", Some("local-path")),
    );
    let app = pod_with_claim("app", "kept", "echo started >> /data/log; exec sleep 3600");
    let lines = |s: &Server| {
        let out = s.kubectl(&["exec", "app", "--", "cat", "/data/log"]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    s.ok_stdin(&["apply", "-f", "-"], &app);
    wait_for("the first run logged", DEADLINE, || {
        (lines(&s) == 1).then_some(())
    });

    // A new pod on the same claim sees what the last one wrote.
    s.ok(&["delete", "pod", "app", "--grace-period=1"]);
    s.ok_stdin(&["apply", "-f", "-"], &app);
    wait_for("the second run logged", DEADLINE, || {
        (lines(&s) == 2).then_some(())
    });

    // krust killed and started again: the pod runs on, its volume still mounted and
    // writable, the data where the driver keeps it.
    s.restart();
    wait_for("the pod reachable again", DEADLINE, || {
        (lines(&s) == 2).then_some(())
    });
    s.ok(&[
        "exec",
        "app",
        "--",
        "sh",
        "-c",
        "echo after-restart >> /data/log",
    ]);
    let volume = s.get_json(&["pvc", "kept"])["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    // The node's containerd killed: the agent starts it again, the pod runs on under
    // its shim, and its volume is still there.
    let config = s.data_dir().join("agent/containerd/config.toml");
    let containerd = containerd_pid(&config).expect("the node's containerd");
    // SAFETY: kill(2) of a process this test found by its command line.
    unsafe {
        libc::kill(containerd, libc::SIGKILL);
    }
    wait_for("containerd started again", DEADLINE, || {
        containerd_pid(&config).filter(|pid| *pid != containerd)
    });
    wait_for("exec works again", DEADLINE, || {
        s.kubectl(&[
            "exec",
            "app",
            "--",
            "sh",
            "-c",
            "echo after-containerd >> /data/log",
        ])
        .status
        .success()
        .then_some(())
    });
    let log =
        std::fs::read_to_string(s.data_dir().join("storage").join(volume).join("log")).unwrap();
    assert_eq!(log, "started\nstarted\nafter-restart\nafter-containerd\n");
    let pod = s.get_json(&["pod", "app"]);
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "{pod}"
    );
}

/// The pid of the containerd running with `config`.
fn containerd_pid(config: &std::path::Path) -> Option<i32> {
    let wanted = config.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_containerd = args.first()?.ends_with(b"containerd");
        let with_config = args.contains(&wanted.as_bytes());
        (is_containerd && with_config).then_some(pid)
    })
}

#[test]
fn a_statefulsets_pods_keep_their_own_provisioned_data_across_deletion() {
    let s = Server::with_agent(&["--cluster-cidr=10.93.0.0/16"]);
    // Each pod writes its name into its volume once; a pod finding a file keeps it.
    let set = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 3, "serviceName": "db", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {
                "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c",
                    "[ -f /data/id ] || hostname > /data/id; echo started >> /data/log; exec sleep 3600"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "16Mi"}}}}]}});
    s.ok_stdin(&["apply", "-f", "-"], &set.to_string());
    s.ok(&["rollout", "status", "statefulset/db", "--timeout=90s"]);
    let read = |pod: &str, file: &str| {
        let out = s.kubectl(&["exec", pod, "--", "cat", &format!("/data/{file}")]);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let mut volumes = Vec::new();
    for ordinal in 0..3 {
        let claim = s.get_json(&["pvc", &format!("data-db-{ordinal}")]);
        assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
        assert_eq!(claim["spec"]["storageClassName"], "local-path");
        volumes.push(claim["spec"]["volumeName"].as_str().unwrap().to_string());
        // Running is not yet the shell's first line: its write may still be coming.
        let (pod, id) = (format!("db-{ordinal}"), format!("db-{ordinal}\n"));
        wait_for("the pod wrote its name", DEADLINE, || {
            (read(&pod, "id") == id).then_some(())
        });
    }
    volumes.sort();
    volumes.dedup();
    assert_eq!(volumes.len(), 3, "one volume per pod");

    // db-1 deleted: its replacement gets the same claim, and the data in it.
    let uid = s.get_json(&["pod", "db-1"])["metadata"]["uid"].clone();
    s.ok(&["delete", "pod", "db-1", "--wait=false"]);
    wait_for("db-1 replaced and running", DEADLINE, || {
        let pod = s.get_json(&["pod", "db-1"]);
        (pod["metadata"]["uid"] != uid && pod["status"]["phase"] == "Running").then_some(())
    });
    wait_for("db-1 read its old volume", DEADLINE, || {
        (read("db-1", "log") == "started\nstarted\n").then_some(())
    });
    assert_eq!(read("db-1", "id"), "db-1\n");
    assert_eq!(read("db-0", "log"), "started\n");
}

#[test]
fn generic_ephemeral_volumes_live_and_die_with_their_pod() {
    let s = Server::with_agent(&["--cluster-cidr=10.90.0.0/16"]);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "scratch"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "echo scratch > /data/file"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "ephemeral": {"volumeClaimTemplate": {
                "metadata": {"labels": {"kind": "scratch"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                    "resources": {"requests": {"storage": "16Mi"}}}}}}]}});
    s.ok_stdin(&["apply", "-f", "-"], &pod.to_string());
    wait_for("scratch done", DEADLINE, || {
        (phase(&s, "pod", "scratch") == "Succeeded").then_some(())
    });
    // The claim `<pod>-<volume>`, from the template, controlled by the pod.
    let pvc = s.get_json(&["pvc", "scratch-data"]);
    assert_eq!(pvc["metadata"]["labels"]["kind"], "scratch");
    let owner = &pvc["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Pod");
    assert_eq!(owner["controller"], true);
    assert_eq!(
        owner["uid"],
        s.get_json(&["pod", "scratch"])["metadata"]["uid"]
    );
    let volume = pvc["spec"]["volumeName"].as_str().unwrap().to_string();
    let data = s.data_dir().join("storage").join(&volume).join("file");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "scratch\n");

    // The pod goes: its claim, the volume and the data go with it.
    s.ok(&["delete", "pod", "scratch"]);
    wait_for("the volume gone with the pod", DEADLINE, || {
        let gone = |kind: &str, name: &str| !s.kubectl(&["get", kind, name]).status.success();
        (gone("pvc", "scratch-data") && gone("pv", &volume)).then_some(())
    });
    assert!(!data.exists());
}

#[test]
fn third_party_drivers_register_stage_once_per_node_and_inline_volumes_get_the_fs_group() {
    let s = Server::with_agent(&["--cluster-cidr=10.91.0.0/16"]);
    let node = wait_for("the node", DEADLINE, || {
        let out = s.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"]);
        let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!name.is_empty()).then_some(name)
    });
    let driver_dir = tempfile::tempdir().unwrap();
    let driver = staged_driver::StagedDriver {
        root: driver_dir.path().join("disks"),
        calls: Default::default(),
    };
    let calls = driver.calls.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let registry = s.data_dir().join("agent/plugins_registry");
    let serving = runtime.spawn({
        let socket = driver_dir.path().join("csi.sock");
        async move { driver.serve(socket, &registry).await }
    });

    // Registered: listed in the node's CSINode beside the built-in driver, with its
    // node ID and volume limit, and in the Node's annotation.
    let drivers = wait_for("both drivers in the CSINode", DEADLINE, || {
        let out = s.kubectl(&["get", "csinode", &node, "-o", "json"]);
        let csi_node: Value = serde_json::from_slice(&out.stdout).ok()?;
        let drivers = csi_node["spec"]["drivers"].as_array()?.clone();
        (drivers.len() == 2).then_some(drivers)
    });
    let entry = drivers
        .iter()
        .find(|d| d["name"] == staged_driver::NAME)
        .expect("the third-party driver");
    assert_eq!(entry["nodeID"], "staged-node-1");
    assert_eq!(entry["allocatable"]["count"], staged_driver::MAX_VOLUMES);
    assert!(
        drivers.iter().any(|d| d["name"] == "local.csi.krust.io"),
        "{drivers:?}"
    );
    let annotation =
        s.get_json(&["node", &node])["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]
            .as_str()
            .unwrap()
            .to_string();
    let ids: Value = serde_json::from_str(&annotation).unwrap();
    assert_eq!(ids[staged_driver::NAME], "staged-node-1");
    assert_eq!(ids["local.csi.krust.io"], node.as_str());

    // Two pods on one volume: staged once, published twice; unstaged after the last.
    let csi =
        |handle: &str| json!({"csi": {"driver": staged_driver::NAME, "volumeHandle": handle}});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &volume("staged", "1Gi", "ext", csi("vol-1")),
    );
    s.ok_stdin(&["apply", "-f", "-"], &claim("staged", "1Gi", Some("ext")));
    for pod in ["first", "second"] {
        s.ok_stdin(
            &["apply", "-f", "-"],
            &pod_with_claim(
                pod,
                "staged",
                &format!("echo {pod} >> /data/log; sleep 3600"),
            ),
        );
    }
    // The driver has no CSIDriver object, so it needs attaching: the controller asks
    // for an attachment, and the test, as the driver's external attacher, attaches it.
    let attach = |volume: &str, status: Value| {
        let attachment = wait_for("the VolumeAttachment", DEADLINE, || {
            let list = s.get_json(&["volumeattachments"]);
            list["items"]
                .as_array()?
                .iter()
                .find(|a| a["spec"]["source"]["persistentVolumeName"] == volume)
                .cloned()
        });
        assert_eq!(attachment["spec"]["attacher"], staged_driver::NAME);
        assert_eq!(attachment["spec"]["nodeName"], node.as_str());
        let name = attachment["metadata"]["name"].as_str().unwrap().to_string();
        assert!(name.starts_with("csi-") && name.len() == 68, "{name}");
        s.ok(&[
            "patch",
            "volumeattachment",
            &name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &json!({"status": status}).to_string(),
        ]);
        name
    };
    let attached =
        json!({"attached": true, "attachmentMetadata": {"device": staged_driver::DEVICE}});
    let attachment = attach("staged", attached.clone());
    let log = driver_dir.path().join("disks/vol-1/log");
    wait_for(
        "both pods wrote through the staged volume",
        DEADLINE,
        || {
            let log = std::fs::read_to_string(&log).ok()?;
            (log.lines().count() == 2).then_some(())
        },
    );
    let seen = |call: &str| calls.lock().unwrap().iter().filter(|c| *c == call).count();
    assert_eq!(seen("stage vol-1"), 1, "{:?}", calls.lock().unwrap());
    assert_eq!(seen("publish vol-1"), 2, "{:?}", calls.lock().unwrap());
    s.ok(&["delete", "pod", "first", "--grace-period=1"]);
    assert_eq!(seen("unpublish vol-1"), 1, "{:?}", calls.lock().unwrap());
    assert_eq!(seen("unstage vol-1"), 0, "the second pod still uses it");
    s.ok(&["delete", "pod", "second", "--grace-period=1"]);
    wait_for("unstaged after the last pod", DEADLINE, || {
        (seen("unstage vol-1") == 1).then_some(())
    });
    let staging = s
        .data_dir()
        .join("agent/plugins/kubernetes.io/csi")
        .join(staged_driver::NAME);
    let left: Vec<_> = std::fs::read_dir(&staging).unwrap().flatten().collect();
    assert!(left.is_empty(), "staging directories left: {left:?}");
    // No pod on the node uses it any more: detached.
    wait_for("the attachment deleted", DEADLINE, || {
        (!s.kubectl(&["get", "volumeattachment", &attachment])
            .status
            .success())
        .then_some(())
    });

    // A volume its attacher cannot attach, then one that cannot be staged: the pod
    // stays ContainerCreating, and its events say why.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &volume("broken", "1Gi", "ext", csi("broken")),
    );
    s.ok_stdin(&["apply", "-f", "-"], &claim("broken", "1Gi", Some("ext")));
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim("stuck", "broken", "true"),
    );
    attach(
        "broken",
        json!({"attached": false, "attachError": {"message": "no such disk"}}),
    );
    let message = wait_for("FailedAttachVolume", DEADLINE, || {
        s.event_messages("stuck", "FailedAttachVolume")
            .into_iter()
            .next()
    });
    assert_eq!(
        message,
        "AttachVolume.Attach failed for volume \"broken\" : no such disk"
    );
    attach("broken", attached);
    let message = wait_for("FailedMount", DEADLINE, || {
        s.event_messages("stuck", "FailedMount")
            .into_iter()
            .find(|m| m.contains("MountDevice"))
    });
    assert_eq!(
        message,
        "MountVolume.MountDevice failed for volume \"data\" : rpc error: code = Internal desc = disk on fire"
    );
    s.ok(&["delete", "pod", "stuck", "--grace-period=0", "--force"]);

    // The driver goes away: deregistered from the CSINode and the annotation.
    serving.abort();
    runtime.shutdown_background();
    std::fs::remove_file(driver_dir.path().join("csi.sock")).unwrap();
    std::fs::remove_file(
        s.data_dir()
            .join("agent/plugins_registry")
            .join(format!("{}-reg.sock", staged_driver::NAME)),
    )
    .unwrap();
    wait_for("deregistered", DEADLINE, || {
        let csi_node = s.get_json(&["csinode", &node]);
        let listed = csi_node["spec"]["drivers"]
            .as_array()?
            .iter()
            .any(|d| d["name"] == staged_driver::NAME);
        (!listed).then_some(())
    });
    let annotation =
        s.get_json(&["node", &node])["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]
            .clone();
    assert!(
        !annotation.as_str().unwrap().contains(staged_driver::NAME),
        "{annotation}"
    );

    // An inline volume of the built-in driver, owned by the pod's fsGroup; its
    // directory goes with the pod.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "inline"},
        "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
            "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
            "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "echo hi > /data/file && stat -c '%g %A' /data /data/file; sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "csi": {"driver": "local.csi.krust.io"}}]}});
    s.ok_stdin(&["apply", "-f", "-"], &pod.to_string());
    let logs = wait_for("the inline volume written as the fsGroup", DEADLINE, || {
        let out = s.kubectl(&["logs", "inline"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (text.lines().count() == 2).then_some(text)
    });
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(lines[0], "2000 drwxrwsr-x", "{logs}");
    assert!(lines[1].starts_with("2000 -rw-r"), "{logs}");
    let ephemeral = s.data_dir().join("storage/.ephemeral");
    assert_eq!(std::fs::read_dir(&ephemeral).unwrap().count(), 1);
    s.ok(&["delete", "pod", "inline", "--grace-period=1"]);
    wait_for("the inline volume removed", DEADLINE, || {
        (std::fs::read_dir(&ephemeral).unwrap().count() == 0).then_some(())
    });

    // The built-in driver reports the node's free storage; a claim larger than that
    // keeps its pod pending, and says why.
    let capacity = wait_for("the node's CSIStorageCapacity", DEADLINE, || {
        let list = s.get_json(&["csistoragecapacities", "-n", "kube-system"]);
        list["items"]
            .as_array()?
            .iter()
            .find(|c| c["storageClassName"] == "local-path")
            .cloned()
    });
    assert_eq!(
        capacity["nodeTopology"]["matchLabels"]["kubernetes.io/hostname"],
        node.as_str()
    );
    assert_eq!(capacity["metadata"]["ownerReferences"][0]["kind"], "Node");
    let free: u64 = capacity["capacity"].as_str().unwrap().parse().unwrap();
    assert!(free > 0, "{capacity}");
    s.ok_stdin(
        &["apply", "-f", "-"],
        &claim("huge", "100Pi", Some("local-path")),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_with_claim("greedy", "huge", "true"),
    );
    let message = wait_for("FailedScheduling", DEADLINE, || {
        s.event_messages("greedy", "FailedScheduling")
            .into_iter()
            .next()
    });
    assert!(
        message.contains("node(s) did not have enough free storage"),
        "{message}"
    );
}
