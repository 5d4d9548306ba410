//! `krust`: one binary, one subcommand per role. `krust server` runs the control plane on
//! an embedded store; `krust controller-manager` runs the controllers alone; `krust
//! kubeconfig` prints the admin kubeconfig.

mod agent;
mod apiserver;
mod cli;
mod controller_manager;
mod scheduler;
mod sim;

use anyhow::Result;
use clap::Parser;

fn main() -> Result<()> {
    // rustls needs its crypto provider chosen before any TLS config is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KRUST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = cli::Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(cli.run())
}
