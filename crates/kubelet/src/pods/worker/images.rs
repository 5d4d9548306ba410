//! Image pulls of a pod worker: the pull policy decided in the kubelet (the image's
//! status first), the credentials of the pod's pull secrets tried in the keyring's
//! order, ErrImagePull then ImagePullBackOff with the container's back-off, and the
//! Pulling/Pulled/Failed events.
//!
//! A new pod's missing images start pulling while its sandbox is made (upstream pulls
//! only once the sandbox is up): a cold start then costs the pull, not the pull plus
//! the sandbox. The container start waits for that pull rather than making its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use krust_client::events::{EventRecorder, EventType};
use krust_cri::api::{AuthConfig, ImageSpec, ImageStatusRequest, PullImageRequest};
use krust_cri::client::ImageClient;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::Worker;
use crate::keyring::Keyring;
use crate::rpc_error;

/// What a pull came to: how long it took, or the error to report.
type Pulled = Result<Duration, String>;

/// What was learned of an image before the sandbox was made, for the container start
/// to use instead of asking again.
pub(super) enum Early {
    /// The node has it.
    Present,
    /// It was missing: its pull.
    Pulling(JoinHandle<Pulled>),
}

/// The images of a new pod as seen before its sandbox was made.
pub(super) type Prefetched = std::collections::HashMap<String, Early>;

/// The pull policy of a container: `IfNotPresent` for tagged images, `Always` for
/// `:latest` and untagged ones, unless it names one.
fn policy(container: &Container) -> String {
    let image = container.image.as_deref().unwrap_or_default();
    let tagged = image
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':'))
        || image.contains('@');
    let latest = !tagged || image.ends_with(":latest");
    container
        .image_pull_policy
        .clone()
        .unwrap_or_else(|| if latest { "Always" } else { "IfNotPresent" }.into())
}

fn spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_string(),
        ..ImageSpec::default()
    }
}

/// Everything a pull needs, owned, so that it can run in a task of its own.
struct Pull {
    images: ImageClient,
    client: Client,
    events: EventRecorder,
    slots: Option<Arc<Semaphore>>,
    pod: Pod,
    image: String,
}

impl Pull {
    /// Pulls with each matching credential in turn (anonymously without any), with
    /// the Pulling and Failed events; one pull at a time when the node says so.
    async fn run(mut self) -> Pulled {
        // One pull at a time unless the node allows more (upstream's serialized puller).
        let _turn = match &self.slots {
            Some(slots) => Some(slots.clone().acquire_owned().await),
            None => None,
        };
        let image = self.image.clone();
        self.event(
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        let pulling = Instant::now();
        let (keyring, unreadable) = Keyring::from_secrets(&self.secrets().await);
        for why in unreadable {
            tracing::warn!(pod = %self.pod.name_any(), error = %why, "a pull secret is unusable");
        }
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
                image: Some(spec(&image)),
                auth,
                ..PullImageRequest::default()
            };
            match self.images.pull_image(request).await {
                Ok(_) => return Ok(pulling.elapsed()),
                Err(status) => failures.push(rpc_error(&status)),
            }
        }
        // Several credentials failed: all their errors, as Go's aggregate.
        let message = match failures.as_slice() {
            [one] => one.clone(),
            all => format!("[{}]", all.join(", ")),
        };
        self.event(
            EventType::Warning,
            "Failed",
            format!("Failed to pull image \"{image}\": {message}"),
        );
        Err(message)
    }

    fn event(&self, kind: EventType, reason: &str, message: String) {
        self.events.record(&self.pod, kind, reason, message);
    }

    /// The pod's pull secrets that can be read; the others are named in a warning
    /// event, and the pull goes on without them, as upstream's kubelet does.
    async fn secrets(&self) -> Vec<Secret> {
        let names: Vec<String> = (self.pod.spec.iter())
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone())
            .collect();
        let api: Api<Secret> = Api::namespaced(
            self.client.clone(),
            &self.pod.namespace().unwrap_or_default(),
        );
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for name in names {
            match api.get_opt(&name).await {
                Ok(Some(secret)) => found.push(secret),
                _ => missing.push(name),
            }
        }
        if !missing.is_empty() {
            self.event(
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

impl Worker {
    fn pull(&self, pod: &Pod, image: &str) -> Pull {
        Pull {
            images: self.runtime.images.clone(),
            client: self.client.clone(),
            events: self.events.clone(),
            slots: self.pull_slots.clone(),
            pod: pod.clone(),
            image: image.to_string(),
        }
    }

    async fn present(&self, image: &str) -> bool {
        let mut images = self.runtime.images.clone();
        images
            .image_status(ImageStatusRequest {
                image: Some(spec(image)),
                verbose: false,
            })
            .await
            .map(|r| r.into_inner().image.is_some())
            .unwrap_or(false)
    }

    /// Starts pulling the images of `pod`'s containers that the node lacks and may
    /// pull (not `Never`, not backing off), each once, and notes those it has.
    pub(super) async fn prefetch(&mut self, pod: &Pod) {
        let wanted: Vec<String> = (pod.spec.iter())
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .filter(|c| policy(c) != "Never")
            .map(|c| c.image.clone().unwrap_or_default())
            .collect();
        let now = Instant::now();
        for image in wanted {
            if self.prefetched.contains_key(&image)
                || self
                    .pulls
                    .get(&image)
                    .is_some_and(|b| b.waiting(now).is_some())
            {
                continue;
            }
            let early = if self.present(&image).await {
                Early::Present
            } else {
                Early::Pulling(tokio::spawn(self.pull(pod, &image).run()))
            };
            self.prefetched.insert(image, early);
        }
    }

    /// `IfNotPresent` (the default for tagged images), `Always` (the default for
    /// `:latest` and untagged) and `Never`, decided here: containerd's PullImage would
    /// contact the registry even for an image it has.
    pub(super) async fn ensure_image(
        &mut self,
        pod: &Pod,
        container: &Container,
    ) -> Result<(), (String, String)> {
        let image = container.image.clone().unwrap_or_default();
        let early = self.prefetched.remove(&image);
        let present = match &early {
            Some(Early::Present) => true,
            Some(Early::Pulling(_)) => false,
            None => self.present(&image).await,
        };
        match policy(container).as_str() {
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
        let pulling = match early {
            Some(Early::Pulling(task)) => Some(task),
            _ => None,
        };
        if pulling.is_none()
            && self
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
        let pulled = match pulling {
            Some(task) => task
                .await
                .unwrap_or_else(|err| Err(format!("the pull failed: {err}"))),
            None => self.pull(pod, &image).run().await,
        };
        match pulled {
            Ok(took) => {
                self.pulls.remove(&image);
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image \"{image}\" in {:.3}s",
                        took.as_secs_f64()
                    ),
                );
                Ok(())
            }
            // `Always` with the image already here: a registry we cannot reach does not
            // stop the container (upstream would fail; offline machines need this).
            Err(_) if present => self.already_present(pod, &image),
            Err(message) => {
                self.pulls.entry(image.clone()).or_default().fail(now);
                Err(("ErrImagePull".into(), message))
            }
        }
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
}
