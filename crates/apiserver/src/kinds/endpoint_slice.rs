//! Strategy of discovery.k8s.io: EndpointSlice — defaults, checks and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::immutable;

pub struct EndpointSlice;
pub static ENDPOINT_SLICE: EndpointSlice = EndpointSlice;
impl Strategy for EndpointSlice {
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let at = &obj["addressType"];
        match at.as_str() {
            Some("IPv4" | "IPv6" | "FQDN") => {}
            None => errs.push(Cause::required("addressType")),
            Some(_) => errs.push(Cause::not_supported(
                "addressType",
                at,
                &["FQDN", "IPv4", "IPv6"],
            )),
        }
        if obj["endpoints"].as_array().is_some_and(|e| e.len() > 1000) {
            errs.push(Cause {
                reason: "FieldValueTooMany",
                message: "Too many: must have at most 1000 items".into(),
                field: "endpoints".into(),
            });
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/addressType", "addressType", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "AddressType",
                ty: "string",
                priority: 0,
                description: "The IP protocol for this slice",
                cell: &|o| o["addressType"].clone(),
            },
            Column {
                name: "Ports",
                ty: "string",
                priority: 0,
                description: "Enumerated ports on this slice",
                cell: &slice_ports,
            },
            Column {
                name: "Endpoints",
                ty: "string",
                priority: 0,
                description: "Endpoints on this slice",
                cell: &slice_endpoints,
            },
            AGE,
        ];
        C
    }
}

fn slice_ports(o: &Value) -> Value {
    let ports: Vec<String> = o["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["port"].as_i64())
        .map(|p| p.to_string())
        .collect();
    if ports.is_empty() {
        json!("<unset>")
    } else {
        json!(ports.join(","))
    }
}

fn slice_endpoints(o: &Value) -> Value {
    let addrs: Vec<&str> = o["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    match addrs.len() {
        0 => json!("<unset>"),
        n if n <= 3 => json!(addrs.join(",")),
        n => json!(format!("{} + {} more...", addrs[..3].join(","), n - 3)),
    }
}
