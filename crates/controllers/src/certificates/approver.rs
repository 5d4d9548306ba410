//! `CsrApprovingController`: approves kubelets' client certificate requests as upstream's
//! csrapproving controller — a request for `kubernetes.io/kube-apiserver-client-kubelet`
//! that keeps that signer's rules is approved when a SubjectAccessReview says its
//! requester may create `certificatesigningrequests/selfnodeclient` (renewing its own
//! node's certificate) or `/nodeclient` (a new node's, granted to bootstrap tokens).
//! Unlike upstream's, it also approves a kubelet's serving certificate request
//! (`kubernetes.io/kubelet-serving`) when the node asks for itself and every name in it
//! is one of its Node's addresses (upstream leaves those to a human or a third-party
//! approver, and its apiserver then cannot verify kubelets); any other waits for
//! `kubectl certificate approve`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Node;
use krust_client::cache::Cache;
use krust_client::informer::SharedInformers;
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::Client;
use kube::api::{Api, PostParams};
use x509_parser::prelude::{FromDer, X509CertificationRequest};

use super::{
    AltName, Enqueue, KUBELET_CLIENT, KUBELET_SERVING, alt_names, check_signer_rules, has, issued,
    request_der,
};
use crate::Error;

pub struct CsrApprovingController {
    client: Client,
    requests: Cache<CertificateSigningRequest>,
    nodes: Cache<Node>,
    queue: Arc<WorkQueue>,
}

impl CsrApprovingController {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let requests = informers.get::<CertificateSigningRequest>();
        let controller = Arc::new(CsrApprovingController {
            client,
            requests: requests.cache(),
            nodes: informers.get::<Node>().cache(),
            queue: WorkQueue::new("csrapproving"),
        });
        requests.add_handler(Arc::new(Enqueue {
            queue: controller.queue.clone(),
            wants: undecided,
        }));
        controller
    }
}

/// A kubelet client or serving request nobody has approved, denied or issued yet.
fn undecided(csr: &CertificateSigningRequest) -> bool {
    [KUBELET_CLIENT, KUBELET_SERVING].contains(&csr.spec.signer_name.as_str())
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
        if csr.spec.signer_name == KUBELET_SERVING {
            return match self.serving_names_are_the_nodes(&csr) {
                Ok(()) => {
                    self.approve(&csr, SERVING_APPROVED, "kubelet serving")
                        .await
                }
                Err(ServingCheck::NotYet(why)) if younger_than(&csr, PENDING_LOOK) => {
                    // The Node (or its addresses) may not have reached this cache yet.
                    tracing::debug!(csr = name, why, "looking at a serving request again");
                    Ok(Some(NODE_WAIT))
                }
                Err(ServingCheck::NotYet(why) | ServingCheck::Refused(why)) => {
                    tracing::info!(
                        csr = name,
                        why,
                        "left a kubelet serving request for a human"
                    );
                    Ok(None)
                }
            };
        }
        for (subresource, message) in recognized(&csr) {
            if self.allowed(&csr, subresource).await? {
                return self.approve(&csr, message, subresource).await;
            }
        }
        Ok(None)
    }
}

/// The approval message of a kubelet serving request.
const SERVING_APPROVED: &str =
    "Auto approving kubelet serving certificate: its names are its Node's addresses.";
/// How soon a serving request is looked at again when its Node is not registered yet
/// (or does not show the requested addresses yet), and for how long after it was made.
const NODE_WAIT: Duration = Duration::from_secs(2);
const PENDING_LOOK: Duration = Duration::from_secs(5 * 60);

fn younger_than(csr: &CertificateSigningRequest, age: Duration) -> bool {
    csr.metadata.creation_timestamp.as_ref().is_none_or(|t| {
        let age = k8s_openapi::jiff::SignedDuration::try_from(age).unwrap_or_default();
        k8s_openapi::jiff::Timestamp::now().duration_since(t.0) < age
    })
}

/// Why a serving request was not approved.
enum ServingCheck {
    /// Its Node or addresses may yet appear: looked at again.
    NotYet(String),
    Refused(String),
}

impl CsrApprovingController {
    async fn approve(
        &self,
        csr: &CertificateSigningRequest,
        message: &str,
        what: &str,
    ) -> Result<Option<Duration>, Error> {
        let name = csr.metadata.name.as_deref().unwrap_or_default();
        {
            let mut csr = csr.clone();
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
                    tracing::info!(csr = name, what, "approved a kubelet's certificate request");
                    Ok(None)
                }
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
                Err(e) => Err(Error::api("approving", name, e)),
            };
        }
    }

    /// A serving request is the node's own (requested by `system:node:<name>` in
    /// `system:nodes` for that name), keeps the signer's rules, and names only the
    /// Node's addresses: DNS names among its Hostname/InternalDNS/ExternalDNS, IPs
    /// among its InternalIP/ExternalIP.
    fn serving_names_are_the_nodes(
        &self,
        csr: &CertificateSigningRequest,
    ) -> Result<(), ServingCheck> {
        let refused = |why: &str| ServingCheck::Refused(why.to_string());
        let der = request_der(&csr.spec.request.0).map_err(|_| refused("not a PEM request"))?;
        let (_, request) =
            X509CertificationRequest::from_der(&der).map_err(|_| refused("not a request"))?;
        check_signer_rules(KUBELET_SERVING, &request, &csr.spec.usages)
            .map_err(|e| refused(&e.0))?;
        let common_name = request
            .certification_request_info
            .subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default();
        let in_nodes = csr
            .spec
            .groups
            .iter()
            .flatten()
            .any(|g| g == "system:nodes");
        if csr.spec.username.as_deref() != Some(common_name) || !in_nodes {
            return Err(refused("not requested by the node it names"));
        }
        let node_name = common_name
            .strip_prefix("system:node:")
            .ok_or_else(|| refused("not a node's name"))?;
        let node = self
            .nodes
            .get(None, node_name)
            .ok_or_else(|| ServingCheck::NotYet(format!("node {node_name} not seen yet")))?;
        let addresses = |node: &Node| -> Vec<(String, String)> {
            node.status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect()
        };
        let own = addresses(&node);
        // A node writes its own addresses: one that names another Node's is not
        // believed (it would get a certificate to impersonate that kubelet).
        let others: Vec<(String, String)> = self
            .nodes
            .state()
            .iter()
            .filter(|n| n.metadata.name.as_deref() != Some(node_name))
            .flat_map(|n| addresses(n))
            .collect();
        let has = |list: &[(String, String)], types: &[&str], value: &str| {
            list.iter()
                .any(|(t, a)| types.contains(&t.as_str()) && a == value)
        };
        for name in alt_names(&request) {
            let (types, value): (&[&str], String) = match &name {
                AltName::Dns(dns) => (&["Hostname", "InternalDNS", "ExternalDNS"], dns.clone()),
                AltName::Ip(Some(ip)) => (&["InternalIP", "ExternalIP"], ip.to_string()),
                _ => return Err(refused(&format!("{name:?} is not a name or address"))),
            };
            if has(&others, types, &value) {
                return Err(ServingCheck::Refused(format!(
                    "{value} is an address of another node"
                )));
            }
            if !has(&own, types, &value) {
                return Err(ServingCheck::NotYet(format!(
                    "{value} is not an address of node {node_name}"
                )));
            }
        }
        Ok(())
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
