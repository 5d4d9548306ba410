//! Types and helpers shared by every krust component: the resource registry, label and
//! field selectors, IPv4 CIDRs, `metav1.Status` errors, strategic merge patch, and decoding of
//! protobuf request bodies.

pub mod apply;
pub mod cidr;
pub mod patch;
pub mod protobuf;
pub mod registry;
pub mod selector;
pub mod status;
