//! `PersistentVolumeController`: upstream's persistent-volume binder. It binds each
//! pending claim to the best matching volume (or asks its class's provisioner for one),
//! keeps both phases true (claims Pending/Bound/Lost, volumes
//! Pending/Available/Bound/Released/Failed), undoes its own half-made bindings, and
//! reclaims the volume of a deleted claim (Retain keeps it Released; Delete leaves a
//! provisioned volume to its provisioner and fails others, which nothing can delete).
//!
//! Every write is an update with the cached resourceVersion (the binder's role allows
//! `update`, not `patch`); a lost race is a 409 and the key is tried again on fresher
//! data. Unbound claims are looked at again every [`RESYNC`], as upstream's
//! `--pvclaimbinder-sync-period`, for volumes created without a claim in mind.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::{
    BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER, PROVISIONED_BY, SELECTED_NODE,
    STORAGE_PROVISIONER, annotation, claim_class, set_annotation,
};
use crate::Error;
use crate::owner::split_key;
use krust_client::volume::{Placement, best_match, refers_to};

/// How often unbound claims are matched again.
const RESYNC: Duration = Duration::from_secs(15);

/// A work-queue key: volumes and claims share the queue.
enum Key<'a> {
    Volume(&'a str),
    Claim(&'a str, &'a str),
}

impl<'a> Key<'a> {
    fn parse(key: &'a str) -> Option<Self> {
        if let Some(name) = key.strip_prefix("pv:") {
            return Some(Key::Volume(name));
        }
        let (ns, name) = split_key(key.strip_prefix("pvc:")?);
        Some(Key::Claim(ns, name))
    }
}

fn volume_key(name: &str) -> String {
    format!("pv:{name}")
}

fn claim_key(ns: &str, name: &str) -> String {
    format!("pvc:{ns}/{name}")
}

pub struct PersistentVolumeController {
    client: Client,
    volumes: Cache<PersistentVolume>,
    claims: Cache<PersistentVolumeClaim>,
    classes: Cache<StorageClass>,
    events: EventRecorder,
    queue: Arc<WorkQueue>,
}

impl PersistentVolumeController {
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let volumes = informers.get::<PersistentVolume>();
        let claims = informers.get::<PersistentVolumeClaim>();
        let classes = informers.get::<StorageClass>();
        let controller = Arc::new(PersistentVolumeController {
            client,
            volumes: volumes.cache(),
            claims: claims.cache(),
            classes: classes.cache(),
            events,
            queue: WorkQueue::new("persistentvolume-binder"),
        });
        volumes.add_handler(Arc::new(VolumeEvents(controller.clone())));
        claims.add_handler(Arc::new(ClaimEvents(controller.clone())));
        classes.add_handler(Arc::new(ClassEvents(controller.clone())));
        controller
    }

    /// Queues every unbound claim (a volume became free, a class appeared).
    fn queue_pending_claims(&self) {
        for claim in self.claims.state() {
            if annotation(&claim.metadata, BIND_COMPLETED).is_none() {
                self.queue.add(claim_key(
                    claim.metadata.namespace.as_deref().unwrap_or_default(),
                    &claim.name_any(),
                ));
            }
        }
    }
}

struct VolumeEvents(Arc<PersistentVolumeController>);

impl EventHandler<PersistentVolume> for VolumeEvents {
    fn on_apply(&self, _old: Option<&PersistentVolume>, pv: &Arc<PersistentVolume>) {
        self.0.queue.add(volume_key(&pv.name_any()));
        match pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            Some(r) => self.0.queue.add(claim_key(
                r.namespace.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default(),
            )),
            None => self.0.queue_pending_claims(),
        }
    }
    fn on_delete(&self, pv: &Arc<PersistentVolume>) {
        if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            self.0.queue.add(claim_key(
                r.namespace.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default(),
            ));
        }
    }
}

/// A class added or changed (a new default, a provisioner) may serve pending claims.
struct ClassEvents(Arc<PersistentVolumeController>);

impl EventHandler<StorageClass> for ClassEvents {
    fn on_apply(&self, _old: Option<&StorageClass>, _class: &Arc<StorageClass>) {
        self.0.queue_pending_claims();
    }
    fn on_delete(&self, _class: &Arc<StorageClass>) {}
}

struct ClaimEvents(Arc<PersistentVolumeController>);

impl ClaimEvents {
    /// The volumes that name or are named by the claim.
    fn queue_volumes(&self, claim: &PersistentVolumeClaim) {
        if let Some(name) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
            self.0.queue.add(volume_key(name));
        }
        for pv in self.0.volumes.state() {
            let r = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            if r.is_some_and(|r| {
                r.namespace == claim.metadata.namespace && r.name == claim.metadata.name
            }) {
                self.0.queue.add(volume_key(&pv.name_any()));
            }
        }
    }
}

