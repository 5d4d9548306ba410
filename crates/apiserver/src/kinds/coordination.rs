//! Strategy of coordination.k8s.io: Lease — leader election and node heartbeats; its columns.

use serde_json::json;

use super::Strategy;
use crate::table::{AGE, Column};

pub struct Lease;
pub static LEASE: Lease = Lease;
impl Strategy for Lease {
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Holder",
                ty: "string",
                priority: 0,
                description: "The holder of the lease",
                cell: &|o| {
                    o["spec"]["holderIdentity"]
                        .as_str()
                        .map_or(json!(""), |s| json!(s))
                },
            },
            AGE,
        ];
        C
    }
}
