//! Strategies of PersistentVolumes and PersistentVolumeClaims: upstream's defaults,
//! the checks of `ValidatePersistentVolume(Claim)` that users meet, what an update may
//! change, and `kubectl get pv,pvc`'s columns.

use krust_api::selector::LabelSelector;
use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::{immutable, set_default};

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];

/// The volume sources a PersistentVolume may name (exactly one of them).
const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// Access modes as kubectl prints them: `RWO,ROX,RWX,RWOP`, in that order.
pub fn access_modes_string(modes: &Value) -> String {
    let has = |m: &str| modes.as_array().is_some_and(|a| a.iter().any(|v| v == m));
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(mode, _)| has(mode))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// The phase column: `Terminating` once deleted, as kubectl shows it.
fn phase_cell(o: &Value) -> Value {
    if o["metadata"]["deletionTimestamp"].is_string() {
        json!("Terminating")
    } else {
        o["status"]["phase"].clone()
    }
}

fn or_unset(v: &Value) -> Value {
    json!(v.as_str().unwrap_or("<unset>"))
}

fn check_access_modes(modes: &Value, field: &str, errs: &mut Vec<Cause>) {
    let Some(list) = modes.as_array().filter(|l| !l.is_empty()) else {
        errs.push(Cause::required(field));
        return;
    };
    for m in list {
        if !m.as_str().is_some_and(|m| ACCESS_MODES.contains(&m)) {
            errs.push(Cause::not_supported(field, m, ACCESS_MODES));
        }
    }
    if list.len() > 1 && list.iter().any(|m| m == "ReadWriteOncePod") {
        errs.push(Cause::forbidden(
            field,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

fn check_one_of(
    obj: &Value,
    pointer: &str,
    field: &str,
    supported: &[&str],
    errs: &mut Vec<Cause>,
) {
    if let Some(v) = obj.pointer(pointer)
        && !v.as_str().is_some_and(|s| supported.contains(&s))
    {
        errs.push(Cause::not_supported(field, v, supported));
    }
}

/// A storage quantity that must be present and above zero.
fn check_storage(obj: &Value, pointer: &str, field: &str, errs: &mut Vec<Cause>) {
    let Some(q) = obj.pointer(pointer) else {
        errs.push(Cause::required(field));
        return;
    };
    let positive = q
        .as_str()
        .and_then(|s| krust_api::quantity::scaled_value(s, 0).ok())
        .is_some_and(|n| n > 0);
    if !positive {
        errs.push(Cause::invalid(field, q, "must be greater than zero"));
    }
}

/// The volume mode and storage class name, which volumes and claims share.
fn check_mode_and_class(obj: &Value, errs: &mut Vec<Cause>) {
    check_one_of(
        obj,
        "/spec/volumeMode",
        "spec.volumeMode",
        VOLUME_MODES,
        errs,
    );
    let spec = &obj["spec"];
    let field = "spec.storageClassName";
    if let Some(class) = spec["storageClassName"].as_str()
        && !class.is_empty()
        && !crate::validation::is_dns1123_subdomain(class)
    {
        errs.push(Cause::invalid(
            field,
            &spec["storageClassName"],
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    }
}

pub struct PersistentVolume;
pub static PERSISTENT_VOLUME: PersistentVolume = PersistentVolume;
impl Strategy for PersistentVolume {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/spec/persistentVolumeReclaimPolicy", json!("Retain"));
        set_default(obj, "/spec/volumeMode", json!("Filesystem"));
        if obj.pointer("/spec/hostPath").is_some() {
            set_default(obj, "/spec/hostPath/type", json!(""));
        }
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({
            "phase": "Pending",
            "lastPhaseTransitionTime": crate::rest::now(),
        });
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        check_access_modes(&spec["accessModes"], "spec.accessModes", errs);
        match spec["capacity"].as_object() {
            None => errs.push(Cause::required("spec.capacity")),
            Some(c) if c.len() != 1 || !c.contains_key("storage") => {
                errs.push(Cause::not_supported(
                    "spec.capacity",
                    &spec["capacity"],
                    &["storage"],
                ));
            }
            Some(_) => check_storage(
                obj,
                "/spec/capacity/storage",
                "spec.capacity[storage]",
                errs,
            ),
        }
        check_one_of(
            obj,
            "/spec/persistentVolumeReclaimPolicy",
            "spec.persistentVolumeReclaimPolicy",
            RECLAIM_POLICIES,
            errs,
        );
        check_mode_and_class(obj, errs);
        let sources: Vec<&str> = PV_SOURCES
            .iter()
            .copied()
            .filter(|s| spec.get(*s).is_some_and(|v| !v.is_null()))
            .collect();
        match sources.as_slice() {
            [] => errs.push(Cause::required_because(
                "spec",
                "must specify a volume type",
            )),
            [_] => {}
            [_, more @ ..] => {
                for s in more {
                    errs.push(Cause::forbidden(
                        format!("spec.{s}"),
                        "may not specify more than 1 volume type",
                    ));
                }
            }
        }
        for (source, required) in [
            ("hostPath", &["path"][..]),
            ("local", &["path"][..]),
            ("nfs", &["server", "path"][..]),
            ("csi", &["driver", "volumeHandle"][..]),
        ] {
            if spec.get(source).is_some_and(Value::is_object) {
                for f in required {
                    if spec[source][*f].as_str().is_none_or(str::is_empty) {
                        errs.push(Cause::required(format!("spec.{source}.{f}")));
                    }
                }
            }
        }
        if spec.get("local").is_some_and(Value::is_object) && spec.get("nodeAffinity").is_none() {
            errs.push(Cause::required_because(
                "spec.nodeAffinity",
                "Local volume requires node affinity",
            ));
        }
        if let Some(affinity) = spec.get("nodeAffinity")
            && affinity["required"]["nodeSelectorTerms"]
                .as_array()
                .is_none_or(Vec::is_empty)
        {
            errs.push(Cause::required(
                "spec.nodeAffinity.required.nodeSelectorTerms",
            ));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        let source = |pv: &Value| -> Value {
            PV_SOURCES
                .iter()
                .filter_map(|s| pv["spec"].get(*s).map(|v| (s.to_string(), v.clone())))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        if source(new) != source(old) {
            errs.push(Cause::forbidden(
                "spec.persistentvolumesource",
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        immutable(new, old, "/spec/volumeMode", "spec.volumeMode", errs);
        immutable(new, old, "/spec/nodeAffinity", "spec.nodeAffinity", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Capacity",
                ty: "string",
                priority: 0,
                description: "capacity is the description of the persistent volume's resources and capacity.",
                cell: &|o| json!(o["spec"]["capacity"]["storage"].as_str().unwrap_or("0")),
            },
            Column {
                name: "Access Modes",
                ty: "string",
                priority: 0,
                description: "accessModes contains all ways the volume can be mounted.",
                cell: &|o| json!(access_modes_string(&o["spec"]["accessModes"])),
            },
            Column {
                name: "Reclaim Policy",
                ty: "string",
                priority: 0,
                description: "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
                cell: &|o| o["spec"]["persistentVolumeReclaimPolicy"].clone(),
            },
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "phase indicates if a volume is available, bound to a claim, or released by a claim.",
                cell: &phase_cell,
            },
            Column {
                name: "Claim",
                ty: "string",
                priority: 0,
                description: "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
                cell: &|o| {
                    let claim = &o["spec"]["claimRef"];
                    json!(if claim.is_object() {
                        format!(
                            "{}/{}",
                            claim["namespace"].as_str().unwrap_or_default(),
                            claim["name"].as_str().unwrap_or_default()
                        )
                    } else {
                        String::new()
                    })
                },
            },
            Column {
                name: "StorageClass",
                ty: "string",
                priority: 0,
                description: "StorageClass of the pv",
                cell: &|o| json!(o["spec"]["storageClassName"].as_str().unwrap_or_default()),
            },
            Column {
                name: "VolumeAttributesClass",
                ty: "string",
                priority: 0,
                description: "VolumeAttributesClass of the pv",
                cell: &|o| or_unset(&o["spec"]["volumeAttributesClassName"]),
            },
            Column {
                name: "Reason",
                ty: "string",
                priority: 0,
                description: "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.",
                cell: &|o| json!(o["status"]["reason"].as_str().unwrap_or_default()),
            },
            AGE,
            Column {
                name: "VolumeMode",
                ty: "string",
                priority: 1,
                description: "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.",
                cell: &|o| or_unset(&o["spec"]["volumeMode"]),
            },
        ];
        C
    }
}

pub struct PersistentVolumeClaim;
pub static PERSISTENT_VOLUME_CLAIM: PersistentVolumeClaim = PersistentVolumeClaim;
impl Strategy for PersistentVolumeClaim {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/spec/volumeMode", json!("Filesystem"));
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending"});
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        if spec["accessModes"].as_array().is_none_or(Vec::is_empty) {
            errs.push(Cause::required_because(
                "spec.accessModes",
                "at least 1 access mode is required",
            ));
        } else {
            check_access_modes(&spec["accessModes"], "spec.accessModes", errs);
        }
        if spec.pointer("/resources/requests/storage").is_none() {
            errs.push(Cause::required("spec.resources[storage]"));
        } else {
            check_storage(
                obj,
                "/spec/resources/requests/storage",
                "spec.resources.requests[storage]",
                errs,
            );
        }
        check_mode_and_class(obj, errs);
        if let Some(selector) = spec.get("selector")
            && let Err(why) = LabelSelector::from_label_selector_json(selector)
        {
            errs.push(Cause::invalid("spec.selector", selector, why.to_string()));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        // What may change: the requested size (expansion) and the attributes class once
        // bound, the volume name while it is still empty (binding), and an absent class
        // to one (upstream's retroactive default class).
        let comparable = |pvc: &Value, other: &Value| -> Value {
            let mut spec = pvc["spec"].clone();
            if let Some(m) = spec.as_object_mut() {
                m.remove("volumeAttributesClassName");
                m.remove("storageClassName");
                if let Some(r) = m.get_mut("resources").and_then(Value::as_object_mut) {
                    r.remove("requests");
                }
                if other["spec"]["volumeName"]
                    .as_str()
                    .is_none_or(str::is_empty)
                    || pvc["spec"]["volumeName"].as_str().is_none_or(str::is_empty)
                {
                    m.remove("volumeName");
                }
            }
            spec
        };
        let bound = old["status"]["phase"] == "Bound";
        let resized = new["spec"]["resources"]["requests"] != old["spec"]["resources"]["requests"];
        let class_changed = new["spec"]["storageClassName"] != old["spec"]["storageClassName"]
            && !old["spec"]["storageClassName"].is_null();
        if comparable(new, old) != comparable(old, new) || (resized && !bound) || class_changed {
            errs.push(Cause::forbidden(
                "spec",
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
            ));
        }
        // A bound claim may grow, never below what its volume already holds.
        let bytes = |v: &Value| {
            v.as_str()
                .and_then(|q| krust_api::quantity::scaled_value(q, 0).ok())
        };
        if resized
            && bound
            && let (Some(asked), Some(held)) = (
                bytes(&new["spec"]["resources"]["requests"]["storage"]),
                bytes(&old["status"]["capacity"]["storage"]),
            )
            && asked < held
        {
            errs.push(Cause::forbidden(
                "spec.resources.requests.storage",
                "field can not be less than status.capacity",
            ));
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "phase represents the current phase of PersistentVolumeClaim.",
                cell: &phase_cell,
            },
            Column {
                name: "Volume",
                ty: "string",
                priority: 0,
                description: "volumeName is the binding reference to the PersistentVolume backing this claim.",
                cell: &|o| json!(o["spec"]["volumeName"].as_str().unwrap_or_default()),
            },
            Column {
                name: "Capacity",
                ty: "string",
                priority: 0,
                description: "capacity represents the actual resources of the underlying volume.",
                cell: &|o| {
                    json!(bound_field(o, |s| s["capacity"]["storage"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()))
                },
            },
            Column {
                name: "Access Modes",
                ty: "string",
                priority: 0,
                description: "accessModes contains the actual access modes the volume backing the PVC has.",
                cell: &|o| json!(bound_field(o, |s| access_modes_string(&s["accessModes"]))),
            },
            Column {
                name: "StorageClass",
                ty: "string",
                priority: 0,
                description: "StorageClass of the pvc",
                cell: &|o| json!(o["spec"]["storageClassName"].as_str().unwrap_or_default()),
            },
            Column {
                name: "VolumeAttributesClass",
                ty: "string",
                priority: 0,
                description: "VolumeAttributesClass of the pvc",
                cell: &|o| or_unset(&o["spec"]["volumeAttributesClassName"]),
            },
            AGE,
            Column {
                name: "VolumeMode",
                ty: "string",
                priority: 1,
                description: "volumeMode defines what type of volume is required by the claim.",
                cell: &|o| or_unset(&o["spec"]["volumeMode"]),
            },
        ];
        C
    }
}

/// A claim's status field, shown only once the claim names its volume.
fn bound_field(o: &Value, f: impl Fn(&Value) -> String) -> String {
    if o["spec"]["volumeName"]
        .as_str()
        .is_some_and(|v| !v.is_empty())
    {
        f(&o["status"])
    } else {
        String::new()
    }
}
