//! The apiserver in process (no TLS, no socket, no krust binary), in one test binary:
//! the REST semantics, hostile request bodies and encryption at rest. `harness` serves
//! requests straight to the handler over a temporary embedded store.

mod harness;

mod compatibility;
mod encryption;
mod hostile;
mod in_process;
