//! Image pulls of a pod worker: the pull policy decided in the kubelet (the image's
//! status first), ErrImagePull then ImagePullBackOff with the container's back-off,
//! and the Pulling/Pulled/Failed events.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod};
use krust_client::events::EventType;
use krust_cri::api::{ImageSpec, ImageStatusRequest, PullImageRequest};

use super::Worker;

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
            "IfNotPresent" if present => {
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                );
                return Ok(());
            }
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
        let pulling = Instant::now();
        match images
            .pull_image(PullImageRequest {
                image: Some(spec),
                ..PullImageRequest::default()
            })
            .await
        {
            Ok(_) => {
                self.pulls.remove(&image);
                let took = pulling.elapsed().as_secs_f64();
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {took:.3}s"),
                );
                Ok(())
            }
            // `Always` with the image already here: a registry we cannot reach does not
            // stop the container (upstream would fail; offline machines need this).
            Err(_) if present => {
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                );
                Ok(())
            }
            Err(err) => {
                self.pulls.entry(image.clone()).or_default().fail(now);
                Err((
                    "ErrImagePull".into(),
                    format!("failed to pull image \"{image}\": {}", err.message()),
                ))
            }
        }
    }
}
