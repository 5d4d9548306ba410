//! `spec.behavior`, as upstream's `normalizeDesiredReplicasWithBehaviors`: a
//! recommendation is stabilized (scaling up takes the lowest recommendation of the
//! scale-up window, scaling down the highest of the scale-down window), then held to the
//! rate the policies allow per period, then to `[minReplicas, maxReplicas]`. Without a
//! behavior upstream's defaults apply: up at once by 4 pods or 100 % per 15 s, down by
//! 100 % per 15 s after a 5-minute window.

use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// One rule set in plain numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    pub window_seconds: i64,
    /// `Max`, `Min` or `Disabled`.
    pub select: String,
    /// (`Pods` or `Percent`, value, period seconds).
    pub policies: Vec<(String, i32, i64)>,
}

fn rules(given: Option<&HPAScalingRules>, up: bool) -> Rules {
    let defaults = if up {
        Rules {
            window_seconds: 0,
            select: "Max".into(),
            policies: vec![("Pods".into(), 4, 15), ("Percent".into(), 100, 15)],
        }
    } else {
        Rules {
            window_seconds: 300,
            select: "Max".into(),
            policies: vec![("Percent".into(), 100, 15)],
        }
    };
    let Some(r) = given else {
        return defaults;
    };
    Rules {
        window_seconds: r
            .stabilization_window_seconds
            .map_or(defaults.window_seconds, i64::from),
        select: r.select_policy.clone().unwrap_or(defaults.select),
        policies: r.policies.as_ref().map_or(defaults.policies, |ps| {
            ps.iter()
                .map(|p| (p.type_.clone(), p.value, i64::from(p.period_seconds)))
                .collect()
        }),
    }
}

/// The scale-up and scale-down rules of a behavior (defaults where unset).
pub fn of(behavior: Option<&HorizontalPodAutoscalerBehavior>) -> (Rules, Rules) {
    (
        rules(behavior.and_then(|b| b.scale_up.as_ref()), true),
        rules(behavior.and_then(|b| b.scale_down.as_ref()), false),
    )
}

/// What one HPA remembers between passes.
#[derive(Default, Debug)]
pub struct Memory {
    /// (when, recommended replicas).
    pub recommendations: Vec<(Timestamp, i32)>,
    /// (when, replicas added; negative for removed).
    pub changes: Vec<(Timestamp, i32)>,
}

/// Why the rate or the bounds held a recommendation back (the ScalingLimited
/// condition's reason and message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Within,
    UpRate,
    DownRate,
    BelowMin,
    AboveMax,
}

impl Limit {
    pub fn reason(self) -> &'static str {
        match self {
            Limit::Within => "DesiredWithinRange",
            Limit::UpRate => "ScaleUpLimit",
            Limit::DownRate => "ScaleDownLimit",
            Limit::BelowMin => "TooFewReplicas",
            Limit::AboveMax => "TooManyReplicas",
        }
    }
    pub fn message(self) -> &'static str {
        match self {
            Limit::Within => "the desired count is within the acceptable range",
            Limit::UpRate => {
                "the desired replica count is increasing faster than the maximum scale rate"
            }
            Limit::DownRate => {
                "the desired replica count is decreasing faster than the maximum scale rate"
            }
            Limit::BelowMin => "the desired replica count is less than the minimum replica count",
            Limit::AboveMax => "the desired replica count is more than the maximum replica count",
        }
    }
}

/// The replicas at the start of each policy's period, and so the bound it sets.
fn rate_limit(
    current: i32,
    changes: &[(Timestamp, i32)],
    rules: &Rules,
    up: bool,
    now: Timestamp,
) -> i32 {
    let mut bound: Option<i32> = None;
    for (kind, value, period) in &rules.policies {
        let since = now - SignedDuration::from_secs(*period);
        let changed: i32 = changes
            .iter()
            .filter(|(t, c)| *t > since && (*c > 0) == up)
            .map(|(_, c)| *c)
            .sum();
        let start = current - changed;
        let limit = match (kind.as_str(), up) {
            ("Pods", true) => start + value,
            ("Pods", false) => start - value,
            (_, true) => (start as f64 * (1.0 + *value as f64 / 100.0)).ceil() as i32,
            (_, false) => (start as f64 * (1.0 - *value as f64 / 100.0)).ceil() as i32,
        };
        // Max allows the most change: the highest bound up, the lowest down.
        let most_change = (rules.select == "Max") == up;
        bound = Some(match bound {
            None => limit,
            Some(b) if most_change => b.max(limit),
            Some(b) => b.min(limit),
        });
    }
    bound.unwrap_or(current)
}

