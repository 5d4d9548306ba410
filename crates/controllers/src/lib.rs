//! krust's controller-manager: the components that turn declarations into more objects
//! by watching the apiserver and writing back, never by calling another component.
//!
//! The machinery, read top to bottom:
//! - `krust_client::informer`: one watch and one cache per kind, shared by every
//!   controller that watches the kind; handlers turn events into work-queue keys.
//! - `krust_client::queue`: a deduplicating, rate-limited work queue and its worker loops.
//! - [`pods`]: pods as controllers cache them (a compact [`pods::CachedPod`]).
//! - [`expectations`]: what a controller wrote and has not yet seen in its cache.
//! - `krust_client::leader` and `krust_client::events`: active/standby through a Lease,
//!   and Events that explain what a controller did.
//!
//! The controllers: [`replicaset`] (pods for a ReplicaSet or a
//! ReplicationController), [`deployment`]
//! (ReplicaSets for a Deployment, rollouts), [`endpoints`] (EndpointSlices and
//! Endpoints for Services), [`gc`] (the garbage collector: owners
//! cascade), [`namespace`] (empties a deleted namespace), [`serviceaccount`] (the
//! `default` ServiceAccount and `kube-root-ca.crt` in every namespace), [`nodeipam`]
//! (a pod range per Node), [`nodelifecycle`] (taints from Node conditions),
//! [`resourcequota`] (ResourceQuotas' `status.used`), [`job`] (Jobs' pods run to
//! completion), [`ttlafterfinished`] (finished Jobs deleted after their TTL),
//! [`cronjob`] (Jobs on a schedule), [`daemonset`] (a pod on every eligible node, with
//! revisions kept by [`history`]), [`statefulset`] (pods with stable identities, in
//! order), [`disruption`] (what PodDisruptionBudgets allow), [`podautoscaler`]
//! (replicas from CPU and memory usage), [`volume`] (claims bound to volumes, and
//! claims and volumes kept while in use) and
//! [`clusterroleaggregation`] (the rules of aggregated
//! ClusterRoles such as `admin`, `edit` and `view`). [`run`] puts them together.

pub mod certificates;
pub mod clusterroleaggregation;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
mod error;
pub mod expectations;
pub mod gc;
pub mod history;
pub mod intern;
pub mod job;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod owner;
pub mod podautoscaler;
pub mod podcontrol;
pub mod podevents;
pub mod podgc;
pub mod pods;
pub mod replicaset;
pub mod resourcequota;
pub mod serviceaccount;
pub mod servicelb;
pub mod statefulset;
pub mod taint_eviction;
pub mod tokencleaner;
pub mod ttlafterfinished;
pub mod volume;

use std::future::Future;

use krust_client::{informer, queue};
use kube::Client;
use tokio::task::JoinSet;

pub use error::Error;
pub use krust_client::leader::{self, LeaderElectionConfig, LeaderElector};

/// Garbage-collector workers per queue (upstream's `--concurrent-gc-syncs`).
const GC_WORKERS: usize = 20;

/// How the controller-manager runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// `None` runs without leader election (a single instance).
    pub leader_election: Option<LeaderElectionConfig>,
    /// Reconcile loops per controller (upstream's `--concurrent-*-syncs`: 5 for most
    /// controllers, 10 for namespaces; one value for all here).
    pub workers: usize,
    /// Node IPAM: the cluster CIDR and the prefix length of each node's range
    /// (upstream's `--cluster-cidr` and `--node-cidr-mask-size`); `None` allocates none.
    pub node_ipam: Option<(krust_api::cidr::Ipv4Cidr, u8)>,
    /// The cluster CA bundle (PEM) published in every namespace as the `kube-root-ca.crt`
    /// ConfigMap (upstream's `--root-ca-file`); `None` publishes nothing.
    pub root_ca: Option<String>,
    /// How often each HorizontalPodAutoscaler is evaluated (upstream's
    /// `--horizontal-pod-autoscaler-sync-period`).
    pub hpa_sync_period: std::time::Duration,
    /// The CA that issues approved certificate signing requests; `None` issues none.
    pub signing: Option<certificates::SigningConfig>,
    /// When silent nodes are `Unknown` and how fast their pods are evicted.
    pub node_monitor: nodelifecycle::health::MonitorConfig,
    /// Give LoadBalancer Services the nodes' addresses (k3s's ServiceLB).
    pub service_lb: bool,
    /// Finished pods kept before the oldest are deleted (upstream's
    /// `--terminated-pod-gc-threshold`; 0 keeps them all).
    pub terminated_pod_gc_threshold: usize,
}

