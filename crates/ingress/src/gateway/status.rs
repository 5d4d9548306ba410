//! Statuses written the way clients expect: a condition keeps its
//! `lastTransitionTime` while its status stays the same, an unchanged status is not
//! written again, and a route's entries for other controllers' parents are left alone.

use serde_json::Value;

use super::plan::CONTROLLER_NAME;

/// The status to write for `desired` given the object's `current` one, or `None` when
/// the object already says it.
pub fn merged(desired: &Value, current: Option<&Value>) -> Option<Value> {
    let current = current.unwrap_or(&Value::Null);
    let ours = |status: &Value| {
        (status.get("parents").and_then(Value::as_array).into_iter())
            .flatten()
            .any(|p| p["controllerName"] == CONTROLLER_NAME)
    };
    if desired.get("parents").is_some() && !ours(desired) && !ours(current) {
        // A route of no Gateway of krust's, now or before: not krust's to write.
        return None;
    }
    let mut out = desired.clone();
    keep_times(&mut out, current);
    if let (Some(ours), Some(theirs)) = (
        out.get_mut("parents").and_then(Value::as_array_mut),
        current.get("parents").and_then(Value::as_array),
    ) {
        let others = theirs
            .iter()
            .filter(|p| p["controllerName"] != CONTROLLER_NAME);
        ours.extend(others.cloned());
    }
    let same = out
        .as_object()?
        .iter()
        .all(|(key, value)| match (value, current.get(key)) {
            // Entries of several controllers: their order is nobody's.
            (Value::Array(want), Some(Value::Array(have))) if key == "parents" => {
                want.len() == have.len() && want.iter().all(|w| have.contains(w))
            }
            (value, have) => have == Some(value),
        });
    (!same).then_some(out)
}

/// Copies the transition times of unchanged conditions from `current` into `desired`,
/// pairing list items by `name` (listeners) or `parentRef` (route parents).
fn keep_times(desired: &mut Value, current: &Value) {
    match desired {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let Some(old) = current.get(key) else {
                    continue;
                };
                if key == "conditions" {
                    keep_condition_times(value, old);
                } else {
                    keep_times(value, old);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if let Some(old) = counterpart(item, current) {
                    keep_times(item, old);
                }
            }
        }
        _ => {}
    }
}

fn counterpart<'a>(item: &Value, current: &'a Value) -> Option<&'a Value> {
    current.as_array()?.iter().find(|old| {
        old.get("controllerName") == item.get("controllerName")
            && ["name", "parentRef"]
                .iter()
                .any(|key| item.get(key).is_some() && item.get(key) == old.get(key))
    })
}

fn keep_condition_times(desired: &mut Value, current: &Value) {
    let (Some(desired), Some(current)) = (desired.as_array_mut(), current.as_array()) else {
        return;
    };
    for condition in desired {
        let old = current
            .iter()
            .find(|c| c["type"] == condition["type"] && c["status"] == condition["status"]);
        if let Some(time) = old.and_then(|c| c.get("lastTransitionTime")) {
            condition["lastTransitionTime"] = time.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cond(status: &str, reason: &str, time: &str) -> Value {
        json!({"type": "Accepted", "status": status, "reason": reason, "message": "", "observedGeneration": 1, "lastTransitionTime": time})
    }

    #[test]
    fn unchanged_statuses_are_not_written_and_times_survive_reason_changes() {
        let current = json!({"conditions": [cond("True", "Accepted", "T1")]});
        let same = json!({"conditions": [cond("True", "Accepted", "T2")]});
        assert_eq!(merged(&same, Some(&current)), None);
        let reason = json!({"conditions": [cond("True", "ListenersNotValid", "T2")]});
        assert_eq!(
            merged(&reason, Some(&current)).unwrap()["conditions"][0]["lastTransitionTime"],
            "T1"
        );
        let flipped = json!({"conditions": [cond("False", "Invalid", "T2")]});
        assert_eq!(
            merged(&flipped, Some(&current)).unwrap()["conditions"][0]["lastTransitionTime"],
            "T2"
        );
        assert!(merged(&same, None).is_some());
    }

    #[test]
    fn other_controllers_parents_are_kept_whatever_their_order() {
        let ours = |time: &str| {
            json!({"parentRef": {"name": "gw"}, "controllerName": CONTROLLER_NAME,
                   "conditions": [cond("True", "Accepted", time)]})
        };
        let theirs = json!({"parentRef": {"name": "other"}, "controllerName": "example.com/gw", "conditions": []});
        let current = json!({"parents": [theirs, ours("T1")]});
        assert_eq!(
            merged(&json!({"parents": [ours("T2")]}), Some(&current)),
            None
        );
        let changed = json!({"parents": [{"parentRef": {"name": "gw"}, "controllerName": CONTROLLER_NAME,
                                          "conditions": [cond("False", "NotAllowedByListeners", "T2")]}]});
        let written = merged(&changed, Some(&current)).unwrap();
        assert_eq!(written["parents"].as_array().unwrap().len(), 2);
        assert!(written["parents"].as_array().unwrap().contains(&theirs));
        // Detached: krust's entry goes, the others' stay; a route never ours is left alone.
        let detached = merged(&json!({"parents": []}), Some(&current)).unwrap();
        assert_eq!(detached["parents"], json!([theirs]));
        let foreign = json!({"parents": [theirs]});
        assert_eq!(merged(&json!({"parents": []}), Some(&foreign)), None);
        assert_eq!(merged(&json!({"parents": []}), None), None);
    }
}
