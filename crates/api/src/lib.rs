//! Types and helpers shared by every krust component: the resource registry, label and
//! field selectors, `metav1.Status` errors, and strategic merge patch.

pub mod patch;
pub mod registry;
pub mod selector;
pub mod status;
