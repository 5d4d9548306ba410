//! krust's scheduler: the scheduling framework, the default plugins and the
//! `KubeSchedulerConfiguration` they are configured from, and the component that
//! runs them against an apiserver ([`run()`]: [`queue`], [`cache`], binding,
//! [`events`]).
//!
//! The framework is pure logic: it never talks to the apiserver. The caller keeps
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

pub mod cache;
pub mod config;
pub mod events;
pub mod framework;
pub mod metrics;
pub mod plugins;
pub mod queue;
pub mod resource;
mod run;
/// Label selectors, node selector terms and tolerations, shared with the controllers
/// (the DaemonSet controller places pods by the same rules).
pub use krust_client::selector;

pub use run::{Error, run};

#[cfg(test)]
mod testing;
