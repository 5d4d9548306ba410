//! Types and helpers shared by every krust component: the resource registry, label and
//! field selectors, `metav1.Status` errors, strategic merge patch, and decoding of
//! protobuf request bodies.

pub mod apply;
pub mod patch;
pub mod protobuf;
pub mod registry;
pub mod selector;
pub mod status;
