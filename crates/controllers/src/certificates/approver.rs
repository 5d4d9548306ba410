//! `CsrApprovingController`: approves kubelets' client certificate requests as upstream's
//! csrapproving controller — a request for `kubernetes.io/kube-apiserver-client-kubelet`
//! that keeps that signer's rules is approved when a SubjectAccessReview says its
//! requester may create `certificatesigningrequests/selfnodeclient` (renewing its own
//! node's certificate) or `/nodeclient` (a new node's, granted to bootstrap tokens).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use krust_client::cache::Cache;
use krust_client::informer::SharedInformers;
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::Client;
use kube::api::{Api, PostParams};
use x509_parser::prelude::{FromDer, X509CertificationRequest};

use super::{Enqueue, KUBELET_CLIENT, check_signer_rules, has, issued, request_der};
use crate::Error;

pub struct CsrApprovingController {
    client: Client,
    requests: Cache<CertificateSigningRequest>,
    queue: Arc<WorkQueue>,
}

impl CsrApprovingController {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let requests = informers.get::<CertificateSigningRequest>();
        let controller = Arc::new(CsrApprovingController {
            client,
            requests: requests.cache(),
            queue: WorkQueue::new("csrapproving"),
        });
        requests.add_handler(Arc::new(Enqueue {
            queue: controller.queue.clone(),
            wants: undecided,
        }));
        controller
    }
}

/// A kubelet client request nobody has approved, denied or issued yet.
fn undecided(csr: &CertificateSigningRequest) -> bool {
    csr.spec.signer_name == KUBELET_CLIENT
        && !has(csr, "Approved")
        && !has(csr, "Denied")
        && !issued(csr)
}

/// The recognizers, in upstream's order: the permission each needs and the message of
/// its approval.
fn recognized(csr: &CertificateSigningRequest) -> Vec<(&'static str, &'static str)> {
    let Ok(der) = request_der(&csr.spec.request.0) else {
        return Vec::new();
    };
    let Ok((_, request)) = X509CertificationRequest::from_der(&der) else {
        return Vec::new();
    };
    if check_signer_rules(KUBELET_CLIENT, &request, &csr.spec.usages).is_err() {
        return Vec::new();
    }
    let common_name = request
        .certification_request_info
        .subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok());
    let mut found = Vec::new();
    if common_name.is_some() && common_name == csr.spec.username.as_deref() {
        found.push((
            "selfnodeclient",
            "Auto approving self kubelet client certificate after SubjectAccessReview.",
        ));
    }
    found.push((
        "nodeclient",
        "Auto approving kubelet client certificate after SubjectAccessReview.",
    ));
    found
}

impl Reconciler for CsrApprovingController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Duration>, Error> {
        let Some(csr) = self.requests.get(None, name) else {
            return Ok(None);
        };
        if !undecided(&csr) {
            return Ok(None);
        }
        for (subresource, message) in recognized(&csr) {
            if !self.allowed(&csr, subresource).await? {
                continue;
            }
            let mut csr = (*csr).clone();
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            );
            csr.status
                .get_or_insert_with(Default::default)
                .conditions
                .get_or_insert_with(Vec::new)
                .push(CertificateSigningRequestCondition {
                    type_: "Approved".into(),
                    status: "True".into(),
                    reason: Some("AutoApproved".into()),
                    message: Some(message.into()),
                    last_update_time: Some(now.clone()),
                    last_transition_time: Some(now),
                });
            return match Api::<CertificateSigningRequest>::all(self.client.clone())
                .patch_approval(
                    name,
                    &Default::default(),
                    &kube::api::Patch::Merge(serde_json::json!({"status": csr.status})),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        csr = name,
                        subresource,
                        "approved a kubelet's certificate request"
                    );
                    Ok(None)
                }
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
                Err(e) => Err(Error::api("approving", name, e)),
            };
        }
        Ok(None)
    }
}

impl CsrApprovingController {
    /// Whether the requester may create `certificatesigningrequests/<subresource>`.
    async fn allowed(
        &self,
        csr: &CertificateSigningRequest,
        subresource: &str,
    ) -> Result<bool, Error> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: csr.spec.username.clone(),
                uid: csr.spec.uid.clone(),
                groups: csr.spec.groups.clone(),
                extra: csr.spec.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("certificates.k8s.io".into()),
                    resource: Some("certificatesigningrequests".into()),
                    subresource: Some(subresource.into()),
                    verb: Some("create".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Error::api(
                    "reviewing the requester of",
                    csr.metadata.name.clone().unwrap_or_default(),
                    e,
                )
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}
