//! A container's Linux security settings from its own and its pod's securityContext,
//! as upstream's kubelet derives them: user and group (the container's win over the
//! pod's), supplemental groups plus fsGroup, privileged, capabilities to add and drop,
//! a read-only root filesystem, and no_new_privs for `allowPrivilegeEscalation: false`;
//! `runAsNonRoot` checked against the user the container will run as.

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use krust_cri::api::{Capability, Int64Value, LinuxContainerSecurityContext};
use kube::ResourceExt;

fn contexts<'a>(
    pod: &'a Pod,
    container: &'a Container,
) -> (Option<&'a PodSecurityContext>, Option<&'a SecurityContext>) {
    (
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref()),
        container.security_context.as_ref(),
    )
}

fn run_as_user(pod: &Pod, container: &Container) -> Option<i64> {
    let (p, c) = contexts(pod, container);
    c.and_then(|c| c.run_as_user)
        .or_else(|| p.and_then(|p| p.run_as_user))
}

pub fn privileged(container: &Container) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|c| c.privileged)
        .unwrap_or(false)
}

/// The CRI security context of one container.
pub fn linux(pod: &Pod, container: &Container) -> LinuxContainerSecurityContext {
    let (p, c) = contexts(pod, container);
    let run_as_group = c
        .and_then(|c| c.run_as_group)
        .or_else(|| p.and_then(|p| p.run_as_group));
    let mut groups: Vec<i64> = p
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default();
    groups.extend(p.and_then(|p| p.fs_group));
    let privileged = privileged(container);
    LinuxContainerSecurityContext {
        capabilities: c
            .and_then(|c| c.capabilities.as_ref())
            .map(|caps| Capability {
                add_capabilities: caps.add.clone().unwrap_or_default(),
                drop_capabilities: caps.drop.clone().unwrap_or_default(),
                ..Capability::default()
            }),
        privileged,
        run_as_user: run_as_user(pod, container).map(|value| Int64Value { value }),
        run_as_group: run_as_group.map(|value| Int64Value { value }),
        readonly_rootfs: c.and_then(|c| c.read_only_root_filesystem).unwrap_or(false),
        supplemental_groups: groups,
        no_new_privs: !privileged && c.and_then(|c| c.allow_privilege_escalation) == Some(false),
        ..LinuxContainerSecurityContext::default()
    }
}

/// Whether the container or its pod asks for `runAsNonRoot`.
pub fn non_root_required(pod: &Pod, container: &Container) -> bool {
    let (p, c) = contexts(pod, container);
    c.and_then(|c| c.run_as_non_root)
        .or_else(|| p.and_then(|p| p.run_as_non_root))
        .unwrap_or(false)
}

/// With `runAsNonRoot`, the container must not run as root: its runAsUser, else the
/// image's user (`image_uid`, or `image_user` when the image names a user by name).
/// The error is upstream's CreateContainerConfigError message.
pub fn verify_non_root(
    pod: &Pod,
    container: &Container,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), String> {
    if !non_root_required(pod, container) {
        return Ok(());
    }
    let pod_name = pod.name_any();
    let name = &container.name;
    match run_as_user(pod, container) {
        Some(0) => Err(format!(
            "container's runAsUser breaks non-root policy (pod: \"{pod_name}\", container: {name})"
        )),
        Some(_) => Ok(()),
        None => match image_uid {
            Some(0) => Err(format!(
                "container has runAsNonRoot and image will run as root (pod: \"{pod_name}\", container: {name})"
            )),
            Some(_) => Ok(()),
            None if !image_user.is_empty() => Err(format!(
                "container has runAsNonRoot and image has non-numeric user ({image_user}), cannot verify user is non-root (pod: \"{pod_name}\", container: {name})"
            )),
            None => Err(format!(
                "container has runAsNonRoot and image will run as root (pod: \"{pod_name}\", container: {name})"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::{from_value, json};

    fn pod(pod_sc: k8s_openapi::serde_json::Value, sc: k8s_openapi::serde_json::Value) -> Pod {
        from_value(json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": pod_sc,
            "containers": [{"name": "c", "securityContext": sc}]}}))
        .unwrap()
    }

    #[test]
    fn container_settings_win_over_the_pods() {
        let p = pod(
            json!({"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000]}),
            json!({"runAsUser": 1001, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                   "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}),
        );
        let c = &p.spec.as_ref().unwrap().containers[0];
        let sc = linux(&p, c);
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1001));
        assert_eq!(sc.run_as_group.map(|v| v.value), Some(3000));
        assert_eq!(sc.supplemental_groups, [4000, 2000]);
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".into()], vec!["ALL".into()])
        );
    }

    #[test]
    fn run_as_non_root_as_upstream_checks_it() {
        let explicit_root = pod(json!({"runAsNonRoot": true}), json!({"runAsUser": 0}));
        let c = &explicit_root.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            verify_non_root(&explicit_root, c, Some(1000), "").unwrap_err(),
            "container's runAsUser breaks non-root policy (pod: \"p\", container: c)"
        );
        let image_root = pod(json!({"runAsNonRoot": true}), json!({}));
        let c = &image_root.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            verify_non_root(&image_root, c, Some(0), "").unwrap_err(),
            "container has runAsNonRoot and image will run as root (pod: \"p\", container: c)"
        );
        assert!(verify_non_root(&image_root, c, Some(65534), "").is_ok());
        assert!(
            verify_non_root(&image_root, c, None, "nobody")
                .unwrap_err()
                .contains("non-numeric user (nobody)")
        );
        let allowed = pod(json!({"runAsNonRoot": true, "runAsUser": 1000}), json!({}));
        let c = &allowed.spec.as_ref().unwrap().containers[0];
        assert!(verify_non_root(&allowed, c, Some(0), "").is_ok());
    }
}
