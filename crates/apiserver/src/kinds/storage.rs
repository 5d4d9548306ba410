//! Strategy of storage.k8s.io: StorageClass — defaults, checks and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::{immutable, set_default};

pub struct StorageClass;
pub static STORAGE_CLASS: StorageClass = StorageClass;
impl Strategy for StorageClass {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/reclaimPolicy", json!("Delete"));
        set_default(obj, "/volumeBindingMode", json!("Immediate"));
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        if obj["provisioner"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required("provisioner"));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        for (p, f) in [
            ("/provisioner", "provisioner"),
            ("/parameters", "parameters"),
            ("/reclaimPolicy", "reclaimPolicy"),
            ("/volumeBindingMode", "volumeBindingMode"),
        ] {
            immutable(new, old, p, f, errs);
        }
    }
    /// Upstream's printer marks the default class.
    fn printed_name(&self, obj: &Value) -> Value {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let annotations = &obj["metadata"]["annotations"];
        let default = [
            "storageclass.kubernetes.io/is-default-class",
            "storageclass.beta.kubernetes.io/is-default-class",
        ]
        .iter()
        .any(|a| annotations[*a] == "true");
        if default {
            json!(format!("{name} (default)"))
        } else {
            json!(name)
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Provisioner",
                ty: "string",
                priority: 0,
                description: "provisioner indicates the type of the provisioner.",
                cell: &|o| o["provisioner"].clone(),
            },
            Column {
                name: "ReclaimPolicy",
                ty: "string",
                priority: 0,
                description: "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class.",
                cell: &|o| o["reclaimPolicy"].clone(),
            },
            Column {
                name: "VolumeBindingMode",
                ty: "string",
                priority: 0,
                description: "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.",
                cell: &|o| o["volumeBindingMode"].clone(),
            },
            Column {
                name: "AllowVolumeExpansion",
                ty: "boolean",
                priority: 0,
                description: "allowVolumeExpansion shows whether the storage class allow volume expand.",
                cell: &|o| json!(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
            },
            AGE,
        ];
        C
    }
}

fn flag(o: &Value, field: &str, default: bool) -> Value {
    json!(o["spec"][field].as_bool().unwrap_or(default))
}

pub struct CsiDriver;
pub static CSI_DRIVER: CsiDriver = CsiDriver;
impl Strategy for CsiDriver {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/spec/attachRequired", json!(true));
        set_default(obj, "/spec/podInfoOnMount", json!(false));
        set_default(obj, "/spec/storageCapacity", json!(false));
        set_default(obj, "/spec/requiresRepublish", json!(false));
        set_default(obj, "/spec/seLinuxMount", json!(false));
        set_default(obj, "/spec/fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
        set_default(obj, "/spec/volumeLifecycleModes", json!(["Persistent"]));
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        const MODES: &[&str] = &["Ephemeral", "Persistent"];
        for (i, mode) in obj["spec"]["volumeLifecycleModes"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !mode.as_str().is_some_and(|m| MODES.contains(&m)) {
                errs.push(Cause::not_supported(
                    format!("spec.volumeLifecycleModes[{i}]"),
                    mode,
                    MODES,
                ));
            }
        }
        const POLICIES: &[&str] = &["File", "None", "ReadWriteOnceWithFSType"];
        let policy = &obj["spec"]["fsGroupPolicy"];
        if !policy.as_str().is_some_and(|p| POLICIES.contains(&p)) {
            errs.push(Cause::not_supported("spec.fsGroupPolicy", policy, POLICIES));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        for (p, f) in [
            ("/spec/attachRequired", "spec.attachRequired"),
            ("/spec/volumeLifecycleModes", "spec.volumeLifecycleModes"),
        ] {
            immutable(new, old, p, f, errs);
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "AttachRequired",
                ty: "boolean",
                priority: 0,
                description: "attachRequired indicates this CSI volume driver requires an attach operation.",
                cell: &|o| flag(o, "attachRequired", true),
            },
            Column {
                name: "PodInfoOnMount",
                ty: "boolean",
                priority: 0,
                description: "podInfoOnMount indicates this CSI volume driver requires additional pod information during mount operations.",
                cell: &|o| flag(o, "podInfoOnMount", false),
            },
            Column {
                name: "StorageCapacity",
                ty: "boolean",
                priority: 0,
                description: "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity that the driver deployment will report.",
                cell: &|o| flag(o, "storageCapacity", false),
            },
            Column {
                name: "TokenRequests",
                ty: "string",
                priority: 0,
                description: "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication.",
                cell: &|o| {
                    let audiences: Vec<&str> = o["spec"]["tokenRequests"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|t| t["audience"].as_str().unwrap_or_default())
                        .collect();
                    json!(if audiences.is_empty() {
                        "<unset>".to_string()
                    } else {
                        audiences.join(",")
                    })
                },
            },
            Column {
                name: "RequiresRepublish",
                ty: "boolean",
                priority: 0,
                description: "requiresRepublish indicates the CSI driver wants `NodePublishVolume` being periodically called to reflect any possible change in the mounted volume.",
                cell: &|o| flag(o, "requiresRepublish", false),
            },
            Column {
                name: "Modes",
                ty: "string",
                priority: 0,
                description: "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports.",
                cell: &|o| {
                    let modes: Vec<&str> = o["spec"]["volumeLifecycleModes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    json!(if modes.is_empty() {
                        "<none>".to_string()
                    } else {
                        modes.join(",")
                    })
                },
            },
            AGE,
        ];
        C
    }
}

