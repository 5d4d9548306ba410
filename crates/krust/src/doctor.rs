//! `krust doctor [TARGET]`: walks the chain of a workload, pod, Service, Ingress or node
//! (or, without a target, the cluster's own parts) through the API and names the first
//! broken link. Exits 1 when a link is broken.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use krust_doctor::{State, Target};

#[derive(Args, Debug)]
pub struct DoctorCommand {
    /// What to examine: deploy/NAME, sts/NAME, ds/NAME, job/NAME, pod/NAME, svc/NAME,
    /// ingress/NAME or node/NAME; without it, the cluster itself.
    target: Option<Target>,
    /// The target's namespace (default: the kubeconfig context's, else `default`).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Instead of the chain: how long each step of the TARGET's latest rollout took
    /// (created → scheduled → image → started → ready), pod by pod.
    #[arg(long, requires = "target")]
    timeline: bool,
    /// `text` (a tree; coloured on a terminal) or `json`.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Text,
    Json,
}

pub async fn run(args: DoctorCommand) -> Result<()> {
    let yaml = args.kubeconfig.read()?;
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&yaml).context("reading the kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .context("loading the kubeconfig")?;
    let namespace = args
        .namespace
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = krust_client::connect::client(config)?;
    if args.timeline {
        let target = args.target.as_ref().context("--timeline needs a TARGET")?;
        let timeline = krust_doctor::timeline::examine(&client, &namespace, target).await?;
        match args.output {
            Output::Json => println!("{}", k8s_openapi::serde_json::to_string_pretty(&timeline)?),
            Output::Text => print!("{}", krust_doctor::timeline::text(&timeline)),
        }
        return Ok(());
    }
    let report = match &args.target {
        Some(target) => krust_doctor::examine(&client, &namespace, target).await?,
        None => krust_doctor::health::examine(&client).await?,
    };
    match args.output {
        Output::Json => println!("{}", k8s_openapi::serde_json::to_string_pretty(&report)?),
        Output::Text => {
            let colour = std::io::stdout().is_terminal();
            let now = k8s_openapi::jiff::Timestamp::now();
            print!("{}", krust_doctor::render::text(&report, colour, now));
        }
    }
    if report.state == State::Broken {
        std::process::exit(1);
    }
    Ok(())
}