/// Starts the controllers (after winning the lease, if leader election is on) and runs
/// until `shutdown` completes. Losing the lease stops every controller at once; the
/// instance then stands by as a candidate again, with fresh caches when it wins.
pub async fn run(client: Client, config: Config, shutdown: impl Future<Output = ()>) {
    let elector = config
        .leader_election
        .clone()
        .map(|le| LeaderElector::new(client.clone(), le));
    leader::run_while_leading(elector, shutdown, || {
        run_controllers(client.clone(), &config)
    })
    .await
}

/// Creates the shared informers and the controllers on them, starts the informers,
/// waits for their caches to fill, then runs the reconcile loops (until dropped).
async fn run_controllers(client: Client, config: &Config) {
    let workers = config.workers;
    let mut tasks = JoinSet::new();
    let tasks = &mut tasks;
    let informers = informer::SharedInformers::new(client.clone());
    let (rs_events, rs_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "replicaset-controller");
    let (d_events, d_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "deployment-controller");
    let replicasets =
        replicaset::ReplicaSetController::<k8s_openapi::api::apps::v1::ReplicaSet>::new(
            client.clone(),
            &informers,
            rs_events,
        );
    let (rc_events, rc_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "replication-controller");
    let replication_controllers = replicaset::ReplicaSetController::<
        k8s_openapi::api::core::v1::ReplicationController,
    >::new(client.clone(), &informers, rc_events);
    let deployments = deployment::DeploymentController::new(client.clone(), &informers, d_events);
    let slices = endpoints::slice::EndpointSliceController::new(client.clone(), &informers);
    let legacy_endpoints = endpoints::legacy::EndpointsController::new(client.clone(), &informers);
    let namespaces = namespace::NamespaceController::new(client.clone(), &informers);
    let node_ipam = config.node_ipam.map(|(cluster, mask)| {
        let (events, sender) =
            krust_client::events::EventRecorder::new(client.clone(), "node-controller");
        tasks.spawn(sender);
        nodeipam::NodeIpamController::new(client.clone(), &informers, cluster, mask, events)
    });
    let node_lifecycle = nodelifecycle::NodeLifecycleController::new(client.clone(), &informers);
    let (nl_events, nl_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "node-controller");
    let node_health = nodelifecycle::health::NodeHealthMonitor::new(
        client.clone(),
        &informers,
        config.node_monitor.clone(),
        nl_events,
    );
    let (te_events, te_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "taint-eviction-controller");
    let taint_eviction =
        taint_eviction::TaintEvictionController::new(client.clone(), &informers, te_events);
    let token_cleaner = tokencleaner::TokenCleaner::new(client.clone(), &informers);
    let pod_gc = podgc::PodGcController::new(
        client.clone(),
        &informers,
        config.terminated_pod_gc_threshold,
    );
    let service_lb = config
        .service_lb
        .then(|| servicelb::ServiceLbController::new(client.clone(), &informers));
    let aggregation =
        clusterroleaggregation::ClusterRoleAggregationController::new(client.clone(), &informers);
    let quotas = resourcequota::ResourceQuotaController::new(client.clone(), &informers);
    let (j_events, j_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "job-controller");
    let (jobs, job_pods) = job::JobController::new(client.clone(), &informers, j_events);
    let ttl = ttlafterfinished::TtlAfterFinishedController::new(client.clone(), &informers);
    let approving = certificates::approver::CsrApprovingController::new(client.clone(), &informers);
    let signing = config.signing.as_ref().and_then(|signing| {
        certificates::CsrSigningController::new(client.clone(), &informers, signing)
            .inspect_err(|err| tracing::error!(error = %err, "not signing certificates"))
            .ok()
    });
    let (cj_events, cj_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "cronjob-controller");
    let cronjobs = cronjob::CronJobController::new(client.clone(), &informers, cj_events);
    let (ds_events, ds_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "daemonset-controller");
    let daemonsets = daemonset::DaemonSetController::new(client.clone(), &informers, ds_events);
    let (pdb_events, pdb_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "controllermanager");
    let disruption = disruption::DisruptionController::new(client.clone(), &informers, pdb_events);
    let (hpa_events, hpa_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "horizontal-pod-autoscaler");
    let autoscalers = podautoscaler::HorizontalController::new(
        client.clone(),
        &informers,
        hpa_events,
        config.hpa_sync_period,
    );
    let (ss_events, ss_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "statefulset-controller");
    let statefulsets =
        statefulset::StatefulSetController::new(client.clone(), &informers, ss_events);
    let (pv_events, pv_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "persistentvolume-controller");
    let volumes =
        volume::binder::PersistentVolumeController::new(client.clone(), &informers, pv_events);
    let pvc_protection =
        volume::protection::PvcProtectionController::new(client.clone(), &informers);
    let pv_protection = volume::protection::PvProtectionController::new(client.clone(), &informers);
    let (ad_events, ad_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "attachdetach-controller");
    let attach_detach =
        volume::attach::AttachDetachController::new(client.clone(), &informers, ad_events);
    let (ev_events, ev_sender) =
        krust_client::events::EventRecorder::new(client.clone(), "ephemeral_volume");
    let ephemeral =
        volume::ephemeral::EphemeralVolumeController::new(client.clone(), &informers, ev_events);
    let service_accounts = serviceaccount::ServiceAccountController::new(
        client.clone(),
        &informers,
        config.root_ca.clone(),
    );
    // The collector keeps its own metadata-only watches of every kind.
    tasks.spawn(gc::GarbageCollector::run(client, GC_WORKERS));
    tasks.spawn(rs_sender);
    tasks.spawn(nl_sender);
    tasks.spawn(te_sender);
    tasks.spawn(rc_sender);
    tasks.spawn(d_sender);
    tasks.spawn(j_sender);
    tasks.spawn(cj_sender);
    tasks.spawn(ds_sender);
    tasks.spawn(ss_sender);
    tasks.spawn(pdb_sender);
    tasks.spawn(hpa_sender);
    tasks.spawn(pv_sender);
    tasks.spawn(ev_sender);
    tasks.spawn(ad_sender);
    tasks.spawn(job_pods.clone().run());
    informers.start(tasks).await;
    job_pods.cache().wait_until_ready().await;
    tracing::info!(
        "caches synced; controllers started: replicaset, replicationcontroller, deployment, endpointslice, endpoints, namespace, nodeipam, node-lifecycle, taint-eviction, servicelb, tokencleaner, pod-garbage-collector, resourcequota, job, ttl-after-finished, csrapproving, csrsigning, cronjob, daemonset, statefulset, disruption, horizontalpodautoscaling, persistentvolume-binder, attachdetach, pvc-protection, pv-protection, ephemeral-volume, serviceaccount, clusterrole-aggregation, garbagecollector"
    );
    tasks.spawn(queue::run(replicasets, workers));
    tasks.spawn(queue::run(replication_controllers, workers));
    tasks.spawn(queue::run(deployments, workers));
    tasks.spawn(queue::run(slices, workers));
    tasks.spawn(queue::run(legacy_endpoints, workers));
    tasks.spawn(queue::run(namespaces, workers));
    if let Some(node_ipam) = node_ipam {
        tasks.spawn(queue::run(node_ipam, workers));
    }
    tasks.spawn(queue::run(service_accounts, workers));
    tasks.spawn(queue::run(aggregation, 1));
    tasks.spawn(queue::run(quotas, workers));
    tasks.spawn(queue::run(jobs, workers));
    tasks.spawn(queue::run(ttl, workers));
    tasks.spawn(queue::run(approving, workers));
    if let Some(signing) = signing {
        tasks.spawn(queue::run(signing, workers));
    }
    tasks.spawn(queue::run(cronjobs, workers));
    tasks.spawn(queue::run(daemonsets, workers));
    tasks.spawn(queue::run(statefulsets, workers));
    tasks.spawn(queue::run(disruption, workers));
    tasks.spawn(queue::run(autoscalers, workers));
    tasks.spawn(queue::run(node_lifecycle, workers));
    tasks.spawn(node_health.run());
    tasks.spawn(queue::run(taint_eviction, workers));
    tasks.spawn(queue::run(token_cleaner, 1));
    tasks.spawn(queue::run(pod_gc, 1));
    if let Some(service_lb) = service_lb {
        tasks.spawn(queue::run(service_lb, workers));
    }
    tasks.spawn(queue::run(volumes, workers));
    tasks.spawn(queue::run(pvc_protection, workers));
    tasks.spawn(queue::run(pv_protection, workers));
    tasks.spawn(queue::run(ephemeral, workers));
    tasks.spawn(queue::run(attach_detach, workers));
    while let Some(done) = tasks.join_next().await {
        if let Err(err) = done {
            tracing::error!(error = %err, "controller task failed");
        }
    }
}
