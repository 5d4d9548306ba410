//! Admission: the last stage before the store, where writes are mutated and checked — as
//! upstream's `admission.Interface`. Each plugin says which requests it handles; the
//! chain runs the mutating half of every plugin that handles the request, in order, then
//! the validating half of each on the object as mutated (upstream's two phases). The
//! plugins krust enables, with upstream's names and in upstream's order, are listed once,
//! by the assembled server (krust-apiserver's `admission::plugins::enabled`).
//!
//! What a kind's REST storage does around the store (Service IP allocation, RBAC's
//! escalation check) is not admission: see `rest::Storage`.

use krust_api::status::{ApiError, Target};
use serde_json::Value;

use crate::rest::Call;

/// The operation a request performs on its resource, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    /// A connect subresource (exec, attach, port-forward): the object is its options.
    Connect,
}

impl Operation {
    /// The name AdmissionReviews and webhook rules use.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }

    /// The kind of the options a request of this operation carries (a CONNECT's
    /// options are its object).
    pub fn options_kind(self) -> Option<&'static str> {
        match self {
            Operation::Create => Some("CreateOptions"),
            Operation::Update => Some("UpdateOptions"),
            Operation::Delete => Some("DeleteOptions"),
            Operation::Connect => None,
        }
    }
}

/// What a plugin sees of a request besides the object it admits (upstream's
/// `admission.Attributes`): the call (resource, subresource, namespace, user, dry run),
/// the operation, and the object as stored before an update or delete.
pub struct Attributes<'r> {
    pub call: &'r Call<'r>,
    pub operation: Operation,
    pub old: Option<&'r Value>,
}

impl<'r> Attributes<'r> {
    pub fn new(call: &'r Call<'r>, operation: Operation, old: Option<&'r Value>) -> Self {
        Attributes {
            call,
            operation,
            old,
        }
    }

    /// Whether the request is for the resource `plural` of `group` (any subresource).
    pub fn is(&self, group: &str, plural: &str) -> bool {
        let info = self.call.kind.info;
        info.group == group && info.plural == plural
    }

    pub fn subresource(&self) -> Option<&str> {
        self.call.info.subresource.as_deref()
    }

    /// A plugin's refusal of the request's object: `<resource> "<name>" is forbidden:
    /// <why>` (upstream's `admission.NewForbidden`).
    pub fn forbidden(&self, name: &str, why: &str) -> ApiError {
        let info = self.call.kind.info;
        ApiError::forbidden_for(
            Target {
                group: info.group,
                resource: info.plural,
                name,
            },
            why,
        )
    }
}

/// One admission plugin (upstream's `admission.Interface`, with its `MutationInterface`
/// and `ValidationInterface` halves). `obj` is the new object on create and update, the
/// options on connect and none on delete; a plugin without a half keeps the default,
/// which admits.
#[async_trait::async_trait]
pub trait Plugin: Send + Sync {
    /// Upstream's name for the plugin.
    fn name(&self) -> &'static str;

    /// Whether the plugin has anything to say about this request.
    fn handles(&self, a: &Attributes<'_>) -> bool;

    /// The mutating half: may change the object, or refuse the request.
    async fn admit(&self, _a: &Attributes<'_>, _obj: Option<&mut Value>) -> Result<(), ApiError> {
        Ok(())
    }

    /// The validating half, on the object as every mutating half left it.
    async fn validate(&self, _a: &Attributes<'_>, _obj: Option<&Value>) -> Result<(), ApiError> {
        Ok(())
    }
}

/// The admission chain.
pub struct Admission {
    plugins: Vec<Box<dyn Plugin>>,
}

impl Admission {
    /// The chain of these plugins, which run in the order given.
    pub fn new(plugins: Vec<Box<dyn Plugin>>) -> Self {
        Admission { plugins }
    }

    /// The mutating phase: every handling plugin's mutating half, in order.
    pub async fn mutate(
        &self,
        a: &Attributes<'_>,
        mut obj: Option<&mut Value>,
    ) -> Result<(), ApiError> {
        for plugin in self.plugins.iter().filter(|p| p.handles(a)) {
            plugin.admit(a, obj.as_deref_mut()).await?;
        }
        Ok(())
    }

    /// The validating phase: every handling plugin's validating half, in order; the first
    /// refusal refuses the request.
    pub async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        for plugin in self.plugins.iter().filter(|p| p.handles(a)) {
            plugin.validate(a, obj).await?;
        }
        Ok(())
    }

    /// Both phases, for a request whose REST storage does nothing between them (a delete).
    pub async fn admit(
        &self,
        a: &Attributes<'_>,
        mut obj: Option<&mut Value>,
    ) -> Result<(), ApiError> {
        self.mutate(a, obj.as_deref_mut()).await?;
        self.validate(a, obj.as_deref()).await
    }
}
