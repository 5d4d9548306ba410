//! krust's scheduler core: the scheduling framework, the default plugins and
//! the `KubeSchedulerConfiguration` they are configured from.
//!
//! This crate is pure logic: it never talks to the apiserver. The caller keeps
//! a cache of nodes and pods ([`framework::NodeInfo`], updated with
//! `add_pod` / `remove_pod` as pods are assumed, bound and deleted), builds a
//! [`framework::Snapshot`] per cycle, and asks a [`framework::Framework`] where
//! a pod should go:
//!
//! ```
//! use std::sync::Arc;
//! use krust_scheduler::config::SchedulerConfiguration;
//! use krust_scheduler::framework::{ScheduleError, Snapshot};
//!
//! let config = SchedulerConfiguration::default();
//! let framework = &config.build_frameworks().unwrap()[0];
//! let snapshot = Snapshot::default();
//! let pod = Arc::new(k8s_openapi::api::core::v1::Pod::default());
//! assert!(matches!(
//!     framework.schedule_pod(&snapshot, pod),
//!     Err(ScheduleError::NoNodesAvailable)
//! ));
//! ```
//!
//! Semantics follow kube-scheduler v1.33; see each plugin's module docs for
//! where krust deliberately differs.

pub mod config;
pub mod framework;
pub mod plugins;
pub mod resource;
pub mod selector;

#[cfg(test)]
mod testing;
