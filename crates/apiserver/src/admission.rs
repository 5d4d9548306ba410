//! Admission: the last stage before the store, where writes are mutated and checked. The
//! built-in steps: NamespaceLifecycle, ServiceAccount (a pod's account and its API
//! credentials volume), DefaultTolerationSeconds, Priority (a pod's priority from its
//! PriorityClass), StorageObjectInUseProtection (the claim and volume protection
//! finalizers), DefaultStorageClass (a claim without a class gets the default), Service IP/port allocation, NodeRestriction (a kubelet writes only its
//! own Node and pods), LimitRanger (`limit_ranger`), PodSecurity (`pod_security`),
//! RBAC's escalation prevention and, last, ResourceQuota (`resource_quota`).

use std::sync::Arc;

use crate::webhook::Operation;
use krust_api::status::{ApiError, Cause, Target};
use serde_json::{Value, json};

use crate::allocator::{ClaimError, ServiceAllocator, claim, claim_keys, unclaim};
use crate::rest::Call;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const CERTIFICATES_GROUP: &str = "certificates.k8s.io";

/// The LimitRanges of the call's namespace (none outside one).
fn limit_ranges(call: &Call<'_>) -> Vec<Value> {
    let (Some(namespace), Some(cache)) = (
        call.namespace(),
        call.api.cache.cache("/registry/limitranges/"),
    ) else {
        return Vec::new();
    };
    cache
        .list(&format!("/registry/limitranges/{namespace}/"))
        .0
        .iter()
        .map(|r| r.value())
        .collect()
}

/// LimitRanger's mutating half, for a new pod: defaults from the namespace's
/// LimitRanges (its QoS class follows them).
fn limit_ranger_defaults(call: &Call<'_>, pod: &mut Value) {
    let ranges = limit_ranges(call);
    if let Some(note) = crate::limit_ranger::apply_defaults(pod, &ranges) {
        pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"] = json!(note);
        pod["status"]["qosClass"] = json!(crate::kinds::pod::qos_class(&pod["spec"]));
    }
}

/// LimitRanger's validating half, for a new pod: the LimitRanges' bounds, on the pod as
/// the mutating webhooks left it.
fn limit_ranger_bounds(call: &Call<'_>, pod: &Value) -> Result<(), ApiError> {
    match crate::limit_ranger::validate_pod(pod, &limit_ranges(call)) {
        None => Ok(()),
        Some(why) => Err(ApiError::forbidden_for(
            Target {
                group: "",
                resource: "pods",
                name: pod["metadata"]["name"].as_str().unwrap_or_default(),
            },
            &why,
        )),
    }
}

/// PodSecurity for a pod or a workload's pod template: a pod violating its namespace's
/// `enforce` level is refused; violating the `audit` level annotates the request's audit
/// events; violating the `warn` level adds a warning.
fn pod_security(call: &Call<'_>, obj: &Value) -> Result<(), ApiError> {
    use crate::pod_security::{Policy, pod_spec, violations};
    let info = call.kind.info;
    let Some(spec) = pod_spec(info.kind, obj) else {
        return Ok(());
    };
    if !info.group.is_empty() && !["apps", "batch"].contains(&info.group) {
        return Ok(());
    }
    let Some(namespace) = call
        .namespace()
        .and_then(|ns| call.api.cache.core_object("namespaces", None, ns))
    else {
        return Ok(());
    };
    if info.kind == "Pod"
        && let Some(policy) = Policy::of(&namespace, "audit")
    {
        let found = violations(spec, policy.level);
        if !found.is_empty() {
            call.audit.add(
                "pod-security.kubernetes.io/audit-violations",
                format!(
                    "would violate PodSecurity {:?}: {}",
                    policy.describe(),
                    found.join(", ")
                ),
            );
        }
    }
    let enforce = Policy::of(&namespace, "enforce");
    if info.kind == "Pod" {
        // Unlabelled namespaces enforce privileged:latest, which allows everything.
        let described = enforce.as_ref().map(Policy::describe);
        call.audit.add(
            "pod-security.kubernetes.io/enforce-policy",
            described.unwrap_or_else(|| "privileged:latest".into()),
        );
    }
    if info.kind == "Pod"
        && let Some(policy) = enforce
    {
        let found = violations(spec, policy.level);
        if !found.is_empty() {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::forbidden_for(
                Target {
                    group: "",
                    resource: "pods",
                    name,
                },
                &format!(
                    "violates PodSecurity {:?}: {}",
                    policy.describe(),
                    found.join(", ")
                ),
            ));
        }
    }
    if let Some(policy) = Policy::of(&namespace, "warn") {
        let found = violations(spec, policy.level);
        if !found.is_empty() {
            call.warnings.add(format!(
                "would violate PodSecurity {:?}: {}",
                policy.describe(),
                found.join(", ")
            ));
        }
    }
    Ok(())
}