pub struct CsiNode;
pub static CSI_NODE: CsiNode = CsiNode;
impl Strategy for CsiNode {
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        for (i, driver) in obj["spec"]["drivers"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for f in ["name", "nodeID"] {
                if driver[f].as_str().is_none_or(str::is_empty) {
                    errs.push(Cause::required(format!("spec.drivers[{i}].{f}")));
                }
            }
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Drivers",
                ty: "integer",
                priority: 0,
                description: "Drivers indicates the number of CSI drivers registered on the node",
                cell: &|o| json!(o["spec"]["drivers"].as_array().map_or(0, Vec::len)),
            },
            AGE,
        ];
        C
    }
}

pub struct CsiStorageCapacity;
pub static CSI_STORAGE_CAPACITY: CsiStorageCapacity = CsiStorageCapacity;
impl Strategy for CsiStorageCapacity {
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        if obj["storageClassName"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required("storageClassName"));
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "StorageClassName",
                ty: "string",
                priority: 0,
                description: "storageClassName represents the name of the StorageClass that the reported capacity applies to.",
                cell: &|o| o["storageClassName"].clone(),
            },
            Column {
                name: "Capacity",
                ty: "string",
                priority: 0,
                description: "capacity is the value reported by the CSI driver in its GetCapacityResponse for a GetCapacityRequest with topology and parameters that match the previous fields.",
                cell: &|o| json!(o["capacity"].as_str().unwrap_or("<unset>")),
            },
        ];
        C
    }
}

pub struct VolumeAttachment;
pub static VOLUME_ATTACHMENT: VolumeAttachment = VolumeAttachment;
impl Strategy for VolumeAttachment {
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        for f in ["attacher", "nodeName"] {
            if spec[f].as_str().is_none_or(str::is_empty) {
                errs.push(Cause::required(format!("spec.{f}")));
            }
        }
        let pv = spec["source"].get("persistentVolumeName").is_some();
        let inline = spec["source"].get("inlineVolumeSpec").is_some();
        if pv == inline {
            errs.push(Cause::invalid(
                "spec.source",
                &spec["source"],
                "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
            ));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/spec", "spec", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Attacher",
                ty: "string",
                priority: 0,
                description: "attacher indicates the name of the volume driver that MUST handle this request.",
                cell: &|o| o["spec"]["attacher"].clone(),
            },
            Column {
                name: "PV",
                ty: "string",
                priority: 0,
                description: "persistentVolumeName represents the name of the persistent volume to attach.",
                cell: &|o| {
                    json!(
                        o["spec"]["source"]["persistentVolumeName"]
                            .as_str()
                            .unwrap_or_default()
                    )
                },
            },
            Column {
                name: "Node",
                ty: "string",
                priority: 0,
                description: "nodeName represents the node that the volume should be attached to.",
                cell: &|o| o["spec"]["nodeName"].clone(),
            },
            Column {
                name: "Attached",
                ty: "boolean",
                priority: 0,
                description: "attached indicates the volume is successfully attached.",
                cell: &|o| json!(o["status"]["attached"].as_bool().unwrap_or(false)),
            },
            AGE,
        ];
        C
    }
}