impl EventHandler<PersistentVolumeClaim> for ClaimEvents {
    fn on_apply(&self, _old: Option<&PersistentVolumeClaim>, claim: &Arc<PersistentVolumeClaim>) {
        self.0.queue.add(claim_key(
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            &claim.name_any(),
        ));
        self.queue_volumes(claim);
    }
    fn on_delete(&self, claim: &Arc<PersistentVolumeClaim>) {
        self.queue_volumes(claim);
    }
}

impl Reconciler for PersistentVolumeController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        match Key::parse(key) {
            Some(Key::Volume(name)) => match self.volumes.get(None, name) {
                Some(pv) => self.sync_volume(&pv).await.map(|()| None),
                None => Ok(None),
            },
            Some(Key::Claim(ns, name)) => match self.claims.get(Some(ns), name) {
                Some(claim) if claim.metadata.deletion_timestamp.is_none() => {
                    self.sync_claim(&claim).await
                }
                _ => Ok(None),
            },
            None => Ok(None),
        }
    }
}

/// A claim's `namespace/name`, for messages and errors.
fn claim_name(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.name_any()
    )
}

impl PersistentVolumeController {
    fn volume_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn claim_api(&self, claim: &PersistentVolumeClaim) -> Api<PersistentVolumeClaim> {
        Api::namespaced(
            self.client.clone(),
            claim.metadata.namespace.as_deref().unwrap_or_default(),
        )
    }

