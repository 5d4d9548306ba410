//! The definitions' controllers, run inside the apiserver as upstream's
//! apiextensions-apiserver runs them: naming (accepted names, NamesAccepted), establishing
//! (Established) and cleanup (the finalizer that deletes a definition's objects before
//! the definition). They write through the REST layer like any controller.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use krust_api::status::ApiError;
use serde_json::{Value, json};

use super::CustomKinds;
use super::DEFINITIONS;
use super::definition::CLEANUP_FINALIZER;
use super::definition::{condition, set_condition};
use crate::loopback::{Loopback, Resource};
use crate::rest::Scope;

const DEFINITION: Resource<'static> = Resource {
    group: "apiextensions.k8s.io",
    version: "v1",
    plural: "customresourcedefinitions",
    namespace: None,
};

/// How often a definition whose objects are still going is looked at again.
const CLEANUP_RETRY: Duration = Duration::from_secs(1);

/// Reconciles every definition whenever one changes, until the cache goes away.
pub async fn run(scope: Arc<Scope>, custom: Arc<CustomKinds>) {
    let Some(cache) = scope.cache.cache(DEFINITIONS) else {
        return;
    };
    let mut changes = cache.subscribe();
    loop {
        let (objs, _) = cache.list(DEFINITIONS);
        let all: Vec<Value> = objs.iter().map(|o| o.value()).collect();
        let mut again = false;
        for crd in &all {
            let name = crd["metadata"]["name"].as_str().unwrap_or_default();
            let outcome = if crd["metadata"]["deletionTimestamp"].is_string() {
                clean_up(&scope, &custom, crd).await
            } else {
                accept(&scope, crd, &all).await.map(|()| true)
            };
            match outcome {
                Ok(done) => again |= !done,
                Err(err) if err.code == 409 || err.code == 404 => again = true,
                Err(err) => {
                    tracing::warn!(%name, %err, "reconciling a CustomResourceDefinition");
                    again = true;
                }
            }
        }
        if again {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(CLEANUP_RETRY) => {}
            }
        } else if changes.changed().await.is_err() {
            return;
        }
    }
}

/// The names a definition asks for, each with its conflict reason, in the order
/// upstream checks them (the last conflict found is the one reported).
fn requested(names: &Value) -> Vec<(&'static str, String)> {
    let one = |field: &str, reason: &'static str| {
        names[field]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(|n| (reason, n.to_string()))
    };
    let mut out: Vec<(&'static str, String)> = Vec::new();
    out.extend(one("plural", "PluralConflict"));
    out.extend(one("singular", "SingularConflict"));
    for short in names["shortNames"].as_array().into_iter().flatten() {
        if let Some(s) = short.as_str() {
            out.push(("ShortNamesConflict", s.to_string()));
        }
    }
    out.extend(one("kind", "KindConflict"));
    out.extend(one("listKind", "ListKindConflict"));
    out
}

/// Accepts a definition's names unless another definition of its group holds one of
/// them, then establishes it; records the storage version among the stored ones.
async fn accept(scope: &Scope, crd: &Value, all: &[Value]) -> Result<(), ApiError> {
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let group = &crd["spec"]["group"];
    let taken: Vec<String> = all
        .iter()
        .filter(|other| other["metadata"]["name"].as_str() != Some(name))
        .filter(|other| other["spec"]["group"] == *group)
        .flat_map(|other| requested(&other["status"]["acceptedNames"]))
        .map(|(_, n)| n)
        .collect();
    let conflict = requested(&crd["spec"]["names"])
        .into_iter()
        .rfind(|(_, n)| taken.contains(n));
    let mut new = crd.clone();
    match conflict {
        Some((reason, n)) => {
            set_condition(
                &mut new,
                condition(
                    "NamesAccepted",
                    false,
                    reason,
                    &format!("\"{n}\" is already in use"),
                ),
            );
            if !was_established(crd) {
                set_condition(
                    &mut new,
                    condition(
                        "Established",
                        false,
                        "NotAccepted",
                        "not all names are accepted",
                    ),
                );
            }
        }
        None => {
            new["status"]["acceptedNames"] = crd["spec"]["names"].clone();
            set_condition(
                &mut new,
                condition("NamesAccepted", true, "NoConflicts", "no conflicts found"),
            );
            set_condition(
                &mut new,
                condition(
                    "Established",
                    true,
                    "InitialNamesAccepted",
                    "the initial names have been accepted",
                ),
            );
        }
    }
    let storage = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == json!(true))
        .and_then(|v| v["name"].as_str());
    if let Some(storage) = storage {
        let stored = &mut new["status"]["storedVersions"];
        if !stored.is_array() {
            *stored = json!([]);
        }
        let list = stored.as_array_mut().expect("made an array above");
        if !list.contains(&json!(storage)) {
            list.push(json!(storage));
        }
    }
    if new != *crd {
        Loopback { scope }.update_status(DEFINITION, &new).await?;
    }
    Ok(())
}

