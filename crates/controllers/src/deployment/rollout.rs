//! The arithmetic of a rolling update, as pure functions over replica counts, so every
//! rule can be tested with fixed inputs. It follows upstream's `rolling.go`:
//!
//! - `maxSurge` (rounded up) bounds all pods, `maxUnavailable` (rounded down) bounds
//!   the pods that may be unavailable; both 0 is read as maxUnavailable 1.
//! - The new ReplicaSet grows while all pods stay within `replicas + maxSurge`.
//! - Old ReplicaSets shrink first by their unavailable pods, then by as many available
//!   pods as keeps `replicas - maxUnavailable` available, oldest ReplicaSet first.
//!
//! Where upstream reads counts that may be stale it can overshoot for a moment. Here
//! each ReplicaSet counts as `max(spec, status.replicas)` pods (a scale-down is not
//! counted as done before its pods are gone) and as `min(available, spec)` available
//! pods (a ReplicaSet that was told to shrink will lose its unavailable pods first, but
//! never keeps more than `spec`), so the bounds hold at every moment, not only in the
//! steady state.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// What the rollout needs to know of one ReplicaSet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `spec.replicas`: what it was told to have.
    pub spec: i32,
    /// `status.replicas`: active pods it has.
    pub pods: i32,
    /// `status.availableReplicas`.
    pub available: i32,
}

impl Counts {
    fn pods_upper_bound(&self) -> i32 {
        self.spec.max(self.pods)
    }
    fn available_lower_bound(&self) -> i32 {
        self.available.min(self.spec)
    }
}

/// An int, or a percentage of `total` rounded up or down (upstream's
/// `GetScaledValueFromIntOrPercent`).
pub fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    match value {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let Some(p) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
                return Err(format!(
                    "invalid value for IntOrString: invalid type: string is not a percentage: {s:?}"
                ));
            };
            let scaled = p * total as i64;
            Ok(if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            } as i32)
        }
    }
}

/// `(maxSurge, maxUnavailable)` for `replicas`, defaults 25% each; maxUnavailable is at
/// most `replicas` and is 1 when both would be 0, so a rollout can always proceed.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    replicas: i32,
) -> Result<(i32, i32), String> {
    let quarter = IntOrString::String("25%".into());
    let surge = scaled_value(max_surge.unwrap_or(&quarter), replicas, true)?;
    let mut unavailable = scaled_value(max_unavailable.unwrap_or(&quarter), replicas, false)?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable.min(replicas.max(0))))
}

/// The size to give the new ReplicaSet: as close to `replicas` as the surge allows.
pub fn new_rs_replicas(replicas: i32, max_surge: i32, all: &[Counts], new: Counts) -> i32 {
    let current: i32 = all.iter().map(Counts::pods_upper_bound).sum();
    let max_total = replicas + max_surge;
    if current >= max_total {
        return new.spec;
    }
    let up = (max_total - current).min(replicas - new.spec).max(0);
    new.spec + up
}

/// The sizes to give the old ReplicaSets (ordered oldest first) in this step.
pub fn old_rs_replicas(
    replicas: i32,
    max_unavailable: i32,
    new: Option<Counts>,
    old: &[Counts],
) -> Vec<i32> {
    let mut targets: Vec<i32> = old.iter().map(|c| c.spec).collect();
    if targets.iter().sum::<i32>() == 0 {
        return targets;
    }
    let new = new.unwrap_or_default();
    let all_pods: i32 = new.spec + targets.iter().sum::<i32>();
    let min_available = replicas - max_unavailable;
    let new_unavailable = new.spec - new.available_lower_bound();
    let max_scaled_down = all_pods - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return targets;
    }
    // Unavailable old pods go first: removing them costs no availability.
    let mut cleaned = 0;
    for (target, counts) in targets.iter_mut().zip(old) {
        if cleaned >= max_scaled_down {
            break;
        }
        let unhealthy = *target - counts.available.min(*target);
        let n = unhealthy.min(max_scaled_down - cleaned);
        *target -= n;
        cleaned += n;
    }
    // Then available ones, while enough stay available.
    let available: i32 = new.available_lower_bound()
        + old
            .iter()
            .zip(&targets)
            .map(|(c, t)| c.available.min(*t))
            .sum::<i32>();
    if available <= min_available {
        return targets;
    }
    let mut budget = available - min_available;
    for target in targets.iter_mut() {
        if budget == 0 {
            break;
        }
        let n = (*target).min(budget);
        *target -= n;
        budget -= n;
    }
    targets
}

