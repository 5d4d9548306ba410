//! The resource registry: every API resource krust serves, with its group, version, kind,
//! names, scope and subresources. One table drives discovery, URL routing, storage keys
//! and the generic REST handlers.

/// A subresource served under `<resource>/<name>/<subresource>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// `status`: get, update and patch of `.status` only.
    Status,
    /// `scale`: autoscaling/v1 Scale view of `.spec.replicas`.
    Scale,
    /// `binding` (pods): create a core/v1 Binding that sets `spec.nodeName`.
    Binding,
    /// `eviction` (pods): create a policy/v1 Eviction.
    Eviction,
    /// `token` (serviceaccounts): create an authentication.k8s.io/v1 TokenRequest.
    Token,
    /// `approval` (certificatesigningrequests): get, update and patch of the approval
    /// conditions (Approved, Denied) only.
    Approval,
    /// `ephemeralcontainers` (pods): get, update and patch of
    /// `spec.ephemeralContainers` only.
    EphemeralContainers,
    /// The connect subresources of pods, served by the node's kubelet through the
    /// apiserver: `log`, `exec`, `attach`, `portforward`.
    Log,
    Exec,
    Attach,
    PortForward,
}

impl Subresource {
    pub fn name(self) -> &'static str {
        match self {
            Subresource::Status => "status",
            Subresource::Scale => "scale",
            Subresource::Binding => "binding",
            Subresource::Eviction => "eviction",
            Subresource::Token => "token",
            Subresource::Approval => "approval",
            Subresource::EphemeralContainers => "ephemeralcontainers",
            Subresource::Log => "log",
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Status,
            Self::Scale,
            Self::Binding,
            Self::Eviction,
            Self::Token,
            Self::Approval,
            Self::EphemeralContainers,
            Self::Log,
            Self::Exec,
            Self::Attach,
            Self::PortForward,
        ]
        .into_iter()
        .find(|sub| sub.name() == s)
    }

    /// (group, version, kind) of the object this subresource reads and writes, when it is
    /// not the parent kind.
    pub fn kind(self) -> Option<(&'static str, &'static str, &'static str)> {
        match self {
            Subresource::Status | Subresource::Approval | Subresource::EphemeralContainers => None,
            Subresource::Scale => Some(("autoscaling", "v1", "Scale")),
            Subresource::Binding => Some(("", "v1", "Binding")),
            Subresource::Eviction => Some(("policy", "v1", "Eviction")),
            Subresource::Token => Some(("authentication.k8s.io", "v1", "TokenRequest")),
            Subresource::Log => None,
            Subresource::Exec => Some(("", "v1", "PodExecOptions")),
            Subresource::Attach => Some(("", "v1", "PodAttachOptions")),
            Subresource::PortForward => Some(("", "v1", "PodPortForwardOptions")),
        }
    }

    /// The verbs discovery advertises for this subresource.
    pub fn verbs(self) -> &'static [&'static str] {
        match self {
            Subresource::Status
            | Subresource::Scale
            | Subresource::Approval
            | Subresource::EphemeralContainers => &["get", "patch", "update"],
            Subresource::Binding | Subresource::Eviction | Subresource::Token => &["create"],
            Subresource::Log => &["get"],
            Subresource::Exec | Subresource::Attach | Subresource::PortForward => {
                &["create", "get"]
            }
        }
    }
}

/// One API resource.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The plural resource name used in URLs (`pods`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub namespaced: bool,
    pub subresources: &'static [Subresource],
    /// The storage prefix under `/registry/`, as upstream lays out etcd (`minions` for
    /// nodes, `services/specs` for services, ...).
    pub storage: &'static str,
}

impl ResourceInfo {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `deployments.apps`, as upstream names resources in messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn has_subresource(&self, sub: Subresource) -> bool {
        self.subresources.contains(&sub)
    }

    /// Whether objects of this resource are never stored: the reviews, which a create
    /// answers (their `storage` is empty).
    pub fn is_virtual(&self) -> bool {
        self.storage.is_empty()
    }

    /// The storage key prefix for all objects of this resource, ending in `/`.
    pub fn storage_prefix(&self) -> String {
        format!("/registry/{}/", self.storage)
    }

    /// The storage key prefix for one namespace (or all, for cluster-scoped kinds).
    pub fn storage_prefix_in(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("/registry/{}/{}/", self.storage, ns),
            _ => self.storage_prefix(),
        }
    }

    /// The storage key of one object.
    pub fn storage_key(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}{}", self.storage_prefix_in(namespace), name)
    }
}

