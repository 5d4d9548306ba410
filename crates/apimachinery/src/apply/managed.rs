//! `metadata.managedFields`: decoding its entries into one field set per manager,
//! encoding them back in upstream's order, and the cap on the number of updaters.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};

use super::set::Set;
use super::value::{go_quote, write_go_string};

/// At most this many `Update` entries are kept; the oldest are merged into
/// [`ANCIENT_CHANGES`] entries, one per API version.
pub(super) const MAX_UPDATERS: usize = 10;
const ANCIENT_CHANGES: &str = "ancient-changes";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Who owns a field set: a manager name and how it wrote. One manager name can own
/// several sets, through different operations, subresources, or (for updates) API
/// versions.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ManagerId {
    pub manager: String,
    pub operation: Operation,
    /// Part of an updater's identity only: an applier is one manager whatever version
    /// it applies with.
    pub api_version: Option<String>,
    pub subresource: String,
}

impl ManagerId {
    /// Upstream's manager identifier (a `ManagedFieldsEntry` as JSON, with only these
    /// fields), which orders managers where the time does not.
    pub(super) fn identifier(&self) -> String {
        let mut out = String::from("{\"manager\":");
        write_go_string(&mut out, &self.manager);
        out.push_str(",\"operation\":");
        write_go_string(&mut out, self.operation.as_str());
        if let Some(api_version) = &self.api_version {
            out.push_str(",\"apiVersion\":");
            write_go_string(&mut out, api_version);
        }
        if !self.subresource.is_empty() {
            out.push_str(",\"subresource\":");
            write_go_string(&mut out, &self.subresource);
        }
        out.push('}');
        out
    }

    /// The manager as conflict messages name it: `"kubectl"`, `"kube-controller-manager"
    /// using apps/v1`, `"x" with subresource "status"`.
    pub(super) fn describe(&self) -> String {
        let mut out = go_quote(&self.manager);
        if !self.subresource.is_empty() {
            out.push_str(" with subresource ");
            out.push_str(&go_quote(&self.subresource));
        }
        if let Some(api_version) = &self.api_version {
            out.push_str(" using ");
            out.push_str(api_version);
        }
        out
    }
}

/// The fields one manager owns.
#[derive(Clone, Debug)]
pub(super) struct Owned {
    pub set: Set,
    /// The version the fields are named in.
    pub api_version: String,
    /// When the manager last changed the object (RFC 3339); upstream leaves it out
    /// when an apply changed nothing.
    pub time: Option<String>,
}

pub(super) type Managers = BTreeMap<ManagerId, Owned>;

/// Reads `metadata.managedFields` (absent or null: no managers). A manager named twice
/// keeps its last entry.
pub(super) fn decode(entries: Option<&Value>) -> Result<Managers, String> {
    let entries = match entries {
        None | Some(Value::Null) => return Ok(Managers::new()),
        Some(Value::Array(entries)) => entries,
        Some(other) => return Err(format!("expected a list, got {other}")),
    };
    let mut managers = Managers::new();
    for (i, entry) in entries.iter().enumerate() {
        let text = |name: &str| entry.get(name).and_then(Value::as_str).unwrap_or("");
        let operation = match text("operation") {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return Err("operation must be `Apply` or `Update`".into()),
        };
        let api_version = text("apiVersion");
        if api_version.is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        match text("fieldsType") {
            "FieldsV1" => {}
            "" => return Err(format!("missing fieldsType in managed fields entry {i}")),
            other => {
                return Err(format!(
                    "invalid fieldsType {} in managed fields entry {i}",
                    go_quote(other)
                ));
            }
        }
        let set = match entry.get("fieldsV1") {
            None | Some(Value::Null) => Set::new(),
            Some(fields) => Set::from_fields_v1(fields)
                .map_err(|e| format!("error decoding set of entry {i}: {e}"))?,
        };
        let id = ManagerId {
            manager: text("manager").to_owned(),
            operation,
            api_version: (operation == Operation::Update).then(|| api_version.to_owned()),
            subresource: text("subresource").to_owned(),
        };
        let time = entry.get("time").and_then(Value::as_str).map(str::to_owned);
        let owned = Owned {
            set,
            api_version: api_version.to_owned(),
            time,
        };
        managers.insert(id, owned);
    }
    Ok(managers)
}