/// Upstream's proportional scaling: when a Deployment is resized while several
/// ReplicaSets have pods (mid-rollout), the change is shared among them in proportion to
/// their sizes, so the rollout's progress is kept instead of being undone.
///
/// `active` holds each ReplicaSet with pods, oldest first: its `spec.replicas` and its
/// `deployment.kubernetes.io/max-replicas` annotation (the Deployment's `replicas +
/// maxSurge` when the ReplicaSet was last sized). `status_replicas` stands in for a
/// missing annotation. Returns the new sizes, in the same order.
pub fn proportional_sizes(
    replicas: i32,
    max_surge: i32,
    active: &[(i32, Option<i32>)],
    status_replicas: i32,
) -> Vec<i32> {
    let total: i32 = active.iter().map(|a| a.0).sum();
    let allowed = if replicas > 0 {
        replicas + max_surge
    } else {
        0
    };
    let to_add = allowed - total;
    // Growing: the largest first, newer before older on ties; shrinking: older first.
    let mut order: Vec<usize> = (0..active.len()).collect();
    order.sort_by(|&a, &b| {
        let by_size = active[b].0.cmp(&active[a].0);
        if to_add > 0 {
            by_size.then(b.cmp(&a))
        } else {
            by_size.then(a.cmp(&b))
        }
    });
    let mut sizes: Vec<i32> = active.iter().map(|a| a.0).collect();
    let mut added = 0;
    for &i in &order {
        let (spec, annotated) = active[i];
        if spec == 0 || to_add == 0 || to_add == added {
            continue;
        }
        let fraction = if replicas == 0 {
            -spec
        } else {
            let annotated = annotated.unwrap_or(status_replicas);
            if annotated == 0 {
                continue;
            }
            ((spec as f64 * allowed as f64) / annotated as f64).round() as i32 - spec
        };
        let remaining = to_add - added;
        let p = if to_add > 0 {
            fraction.min(remaining)
        } else {
            fraction.max(remaining)
        };
        sizes[i] += p;
        added += p;
    }
    // Rounding leftovers go to the largest ReplicaSet.
    if to_add != added
        && let Some(&first) = order.first()
    {
        sizes[first] = (sizes[first] + to_add - added).max(0);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn percentages_round_surge_up_and_unavailable_down() {
        assert_eq!(resolve_fenceposts(None, None, 10), Ok((3, 2)), "25% of 10");
        assert_eq!(
            resolve_fenceposts(Some(&pct("10%")), Some(&pct("10%")), 3),
            Ok((1, 0))
        );
        assert_eq!(
            resolve_fenceposts(Some(&IntOrString::Int(2)), Some(&pct("50%")), 5),
            Ok((2, 2))
        );
        assert!(resolve_fenceposts(Some(&pct("x")), None, 3).is_err());
    }

    #[test]
    fn zero_surge_and_zero_unavailable_means_one_unavailable() {
        assert_eq!(
            resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(0)), 3),
            Ok((0, 1))
        );
        assert_eq!(
            resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(9)), 3),
            Ok((0, 3))
        );
    }

    #[test]
    fn the_new_replicaset_grows_only_within_the_surge() {
        let old = Counts {
            spec: 3,
            pods: 3,
            available: 3,
        };
        let new = Counts::default();
        assert_eq!(new_rs_replicas(3, 1, &[old, new], new), 1);
        // An old ReplicaSet told to shrink still counts its pods until they are gone.
        let shrinking = Counts {
            spec: 2,
            pods: 3,
            available: 3,
        };
        let new = Counts {
            spec: 1,
            pods: 1,
            available: 1,
        };
        assert_eq!(new_rs_replicas(3, 1, &[shrinking, new], new), 1);
        let shrunk = Counts {
            spec: 2,
            pods: 2,
            available: 2,
        };
        assert_eq!(new_rs_replicas(3, 1, &[shrunk, new], new), 2);
        // Never beyond replicas.
        assert_eq!(new_rs_replicas(3, 10, &[new], new), 3);
    }

    #[test]
    fn old_replicasets_shrink_only_while_enough_pods_stay_available() {
        let old = [Counts {
            spec: 3,
            pods: 3,
            available: 3,
        }];
        let unready_new = Counts {
            spec: 1,
            pods: 1,
            available: 0,
        };
        assert_eq!(old_rs_replicas(3, 0, Some(unready_new), &old), [3]);
        let ready_new = Counts {
            spec: 1,
            pods: 1,
            available: 1,
        };
        assert_eq!(old_rs_replicas(3, 0, Some(ready_new), &old), [2]);
        // Unavailable old pods go first, and oldest ReplicaSets first.
        let old = [
            Counts {
                spec: 2,
                pods: 2,
                available: 1,
            },
            Counts {
                spec: 2,
                pods: 2,
                available: 2,
            },
        ];
        assert_eq!(old_rs_replicas(4, 1, Some(Counts::default()), &old), [1, 2]);
        assert_eq!(old_rs_replicas(4, 2, Some(Counts::default()), &old), [0, 2]);
    }

    /// A whole rollout in a world where pods appear, become available and disappear at
    /// once: the bounds hold after every step and the rollout completes.
    fn simulate(replicas: i32, surge: &IntOrString, unavailable: &IntOrString) {
        let (max_surge, max_unavailable) =
            resolve_fenceposts(Some(surge), Some(unavailable), replicas).unwrap();
        let settle = |c: &mut Counts| {
            *c = Counts {
                spec: c.spec,
                pods: c.spec,
                available: c.spec,
            }
        };
        let mut old = Counts {
            spec: replicas,
            pods: replicas,
            available: replicas,
        };
        let mut new = Counts::default();
        for step in 0..100 {
            new.spec = new_rs_replicas(replicas, max_surge, &[old, new], new);
            settle(&mut new);
            new.available = new.pods; // ready at once
            old.spec = old_rs_replicas(replicas, max_unavailable, Some(new), &[old])[0];
            settle(&mut old);
            assert!(
                old.pods + new.pods <= replicas + max_surge,
                "surge exceeded at step {step}"
            );
            assert!(
                old.available + new.available >= replicas - max_unavailable,
                "too few available at step {step}"
            );
            if new.available == replicas && old.pods == 0 {
                return;
            }
        }
        panic!("rollout did not complete: old {old:?} new {new:?}");
    }

    #[test]
    fn rollouts_complete_within_their_bounds() {
        simulate(3, &IntOrString::Int(1), &IntOrString::Int(0));
        simulate(10, &pct("25%"), &pct("25%"));
        simulate(5, &IntOrString::Int(0), &IntOrString::Int(1));
        simulate(1000, &pct("10%"), &IntOrString::Int(0));
    }

    #[test]
    fn a_resize_mid_rollout_is_shared_in_proportion() {
        // 10 replicas, surge 3: old 8 and new 5 (13 = 10 + 3). Scaled to 20 (surge 5):
        // 25 allowed, 12 more, shared 8:5 and rounded, leftovers to the largest.
        let sizes = proportional_sizes(20, 5, &[(8, Some(13)), (5, Some(13))], 13);
        assert_eq!(sizes.iter().sum::<i32>(), 25);
        assert_eq!(sizes, [15, 10]);
        // Back down to 10: the shrink is shared the same way.
        assert_eq!(
            proportional_sizes(10, 3, &[(15, Some(25)), (10, Some(25))], 25),
            [8, 5]
        );
        // To zero: everything goes.
        assert_eq!(
            proportional_sizes(0, 0, &[(8, Some(13)), (5, Some(13))], 13),
            [0, 0]
        );
    }
}
