//! krust's container runtime side, used by the kubelet:
//! - [`client`]: the CRI v1 runtime and image services over a unix socket;
//! - [`containerd`]: containerd as a child process with a generated configuration
//!   (or an existing CRI socket), surviving krust restarts;
//! - [`image`]: images built locally as docker-archive tarballs (the pause sandbox image
//!   and a busybox image from the machine's static busybox), and importing tarballs into
//!   containerd, for machines without a registry;
//! - [`metrics`]: every CRI call counted and timed (the kubelet's runtime operation
//!   metrics);
//! - [`runtimes`]: the runtime handlers containerd offers (runc, crun).

pub mod bundle;
pub mod client;
pub mod containerd;
pub mod image;
pub mod metrics;
pub mod netns;
pub mod registries;
pub mod runtimes;

pub use client::Runtime;
pub use k8s_cri::v1 as api;

/// What went wrong talking to or running the container runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to the CRI socket {socket}: {source}")]
    Connect {
        socket: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("CRI call {call}: {source}")]
    Call {
        call: &'static str,
        #[source]
        source: Box<tonic::Status>,
    },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
    #[error("containerd did not answer on {socket} within {seconds} s; its log: {log}")]
    NotReady {
        socket: String,
        seconds: u64,
        log: String,
    },
    #[error("importing {file}: {message}")]
    Import { file: String, message: String },
}

impl Error {
    pub(crate) fn io(action: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            action: action.into(),
            source,
        }
    }
}
