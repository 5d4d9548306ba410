//! Names that several components must spell the same way without depending on each
//! other: krust's own labels and the upstream types they recognise objects by.

/// The label every simulated node (`krust sim`) carries: its addresses lead nowhere, so
/// the pod network and ServiceLB leave such nodes out.
pub const SIMULATED_NODE_LABEL: &str = "node.krust.io/simulated";

/// The Secret type of bootstrap tokens (upstream's `bootstrap.kubernetes.io/token`):
/// the apiserver authenticates them, `krust token` writes them, the token cleaner
/// deletes them once expired.
pub const BOOTSTRAP_TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
