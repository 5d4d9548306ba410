//! Reading evidence: an object's events (newest first) and conditions.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;

use crate::{Context, Error};

/// The events about the object with `uid`, newest first (one field-selected list,
/// never the namespace's whole history).
pub async fn events(ctx: &Context, uid: Option<&str>) -> Result<Vec<Event>, Error> {
    let Some(uid) = uid else {
        return Ok(Vec::new());
    };
    let params = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let mut events = ctx.namespaced::<Event>().list(&params).await?.items;
    events.sort_by_key(|e| std::cmp::Reverse(last_seen(e)));
    Ok(events)
}

/// When an event was last seen, whichever of its times it carries.
pub fn last_seen(event: &Event) -> Option<Timestamp> {
    (event.last_timestamp.as_ref().map(|t| t.0))
        .or(event.event_time.as_ref().map(|t| t.0))
        .or(event.first_timestamp.as_ref().map(|t| t.0))
        .or(event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The newest event with one of `reasons`: `(reason, message, last seen)`.
pub fn newest<'a>(
    events: &'a [Event],
    reasons: &[&str],
) -> Option<(&'a str, &'a str, Option<Timestamp>)> {
    events.iter().find_map(|e| {
        let reason = e.reason.as_deref()?;
        reasons.contains(&reason).then(|| {
            (
                reason,
                e.message.as_deref().unwrap_or_default(),
                last_seen(e),
            )
        })
    })
}

/// A status condition, as the many `*Condition` types of the API all have these fields.
pub struct Condition<'a> {
    pub status: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
    pub since: Option<Timestamp>,
}

/// Looks up a condition by type in any of the API's condition lists.
#[macro_export]
macro_rules! condition {
    ($conditions:expr, $type:expr) => {
        ($conditions)
            .iter()
            .flatten()
            .find(|c| c.type_ == $type)
            .map(|c| $crate::facts::Condition {
                status: c.status.as_str(),
                reason: c.reason.as_deref().unwrap_or_default(),
                message: c.message.as_deref().unwrap_or_default(),
                since: c.last_transition_time.as_ref().map(|t| t.0),
            })
    };
}

/// Ready endpoints of a Service, as far as they were read.
pub struct Ready {
    pub addresses: Vec<String>,
    /// More slices were left unread: there may be more.
    pub more: bool,
}

impl Ready {
    pub fn none(&self) -> bool {
        self.addresses.is_empty()
    }
}

/// `3 ready: a, b, c` (`120+ ready: a, b, c, d, e, …` when more were left unread).
impl std::fmt::Display for Ready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 5;
        let plus = if self.more { "+" } else { "" };
        let shown = self
            .addresses
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let ellipsis = if self.addresses.len() > SHOWN || self.more {
            ", …"
        } else {
            ""
        };
        write!(f, "{}{plus} ready: {shown}{ellipsis}", self.addresses.len())
    }
}

/// The ready endpoints of the Service `name` in `namespace`, from its EndpointSlices,
/// read a few slices at a time until one is ready (a Service of 10,000 pods is not
/// read whole to learn that it has some).
pub async fn ready_endpoints(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Ready, Error> {
    let api = kube::Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let mut params = ListParams::default()
        .labels(&format!("kubernetes.io/service-name={name}"))
        .limit(10);
    let mut addresses = Vec::new();
    loop {
        let page = api.list(&params).await?;
        addresses.extend(
            (page.items.into_iter().flat_map(|s| s.endpoints))
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .filter_map(|e| e.addresses.into_iter().next()),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) if addresses.is_empty() => params = params.continue_token(&token),
            rest => {
                return Ok(Ready {
                    addresses,
                    more: rest.is_some(),
                });
            }
        }
    }
}

/// Where to look when the cluster DNS has no ready endpoints.
pub const DNS_ENDPOINTS: &str =
    "kubectl get endpointslices -n kube-system -l kubernetes.io/service-name=kube-dns";
