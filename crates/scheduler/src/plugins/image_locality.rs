//! ImageLocality: prefers nodes that already have the pod's images, weighted by
//! image size and damped by how many nodes have them (an image present on every
//! node does not distinguish any), so big images start faster without piling
//! pods onto the one node that happens to have them.

use crate::framework::{
    CycleState, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo, PreScorePlugin, ScorePlugin, Snapshot,
    Status,
};

pub const NAME: &str = "ImageLocality";

const MB: i64 = 1024 * 1024;
/// Below this total, image locality is not worth anything.
const MIN_THRESHOLD: i64 = 23 * MB;
/// Per container: beyond this, having the image does not score higher.
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

pub struct ImageLocality;

/// For each of the pod's containers (init ones included), its normalized image
/// name and on how many nodes it is present.
#[derive(Clone)]
struct PreScoreState {
    images: Vec<(String, usize)>,
    total_nodes: usize,
}

/// Adds `:latest` to an image reference without a tag, as the container
/// runtime would, so it matches the names nodes report.
fn normalized_image_name(name: &str) -> String {
    if name
        .rfind(':')
        .is_none_or(|colon| name.rfind('/').is_some_and(|slash| colon < slash))
    {
        format!("{name}:latest")
    } else {
        name.to_string()
    }
}

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreScorePlugin for ImageLocality {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        _nodes: &[&NodeInfo],
    ) -> Status {
        let Some(spec) = pod.pod.spec.as_ref() else {
            return Status::skip();
        };
        let images = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .map(|c| {
                let name = normalized_image_name(c.image.as_deref().unwrap_or(""));
                let count = snapshot.image_node_count(&name);
                (name, count)
            })
            .collect();
        state.write(PreScoreState {
            images,
            total_nodes: snapshot.num_nodes(),
        });
        Status::success()
    }
}

impl ScorePlugin for ImageLocality {
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let s = state
            .read::<PreScoreState>()
            .ok_or_else(|| Status::error("ImageLocality PreScore state missing"))?;
        let sum: i64 = s
            .images
            .iter()
            .filter_map(|(name, count)| {
                let size = node.image_size(name)?;
                let spread = *count as f64 / s.total_nodes as f64;
                Some((size as f64 * spread) as i64)
            })
            .sum();
        let max_threshold = MAX_CONTAINER_THRESHOLD * s.images.len() as i64;
        let clamped = sum.clamp(MIN_THRESHOLD, max_threshold.max(MIN_THRESHOLD));
        Ok(MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) / (max_threshold - MIN_THRESHOLD).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container, node, node_with, normalized_scores, pod, snapshot};

    #[test]
    fn image_names_are_normalized() {
        assert_eq!(normalized_image_name("nginx"), "nginx:latest");
        assert_eq!(normalized_image_name("nginx:1.27"), "nginx:1.27");
        assert_eq!(
            normalized_image_name("localhost:5000/app"),
            "localhost:5000/app:latest"
        );
        assert_eq!(
            normalized_image_name("localhost:5000/app:v1"),
            "localhost:5000/app:v1"
        );
    }

    #[test]
    fn larger_and_more_spread_images_score_higher() {
        let snap = snapshot(vec![
            node_with(node("big").image(&["app:v1"], 500 * MB), vec![]),
            node_with(
                node("both")
                    .image(&["app:v1"], 500 * MB)
                    .image(&["side:latest"], 300 * MB),
                vec![],
            ),
            node_with(node("none"), vec![]),
            node_with(node("tiny").image(&["side:latest"], 300 * MB), vec![]),
        ]);
        let p = pod("p")
            .container(container("a").image("app:v1"))
            .container(container("b").image("side"));
        let scores = normalized_scores(Some(&ImageLocality), &ImageLocality, p, &snap);
        // app:v1 on 2 of 4 nodes: 250MB each; side on 2 of 4: 150MB.
        // big: (250-23)*100/(2000-23) = 11; both: (400-23)*100/1977 = 19; tiny: 6.
        assert_eq!(scores, vec![11, 19, 0, 6]);
    }
}
