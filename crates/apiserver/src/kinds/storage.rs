//! Strategy of storage.k8s.io: StorageClass — defaults, checks and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use super::table::{AGE, Column};
use super::validation::{immutable, set_default};

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
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Provisioner",
                ty: "string",
                priority: 0,
                description: "provisioner indicates the type of the provisioner.",
                cell: |o| o["provisioner"].clone(),
            },
            Column {
                name: "ReclaimPolicy",
                ty: "string",
                priority: 0,
                description: "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class.",
                cell: |o| o["reclaimPolicy"].clone(),
            },
            Column {
                name: "VolumeBindingMode",
                ty: "string",
                priority: 0,
                description: "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.",
                cell: |o| o["volumeBindingMode"].clone(),
            },
            Column {
                name: "AllowVolumeExpansion",
                ty: "boolean",
                priority: 0,
                description: "allowVolumeExpansion shows whether the storage class allow volume expand.",
                cell: |o| json!(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
            },
            AGE,
        ];
        C
    }
}