/// A namespace's PodSecurity labels must name levels and versions; a new `enforce`
/// level warns about the namespace's pods that violate it, as upstream.
fn namespace_pod_security(
    call: &Call<'_>,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    use crate::pod_security::{Policy, invalid_labels, violations};
    let name = new["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = invalid_labels(&new["metadata"]["labels"]);
    if !invalid.is_empty() {
        let causes = invalid
            .iter()
            .map(|(label, value, allowed)| {
                Cause::invalid(
                    format!("metadata.labels[{label}]"),
                    &json!(value),
                    format!("must be one of {allowed}"),
                )
            })
            .collect();
        return Err(ApiError::invalid("Namespace", "", name, causes));
    }
    let Some(policy) = Policy::of(new, "enforce") else {
        return Ok(());
    };
    if old.and_then(|old| Policy::of(old, "enforce")).as_ref() == Some(&policy) {
        return Ok(());
    }
    let Some(pods) = call.api.cache.cache("/registry/pods/") else {
        return Ok(());
    };
    let mut offenders = Vec::new();
    for pod in pods.list(&format!("/registry/pods/{name}/")).0 {
        let pod = pod.value();
        let reasons: Vec<String> = violations(&pod["spec"], policy.level)
            .iter()
            .map(|v| v.split(" (").next().unwrap_or_default().to_string())
            .collect();
        if !reasons.is_empty() {
            let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
            offenders.push(format!("{pod_name}: {}", reasons.join(", ")));
        }
    }
    if !offenders.is_empty() {
        call.warnings.add(format!(
            "existing pods in namespace {name:?} violate the new PodSecurity enforce level {:?}",
            policy.describe()
        ));
        offenders.into_iter().for_each(|o| call.warnings.add(o));
    }
    Ok(())
}

/// StorageObjectInUseProtection: a new claim or volume carries the finalizer that keeps
/// it until no pod uses it (claims) or no claim is bound to it (volumes).
fn storage_object_in_use_protection(info: &krust_api::registry::ResourceInfo, obj: &mut Value) {
    let finalizer = match (info.group, info.plural) {
        ("", "persistentvolumeclaims") => "kubernetes.io/pvc-protection",
        ("", "persistentvolumes") => "kubernetes.io/pv-protection",
        _ => return,
    };
    let finalizers = &mut obj["metadata"]["finalizers"];
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    let list = finalizers.as_array_mut().expect("made an array above");
    if !list.iter().any(|f| f == finalizer) {
        list.push(json!(finalizer));
    }
}

/// DefaultStorageClass: a claim that names no class (`storageClassName` absent, not
/// `""`) gets the default one: the class annotated `is-default-class`, the newest if
/// there are several (then by name, as upstream).
fn default_storage_class(call: &Call<'_>, claim: &mut Value) {
    const DEFAULT: &str = "storageclass.kubernetes.io/is-default-class";
    const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
    if !claim["spec"]["storageClassName"].is_null()
        || claim["metadata"]["annotations"].get(BETA_CLASS).is_some()
    {
        return;
    }
    let Some(cache) = call.api.cache.cache("/registry/storageclasses/") else {
        return;
    };
    let classes: Vec<Value> = cache
        .list("/registry/storageclasses/")
        .0
        .iter()
        .map(|c| c.value())
        .filter(|c| c["metadata"]["annotations"][DEFAULT] == "true")
        .collect();
    let newest = classes.iter().max_by(|a, b| {
        let created = |c: &Value| {
            c["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_owned)
        };
        let name = |c: &Value| c["metadata"]["name"].as_str().map(str::to_owned);
        (created(a), name(b)).cmp(&(created(b), name(a)))
    });
    if let Some(class) = newest {
        claim["spec"]["storageClassName"] = class["metadata"]["name"].clone();
    }
}

/// The admission steps run on writes.
pub struct Admission {
    pub services: Arc<ServiceAllocator>,
}

impl Admission {
    /// Admits a create, in upstream's two phases: the mutating plugins (built-in, then
    /// webhooks), then the validating ones on the object as mutated.
    pub async fn admit_create(&self, call: &Call<'_>, obj: &mut Value) -> Result<(), ApiError> {
        let info = call.kind.info;
        if info.namespaced {
            namespace_lifecycle(call, obj).await?;
        }
        if info.plural == "services" && info.group.is_empty() {
            self.allocate_service(call, obj, None).await?;
        }
        // NodeRestriction is a mutating plugin upstream: it judges what the kubelet sent.
        crate::authz::node::restrict(&call.user, info.plural, None, obj, None)?;
        let pod = info.plural == "pods" && info.group.is_empty();
        if pod {
            limit_ranger_defaults(call, obj);
        }
        storage_object_in_use_protection(info, obj);
        if info.plural == "persistentvolumeclaims" && info.group.is_empty() {
            default_storage_class(call, obj);
        }
        if pod {
            service_account(call, obj);
            default_toleration_seconds(obj);
            priority(call, obj)?;
        }
        mutating_webhooks(call, Operation::Create, obj, None).await?;

        if info.group == RBAC_GROUP {
            // In RBAC's storage upstream, on the object admission made.
            crate::authz::escalation::check(call.api, &call.user, info.plural, obj)?;
        }
        if info.group == CERTIFICATES_GROUP {
            crate::authz::signers::admit(call, obj, None).await?;
        }
        if info.plural == "namespaces" && info.group.is_empty() {
            namespace_pod_security(call, obj, None)?;
        }
        if pod {
            limit_ranger_bounds(call, obj)?;
        }
        pod_security(call, obj)?;
        crate::webhook::validate(call, Operation::Create, Some(obj), None).await?;
        // Last, on the object as it will be stored.
        crate::resource_quota::admit(call, obj, None).await
    }

    /// Admits an update, in the same two phases as a create.
    pub async fn admit_update(
        &self,
        call: &Call<'_>,
        new: &mut Value,
        old: &Value,
    ) -> Result<(), ApiError> {
        let info = call.kind.info;
        let subresource = call.info.subresource.as_deref();
        crate::authz::node::restrict(&call.user, info.plural, subresource, new, Some(old))?;
        if info.plural == "services" && info.group.is_empty() {
            // Keep what was allocated; allocate what a type change now needs.
            if new["spec"]["clusterIP"].as_str().is_none_or(str::is_empty)
                && old["spec"]["type"] != "ExternalName"
            {
                new["spec"]["clusterIP"] = old["spec"]["clusterIP"].clone();
                new["spec"]["clusterIPs"] = old["spec"]["clusterIPs"].clone();
                new["spec"]["ipFamilies"] = old["spec"]["ipFamilies"].clone();
                new["spec"]["ipFamilyPolicy"] = old["spec"]["ipFamilyPolicy"].clone();
            }
            let needs_ports = matches!(
                new["spec"]["type"].as_str(),
                Some("NodePort" | "LoadBalancer")
            );
            if needs_ports {
                keep_node_ports(new, old);
            }
            if crate::allocator::needs_health_check_node_port(&new["spec"])
                && new["spec"]["healthCheckNodePort"].is_null()
            {
                new["spec"]["healthCheckNodePort"] = old["spec"]["healthCheckNodePort"].clone();
            }
            self.allocate_service(call, new, Some(old)).await?;
        }
        mutating_webhooks(call, Operation::Update, new, Some(old)).await?;

        if info.group == RBAC_GROUP {
            crate::authz::escalation::check(call.api, &call.user, info.plural, new)?;
        }
        if info.plural == "namespaces" && info.group.is_empty() {
            namespace_pod_security(call, new, Some(old))?;
        } else if info.plural != "pods" && subresource.is_none() {
            // Pods' specs hardly change after creation; workloads' templates do.
            pod_security(call, new)?;
        }
        if info.group == CERTIFICATES_GROUP {
            crate::authz::signers::admit(call, new, Some(old)).await?;
        }
        crate::webhook::validate(call, Operation::Update, Some(new), Some(old)).await?;
        crate::resource_quota::admit(call, new, Some(old)).await
    }

    /// Gives a Service (new, or `old` updated) its ClusterIP and NodePorts, claimed in
    /// the store. An auto-assigned IP or port another apiserver took meanwhile is skipped
    /// and another picked; a requested one is refused.
    async fn allocate_service(
        &self,
        call: &Call<'_>,
        svc: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let name = svc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let owner = format!(
            "{}/{name}",
            svc["metadata"]["namespace"].as_str().unwrap_or_default()
        );
        let requested = claim_keys(svc);
        for _ in 0..16 {
            let mut probe = svc.clone();
            if let Some(old) = old {
                self.services.release(old);
            }
            let allocated = self.services.allocate(&mut probe);
            if let Some(old) = old {
                self.services.observe(old);
            }
            allocated.map_err(|causes| ApiError::invalid("Service", "", &name, causes))?;
            if call.dry_run() {
                if old.is_none() {
                    self.services.release(&probe);
                }
                *svc = probe;
                return Ok(());
            }
            let keys = claim_keys(&probe);
            match claim(call.api.store.as_ref(), &owner, &keys).await {
                Ok(()) => {
                    if let Some(old) = old {
                        let dropped: Vec<String> = claim_keys(old)
                            .into_iter()
                            .filter(|k| !keys.contains(k))
                            .collect();
                        self.services.release(old);
                        self.services.observe(&probe);
                        unclaim(call.api.store.as_ref(), &owner, &dropped)
                            .await
                            .map_err(|e| ApiError::internal(e.to_string()))?;
                    }
                    *svc = probe;
                    return Ok(());
                }
                Err(ClaimError::Taken(key)) => {
                    self.services.release(&probe);
                    if let Some(old) = old {
                        self.services.observe(old);
                    }
                    self.services.observe_key(&key);
                    if requested.contains(&key) {
                        let what = key.rsplit('/').next().unwrap_or_default().to_string();
                        let field = if key.contains("serviceips") {
                            "spec.clusterIPs"
                        } else {
                            "spec.ports"
                        };
                        return Err(ApiError::invalid(
                            "Service",
                            "",
                            &name,
                            vec![Cause::invalid(
                                field,
                                &Value::String(what.clone()),
                                format!(
                                    "failed to allocate {what}: provided value is already allocated"
                                ),
                            )],
                        ));
                    }
                }
                Err(ClaimError::Store(e)) => {
                    self.services.release(&probe);
                    return Err(ApiError::internal(e.to_string()));
                }
            }
        }
        Err(ApiError::internal(
            "could not allocate a ClusterIP or NodePort: every candidate was taken",
        ))
    }

    /// Checks a delete of `old` before it happens.
    pub fn admit_delete(&self, call: &Call<'_>, old: &Value) -> Result<(), ApiError> {
        let info = call.kind.info;
        if info.plural == "namespaces" && info.group.is_empty() {
            immortal_namespaces(old)?;
        }
        crate::authz::node::restrict(&call.user, info.plural, None, old, Some(old))
    }

    pub async fn after_delete(&self, call: &Call<'_>, obj: &Value) {
        if call.kind.info.plural == "services" && call.kind.info.group.is_empty() {
            self.services.release(obj);
            let owner = format!(
                "{}/{}",
                obj["metadata"]["namespace"].as_str().unwrap_or_default(),
                obj["metadata"]["name"].as_str().unwrap_or_default()
            );
            if let Err(err) = unclaim(call.api.store.as_ref(), &owner, &claim_keys(obj)).await {
                tracing::warn!(%err, %owner, "releasing a Service's IP and ports");
            }
        }
    }
}

/// The mutating admission webhooks, after the built-in mutating plugins; an object they
/// changed is defaulted and validated again (upstream validates after all mutating
/// admission), before the validating plugins judge it.
async fn mutating_webhooks(
    call: &Call<'_>,
    operation: Operation,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if crate::webhook::mutate(call, operation, obj, old).await? {
        call.kind.strategy.default(obj);
        crate::rest::validate(call, obj, old)?;
    }
    Ok(())
}

/// NodePorts of ports the update leaves unset keep their old values (matched by port).
fn keep_node_ports(new: &mut Value, old: &Value) {
    let old_ports = old["spec"]["ports"].as_array().cloned().unwrap_or_default();
    for p in crate::kinds::validation::each_mut(new, "/spec/ports") {
        if p["nodePort"].is_null()
            && let Some(o) = old_ports
                .iter()
                .find(|o| o["port"] == p["port"] && o["protocol"] == p["protocol"])
        {
            p["nodePort"] = o["nodePort"].clone();
        }
    }
}

/// The namespaces NamespaceLifecycle keeps from deletion, as upstream: without them the
/// cluster loses its `kubernetes` Service, its controllers' Leases and its public data.
/// (kube-node-lease may go: the system namespaces loop creates it again.)
pub const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// NamespaceLifecycle's delete half: an immortal namespace may not be deleted.
fn immortal_namespaces(namespace: &Value) -> Result<(), ApiError> {
    let name = namespace["metadata"]["name"].as_str().unwrap_or_default();
    if !IMMORTAL_NAMESPACES.contains(&name) {
        return Ok(());
    }
    Err(ApiError::forbidden_for(
        Target {
            group: "",
            resource: "namespaces",
            name,
        },
        "this namespace may not be deleted",
    ))
}

/// Objects may only be created in namespaces that exist and are not terminating.
async fn namespace_lifecycle(call: &Call<'_>, obj: &Value) -> Result<(), ApiError> {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let cache = call
        .api
        .cache
        .cache("/registry/namespaces/")
        .ok_or_else(|| ApiError::internal("namespace cache missing"))?;
    let key = format!("/registry/namespaces/{ns}");
    // The hot path reads the cache as it is; only a miss (maybe a namespace created a
    // moment ago) pays for catching up with the store first.
    let found = match cache.get(&key) {
        Some(ns) => Some(ns),
        None => {
            call.consistent().await?;
            cache.get(&key)
        }
    };
    let Some(namespace) = found else {
        return Err(ApiError::not_found(Target {
            group: "",
            resource: "namespaces",
            name: ns,
        }));
    };
    if namespace.field("status.phase").as_deref() == Some("Terminating") {
        let info = call.kind.info;
        let mut err = ApiError::forbidden_for(
            Target {
                group: info.group,
                resource: info.plural,
                name: obj["metadata"]["name"].as_str().unwrap_or_default(),
            },
            &format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ),
        );
        if let Some(details) = err.details.as_mut() {
            details.causes.push(Cause {
                reason: "NamespaceTerminating",
                message: format!("namespace {ns} is being terminated"),
                field: "metadata.namespace".into(),
            });
        }
        return Err(err);
    }
    Ok(())
}

/// Where the API credentials volume is mounted, as upstream.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount admission step: a pod without an account gets `default`; a pod
/// whose account exists gets the `kube-api-access-<random>` projected volume (a token
/// of 3607 s, the cluster CA from `kube-root-ca.crt`, the namespace) mounted read-only
/// at [`SERVICE_ACCOUNT_DIR`] in every container, unless the pod (or else the account)
/// says `automountServiceAccountToken: false` or a container mounts something there
/// already. Upstream refuses a pod whose account does not exist; krust admits it
/// without the volume, since an apiserver running without the ServiceAccount
/// controller has no `default` accounts.
fn service_account(call: &Call<'_>, pod: &mut Value) {
    if pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string() {
        return;
    }
    let spec = &mut pod["spec"];
    let name = match spec["serviceAccountName"]
        .as_str()
        .filter(|n| !n.is_empty())
    {
        Some(n) => n.to_string(),
        None => {
            spec["serviceAccountName"] = json!("default");
            spec["serviceAccount"] = json!("default");
            "default".to_string()
        }
    };
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let Some(account) = call
        .api
        .cache
        .core_object("serviceaccounts", Some(ns), &name)
    else {
        return;
    };
    let spec = &mut pod["spec"];
    let automount = spec["automountServiceAccountToken"]
        .as_bool()
        .or(account["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    let lists = ["initContainers", "containers"];
    let mounted = lists
        .iter()
        .filter_map(|l| spec.get(l).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c["volumeMounts"].as_array())
        .flatten()
        .any(|m| m["mountPath"] == SERVICE_ACCOUNT_DIR);
    if !automount || mounted {
        return;
    }
    let volume = format!("kube-api-access-{}", krust_api::names::random_suffix(5));
    let projected = json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}});
    match spec["volumes"].as_array_mut() {
        Some(volumes) => volumes.push(projected),
        None => spec["volumes"] = json!([projected]),
    }
    let mount = json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_DIR});
    for list in lists {
        // `get_mut`, not indexing: indexing a missing key would store a null.
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            match c["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount.clone()),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
    }
}

