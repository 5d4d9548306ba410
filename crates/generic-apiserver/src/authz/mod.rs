//! Authorization, the stage after authentication: may this user do this? As upstream, a
//! chain of authorizers each answers allow, deny or no opinion: members of
//! `system:masters` are allowed outright, kubelets get what their pods need from the
//! [`node`] authorizer, then [`rbac`] decides from Roles and bindings held in memory. Reviews (`kubectl auth can-i`), impersonation and RBAC's escalation
//! checks are built on the same decisions.

pub mod bootstrap_policy;
pub mod escalation;
pub mod identity;
pub mod impersonation;
pub mod node;
pub mod rbac;
pub mod reviews;
pub mod rules;

use krust_api::status::{ApiError, Target as ErrorTarget};

use crate::auth::User;
use crate::request::RequestInfo;

/// The group whose members may do everything (upstream's `system:masters`).
pub const MASTERS: &str = "system:masters";

/// What a request asks to do, as upstream's `authorizer.Attributes`.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    pub user: &'a User,
    /// `get`, `list`, `create`, ... for resources; the lower-cased HTTP method for paths.
    pub verb: &'a str,
    pub target: Target<'a>,
}

#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Resource(ResourceAttributes<'a>),
    /// A URL that is not a resource (`/healthz`, `/api`, `/metrics`).
    NonResource {
        path: &'a str,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct ResourceAttributes<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl<'a> Attributes<'a> {
    /// The attributes of a parsed resource request.
    pub fn of_request(user: &'a User, info: &'a RequestInfo) -> Self {
        Attributes {
            user,
            verb: info.verb.as_str(),
            target: Target::Resource(ResourceAttributes {
                group: &info.group,
                resource: &info.resource,
                subresource: info.subresource.as_deref(),
                namespace: info.namespace.as_deref(),
                name: info.name.as_deref(),
            }),
        }
    }

    pub fn namespace(&self) -> Option<&'a str> {
        match self.target {
            Target::Resource(r) => r.namespace.filter(|ns| !ns.is_empty()),
            Target::NonResource { .. } => None,
        }
    }
}

/// One authorizer's answer; the reason is what reviews report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow(String),
    Deny(String),
    NoOpinion(String),
}

impl Decision {
    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }

    pub fn reason(&self) -> &str {
        match self {
            Decision::Allow(r) | Decision::Deny(r) | Decision::NoOpinion(r) => r,
        }
    }
}

/// Decides one request.
pub trait Authorizer: Send + Sync {
    fn authorize(&self, attrs: &Attributes<'_>) -> Decision;
}

impl<T: Authorizer> Authorizer for std::sync::Arc<T> {
    fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        (**self).authorize(attrs)
    }
}

/// Members of `system:masters` may do anything, without consulting policy (upstream's
/// privileged-groups authorizer, first in its chain).
pub struct PrivilegedGroups;

impl Authorizer for PrivilegedGroups {
    fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        if attrs.user.groups.iter().any(|g| g == MASTERS) {
            Decision::Allow(String::new())
        } else {
            Decision::NoOpinion(String::new())
        }
    }
}

/// Authorizers asked in order until one allows or denies (upstream's union authorizer).
pub struct Authorizers(pub Vec<Box<dyn Authorizer>>);

impl Authorizers {
    pub fn decide(&self, attrs: &Attributes<'_>) -> Decision {
        let mut reasons = Vec::new();
        for authorizer in &self.0 {
            match authorizer.authorize(attrs) {
                Decision::NoOpinion(reason) => {
                    if !reason.is_empty() {
                        reasons.push(reason);
                    }
                }
                decided => return decided,
            }
        }
        Decision::NoOpinion(reasons.join("\n"))
    }
}

/// The 403 for a refused request, in upstream's words: `pods is forbidden: User "bob"
/// cannot list resource "pods" in API group "" in the namespace "default"`.
pub fn forbidden(attrs: &Attributes<'_>, reason: &str) -> ApiError {
    let user = &attrs.user.name;
    let verb = attrs.verb;
    let (message, target) = match attrs.target {
        Target::NonResource { path } => (
            format!("User {user:?} cannot {verb} path {path:?}"),
            ErrorTarget {
                group: "",
                resource: "",
                name: "",
            },
        ),
        Target::Resource(r) => {
            let resource = match r.subresource {
                Some(sub) => format!("{}/{sub}", r.resource),
                None => r.resource.to_string(),
            };
            let scope = match attrs.namespace() {
                Some(ns) => format!("in the namespace {ns:?}"),
                None => "at the cluster scope".to_string(),
            };
            (
                format!(
                    "User {user:?} cannot {verb} resource {resource:?} in API group {:?} {scope}",
                    r.group
                ),
                ErrorTarget {
                    group: r.group,
                    resource: r.resource,
                    name: r.name.unwrap_or_default(),
                },
            )
        }
    };
    let message = if reason.is_empty() {
        message
    } else {
        format!("{message}: {reason}")
    };
    ApiError::forbidden_for(target, &message)
}

/// The chain's decision, re-taken against every RBAC write the store has acknowledged
/// when it is not an allow: the index follows the watch cache, which may be a moment
/// behind a binding just created. Anonymous refusals are not re-checked, so
/// unauthenticated clients cannot make the server read the store's revision at will.
pub async fn decide_fresh(scope: &crate::rest::Scope, attrs: &Attributes<'_>) -> Decision {
    let decision = scope.authorizers.decide(attrs);
    if decision.allowed() || attrs.user.is_anonymous() {
        return decision;
    }
    match scope.store.current_revision().await {
        Ok(rev) => {
            scope.cache.wait_for(rev).await;
            if scope.rbac.is_stale() {
                scope.authorizers.decide(attrs)
            } else {
                decision
            }
        }
        Err(_) => decision,
    }
}

/// Whether `attrs.user` may do what `attrs` describe: `Ok` with the decision (its
/// reason goes to the audit log), or upstream's 403.
pub async fn authorize(
    scope: &crate::rest::Scope,
    attrs: &Attributes<'_>,
) -> Result<Decision, ApiError> {
    let decision = decide_fresh(scope, attrs).await;
    if decision.allowed() {
        Ok(decision)
    } else {
        Err(forbidden(attrs, decision.reason()))
    }
}
