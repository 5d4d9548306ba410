//! How many replicas a Resource metric asks for, as upstream's `ReplicaCalculator`:
//! the usage of the ready pods against their requests (Utilization) or per pod
//! (AverageValue); within 10 % of the target nothing changes; pods without metrics
//! count as idle when scaling up and as at target when scaling down, not-ready pods as
//! idle when scaling up, so that neither makes a change larger than it should be.
//!
//! One simplification: a pod counts as unready when its Ready condition is not True.
//! Upstream also leaves out, for CPU, samples of pods still in their first five
//! minutes whose metric window began before they became ready.

use std::collections::HashMap;

/// Within this fraction of the target, the current count stands.
pub const TOLERANCE: f64 = 0.1;

/// One pod as the calculation sees it.
#[derive(Clone, Debug, Default)]
pub struct PodSample {
    pub name: String,
    /// Being deleted or failed: left out entirely.
    pub ignored: bool,
    /// Pending or not ready: its sample does not count.
    pub unready: bool,
    /// The pod's usage (milli-units for CPU, bytes for memory), if measured.
    pub usage: Option<i64>,
    /// The sum of its containers' requests for the resource, if every one has one.
    pub request: Option<i64>,
}

/// What a target is measured in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// Percent of the pods' requests.
    Utilization(i64),
    /// Usage per pod (same units as the samples).
    AverageValue(i64),
}

/// The proposal for one metric and what was measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    pub replicas: i32,
    /// Percent of requests (Utilization targets).
    pub utilization: Option<i64>,
    /// Average usage per measured pod.
    pub average: i64,
}

/// The ratio of usage to target over `usage` (pod → usage).
fn ratio(
    usage: &HashMap<&str, i64>,
    requests: &HashMap<&str, i64>,
    target: Target,
) -> Result<(f64, Option<i64>, i64), String> {
    let total: i64 = usage.values().sum();
    let average = total / usage.len().max(1) as i64;
    match target {
        Target::Utilization(pct) => {
            let mut requested = 0;
            for pod in usage.keys() {
                requested += requests
                    .get(pod)
                    .ok_or_else(|| format!("missing request for pod {pod}"))?;
            }
            if requested == 0 {
                return Err("no requests for the measured pods".into());
            }
            let utilization = total * 100 / requested;
            Ok((utilization as f64 / pct as f64, Some(utilization), average))
        }
        Target::AverageValue(per_pod) => Ok((
            total as f64 / (per_pod as f64 * usage.len() as f64),
            None,
            average,
        )),
    }
}

pub fn replicas(current: i32, pods: &[PodSample], target: Target) -> Result<Proposal, String> {
    let mut usage: HashMap<&str, i64> = HashMap::new();
    let mut requests: HashMap<&str, i64> = HashMap::new();
    let (mut missing, mut unready) = (Vec::new(), Vec::new());
    let mut ready = 0;
    for pod in pods.iter().filter(|p| !p.ignored) {
        if let Some(r) = pod.request {
            requests.insert(&pod.name, r);
        } else if matches!(target, Target::Utilization(_)) {
            return Err(format!(
                "missing request for the resource in pod {}",
                pod.name
            ));
        }
        match (pod.unready, pod.usage) {
            (true, _) => unready.push(pod.name.as_str()),
            (false, None) => missing.push(pod.name.as_str()),
            (false, Some(u)) => {
                usage.insert(&pod.name, u);
                ready += 1;
            }
        }
    }
    if usage.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let (first, utilization, average) = ratio(&usage, &requests, target)?;
    let proposal = |replicas| Proposal {
        replicas,
        utilization,
        average,
    };
    let scale_up_with_unready = !unready.is_empty() && first > 1.0;
    if !scale_up_with_unready && missing.is_empty() {
        if (1.0 - first).abs() <= TOLERANCE {
            return Ok(proposal(current));
        }
        return Ok(proposal((first * ready as f64).ceil() as i32));
    }
    let assumed = |pod: &str| match target {
        Target::Utilization(_) => requests.get(pod).copied().unwrap_or(0),
        Target::AverageValue(v) => v,
    };
    for pod in &missing {
        usage.insert(pod, if first < 1.0 { assumed(pod) } else { 0 });
    }
    if scale_up_with_unready {
        for pod in &unready {
            usage.insert(pod, 0);
        }
    }
    let (second, _, _) = ratio(&usage, &requests, target)?;
    if (1.0 - second).abs() <= TOLERANCE
        || (first < 1.0 && second > 1.0)
        || (first > 1.0 && second < 1.0)
    {
        return Ok(proposal(current));
    }
    let replicas = (second * usage.len() as f64).ceil() as i32;
    if (second < 1.0 && replicas > current) || (second > 1.0 && replicas < current) {
        return Ok(proposal(current));
    }
    Ok(proposal(replicas))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, usage: Option<i64>, request: i64, unready: bool) -> PodSample {
        PodSample {
            name: name.into(),
            ignored: false,
            unready,
            usage,
            request: Some(request),
        }
    }

    #[test]
    fn utilization_scales_by_the_ratio_to_the_target_with_a_tolerance() {
        // 2 pods at 900m of 1000m requested, target 50 %: 180 % / 50 % = 3.6 → 4.
        let busy = [
            pod("a", Some(900), 1000, false),
            pod("b", Some(900), 1000, false),
        ];
        let p = replicas(2, &busy, Target::Utilization(50)).unwrap();
        assert_eq!((p.replicas, p.utilization, p.average), (4, Some(90), 900));
        // 52 % against 50 %: within tolerance.
        let near = [pod("a", Some(520), 1000, false)];
        assert_eq!(
            replicas(1, &near, Target::Utilization(50))
                .unwrap()
                .replicas,
            1
        );
        // Idle: 0 % (an integer percent, as upstream) asks for none; minReplicas decides.
        let idle = [
            pod("a", Some(1), 1000, false),
            pod("b", Some(1), 1000, false),
        ];
        let asked = replicas(2, &idle, Target::Utilization(50)).unwrap();
        assert_eq!(asked.replicas, 0);
        assert_eq!(
            replicas(2, &idle, Target::AverageValue(100))
                .unwrap()
                .replicas,
            1
        );
    }

    #[test]
    fn pods_without_metrics_or_readiness_dampen_the_change() {
        // Scaling up: the unready pod counts as idle: (900 + 0) / 2000 = 45 % of 50 %:
        // within tolerance, no change.
        let pods = [pod("a", Some(900), 1000, false), pod("b", None, 1000, true)];
        assert_eq!(
            replicas(2, &pods, Target::Utilization(50))
                .unwrap()
                .replicas,
            2
        );
        // Scaling down: a pod without metrics counts as at its request.
        let pods = [
            pod("a", Some(100), 1000, false),
            pod("b", None, 1000, false),
        ];
        // (100 + 1000) / 2000 = 55 % of 50 %: within tolerance.
        assert_eq!(
            replicas(2, &pods, Target::Utilization(50))
                .unwrap()
                .replicas,
            2
        );
        let none = [pod("a", None, 1000, true)];
        assert!(replicas(1, &none, Target::Utilization(50)).is_err());
        let no_request = [PodSample {
            request: None,
            ..pod("a", Some(5), 0, false)
        }];
        assert!(
            replicas(1, &no_request, Target::Utilization(50))
                .unwrap_err()
                .contains("missing request")
        );
    }
}
