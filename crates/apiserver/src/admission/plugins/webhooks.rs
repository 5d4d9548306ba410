//! The dynamic admission plugins: mutating webhooks, ValidatingAdmissionPolicies and
//! validating webhooks, configured through the API (the machinery is in `webhook`).

use krust_api::status::ApiError;
use serde_json::Value;

use crate::admission::{Attributes, Operation, Plugin};
use crate::webhook;

/// MutatingAdmissionWebhook: an object a webhook changed is defaulted and validated
/// again (upstream validates after all mutating admission) before the validating
/// plugins judge it.
pub struct MutatingAdmissionWebhook;

#[async_trait::async_trait]
impl Plugin for MutatingAdmissionWebhook {
    fn name(&self) -> &'static str {
        "MutatingAdmissionWebhook"
    }

    fn handles(&self, _a: &Attributes<'_>) -> bool {
        true
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        match (a.operation, obj) {
            (Operation::Create | Operation::Update, Some(obj)) => {
                if webhook::mutate(a.call, a.operation, obj, a.old).await? {
                    a.call.kind.strategy.default(obj);
                    crate::rest::validate(a.call, obj, a.old)?;
                }
                Ok(())
            }
            (operation, obj) => webhook::consult(a.call, operation, obj.as_deref(), a.old).await,
        }
    }
}

pub struct ValidatingAdmissionPolicy;

#[async_trait::async_trait]
impl Plugin for ValidatingAdmissionPolicy {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionPolicy"
    }

    fn handles(&self, _a: &Attributes<'_>) -> bool {
        true
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        webhook::apply_policies(a.call, a.operation, obj, a.old).await
    }
}

pub struct ValidatingAdmissionWebhook;

#[async_trait::async_trait]
impl Plugin for ValidatingAdmissionWebhook {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionWebhook"
    }

    fn handles(&self, _a: &Attributes<'_>) -> bool {
        true
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        webhook::validate(a.call, a.operation, obj, a.old).await
    }
}