/// The `metadata.managedFields` list, ordered as upstream orders it: appliers first,
/// then by time, manager, version and subresource; `None` when nobody owns anything.
pub(super) fn encode(managers: &Managers) -> Option<Value> {
    if managers.is_empty() {
        return None;
    }
    let mut sorted: Vec<(&ManagerId, &Owned)> = managers.iter().collect();
    sorted.sort_by(|(a, a_owned), (b, b_owned)| {
        a.operation
            .cmp(&b.operation)
            .then_with(|| seconds(a_owned.time.as_deref()).cmp(&seconds(b_owned.time.as_deref())))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a_owned.api_version.cmp(&b_owned.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let entries = sorted
        .into_iter()
        .map(|(id, owned)| {
            let mut entry = Map::new();
            if !id.manager.is_empty() {
                entry.insert("manager".into(), id.manager.clone().into());
            }
            entry.insert("operation".into(), id.operation.as_str().into());
            entry.insert("apiVersion".into(), owned.api_version.clone().into());
            if let Some(time) = &owned.time {
                entry.insert("time".into(), time.clone().into());
            }
            entry.insert("fieldsType".into(), "FieldsV1".into());
            entry.insert("fieldsV1".into(), owned.set.to_fields_v1());
            if !id.subresource.is_empty() {
                entry.insert("subresource".into(), id.subresource.clone().into());
            }
            Value::Object(entry)
        })
        .collect();
    Some(Value::Array(entries))
}

/// Merges the oldest updaters into one `ancient-changes` entry per API version until
/// at most `max` updaters are left.
pub(super) fn cap_updaters(managers: &mut Managers, max: usize) {
    let mut updaters: Vec<ManagerId> = managers
        .keys()
        .filter(|id| id.operation == Operation::Update)
        .cloned()
        .collect();
    if updaters.len() <= max {
        return;
    }
    updaters.sort_by_cached_key(|id| (seconds(managers[id].time.as_deref()), id.identifier()));
    let mut first_of_version: HashMap<String, ManagerId> = HashMap::new();
    let mut count = updaters.len();
    for id in updaters {
        if count <= max {
            break;
        }
        let owned = managers[&id].clone();
        let Some(first) = first_of_version.get(&owned.api_version) else {
            first_of_version.insert(owned.api_version, id);
            continue;
        };
        let bucket = ManagerId {
            manager: ANCIENT_CHANGES.to_owned(),
            operation: Operation::Update,
            api_version: Some(owned.api_version.clone()),
            subresource: String::new(),
        };
        if !managers.contains_key(&bucket)
            && let Some(first) = managers.remove(first)
        {
            managers.insert(bucket.clone(), first);
        }
        let set = managers
            .get(&bucket)
            .map_or_else(Set::new, |bucket| bucket.set.clone());
        managers.insert(
            bucket,
            Owned {
                set: owned.set.union(&set),
                ..owned
            },
        );
        managers.remove(&id);
        count -= 1;
    }
}

/// Seconds since the epoch of an RFC 3339 time; a missing or unreadable time counts as
/// 0, as a missing one does upstream.
fn seconds(time: Option<&str>) -> i64 {
    time.and_then(parse_rfc3339).unwrap_or(0)
}

fn parse_rfc3339(time: &str) -> Option<i64> {
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = time.get(range)?;
        digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse().ok())?
    };
    let bytes = time.as_bytes();
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    // Skip fractional seconds up to the zone.
    let zone_at = time[19..].find(['Z', 'z', '+', '-']).map(|i| i + 19)?;
    let offset = match &time[zone_at..] {
        "Z" | "z" => 0,
        zone if zone.len() == 6 => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            sign * (number(zone_at + 1..zone_at + 3)? * 3600
                + number(zone_at + 4..zone_at + 6)? * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn updater(name: &str, time: &str) -> (ManagerId, Owned) {
        let mut set = Set::new();
        set.insert(&[super::super::path::PathElement::Field(name.to_owned())]);
        (
            ManagerId {
                manager: name.to_owned(),
                operation: Operation::Update,
                api_version: Some("v1".into()),
                subresource: String::new(),
            },
            Owned {
                set,
                api_version: "v1".into(),
                time: Some(time.to_owned()),
            },
        )
    }

    #[test]
    fn parses_times() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2024-03-01T12:30:05Z"), Some(1_709_296_205));
        assert_eq!(
            parse_rfc3339("2024-03-01T14:30:05.123+02:00"),
            Some(1_709_296_205)
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn round_trips_and_orders_entries() {
        let entries = json!([
            {"manager": "b", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:02Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:b": {}}}},
            {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:02Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}, "subresource": "status"},
            {"manager": "z", "operation": "Apply", "apiVersion": "v1", "time": "2024-01-01T00:00:09Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:z": {}}}},
        ]);
        let managers = decode(Some(&entries)).unwrap();
        let encoded = encode(&managers).unwrap();
        let names: Vec<&str> = encoded
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["z", "a", "b"]);
        assert_eq!(encoded[1], entries[1]);
        assert_eq!(
            serde_json::to_string(&encoded[0]).unwrap(),
            r#"{"manager":"z","operation":"Apply","apiVersion":"v1","time":"2024-01-01T00:00:09Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{"f:z":{}}}}"#
        );
        assert!(encode(&Managers::new()).is_none());
    }

    #[test]
    fn refuses_malformed_entries() {
        for (entry, error) in [
            (
                json!({"operation": "Patch", "apiVersion": "v1"}),
                "operation",
            ),
            (json!({"operation": "Update"}), "apiVersion"),
            (
                json!({"operation": "Update", "apiVersion": "v1"}),
                "missing fieldsType",
            ),
            (
                json!({"operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV2"}),
                "invalid fieldsType \"FieldsV2\"",
            ),
            (
                json!({"operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"x": {}}}),
                "decoding",
            ),
        ] {
            let message = decode(Some(&json!([entry]))).unwrap_err();
            assert!(message.contains(error), "{message}");
        }
        assert!(decode(Some(&json!({}))).is_err());
    }

    #[test]
    fn caps_updaters_into_ancient_changes() {
        let mut managers: Managers = (0..12)
            .map(|i| updater(&format!("m{i:02}"), &format!("2024-01-01T00:00:{i:02}Z")))
            .collect();
        cap_updaters(&mut managers, MAX_UPDATERS);
        let names: Vec<&str> = managers.keys().map(|id| id.manager.as_str()).collect();
        assert_eq!(names.len(), MAX_UPDATERS);
        assert!(names.contains(&ANCIENT_CHANGES));
        assert!(!names.contains(&"m00") && !names.contains(&"m01") && !names.contains(&"m02"));
        let ancient = managers
            .iter()
            .find(|(id, _)| id.manager == ANCIENT_CHANGES)
            .unwrap()
            .1;
        assert_eq!(ancient.set.paths().len(), 3);
        assert_eq!(ancient.time.as_deref(), Some("2024-01-01T00:00:02Z"));
    }
}
