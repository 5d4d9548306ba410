//! Events: core/v1 and events.k8s.io/v1 are two views of ONE stored object (upstream keeps
//! core/v1 in storage and converts), so `kubectl get events` shows events written through
//! either API. This module owns the field mapping between the two.

use serde_json::{Map, Value, json};

use super::Strategy;
use crate::table::{AGE, Column, age};

/// (events.k8s.io/v1 field, core/v1 field) pairs that differ only in name.
const RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

fn rename(obj: Value, to_core: bool, api_version: &str) -> Value {
    let Value::Object(map) = obj else { return obj };
    let mut out = Map::new();
    for (k, v) in map {
        let key = RENAMES
            .iter()
            .find(|(v1, core)| if to_core { v1 == &k } else { core == &k })
            .map(|(v1, core)| {
                if to_core {
                    core.to_string()
                } else {
                    v1.to_string()
                }
            })
            .unwrap_or(k);
        out.insert(key, v);
    }
    out.insert("apiVersion".into(), json!(api_version));
    Value::Object(out)
}

fn columns() -> &'static [Column] {
    static C: &[Column] = &[
        Column {
            name: "Last Seen",
            ty: "string",
            priority: 0,
            description: "Time when this Event was last observed.",
            cell: &last_seen,
        },
        Column {
            name: "Type",
            ty: "string",
            priority: 0,
            description: "Type of this event (Normal, Warning), new types could be added in the future.",
            cell: &|o| o["type"].clone(),
        },
        Column {
            name: "Reason",
            ty: "string",
            priority: 0,
            description: "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
            cell: &|o| o["reason"].clone(),
        },
        Column {
            name: "Object",
            ty: "string",
            priority: 0,
            description: "The object that this event is about.",
            cell: &|o| {
                let io = if o["involvedObject"].is_object() {
                    &o["involvedObject"]
                } else {
                    &o["regarding"]
                };
                json!(format!(
                    "{}/{}",
                    io["kind"].as_str().unwrap_or_default().to_lowercase(),
                    io["name"].as_str().unwrap_or_default()
                ))
            },
        },
        Column {
            name: "Message",
            ty: "string",
            priority: 0,
            description: "A human-readable description of the status of this operation.",
            cell: &|o| {
                if o["message"].is_string() {
                    o["message"].clone()
                } else {
                    o["note"].clone()
                }
            },
        },
    ];
    C
}

fn last_seen(o: &Value) -> Value {
    for field in [
        "lastTimestamp",
        "deprecatedLastTimestamp",
        "eventTime",
        "firstTimestamp",
    ] {
        if o[field].is_string() {
            return json!(age(&o[field]));
        }
    }
    if o["series"]["lastObservedTime"].is_string() {
        return json!(age(&o["series"]["lastObservedTime"]));
    }
    (AGE.cell)(o)
}

fn event_fields(o: &Value) -> Vec<(&'static str, String)> {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let io = &o["involvedObject"];
    vec![
        ("involvedObject.kind", s(&io["kind"])),
        ("involvedObject.namespace", s(&io["namespace"])),
        ("involvedObject.name", s(&io["name"])),
        ("involvedObject.uid", s(&io["uid"])),
        ("involvedObject.apiVersion", s(&io["apiVersion"])),
        ("involvedObject.resourceVersion", s(&io["resourceVersion"])),
        ("involvedObject.fieldPath", s(&io["fieldPath"])),
        ("reason", s(&o["reason"])),
        ("reportingComponent", s(&o["reportingComponent"])),
        ("source", s(&o["source"]["component"])),
        ("type", s(&o["type"])),
    ]
}

pub struct CoreEvent;
pub static CORE: CoreEvent = CoreEvent;
impl Strategy for CoreEvent {
    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        event_fields(obj)
    }
    fn columns(&self) -> &'static [Column] {
        columns()
    }
}

pub struct EventsV1;
pub static EVENTS_V1: EventsV1 = EventsV1;
impl Strategy for EventsV1 {
    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        event_fields(obj)
    }
    fn columns(&self) -> &'static [Column] {
        columns()
    }
    fn to_storage(&self, obj: Value) -> Value {
        rename(obj, true, "v1")
    }
    fn to_served(&self, obj: Value) -> Value {
        rename(obj, false, "events.k8s.io/v1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_between_versions() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hello", "reason": "Started",
            "reportingController": "krust/kubelet", "eventTime": "2026-01-01T00:00:00.000000Z"});
        let core = EVENTS_V1.to_storage(v1.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hello");
        assert_eq!(core["reportingComponent"], "krust/kubelet");
        assert_eq!(EVENTS_V1.to_served(core), v1);
    }
}
