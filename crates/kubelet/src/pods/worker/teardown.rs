//! Teardown of a pod worker: containers stopped within the grace period (preStop hook,
//! SIGTERM, SIGKILL), the sandbox stopped and removed, and the pod deleted for good
//! once nothing of it runs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use krust_client::events::EventType;
use krust_cri::api::{
    ContainerFilter, ContainerState, ListContainersRequest, ListPodSandboxRequest,
    PodSandboxFilter, RemovePodSandboxRequest, StopContainerRequest, StopPodSandboxRequest,
};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};

use super::super::{lifecycle, spec, volumes};
use super::{Worker, spec_container};

impl Worker {
    /// Stops one container: its preStop hook first (with `pod` known), within the
    /// grace period, then SIGTERM with what is left of it (at least 2 s), then SIGKILL.
    pub(super) async fn stop(&self, pod: Option<&Pod>, name: &str, id: &str, grace: i64) {
        let started = Instant::now();
        let pre_stop = pod.and_then(|p| spec_container(p, name)).and_then(|c| {
            let hook = c.lifecycle.as_ref()?.pre_stop.clone()?;
            Some((c, hook))
        });
        if let (Some(pod), Some((container, hook))) = (pod, pre_stop.as_ref()) {
            let ip = self.observed.pod_ip.clone().unwrap_or_default();
            let budget = Duration::from_secs(grace.max(0) as u64);
            let hooked = tokio::time::timeout(
                budget,
                lifecycle::run(&self.runtime, id, container, hook, &ip, budget),
            )
            .await
            .unwrap_or_else(|_| Err("the grace period ran out".into()));
            if let Err(message) = hooked {
                tracing::info!(pod = %pod.name_any(), container = name, %message, "preStop hook failed");
                self.event(
                    pod,
                    EventType::Warning,
                    "FailedPreStopHook",
                    "PreStopHook failed".into(),
                );
            }
        }
        let left = (grace - started.elapsed().as_secs() as i64).max(lifecycle::MIN_STOP_GRACE);
        let _ = self
            .runtime
            .runtime
            .clone()
            .stop_container(StopContainerRequest {
                container_id: id.to_string(),
                timeout: left,
            })
            .await;
    }

    /// Stops every container (SIGTERM, SIGKILL after `grace` seconds) and removes the
    /// sandbox. With `pod` unknown (deleted outright), finds the sandboxes by UID label.
    pub(super) async fn tear_down(&mut self, pod: Option<&Pod>, grace: i64) {
        let mut rt = self.runtime.runtime.clone();
        let mut sandboxes: Vec<String> = self.sandbox.iter().cloned().collect();
        if let Some(uid) = pod.and_then(|p| p.uid()) {
            let listed = rt
                .list_pod_sandbox(ListPodSandboxRequest {
                    filter: Some(PodSandboxFilter {
                        label_selector: HashMap::from([(spec::POD_UID.to_string(), uid)]),
                        ..PodSandboxFilter::default()
                    }),
                })
                .await
                .map(|r| r.into_inner().items)
                .unwrap_or_default();
            sandboxes.extend(listed.into_iter().map(|s| s.id));
        }
        sandboxes.sort();
        sandboxes.dedup();
        for sandbox in sandboxes {
            let containers = rt
                .list_containers(ListContainersRequest {
                    filter: Some(ContainerFilter {
                        pod_sandbox_id: sandbox.clone(),
                        ..ContainerFilter::default()
                    }),
                })
                .await
                .map(|r| r.into_inner().containers)
                .unwrap_or_default();
            let running = containers
                .into_iter()
                .filter(|c| c.state == ContainerState::ContainerRunning as i32);
            let this = &*self;
            let stops = running.map(|c| {
                let name = c.metadata.map(|m| m.name).unwrap_or_default();
                async move {
                    if let Some(pod) = pod {
                        this.event(
                            pod,
                            EventType::Normal,
                            "Killing",
                            format!("Stopping container {name}"),
                        );
                    }
                    this.stop(pod, &name, &c.id, grace).await;
                }
            });
            futures::future::join_all(stops).await;
            let _ = rt
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: sandbox.clone(),
                })
                .await;
            if let Err(err) = rt
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: sandbox.clone(),
                })
                .await
            {
                tracing::warn!(%sandbox, error = %err, "removing the pod sandbox failed");
            }
        }
        self.sandbox = None;
        self.changed_at = Instant::now();
        if let Some(pod) = pod {
            self.remove_pod_dir(&spec::pod_dir(&self.config, pod)).await;
        }
        self.volumes = None;
    }

    /// Unpublishes and unmounts the pod's volumes and removes its directory.
    pub(super) async fn remove_pod_dir(&self, dir: &std::path::Path) {
        crate::csi::publish::unpublish_all(&self.csi, &self.config.data_dir.join("pods"), dir)
            .await;
        volumes::unmount_all(dir);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The containers are gone: the pod object can go (grace period 0). Whether it is
    /// gone: a failed delete (the apiserver restarting, a connection the restart broke)
    /// is tried again by the next pass — no one else would ever finish the pod.
    pub(super) async fn delete_for_good(&self, pod: &Pod) -> bool {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => {
                tracing::info!(pod = %pod.name_any(), "pod terminated");
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
            Err(err) => {
                tracing::warn!(pod = %pod.name_any(), error = %err, "deleting the terminated pod failed; trying again");
                false
            }
        }
    }
}
