//! The node's images, as upstream's image manager keeps them: the list
//! `node.status.images` reports (the 50 largest, up to 5 names each), and garbage
//! collection by upstream's policy — when the image filesystem is more than
//! `--image-gc-high-threshold` percent used, the least recently used images no
//! container uses, older than `--image-minimum-gc-age`, are removed until usage is at
//! `--image-gc-low-threshold`; `FreeDiskSpaceFailed` and `ImageGCFailed` events when
//! that is not enough. The eviction manager reclaims every unused image the same way
//! before it evicts a pod for disk pressure. Pinned images (the runtime's pinned flag,
//! the sandbox and built-in images, those imported from air-gap bundles) are never
//! removed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use krust_api::sync::UnpoisonedRw;
use krust_client::events::{EventRecorder, EventType};
use krust_cri::Runtime;
use krust_cri::api::{
    Image, ImageSpec, ListContainersRequest, ListImagesRequest, RemoveImageRequest,
};
use serde_json::{Value, json};
use tokio::sync::{Mutex, watch};

use crate::Config;
use crate::machine::filesystem;

/// Upstream's nodeStatusMaxImages and maxNamesPerImageInNodeStatus.
const MAX_IMAGES_IN_STATUS: usize = 50;
const MAX_NAMES_PER_IMAGE: usize = 5;

/// Upstream's image GC flags.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Percent of the image filesystem used above which images are collected.
    pub high_threshold: u8,
    /// Percent used that collection brings usage down to.
    pub low_threshold: u8,
    /// Images younger than this are never collected.
    pub minimum_age: Duration,
    /// How often usage is checked (upstream: every 5 minutes).
    pub interval: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            high_threshold: 85,
            low_threshold: 80,
            minimum_age: Duration::from_secs(120),
            interval: Duration::from_secs(300),
        }
    }
}

/// Image names that are never collected (the agent adds those it imports).
#[derive(Clone, Debug, Default)]
pub struct Pinned(Arc<RwLock<HashSet<String>>>);

impl Pinned {
    pub fn add(&self, names: impl IntoIterator<Item = String>) {
        self.0.write_locked().extend(names);
    }

    fn covers(&self, image: &Image) -> bool {
        let pinned = self.0.read_locked();
        image.pinned || image.repo_tags.iter().any(|t| pinned.contains(t))
    }
}

/// What the manager knows of an image.
struct Record {
    first_detected: Instant,
    last_used: Instant,
}

/// The images of the node and their collection; shared by the status reporter, the
/// collector and the eviction manager.
#[derive(Clone)]
pub struct Images {
    inner: Arc<Mutex<Inner>>,
    status: watch::Sender<Value>,
}

struct Inner {
    runtime: Runtime,
    pinned: Pinned,
    records: HashMap<String, Record>,
}

impl Images {
    pub fn new(runtime: Runtime, pinned: Pinned) -> (Images, watch::Receiver<Value>) {
        let (status, receiver) = watch::channel(Value::Array(Vec::new()));
        let inner = Inner {
            runtime,
            pinned,
            records: HashMap::new(),
        };
        let images = Images {
            inner: Arc::new(Mutex::new(inner)),
            status,
        };
        (images, receiver)
    }

