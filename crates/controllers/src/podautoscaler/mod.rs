//! `HorizontalController`: scales workloads through their `/scale` subresource to keep
//! Resource metrics (CPU, memory) at target, as upstream's horizontal-pod-autoscaler
//! controller with autoscaling/v2. Every sync period: read the target's scale, measure
//! its pods through the metrics API (`metrics.k8s.io`, which krust's apiserver serves),
//! take the largest replica count any metric asks for ([`replicas`]), stabilize and
//! rate-limit it ([`behavior`]), write the scale, then the status (currentReplicas,
//! desiredReplicas, currentMetrics, lastScaleTime and the AbleToScale, ScalingActive and
//! ScalingLimited conditions) with upstream's reasons and events.

mod behavior;
mod replicas;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{
    HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus,
    MetricSpec, MetricStatus, MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use krust_api::sync::Unpoisoned;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};
use replicas::{PodSample, Target};

/// Upstream's `--horizontal-pod-autoscaler-sync-period`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);

pub struct HorizontalController {
    client: Client,
    hpas: Cache<HorizontalPodAutoscaler>,
    queue: Arc<WorkQueue>,
    events: EventRecorder,
    memory: Mutex<HashMap<String, behavior::Memory>>,
    sync_period: Duration,
}

impl HorizontalController {
    pub fn new(
        client: Client,
        informers: &SharedInformers,
        events: EventRecorder,
        sync_period: Duration,
    ) -> Arc<Self> {
        let informer = informers.get::<HorizontalPodAutoscaler>();
        let controller = Arc::new(HorizontalController {
            client,
            hpas: informer.cache(),
            queue: WorkQueue::new("horizontalpodautoscaler"),
            events,
            memory: Mutex::default(),
            sync_period,
        });
        informer.add_handler(Arc::new(HpaEvents(controller.clone())));
        controller
    }
}

/// The measurement of one metric.
struct Measured {
    proposal: replicas::Proposal,
    status: MetricStatus,
    /// `cpu resource utilization (percentage of request)` and the like.
    description: String,
}

