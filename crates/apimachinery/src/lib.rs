//! The apiserver's request-body machinery, kept out of `krust-api` so that components
//! do not compile it: decoding of protobuf request bodies ([`protobuf`]), JSON, merge and
//! strategic merge patches ([`patch`]) and server-side apply with managedFields
//! ([`apply`], structured-merge-diff's semantics).

pub mod apply;
pub mod patch;
pub mod protobuf;