/// The verbs every resource supports.
pub const RESOURCE_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

use Subresource::*;

macro_rules! resources {
    ($( $group:literal $version:literal $kind:literal $plural:literal $singular:literal
        [$($short:literal),*] [$($cat:literal),*] $namespaced:literal [$($sub:ident),*] $storage:literal ;)*) => {
        /// Every resource krust serves, grouped by API group in discovery order.
        pub static RESOURCES: &[ResourceInfo] = &[
            $(ResourceInfo {
                group: $group,
                version: $version,
                kind: $kind,
                plural: $plural,
                singular: $singular,
                short_names: &[$($short),*],
                categories: &[$($cat),*],
                namespaced: $namespaced,
                subresources: &[$($sub),*],
                storage: $storage,
            },)*
        ];
    };
}

resources! {
    "" "v1" "Binding" "bindings" "binding" [] [] true [] "bindings";
    "" "v1" "ComponentStatus" "componentstatuses" "componentstatus" ["cs"] [] false [] "";
    "" "v1" "ConfigMap" "configmaps" "configmap" ["cm"] [] true [] "configmaps";
    "" "v1" "Endpoints" "endpoints" "endpoints" ["ep"] [] true [] "services/endpoints";
    "" "v1" "Event" "events" "event" ["ev"] [] true [] "events";
    "" "v1" "LimitRange" "limitranges" "limitrange" ["limits"] [] true [] "limitranges";
    "" "v1" "Namespace" "namespaces" "namespace" ["ns"] [] false [Status] "namespaces";
    "" "v1" "Node" "nodes" "node" ["no"] [] false [Status] "minions";
    "" "v1" "PersistentVolumeClaim" "persistentvolumeclaims" "persistentvolumeclaim" ["pvc"] [] true [Status] "persistentvolumeclaims";
    "" "v1" "PersistentVolume" "persistentvolumes" "persistentvolume" ["pv"] [] false [Status] "persistentvolumes";
    "" "v1" "Pod" "pods" "pod" ["po"] ["all"] true [Status, Binding, Eviction, EphemeralContainers, Log, Exec, Attach, PortForward] "pods";
    "" "v1" "PodTemplate" "podtemplates" "podtemplate" [] [] true [] "podtemplates";
    "" "v1" "ReplicationController" "replicationcontrollers" "replicationcontroller" ["rc"] ["all"] true [Status, Scale] "controllers";
    "" "v1" "ResourceQuota" "resourcequotas" "resourcequota" ["quota"] [] true [Status] "resourcequotas";
    "" "v1" "Secret" "secrets" "secret" [] [] true [] "secrets";
    "" "v1" "ServiceAccount" "serviceaccounts" "serviceaccount" ["sa"] [] true [Token] "serviceaccounts";
    "" "v1" "Service" "services" "service" ["svc"] ["all"] true [Status] "services/specs";
    "apps" "v1" "ControllerRevision" "controllerrevisions" "controllerrevision" [] [] true [] "controllerrevisions";
    "apps" "v1" "DaemonSet" "daemonsets" "daemonset" ["ds"] ["all"] true [Status] "daemonsets";
    "apps" "v1" "Deployment" "deployments" "deployment" ["deploy"] ["all"] true [Status, Scale] "deployments";
    "apps" "v1" "ReplicaSet" "replicasets" "replicaset" ["rs"] ["all"] true [Status, Scale] "replicasets";
    "apps" "v1" "StatefulSet" "statefulsets" "statefulset" ["sts"] ["all"] true [Status, Scale] "statefulsets";
    "admissionregistration.k8s.io" "v1" "MutatingWebhookConfiguration" "mutatingwebhookconfigurations" "mutatingwebhookconfiguration" [] ["api-extensions"] false [] "mutatingwebhookconfigurations";
    "admissionregistration.k8s.io" "v1" "ValidatingWebhookConfiguration" "validatingwebhookconfigurations" "validatingwebhookconfiguration" [] ["api-extensions"] false [] "validatingwebhookconfigurations";
    "admissionregistration.k8s.io" "v1" "ValidatingAdmissionPolicy" "validatingadmissionpolicies" "validatingadmissionpolicy" [] ["api-extensions"] false [Status] "validatingadmissionpolicies";
    "admissionregistration.k8s.io" "v1" "ValidatingAdmissionPolicyBinding" "validatingadmissionpolicybindings" "validatingadmissionpolicybinding" [] ["api-extensions"] false [] "validatingadmissionpolicybindings";
    "apiextensions.k8s.io" "v1" "CustomResourceDefinition" "customresourcedefinitions" "customresourcedefinition" ["crd", "crds"] ["api-extensions"] false [Status] "apiextensions.k8s.io/customresourcedefinitions";
    "apiregistration.k8s.io" "v1" "APIService" "apiservices" "apiservice" [] ["api-extensions"] false [Status] "apiregistration.k8s.io/apiservices";
    "authentication.k8s.io" "v1" "SelfSubjectReview" "selfsubjectreviews" "selfsubjectreview" [] [] false [] "";
    "authentication.k8s.io" "v1" "TokenReview" "tokenreviews" "tokenreview" [] [] false [] "";
    "authorization.k8s.io" "v1" "LocalSubjectAccessReview" "localsubjectaccessreviews" "localsubjectaccessreview" [] [] true [] "";
    "authorization.k8s.io" "v1" "SelfSubjectAccessReview" "selfsubjectaccessreviews" "selfsubjectaccessreview" [] [] false [] "";
    "authorization.k8s.io" "v1" "SelfSubjectRulesReview" "selfsubjectrulesreviews" "selfsubjectrulesreview" [] [] false [] "";
    "authorization.k8s.io" "v1" "SubjectAccessReview" "subjectaccessreviews" "subjectaccessreview" [] [] false [] "";
    "autoscaling" "v2" "HorizontalPodAutoscaler" "horizontalpodautoscalers" "horizontalpodautoscaler" ["hpa"] ["all"] true [Status] "horizontalpodautoscalers";
    "autoscaling" "v1" "HorizontalPodAutoscaler" "horizontalpodautoscalers" "horizontalpodautoscaler" ["hpa"] ["all"] true [Status] "horizontalpodautoscalers";
    "batch" "v1" "CronJob" "cronjobs" "cronjob" ["cj"] ["all"] true [Status] "cronjobs";
    "batch" "v1" "Job" "jobs" "job" [] ["all"] true [Status] "jobs";
    "certificates.k8s.io" "v1" "CertificateSigningRequest" "certificatesigningrequests" "certificatesigningrequest" ["csr"] [] false [Status, Approval] "certificatesigningrequests";
    "coordination.k8s.io" "v1" "Lease" "leases" "lease" [] [] true [] "leases";
    "discovery.k8s.io" "v1" "EndpointSlice" "endpointslices" "endpointslice" [] [] true [] "endpointslices";
    "events.k8s.io" "v1" "Event" "events" "event" ["ev"] [] true [] "events";
    "metrics.k8s.io" "v1beta1" "NodeMetrics" "nodes" "nodemetrics" [] [] false [] "";
    "metrics.k8s.io" "v1beta1" "PodMetrics" "pods" "podmetrics" [] [] true [] "";
    "networking.k8s.io" "v1" "IngressClass" "ingressclasses" "ingressclass" [] [] false [] "ingressclasses";
    "networking.k8s.io" "v1" "Ingress" "ingresses" "ingress" ["ing"] [] true [Status] "ingress";
    "networking.k8s.io" "v1" "NetworkPolicy" "networkpolicies" "networkpolicy" ["netpol"] [] true [] "networkpolicies";
    "node.k8s.io" "v1" "RuntimeClass" "runtimeclasses" "runtimeclass" [] [] false [] "runtimeclasses";
    "policy" "v1" "PodDisruptionBudget" "poddisruptionbudgets" "poddisruptionbudget" ["pdb"] [] true [Status] "poddisruptionbudgets";
    "rbac.authorization.k8s.io" "v1" "ClusterRoleBinding" "clusterrolebindings" "clusterrolebinding" [] [] false [] "clusterrolebindings";
    "rbac.authorization.k8s.io" "v1" "ClusterRole" "clusterroles" "clusterrole" [] [] false [] "clusterroles";
    "rbac.authorization.k8s.io" "v1" "RoleBinding" "rolebindings" "rolebinding" [] [] true [] "rolebindings";
    "rbac.authorization.k8s.io" "v1" "Role" "roles" "role" [] [] true [] "roles";
    "scheduling.k8s.io" "v1" "PriorityClass" "priorityclasses" "priorityclass" ["pc"] [] false [] "priorityclasses";
    "storage.k8s.io" "v1" "CSIDriver" "csidrivers" "csidriver" [] [] false [] "csidrivers";
    "storage.k8s.io" "v1" "CSINode" "csinodes" "csinode" [] [] false [] "csinodes";
    "storage.k8s.io" "v1" "CSIStorageCapacity" "csistoragecapacities" "csistoragecapacity" [] [] true [] "csistoragecapacities";
    "storage.k8s.io" "v1" "StorageClass" "storageclasses" "storageclass" ["sc"] [] false [] "storageclasses";
    "storage.k8s.io" "v1" "VolumeAttachment" "volumeattachments" "volumeattachment" [] [] false [Status] "volumeattachments";
}