fn was_established(crd: &Value) -> bool {
    serde_json::from_value::<CustomResourceDefinition>(crd.clone())
        .is_ok_and(|c| super::definition::established(&c))
}

/// Deletes a deleted definition's objects, then lets the definition go. Returns whether
/// it is done.
async fn clean_up(scope: &Scope, custom: &CustomKinds, crd: &Value) -> Result<bool, ApiError> {
    let finalizers = crd["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !finalizers.contains(&json!(CLEANUP_FINALIZER)) {
        return Ok(true);
    }
    let internal = Loopback { scope };
    let mut new = crd.clone();
    let served = super::kind::served_versions(
        &serde_json::from_value::<CustomResourceDefinition>(crd.clone())
            .map_err(|e| ApiError::internal(e.to_string()))?,
    )
    .first()
    .map(|v| v.name.clone());
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["status"]["acceptedNames"]["plural"]
        .as_str()
        .unwrap_or_default();
    // Only a custom kind: never a built-in one of the same name.
    let kind = served
        .as_deref()
        .and_then(|version| custom.find(group, version, plural));
    let outcome = match kind {
        None => condition(
            "Terminating",
            false,
            "NeverEstablished",
            "resource was never established",
        ),
        Some(kind) => {
            let resource = Resource {
                group,
                version: kind.info.version,
                plural,
                namespace: None,
            };
            set_condition(
                &mut new,
                condition(
                    "Terminating",
                    true,
                    "InstanceDeletionInProgress",
                    "CustomResource deletion is in progress",
                ),
            );
            if new != *crd {
                new = internal.update_status(DEFINITION, &new).await?;
            }
            if let Err(err) = internal.delete_all(resource).await {
                let failed = condition(
                    "Terminating",
                    true,
                    "InstanceDeletionFailed",
                    &format!("could not issue all deletes: {}", err.message),
                );
                set_condition(&mut new, failed);
                internal.update_status(DEFINITION, &new).await?;
                return Ok(false);
            }
            let prefix = kind.info.storage_prefix();
            let left = scope
                .cache
                .cache(&prefix)
                .map_or(0, |c| c.list(&prefix).0.len());
            if left > 0 {
                // Objects with finalizers of their own go when those are done.
                return Ok(false);
            }
            condition(
                "Terminating",
                false,
                "InstanceDeletionCompleted",
                "removed all instances",
            )
        }
    };
    set_condition(&mut new, outcome);
    let mut new = internal.update_status(DEFINITION, &new).await?;
    let finalizers: Vec<Value> = finalizers
        .into_iter()
        .filter(|f| *f != json!(CLEANUP_FINALIZER))
        .collect();
    new["metadata"]["finalizers"] = Value::Array(finalizers);
    internal.update(DEFINITION, &new).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_names_carry_their_conflict_reasons() {
        let names = json!({"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList", "shortNames": ["wd"]});
        assert_eq!(
            requested(&names),
            [
                ("PluralConflict", "widgets".to_string()),
                ("SingularConflict", "widget".to_string()),
                ("ShortNamesConflict", "wd".to_string()),
                ("KindConflict", "Widget".to_string()),
                ("ListKindConflict", "WidgetList".to_string()),
            ]
        );
    }
}