impl Reconciler for HorizontalController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(hpa) = self.hpas.get(Some(ns), name) else {
            self.memory.locked().remove(key);
            return Ok(None);
        };
        let spec = hpa.spec.clone().unwrap_or_default();
        let now = Timestamp::now();
        let old = hpa.status.clone().unwrap_or_default();
        let mut conditions: Vec<HorizontalPodAutoscalerCondition> = Vec::new();
        let mut condition = |ty: &str, ok: bool, reason: &str, message: String| {
            let status = if ok { "True" } else { "False" };
            let since = old
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == ty && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            conditions.push(HorizontalPodAutoscalerCondition {
                type_: ty.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_transition_time: Some(since),
            });
        };
        let target = &spec.scale_target_ref;
        let scales = self.scale_api(ns, target.api_version.as_deref(), &target.kind);
        let scale = match scales.get_scale(&target.name).await {
            Ok(s) => s,
            Err(e) => {
                let message =
                    format!("the HPA controller was unable to get the target's current scale: {e}");
                self.events
                    .record(&*hpa, EventType::Warning, "FailedGetScale", e.to_string());
                condition("AbleToScale", false, "FailedGetScale", message);
                self.write_status(
                    &hpa,
                    HorizontalPodAutoscalerStatus {
                        conditions: Some(conditions),
                        ..old.clone()
                    },
                )
                .await?;
                return Ok(Some(self.sync_period));
            }
        };
        let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let selector = scale
            .status
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;

        let mut metrics_status = Vec::new();
        let (desired, limit, reason) = if current == 0 && min != 0 {
            condition(
                "ScalingActive",
                false,
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero".into(),
            );
            (0, behavior::Limit::Within, String::new())
        } else {
            match self
                .measure(
                    ns,
                    &selector,
                    current,
                    spec.metrics.as_deref().unwrap_or_default(),
                )
                .await
            {
                Ok(measured) => {
                    let best = measured
                        .iter()
                        .max_by_key(|m| m.proposal.replicas)
                        .expect("one metric at least");
                    condition(
                        "ScalingActive",
                        true,
                        "ValidMetricFound",
                        format!(
                            "the HPA was able to successfully calculate a replica count from {}",
                            best.description
                        ),
                    );
                    // Upstream's wording: the metric that asks for the most when scaling
                    // up, all of them otherwise.
                    let reason = if best.proposal.replicas > current {
                        format!("{} above target", best.description)
                    } else {
                        "All metrics below target".to_string()
                    };
                    let recommended = best.proposal.replicas;
                    metrics_status = measured.into_iter().map(|m| m.status).collect();
                    let rules = behavior::of(spec.behavior.as_ref());
                    let mut memory = self.memory.locked();
                    let memory = memory.entry(key.to_string()).or_default();
                    let (desired, limit) =
                        behavior::normalize(memory, &rules, current, recommended, (min, max), now);
                    (desired, limit, reason)
                }
                Err(message) => {
                    self.events.record(
                        &*hpa,
                        EventType::Warning,
                        "FailedGetResourceMetric",
                        message.clone(),
                    );
                    condition(
                        "ScalingActive",
                        false,
                        "FailedGetResourceMetric",
                        format!("the HPA was unable to compute the replica count: {message}"),
                    );
                    let clamped = current.clamp(min, max);
                    (
                        clamped,
                        behavior::Limit::Within,
                        "the current replica count is outside the acceptable range".into(),
                    )
                }
            }
        };

        let mut last_scale = old.last_scale_time.clone();
        if desired != current {
            // An update: the role grants `update` of `*/scale`, not `patch`.
            let mut wanted = scale.clone();
            wanted.spec.get_or_insert_with(Default::default).replicas = Some(desired);
            // Unconditional, as `kubectl scale`: the target's status moves all the time.
            wanted.metadata.resource_version = None;
            match scales
                .replace_scale(&target.name, &PostParams::default(), &wanted)
                .await
            {
                Ok(_) => {
                    self.events.record(
                        &*hpa,
                        EventType::Normal,
                        "SuccessfulRescale",
                        format!("New size: {desired}; reason: {reason}"),
                    );
                    condition(
                        "AbleToScale",
                        true,
                        "SucceededRescale",
                        format!(
                            "the HPA controller was able to update the target scale to {desired}"
                        ),
                    );
                    behavior::record_change(
                        self.memory.locked().entry(key.to_string()).or_default(),
                        desired - current,
                        now,
                    );
                    last_scale = Some(Time(now));
                }
                Err(e) => {
                    self.events.record(
                        &*hpa,
                        EventType::Warning,
                        "FailedRescale",
                        format!("New size: {desired}; reason: {reason}; error: {e}"),
                    );
                    condition(
                        "AbleToScale",
                        false,
                        "FailedUpdateScale",
                        format!("the HPA controller was unable to update the target scale: {e}"),
                    );
                }
            }
        } else {
            condition(
                "AbleToScale",
                true,
                "ReadyForNewScale",
                "recommended size matches current size".into(),
            );
        }
        let limited = limit != behavior::Limit::Within;
        condition(
            "ScalingLimited",
            limited,
            limit.reason(),
            limit.message().into(),
        );
        // Upstream's order: AbleToScale, ScalingActive, ScalingLimited.
        let rank = |t: &str| {
            ["AbleToScale", "ScalingActive", "ScalingLimited"]
                .iter()
                .position(|x| *x == t)
        };
        conditions.sort_by_key(|c| rank(&c.type_));
        let status = HorizontalPodAutoscalerStatus {
            observed_generation: hpa.metadata.generation,
            current_replicas: Some(current),
            desired_replicas: desired,
            current_metrics: (!metrics_status.is_empty())
                .then_some(metrics_status)
                .or(old.current_metrics.clone()),
            last_scale_time: last_scale,
            conditions: Some(conditions),
        };
        self.write_status(&hpa, status).await?;
        Ok(Some(self.sync_period))
    }
}