/// Looks up a resource by group, version and plural name.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Looks up a resource by group, version and kind.
pub fn find_kind(group: &str, version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.kind == kind)
}

/// The API groups in discovery order (the legacy core group "" first), each with its
/// versions.
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    groups_of(RESOURCES.iter())
}

/// The groups of some resources, each with its versions, in the order they first appear.
pub fn groups_of<'a>(
    resources: impl Iterator<Item = &'a ResourceInfo>,
) -> Vec<(&'a str, Vec<&'a str>)> {
    let mut out: Vec<(&'a str, Vec<&'a str>)> = Vec::new();
    for r in resources {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) if !versions.contains(&r.version) => versions.push(r.version),
            Some(_) => {}
            None => out.push((r.group, vec![r.version])),
        }
    }
    out
}

/// Orders Kubernetes version names as upstream does: GA before beta before alpha, higher
/// numbers first, names that are not Kubernetes versions last and alphabetically.
pub fn version_priority(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(v: &str) -> (u8, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>, String) {
        let parsed = v.strip_prefix('v').and_then(|rest| {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let major: u64 = rest[..digits].parse().ok()?;
            let tail = &rest[digits..];
            let (stage, minor) = if tail.is_empty() {
                (0, "0")
            } else if let Some(m) = tail.strip_prefix("beta") {
                (1, m)
            } else if let Some(m) = tail.strip_prefix("alpha") {
                (2, m)
            } else {
                return None;
            };
            let minor: u64 = if minor.is_empty() {
                0
            } else {
                minor.parse().ok()?
            };
            Some((stage, major, minor))
        });
        match parsed {
            Some((stage, major, minor)) => (
                stage,
                std::cmp::Reverse(major),
                std::cmp::Reverse(minor),
                String::new(),
            ),
            None => (3, std::cmp::Reverse(0), std::cmp::Reverse(0), v.to_string()),
        }
    }
    key(a).cmp(&key(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_keys_follow_upstream_layout() {
        let pods = find("", "v1", "pods").unwrap();
        assert_eq!(
            pods.storage_key(Some("default"), "web"),
            "/registry/pods/default/web"
        );
        let nodes = find_kind("", "v1", "Node").unwrap();
        assert_eq!(nodes.storage_key(None, "n1"), "/registry/minions/n1");
        let deploy = find("apps", "v1", "deployments").unwrap();
        assert_eq!(deploy.qualified_plural(), "deployments.apps");
        assert_eq!(deploy.api_version(), "apps/v1");
        assert!(deploy.has_subresource(Subresource::Scale));
        assert!(find("apps", "v1", "pods").is_none());
    }

    #[test]
    fn plural_names_are_unique_per_group_version() {
        for (i, a) in RESOURCES.iter().enumerate() {
            for b in &RESOURCES[i + 1..] {
                assert!(
                    !(a.group == b.group && a.version == b.version && a.plural == b.plural),
                    "{} duplicated",
                    a.plural
                );
            }
        }
    }

    #[test]
    fn versions_sort_as_upstream_prefers_them() {
        let mut v = vec![
            "v1alpha1", "foo", "v1beta2", "v2", "v1", "v1beta1", "v10", "bar",
        ];
        v.sort_by(|a, b| version_priority(a, b));
        assert_eq!(
            v,
            [
                "v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "bar", "foo"
            ]
        );
    }

    #[test]
    fn groups_start_with_core() {
        let groups = groups();
        assert_eq!(groups[0], ("", vec!["v1"]));
        assert!(groups.iter().any(|(g, _)| *g == "apps"));
    }
}
