//! Image pulls of a pod worker: the pull policy decided in the kubelet (the image's
//! status first), the credentials of the pod's pull secrets tried in the keyring's
//! order, ErrImagePull then ImagePullBackOff with the container's back-off, and the
//! Pulling/Pulled/Failed events.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use krust_client::events::EventType;
use krust_cri::api::{AuthConfig, ImageSpec, ImageStatusRequest, PullImageRequest};
use kube::ResourceExt;
use kube::api::Api;

use super::Worker;
use crate::keyring::Keyring;
use crate::rpc_error;

impl Worker {
    /// `IfNotPresent` (the default for tagged images), `Always` (the default for
    /// `:latest` and untagged) and `Never`, decided here: containerd's PullImage would
    /// contact the registry even for an image it has.
    pub(super) async fn ensure_image(
        &mut self,
        pod: &Pod,
        container: &Container,
    ) -> Result<(), (String, String)> {
        let image = container.image.clone().unwrap_or_default();
        let tagged = image
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
            || image.contains('@');
        let latest = !tagged || image.ends_with(":latest");
        let policy = container
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| if latest { "Always" } else { "IfNotPresent" }.into());
        let spec = ImageSpec {
            image: image.clone(),
            ..ImageSpec::default()
        };
        let mut images = self.runtime.images.clone();
        let present = images
            .image_status(ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            })
            .await
            .map(|r| r.into_inner().image.is_some())
            .unwrap_or(false);
        match policy.as_str() {
            "Never" if present => return Ok(()),
            "Never" => {
                return Err((
                    "ErrImageNeverPull".into(),
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                ));
            }
            "IfNotPresent" if present => return self.already_present(pod, &image),
            _ => {}
        }
        let now = Instant::now();
        if self
            .pulls
            .entry(image.clone())
            .or_default()
            .waiting(now)
            .is_some()
        {
            return Err((
                "ImagePullBackOff".into(),
                format!("Back-off pulling image \"{image}\""),
            ));
        }
        self.event(
            pod,
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        // One pull at a time unless the node allows more (upstream's serialized puller).
        let _turn = match &self.pull_slots {
            Some(slots) => Some(slots.clone().acquire_owned().await),
            None => None,
        };
        let pulling = Instant::now();
        let (keyring, unreadable) = Keyring::from_secrets(&self.pull_secrets(pod).await);
        for why in unreadable {
            tracing::warn!(pod = %pod.name_any(), error = %why, "a pull secret is unusable");
        }
        // Each matching credential in turn; without any, an anonymous pull.
        let credentials = keyring.lookup(&image);
        let auths: Vec<Option<AuthConfig>> = if credentials.is_empty() {
            vec![None]
        } else {
            (credentials.into_iter())
                .map(|c| {
                    Some(AuthConfig {
                        username: c.username.clone(),
                        password: c.password.clone(),
                        ..AuthConfig::default()
                    })
                })
                .collect()
        };
        let mut failures = Vec::new();
        for auth in auths {
            let request = PullImageRequest {
                image: Some(spec.clone()),
                auth,
                ..PullImageRequest::default()
            };
            match images.pull_image(request).await {
                Ok(_) => {
                    self.pulls.remove(&image);
                    let took = pulling.elapsed().as_secs_f64();
                    self.event(
                        pod,
                        EventType::Normal,
                        "Pulled",
                        format!("Successfully pulled image \"{image}\" in {took:.3}s"),
                    );
                    return Ok(());
                }
                Err(status) => failures.push(rpc_error(&status)),
            }
        }
        // `Always` with the image already here: a registry we cannot reach does not
        // stop the container (upstream would fail; offline machines need this).
        if present {
            return self.already_present(pod, &image);
        }
        self.pulls.entry(image.clone()).or_default().fail(now);
        // Several credentials failed: all their errors, as Go's aggregate.
        let message = match failures.as_slice() {
            [one] => one.clone(),
            all => format!("[{}]", all.join(", ")),
        };
        self.event(
            pod,
            EventType::Warning,
            "Failed",
            format!("Failed to pull image \"{image}\": {message}"),
        );
        Err(("ErrImagePull".into(), message))
    }

    fn already_present(&self, pod: &Pod, image: &str) -> Result<(), (String, String)> {
        self.event(
            pod,
            EventType::Normal,
            "Pulled",
            format!("Container image \"{image}\" already present on machine"),
        );
        Ok(())
    }

    /// The pod's pull secrets that can be read; the others are named in a warning
    /// event, and the pull goes on without them, as upstream's kubelet does.
    async fn pull_secrets(&self, pod: &Pod) -> Vec<Secret> {
        let names = (pod.spec.iter())
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone());
        let api: Api<Secret> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for name in names {
            match api.get_opt(&name).await {
                Ok(Some(secret)) => found.push(secret),
                _ => missing.push(name),
            }
        }
        if !missing.is_empty() {
            self.event(
                pod,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        found
    }
}
