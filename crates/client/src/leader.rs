//! `LeaderElector`: active/standby through a coordination.k8s.io/v1 Lease, with
//! client-go's leader-election semantics.
//!
//! - A candidate takes the lease when it is free, or when the holder has not renewed it
//!   for `leaseDurationSeconds`. "Not renewed" is judged by when *this* candidate last saw
//!   the lease record change, on its own clock, never by comparing the timestamps written
//!   in the lease with its clock: clocks of different machines may disagree.
//! - The leader renews every `retry_period`; if it cannot renew for `renew_deadline`
//!   (shorter than the lease duration) it stops acting before anyone else can take over,
//!   so two instances are never active at once.
//! - Every write is a compare-and-swap on the lease's resourceVersion.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use krust_api::sync::Unpoisoned;
use kube::Client;

use kube::api::{Api, PostParams};

use crate::{LeaderElectionError, is_status};

/// Where the lease lives, who we are, and the timings (upstream: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// The Lease `kube-system/<name>` (e.g. `kube-scheduler`) with upstream timings.
    pub fn kube_system(name: &str, identity: String) -> Self {
        LeaderElectionConfig {
            namespace: "kube-system".into(),
            name: name.into(),
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    /// The last lease spec seen, and when it was first seen in that state.
    observed: Mutex<Option<(LeaseSpec, Instant)>>,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: Mutex::new(None),
        }
    }

    pub fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    /// Returns once this instance holds the lease.
    pub async fn acquire(&self) {
        tracing::info!(lease = %self.lease_name(), identity = %self.config.identity, "attempting to acquire leader lease");
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.lease_name(), identity = %self.config.identity, "acquired leader lease");
                    return;
                }
                Ok(false) => {}
                Err(err) => tracing::warn!(error = %err, "leader election"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the lease every retry period; returns when it could not be renewed for the
    /// renew deadline, i.e. when leadership is lost.
    pub async fn hold(&self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => {}
                Err(err) => tracing::warn!(error = %err, "renewing leader lease"),
            }
            if renewed.elapsed() >= self.config.renew_deadline {
                tracing::error!(lease = %self.lease_name(), "failed to renew leader lease within the renew deadline; leadership lost");
                return;
            }
        }
    }

    /// Gives the lease up (on a clean shutdown), so a standby takes over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(&self.config.identity) {
            return;
        }
        spec.holder_identity = None;
        // A released lease is free for anyone: keep the duration minimal, like client-go.
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.lease_name(), "released leader lease"),
            Err(err) => tracing::warn!(error = %err, "releasing leader lease"),
        }
    }

    /// One attempt: create the lease, renew it, or take it over if it expired.
    async fn try_acquire_or_renew(&self) -> Result<bool, LeaderElectionError> {
        let now = Timestamp::now();
        let lease_secs = self.config.lease_duration.as_secs().max(1) as i32;
        let err = |source| LeaderElectionError {
            lease: self.lease_name(),
            source,
        };
        let Some(mut lease) = self.api.get_opt(&self.config.name).await.map_err(err)? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(lease_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_status(&e, 409) => Ok(false),
                Err(e) => Err(err(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let observed_at = {
            let mut observed = self.observed.locked();
            match &*observed {
                Some((seen, at)) if *seen == spec => *at,
                _ => {
                    let at = Instant::now();
                    *observed = Some((spec.clone(), at));
                    at
                }
            }
        };
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let i_hold = holder == self.config.identity;
        let duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(lease_secs).max(0) as u64);
        if !holder.is_empty() && !i_hold && observed_at.elapsed() < duration {
            return Ok(false);
        }
        let new_spec = LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(lease_secs),
            acquire_time: if i_hold {
                spec.acquire_time.clone()
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(
                spec.lease_transitions.unwrap_or(0) + if i_hold { 0 } else { 1 },
            ),
            ..spec
        };
        lease.spec = Some(new_spec.clone());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                *self.observed.locked() = Some((new_spec, Instant::now()));
                if !i_hold {
                    tracing::info!(lease = %self.lease_name(), previous = %holder, "took over leader lease");
                }
                Ok(true)
            }
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(err(e)),
        }
    }
}

/// Runs `work` while this instance leads (always, without an elector) until
/// `shutdown`. Losing the lease drops `work` (stopping everything it runs); the instance
/// then stands by as a candidate again and starts a fresh `work` when it wins. A clean
/// shutdown releases the lease so a standby takes over at once.
pub async fn run_while_leading<F, Fut>(
    elector: Option<LeaderElector>,
    shutdown: impl Future<Output = ()>,
    work: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    tokio::pin!(shutdown);
    loop {
        if let Some(elector) = &elector {
            tokio::select! {
                _ = elector.acquire() => {}
                _ = &mut shutdown => return,
            }
        }
        let lost = async {
            match &elector {
                Some(elector) => elector.hold().await,
                None => std::future::pending().await,
            }
        };
        let stop = tokio::select! {
            _ = &mut shutdown => true,
            _ = lost => false,
            _ = work() => false,
        };
        if stop {
            if let Some(elector) = &elector {
                elector.release().await;
            }
            return;
        }
        tracing::warn!(lease = ?elector.as_ref().map(LeaderElector::lease_name), "leadership lost: stopped; standing by");
    }
}
