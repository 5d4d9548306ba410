//! Types and helpers shared by every krust component: the resource registry, label and
//! field selectors, IPv4 CIDRs, generated names, resource quantities, quota accounting,
//! cron schedules, `metav1.Status` errors, panic messages and well-known names. Small on purpose: every component compiles it. What only
//! the apiserver needs (patches, server-side apply, protobuf decoding) is in
//! `krust-apimachinery`.

pub mod cidr;
pub mod cron;
pub mod names;
pub mod panics;
pub mod quantity;
pub mod quota;
pub mod registry;
pub mod resource_metrics;
pub mod selector;
pub mod status;
pub mod sync;
pub mod well_known;

#[cfg(test)]
mod proptests;