/// The DefaultTolerationSeconds step: a pod that does not say otherwise tolerates a
/// not-ready or unreachable node for 300 s before it is evicted from it.
fn default_toleration_seconds(pod: &mut Value) {
    const DEFAULT_SECONDS: i64 = 300;
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let existing: Vec<Value> = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut added = Vec::new();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = existing.iter().any(|t| {
            let effect = t["effect"].as_str().unwrap_or_default();
            let t_key = t["key"].as_str().unwrap_or_default();
            (effect.is_empty() || effect == "NoExecute")
                && (t_key == key || (t_key.is_empty() && t["operator"] == "Exists"))
        });
        if !tolerated {
            added.push(
                json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_SECONDS}),
            );
        }
    }
    if !added.is_empty() {
        let mut all = existing;
        all.extend(added);
        spec.insert("tolerations".into(), Value::Array(all));
    }
}

/// The PriorityClasses every cluster has: (name, value, description), as upstream.
pub const SYSTEM_PRIORITY_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// The Priority admission step: a new pod's `spec.priority` and `spec.preemptionPolicy`
/// come from its PriorityClass (or the global default class, or 0 when there is none);
/// a pod may not claim values of its own that differ.
fn priority(call: &Call<'_>, pod: &mut Value) -> Result<(), ApiError> {
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let forbidden = |message: String| {
        let mut err = ApiError::forbidden(format!("pods \"{name}\" is forbidden: {message}"));
        err.details = Some(Box::new(krust_api::status::Details {
            name: name.clone(),
            kind: "pods".into(),
            ..Default::default()
        }));
        err
    };
    let classes = call
        .api
        .cache
        .cache("/registry/priorityclasses/")
        .ok_or_else(|| ApiError::internal("priority class cache missing"))?;
    let requested = pod["spec"]["priorityClassName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let class = if requested.is_empty() {
        // The global default with the lowest value, as upstream picks among several.
        classes
            .list("/registry/priorityclasses/")
            .0
            .iter()
            .map(|c| c.value())
            .filter(|c| c["globalDefault"] == true)
            .min_by_key(|c| c["value"].as_i64().unwrap_or(0))
    } else {
        match classes.get(&format!("/registry/priorityclasses/{requested}")) {
            Some(c) => Some(c.value()),
            None => match SYSTEM_PRIORITY_CLASSES.iter().find(|c| c.0 == requested) {
                Some((_, value, _)) => Some(serde_json::json!({"value": value})),
                None => {
                    return Err(forbidden(format!(
                        "no PriorityClass with name {requested} was found"
                    )));
                }
            },
        }
    };
    let value = class
        .as_ref()
        .and_then(|c| c["value"].as_i64())
        .unwrap_or(0);
    let policy = class
        .as_ref()
        .and_then(|c| c["preemptionPolicy"].as_str())
        .unwrap_or("PreemptLowerPriority")
        .to_string();
    if let Some(given) = pod["spec"]["priority"].as_i64()
        && given != value
    {
        return Err(forbidden(format!(
            "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {value} from the given PriorityClass name"
        )));
    }
    if let Some(given) = pod["spec"]["preemptionPolicy"].as_str()
        && given != policy
    {
        return Err(forbidden(format!(
            "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
        )));
    }
    if requested.is_empty()
        && let Some(class) = &class
    {
        pod["spec"]["priorityClassName"] = class["metadata"]["name"].clone();
    }
    pod["spec"]["priority"] = serde_json::json!(value);
    pod["spec"]["preemptionPolicy"] = serde_json::json!(policy);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_tolerate_not_ready_and_unreachable_nodes_for_five_minutes() {
        let mut pod = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]}});
        default_toleration_seconds(&mut pod);
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ])
        );
        let mut everything = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_toleration_seconds(&mut everything);
        assert_eq!(
            everything["spec"]["tolerations"],
            json!([{"operator": "Exists"}])
        );
        let mut bare = json!({"spec": {}});
        default_toleration_seconds(&mut bare);
        assert_eq!(bare["spec"]["tolerations"].as_array().unwrap().len(), 2);
    }
}