impl HorizontalController {
    /// The target's kind as a dynamic API with its `/scale` subresource.
    fn scale_api(&self, ns: &str, api_version: Option<&str>, kind: &str) -> Api<DynamicObject> {
        let (group, version) = match api_version.unwrap_or("v1").split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version.unwrap_or("v1")),
        };
        let plural = match kind {
            "ReplicationController" => "replicationcontrollers".to_string(),
            other => format!("{}s", other.to_lowercase()),
        };
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            &plural,
        );
        Api::namespaced_with(self.client.clone(), ns, &ar)
    }

    /// Every metric's proposal, or why none could be made.
    async fn measure(
        &self,
        ns: &str,
        selector: &str,
        current: i32,
        metrics: &[MetricSpec],
    ) -> Result<Vec<Measured>, String> {
        if selector.is_empty() {
            return Err("the target's scale has no selector".into());
        }
        let lp = ListParams::default().labels(selector);
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&lp)
            .await
            .map_err(|e| format!("unable to list pods: {e}"))?;
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics"),
            "pods",
        );
        let usage = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &ar)
            .list(&lp)
            .await
            .map_err(|e| format!("unable to get metrics for resource: unable to fetch metrics from resource metrics API: {e}"))?;
        let mut out = Vec::new();
        for metric in metrics {
            let Some(resource) = metric
                .resource
                .as_ref()
                .filter(|_| metric.type_ == "Resource")
            else {
                return Err(format!(
                    "metric type {} is not supported by krust yet",
                    metric.type_
                ));
            };
            let name = resource.name.as_str();
            let milli = name == "cpu";
            let amount = |q: &str| amount(q, milli);
            let samples: Vec<PodSample> = pods
                .items
                .iter()
                .map(|pod| {
                    let pod_name = pod.name_any();
                    let phase = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .unwrap_or_default();
                    let ready = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                    let request = pod
                        .spec
                        .as_ref()
                        .map(|s| {
                            s.containers
                                .iter()
                                .map(|c| {
                                    c.resources
                                        .as_ref()
                                        .and_then(|r| r.requests.as_ref())
                                        .and_then(|r| r.get(name))
                                        .and_then(|q| amount(&q.0))
                                })
                                .sum::<Option<i64>>()
                        })
                        .unwrap_or(None);
                    let used = usage
                        .items
                        .iter()
                        .find(|m| m.name_any() == pod_name)
                        .and_then(|m| {
                            m.data["containers"].as_array().map(|cs| {
                                cs.iter()
                                    .filter_map(|c| c["usage"][name].as_str().and_then(amount))
                                    .sum::<i64>()
                            })
                        });
                    PodSample {
                        name: pod_name,
                        ignored: pod.metadata.deletion_timestamp.is_some() || phase == "Failed",
                        unready: phase == "Pending" || !ready,
                        usage: used,
                        request,
                    }
                })
                .collect();
            let target = match (
                resource.target.type_.as_str(),
                resource.target.average_utilization,
                resource.target.average_value.as_ref(),
            ) {
                ("Utilization", Some(pct), _) => Target::Utilization(i64::from(pct)),
                ("AverageValue", _, Some(v)) => {
                    Target::AverageValue(amount(&v.0).ok_or("invalid averageValue")?)
                }
                (other, _, _) => {
                    return Err(format!(
                        "target type {other} is not supported for resource metrics"
                    ));
                }
            };
            let proposal = replicas::replicas(current, &samples, target)
                .map_err(|e| format!("failed to get {name} utilization: {e}"))?;
            let average = if milli {
                format!("{}m", proposal.average)
            } else {
                proposal.average.to_string()
            };
            let description = match target {
                Target::Utilization(_) => {
                    format!("{name} resource utilization (percentage of request)")
                }
                Target::AverageValue(_) => format!("{name} resource"),
            };
            out.push(Measured {
                status: MetricStatus {
                    type_: "Resource".into(),
                    resource: Some(ResourceMetricStatus {
                        name: name.into(),
                        current: MetricValueStatus {
                            average_utilization: proposal.utilization.map(|u| u as i32),
                            average_value: Some(Quantity(average)),
                            value: None,
                        },
                    }),
                    ..Default::default()
                },
                proposal,
                description,
            });
        }
        if out.is_empty() {
            return Err("no metrics to scale on".into());
        }
        Ok(out)
    }

    async fn write_status(
        &self,
        hpa: &HorizontalPodAutoscaler,
        status: HorizontalPodAutoscalerStatus,
    ) -> Result<(), Error> {
        if hpa.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let mut updated = hpa.clone();
        updated.status = Some(status);
        let ns = hpa.namespace().unwrap_or_default();
        Api::<HorizontalPodAutoscaler>::namespaced(self.client.clone(), &ns)
            .replace_status(&hpa.name_any(), &PostParams::default(), &updated)
            .await
            .map(|_| ())
            .map_err(|e| {
                Error::api(
                    "updating status of horizontalpodautoscaler",
                    key_of(&hpa.metadata),
                    e,
                )
            })
    }
}

struct HpaEvents(Arc<HorizontalController>);

impl EventHandler<HorizontalPodAutoscaler> for HpaEvents {
    fn on_apply(&self, old: Option<&HorizontalPodAutoscaler>, new: &Arc<HorizontalPodAutoscaler>) {
        // Status writes come back here; only spec changes (and new HPAs) are news.
        if old.is_none_or(|o| o.spec != new.spec) {
            self.0.queue.add(key_of(&new.metadata));
        }
    }
    fn on_delete(&self, obj: &Arc<HorizontalPodAutoscaler>) {
        self.0.memory.locked().remove(&key_of(&obj.metadata));
    }
}

/// A quantity in the unit the autoscaler computes with: milli-units for CPU (`milli`),
/// whole units otherwise (bytes of memory).
fn amount(quantity: &str, milli: bool) -> Option<i64> {
    krust_api::quantity::scaled_value(quantity, if milli { 3 } else { 0 }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_counted_in_millicores_and_memory_in_bytes() {
        // A request of 100m and usage as metrics report it: 200 % of the request.
        let (request, usage) = (amount("100m", true), amount("200000000n", true));
        assert_eq!((request, usage), (Some(100), Some(200)));
        assert_eq!(amount("1.5", true), Some(1500));
        assert_eq!(amount("64Mi", false), Some(64 << 20));
        assert_eq!(amount("65536Ki", false), Some(64 << 20));
        assert_eq!(amount("lots", true), None);
    }
}