    /// Refreshes the list every `refresh` and collects by `policy`; never returns.
    pub async fn run(self, config: Arc<Config>, events: EventRecorder, refresh: Duration) {
        // Upstream's node reference carries the node's name as its UID.
        let node = Node {
            metadata: ObjectMeta {
                name: Some(config.node_name.clone()),
                uid: Some(config.node_name.clone()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let mut refreshing = tokio::time::interval(refresh);
        let mut collecting = tokio::time::interval(config.image_gc.interval);
        collecting.tick().await;
        // Upstream reports a failed collection only when the one before failed too.
        let mut failed_before = false;
        loop {
            tokio::select! {
                _ = refreshing.tick() => {
                    if let Err(err) = self.inner.lock().await.detect(&self.status).await {
                        tracing::warn!(error = %err, "listing images failed");
                    }
                }
                _ = collecting.tick() => {
                    match self.collect(&config, &events, &node).await {
                        Ok(()) => failed_before = false,
                        Err(err) => {
                            tracing::warn!(error = %err, "image garbage collection failed");
                            if failed_before {
                                events.record(&node, EventType::Warning, "ImageGCFailed", err);
                            }
                            failed_before = true;
                        }
                    }
                }
            }
        }
    }

    /// One collection by the policy's thresholds.
    async fn collect(
        &self,
        config: &Config,
        events: &EventRecorder,
        node: &Node,
    ) -> Result<(), String> {
        let policy = config.image_gc;
        let fs = filesystem(&config.image_fs).ok_or("the image filesystem cannot be measured")?;
        if fs.bytes == 0 {
            return Ok(());
        }
        let used_percent = 100 - fs.bytes_available * 100 / fs.bytes;
        if used_percent < u64::from(policy.high_threshold) {
            return Ok(());
        }
        let goal = fs.bytes * (100 - u64::from(policy.low_threshold)) / 100;
        let to_free = goal.saturating_sub(fs.bytes_available);
        tracing::info!(
            used_percent,
            high = policy.high_threshold,
            to_free,
            "image filesystem over the high threshold; collecting images"
        );
        let freed = self.free(to_free, Some(policy.minimum_age)).await?;
        if freed < to_free {
            let message = format!(
                "Failed to garbage collect required amount of images. Attempted to free {to_free} bytes, but only found {freed} bytes eligible to free."
            );
            events.record(
                node,
                EventType::Warning,
                "FreeDiskSpaceFailed",
                message.clone(),
            );
            return Err(message);
        }
        Ok(())
    }

    /// Removes unused images, least recently used first, until `bytes` are freed;
    /// with `minimum_age`, only images detected at least that long ago. The bytes freed.
    pub async fn free(&self, bytes: u64, minimum_age: Option<Duration>) -> Result<u64, String> {
        let mut inner = self.inner.lock().await;
        let (images, in_use) = inner
            .detect(&self.status)
            .await
            .map_err(|e| crate::rpc_error(&e))?;
        let now = Instant::now();
        let mut candidates: Vec<&Image> = (images.iter())
            .filter(|i| !in_use.contains(&i.id) && !inner.pinned.covers(i))
            .filter(|i| {
                let record = &inner.records[&i.id];
                minimum_age.is_none_or(|age| now.duration_since(record.first_detected) >= age)
            })
            .collect();
        candidates.sort_by_key(|i| {
            let record = &inner.records[&i.id];
            (record.last_used, record.first_detected)
        });
        let mut freed = 0;
        let mut removed = Vec::new();
        for image in candidates {
            if freed >= bytes {
                break;
            }
            let request = RemoveImageRequest {
                image: Some(ImageSpec {
                    image: image.id.clone(),
                    ..ImageSpec::default()
                }),
            };
            match inner.runtime.images.remove_image(request).await {
                Ok(_) => {
                    tracing::info!(image = %image.id, tags = ?image.repo_tags, size = image.size, "image removed");
                    freed += image.size;
                    removed.push(image.id.clone());
                }
                Err(err) => {
                    tracing::warn!(image = %image.id, error = %crate::rpc_error(&err), "removing an image failed")
                }
            }
        }
        for id in &removed {
            inner.records.remove(id);
        }
        if !removed.is_empty() {
            inner
                .detect(&self.status)
                .await
                .map_err(|e| crate::rpc_error(&e))?;
        }
        Ok(freed)
    }
}

impl Inner {
    /// Lists the images and the ones containers use, updates the records (first
    /// seen; last used: now, for those in use) and publishes the status list.
    async fn detect(
        &mut self,
        status: &watch::Sender<Value>,
    ) -> Result<(Vec<Image>, HashSet<String>), tonic::Status> {
        let images = (self.runtime.images)
            .list_images(ListImagesRequest { filter: None })
            .await?
            .into_inner()
            .images;
        let containers = (self.runtime.runtime)
            .list_containers(ListContainersRequest { filter: None })
            .await?
            .into_inner()
            .containers;
        let in_use: HashSet<String> = containers
            .iter()
            .flat_map(|c| {
                [
                    c.image_ref.clone(),
                    c.image
                        .as_ref()
                        .map(|i| i.image.clone())
                        .unwrap_or_default(),
                ]
            })
            .collect();
        let now = Instant::now();
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for image in &images {
            let record = self.records.entry(image.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: now,
            });
            if in_use.contains(&image.id) {
                record.last_used = now;
            }
        }
        status.send_if_modified(|current| {
            let fresh = node_images(&images);
            let changed = *current != fresh;
            *current = fresh;
            changed
        });
        Ok((images, in_use))
    }
}

/// `node.status.images`: the largest first, as upstream lists them.
fn node_images(images: &[Image]) -> Value {
    let mut sorted: Vec<&Image> = images.iter().collect();
    sorted.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    let listed: Vec<Value> = sorted
        .into_iter()
        .take(MAX_IMAGES_IN_STATUS)
        .map(|i| {
            let names: Vec<&String> = (i.repo_tags.iter())
                .chain(&i.repo_digests)
                .take(MAX_NAMES_PER_IMAGE)
                .collect();
            json!({"names": names, "sizeBytes": i.size})
        })
        .collect();
    Value::Array(listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64, tags: &[&str]) -> Image {
        Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            repo_digests: vec![format!("registry.example/{id}@sha256:{id}")],
            ..Image::default()
        }
    }

    #[test]
    fn the_status_lists_the_largest_images_with_at_most_five_names() {
        let mut images: Vec<Image> = (0..60)
            .map(|n| image(&format!("i{n:02}"), n, &["a"]))
            .collect();
        images.push(image("big", 1000, &["t1", "t2", "t3", "t4", "t5", "t6"]));
        let listed = node_images(&images);
        let listed = listed.as_array().unwrap();
        assert_eq!(listed.len(), 50);
        assert_eq!(
            listed[0],
            json!({"names": ["t1", "t2", "t3", "t4", "t5"], "sizeBytes": 1000})
        );
        assert_eq!(listed[1]["sizeBytes"], 59);
        assert_eq!(listed[49]["sizeBytes"], 11);
    }

    #[test]
    fn pinned_images_are_those_the_runtime_pins_or_krust_named() {
        let pinned = Pinned::default();
        pinned.add(["krust.local/pause:3.10".to_string()]);
        assert!(pinned.covers(&image("p", 1, &["krust.local/pause:3.10"])));
        assert!(!pinned.covers(&image("x", 1, &["docker.io/library/x:1"])));
        let runtime_pinned = Image {
            pinned: true,
            ..image("r", 1, &[])
        };
        assert!(pinned.covers(&runtime_pinned));
    }
}