    async fn sync_claim(&self, claim: &PersistentVolumeClaim) -> Result<Option<Duration>, Error> {
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty());
        if annotation(&claim.metadata, BIND_COMPLETED).is_some() {
            self.sync_bound_claim(claim, volume_name).await?;
            return Ok(None);
        }
        match volume_name {
            None => self.sync_unbound_claim(claim).await,
            Some(name) => {
                // Pre-bound by the user to a volume by name.
                match self.volumes.get(None, name) {
                    Some(pv) => {
                        let free = pv
                            .spec
                            .as_ref()
                            .and_then(|s| s.claim_ref.as_ref())
                            .is_none();
                        if free || refers_to(&pv, claim) {
                            self.bind(&pv, claim).await?;
                        } else {
                            self.events.record(
                                claim,
                                EventType::Warning,
                                "FailedBinding",
                                format!("volume \"{name}\" already bound to a different claim."),
                            );
                            self.claim_phase(claim, "Pending").await?;
                        }
                    }
                    None => self.claim_phase(claim, "Pending").await?,
                }
                Ok(None)
            }
        }
    }

    async fn sync_unbound_claim(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<Duration>, Error> {
        // A claim made before any default class existed gets the default class now
        // (upstream's retroactive default StorageClass); its update brings it back.
        let classless = claim
            .spec
            .as_ref()
            .is_none_or(|s| s.storage_class_name.is_none())
            && annotation(&claim.metadata, krust_client::volume::BETA_CLASS).is_none();
        if classless {
            let classes = self.classes.state();
            if let Some(class) = krust_client::volume::default_class(classes.iter().map(|c| &**c)) {
                let mut updated = claim.clone();
                updated
                    .spec
                    .get_or_insert_with(Default::default)
                    .storage_class_name = class.metadata.name.clone();
                return match self
                    .claim_api(claim)
                    .replace(&claim.name_any(), &PostParams::default(), &updated)
                    .await
                {
                    Ok(_) => Ok(None),
                    Err(e) if is_status(&e, 404) => Ok(None),
                    Err(e) => Err(Error::api(
                        "setting the default class of claim",
                        claim_name(claim),
                        e,
                    )),
                };
            }
        }
        let class_name = claim_class(claim);
        let class = (!class_name.is_empty())
            .then(|| self.classes.get(None, class_name))
            .flatten();
        // A WaitForFirstConsumer claim takes only a volume pre-bound to it here: the
        // scheduler picks free volumes with the node, or names the node for the
        // provisioner (`selected-node`).
        let delayed = class
            .as_ref()
            .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
        let placement = if delayed {
            Placement::Undecided
        } else {
            Placement::Anywhere
        };
        let volumes = self.volumes.state();
        if let Some(pv) = best_match(claim, volumes.iter().map(|v| &**v), placement) {
            self.bind(pv, claim).await?;
            return Ok(None);
        }
        if delayed && annotation(&claim.metadata, SELECTED_NODE).is_none() {
            self.events.record(
                claim,
                EventType::Normal,
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding".into(),
            );
        } else if let Some(class) = &class {
            self.ask_provisioner(claim, &class.provisioner).await?;
        } else if class_name.is_empty() {
            self.events.record(
                claim,
                EventType::Normal,
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set".into(),
            );
        } else {
            self.events.record(
                claim,
                EventType::Warning,
                "ProvisioningFailed",
                format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
            );
        }
        self.claim_phase(claim, "Pending").await?;
        Ok(Some(RESYNC))
    }

    /// Names the provisioner on the claim, which it watches for (upstream's external
    /// provisioning hand-off).
    async fn ask_provisioner(
        &self,
        claim: &PersistentVolumeClaim,
        provisioner: &str,
    ) -> Result<(), Error> {
        if annotation(&claim.metadata, STORAGE_PROVISIONER) == Some(provisioner) {
            return Ok(());
        }
        let mut updated = claim.clone();
        set_annotation(&mut updated.metadata, STORAGE_PROVISIONER, provisioner);
        set_annotation(&mut updated.metadata, BETA_STORAGE_PROVISIONER, provisioner);
        self.claim_api(claim)
            .replace(&claim.name_any(), &PostParams::default(), &updated)
            .await
            .map_err(|e| Error::api("naming the provisioner of claim", claim_name(claim), e))?;
        self.events.record(
            claim,
            EventType::Normal,
            "ExternalProvisioning",
            format!(
                "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
            ),
        );
        Ok(())
    }

    async fn sync_bound_claim(
        &self,
        claim: &PersistentVolumeClaim,
        volume_name: Option<&str>,
    ) -> Result<(), Error> {
        let Some(name) = volume_name else {
            return self
                .lose(claim, "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
                .await;
        };
        let Some(pv) = self.volumes.get(None, name) else {
            return self
                .lose(
                    claim,
                    "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                )
                .await;
        };
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        match claim_ref {
            None => self.bind(&pv, claim).await,
            Some(r) if r.uid.as_deref() == claim.metadata.uid.as_deref() => {
                self.bind(&pv, claim).await
            }
            Some(_) => {
                self.events.record(
                    claim,
                    EventType::Warning,
                    "ClaimMisbound",
                    "Two claims are bound to the same volume, this one is bound incorrectly".into(),
                );
                self.claim_phase(claim, "Lost").await
            }
        }
    }

    async fn lose(&self, claim: &PersistentVolumeClaim, why: &str) -> Result<(), Error> {
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Lost") {
            self.events
                .record(claim, EventType::Warning, "ClaimLost", why.to_string());
        }
        self.claim_phase(claim, "Lost").await
    }

    /// Writes both halves of a binding and both Bound phases, each only if needed.
    async fn bind(
        &self,
        pv: &PersistentVolume,
        claim: &PersistentVolumeClaim,
    ) -> Result<(), Error> {
        let pv_name = pv.name_any();
        // The volume's half: claimRef with the claim's UID.
        let mut volume = pv.clone();
        let current = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let complete = current
            .is_some_and(|r| r.uid.is_some() && r.uid.as_deref() == claim.metadata.uid.as_deref());
        if !complete {
            let by_controller = current.is_none();
            let spec = volume.spec.get_or_insert_with(Default::default);
            spec.claim_ref = Some(krust_client::volume::claim_ref(claim));
            if by_controller {
                set_annotation(&mut volume.metadata, BOUND_BY_CONTROLLER, "yes");
            }
            volume = self
                .volume_api()
                .replace(&pv_name, &PostParams::default(), &volume)
                .await
                .map_err(|e| Error::api("binding volume", pv_name.clone(), e))?;
        }
        // The volume's phase and the claim's half are independent writes: made at
        // once (the scheduler waits for the claim).
        let claim_half = async {
            // volumeName and the completion annotations.
            let mut updated = claim.clone();
            let named = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            if named != Some(pv_name.as_str())
                || annotation(&claim.metadata, BIND_COMPLETED).is_none()
            {
                if named.is_none_or(str::is_empty) {
                    set_annotation(&mut updated.metadata, BOUND_BY_CONTROLLER, "yes");
                }
                set_annotation(&mut updated.metadata, BIND_COMPLETED, "yes");
                updated
                    .spec
                    .get_or_insert_with(Default::default)
                    .volume_name = Some(pv_name.clone());
                updated = self
                    .claim_api(claim)
                    .replace(&claim.name_any(), &PostParams::default(), &updated)
                    .await
                    .map_err(|e| Error::api("binding claim", claim_name(claim), e))?;
            }
            let vspec = volume.spec.as_ref();
            let status = updated.status.get_or_insert_with(Default::default);
            let access_modes = vspec.and_then(|s| s.access_modes.clone());
            let capacity = vspec.and_then(|s| s.capacity.clone());
            if status.phase.as_deref() != Some("Bound")
                || status.access_modes != access_modes
                || status.capacity != capacity
            {
                status.phase = Some("Bound".into());
                status.access_modes = access_modes;
                status.capacity = capacity;
                self.claim_api(claim)
                    .replace_status(&claim.name_any(), &PostParams::default(), &updated)
                    .await
                    .map_err(|e| Error::api("writing the status of claim", claim_name(claim), e))?;
                tracing::info!(claim = %claim_name(claim), volume = %pv_name, "bound");
            }
            Ok::<_, Error>(())
        };
        futures::try_join!(self.volume_phase(&volume, "Bound", None), claim_half)?;
        Ok(())
    }

    async fn claim_phase(&self, claim: &PersistentVolumeClaim, phase: &str) -> Result<(), Error> {
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
            return Ok(());
        }
        let mut updated = claim.clone();
        updated.status.get_or_insert_with(Default::default).phase = Some(phase.into());
        match self
            .claim_api(claim)
            .replace_status(&claim.name_any(), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(Error::api(
                "writing the phase of claim",
                claim_name(claim),
                e,
            )),
        }
    }

    async fn volume_phase(
        &self,
        pv: &PersistentVolume,
        phase: &str,
        message: Option<String>,
    ) -> Result<(), Error> {
        let status = pv.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some(phase)
            && status.and_then(|s| s.message.clone()) == message
        {
            return Ok(());
        }
        let mut updated = pv.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        if status.phase.as_deref() != Some(phase) {
            status.last_phase_transition_time =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        status.phase = Some(phase.into());
        status.message = message;
        match self
            .volume_api()
            .replace_status(&pv.name_any(), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(Error::api("writing the phase of volume", pv.name_any(), e)),
        }
    }

    async fn sync_volume(&self, pv: &PersistentVolume) -> Result<(), Error> {
        let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            return self.volume_phase(pv, "Available", None).await;
        };
        let claim = self
            .claims
            .get(
                claim_ref.namespace.as_deref(),
                claim_ref.name.as_deref().unwrap_or_default(),
            )
            .filter(|c| {
                claim_ref.uid.as_deref().is_none_or(str::is_empty)
                    || c.metadata.uid == claim_ref.uid
            });
        let prebound = claim_ref.uid.as_deref().is_none_or(str::is_empty);
        match claim {
            // Reserved by a user for a claim that does not exist (yet).
            None if prebound => self.volume_phase(pv, "Available", None).await,
            None => self.release(pv).await,
            Some(claim) => {
                let named = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
                match named {
                    // The claim's half is still to be written; the claim's sync does it.
                    None | Some("") if prebound => self.volume_phase(pv, "Available", None).await,
                    None | Some("") => self.volume_phase(pv, "Bound", None).await,
                    Some(name) if name == pv.name_any() => {
                        self.volume_phase(pv, "Bound", None).await
                    }
                    // The claim went to another volume: undo our half-made binding.
                    Some(_) if annotation(&pv.metadata, BOUND_BY_CONTROLLER).is_some() => {
                        let mut updated = (*pv).clone();
                        if let Some(spec) = updated.spec.as_mut() {
                            spec.claim_ref = None;
                        }
                        if let Some(a) = updated.metadata.annotations.as_mut() {
                            a.remove(BOUND_BY_CONTROLLER);
                        }
                        self.volume_api()
                            .replace(&pv.name_any(), &PostParams::default(), &updated)
                            .await
                            .map_err(|e| Error::api("unbinding volume", pv.name_any(), e))?;
                        Ok(())
                    }
                    Some(_) => Ok(()),
                }
            }
        }
    }

    /// The claim of a bound volume is gone: Released, then its reclaim policy.
    async fn release(&self, pv: &PersistentVolume) -> Result<(), Error> {
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        if phase == Some("Failed") {
            return Ok(());
        }
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        match policy {
            "Delete" if annotation(&pv.metadata, PROVISIONED_BY).is_some() => {
                // Its provisioner deletes the storage, then the volume.
                self.volume_phase(pv, "Released", None).await
            }
            "Delete" => {
                let why = format!(
                    "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                    pv.name_any()
                );
                self.events
                    .record(pv, EventType::Warning, "VolumeFailedDelete", why.clone());
                self.volume_phase(pv, "Failed", Some(why)).await
            }
            "Recycle" => {
                let why = "No recycler plugin found for the volume!".to_string();
                self.events
                    .record(pv, EventType::Warning, "VolumeFailedRecycle", why.clone());
                self.volume_phase(pv, "Failed", Some(why)).await
            }
            _ => self.volume_phase(pv, "Released", None).await,
        }
    }
}