/// The replicas to scale to, given the metrics' recommendation.
#[allow(clippy::too_many_arguments)]
pub fn normalize(
    memory: &mut Memory,
    (up, down): &(Rules, Rules),
    current: i32,
    recommended: i32,
    (min, max): (i32, i32),
    now: Timestamp,
) -> (i32, Limit) {
    let in_window = |t: &Timestamp, secs: i64| *t > now - SignedDuration::from_secs(secs);
    let (mut up_rec, mut down_rec) = (recommended, recommended);
    for (t, r) in &memory.recommendations {
        if in_window(t, up.window_seconds) {
            up_rec = up_rec.min(*r);
        }
        if in_window(t, down.window_seconds) {
            down_rec = down_rec.max(*r);
        }
    }
    let mut stabilized = current;
    if stabilized < up_rec {
        stabilized = up_rec;
    }
    if stabilized > down_rec {
        stabilized = down_rec;
    }
    memory.recommendations.push((now, recommended));
    let keep = up.window_seconds.max(down.window_seconds);
    memory.recommendations.retain(|(t, _)| in_window(t, keep));

    let mut limit = Limit::Within;
    let mut desired = stabilized;
    if desired > current {
        let rate = if up.select == "Disabled" {
            current
        } else {
            rate_limit(current, &memory.changes, up, true, now).max(current)
        };
        if desired > rate {
            desired = rate;
            limit = Limit::UpRate;
        }
    } else if desired < current {
        let rate = if down.select == "Disabled" {
            current
        } else {
            rate_limit(current, &memory.changes, down, false, now).min(current)
        };
        if desired < rate {
            desired = rate;
            limit = Limit::DownRate;
        }
    }
    if desired > max {
        (desired, limit) = (max, Limit::AboveMax);
    } else if desired < min {
        (desired, limit) = (min, Limit::BelowMin);
    }
    (desired, limit)
}

/// Remembers a scale so that the policies' periods count it.
pub fn record_change(memory: &mut Memory, change: i32, now: Timestamp) {
    memory.changes.push((now, change));
    let oldest = now - SignedDuration::from_secs(30 * 60);
    memory.changes.retain(|(t, _)| *t > oldest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn scaling_up_is_rate_limited_and_scaling_down_waits_for_its_window() {
        let defaults = of(None);
        let mut m = Memory::default();
        // From 1 to 10 at once: 4 pods or 100 % per 15 s, the larger: 5.
        let (d, limit) = normalize(&mut m, &defaults, 1, 10, (1, 20), at(0));
        assert_eq!((d, limit), (5, Limit::UpRate));
        record_change(&mut m, 4, at(0));
        // Ten seconds later the period still holds the 4 added: 1 + 4 = 5 or 2 × 1.
        assert_eq!(normalize(&mut m, &defaults, 5, 10, (1, 20), at(10)).0, 5);
        // After the period: 5 + 4 or 2 × 5.
        assert_eq!(normalize(&mut m, &defaults, 5, 10, (1, 20), at(20)).0, 10);
        // Down: the highest recommendation of the last five minutes stands.
        assert_eq!(normalize(&mut m, &defaults, 10, 2, (1, 20), at(40)).0, 10);
        assert_eq!(normalize(&mut m, &defaults, 10, 2, (1, 20), at(400)).0, 2);
        // Bounds.
        assert_eq!(
            normalize(&mut Memory::default(), &defaults, 3, 30, (1, 4), at(0)),
            (4, Limit::AboveMax)
        );
    }

    #[test]
    fn a_zero_scale_down_window_follows_the_metrics_at_once() {
        let behavior: HorizontalPodAutoscalerBehavior = k8s_openapi::serde_json::from_value(
            k8s_openapi::serde_json::json!({"scaleDown": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}),
        )
        .unwrap();
        let rules = of(Some(&behavior));
        assert_eq!(rules.1.window_seconds, 0);
        let mut m = Memory::default();
        let (d, limit) = normalize(&mut m, &rules, 4, 1, (1, 10), at(0));
        assert_eq!((d, limit), (3, Limit::DownRate), "one pod per minute");
    }
}
