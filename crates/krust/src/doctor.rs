//! `krust doctor [TARGET]`: walks the chain of a workload, pod, Service, Ingress, route or node
//! (or, without a target, the cluster's own parts) through the API and names the first
//! broken link. Exits 1 when a link is broken.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use krust_doctor::{Report, State, Target};

#[derive(Args, Debug)]
pub struct DoctorCommand {
    /// What to examine: deploy/NAME, sts/NAME, ds/NAME, job/NAME, pod/NAME, svc/NAME,
    /// ingress/NAME, httproute/NAME, node/NAME or a URL (http://web.example/cart);
    /// without it, the cluster itself.
    target: Option<Target>,
    /// The target's namespace (default: the kubeconfig context's, else `default`).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Instead of the chain: how long each step of the TARGET's latest rollout took
    /// (created → scheduled → sandbox → image → started → ready), pod by pod.
    #[arg(long, requires = "target")]
    timeline: bool,
    /// Also test the data path from this machine (a node): resolve the Service's name
    /// through the cluster DNS, connect to its cluster IP and ready endpoints, send a
    /// URL's request through the Ingress controller.
    #[arg(long)]
    probe: bool,
    /// Keep examining, and show the chain again whenever it changes (Ctrl-C ends).
    #[arg(short, long, conflicts_with = "timeline")]
    watch: bool,
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
    let options = krust_doctor::Options { probe: args.probe };
    let examine = || async {
        match &args.target {
            Some(target) => krust_doctor::examine(&client, &namespace, target, options).await,
            None => krust_doctor::health::examine(&client).await,
        }
    };
    let terminal = std::io::stdout().is_terminal();
    if !args.watch {
        let report = examine().await?;
        show(&report, args.output, terminal, false)?;
        if report.state == State::Broken {
            std::process::exit(1);
        }
        return Ok(());
    }
    // On a terminal the screen is redrawn each time (the ages move on); piped, a report
    // is written only when something in it changed.
    // A target that does not exist yet (or an apiserver that does not answer) is said,
    // and watched for.
    let mut shown = None;
    let mut failing = None;
    loop {
        match examine().await {
            Ok(report) => {
                failing = None;
                let now = k8s_openapi::serde_json::to_value(&report)?;
                if terminal || shown.as_ref() != Some(&now) {
                    show(&report, args.output, terminal, true)?;
                    shown = Some(now);
                }
            }
            Err(err) => {
                let said = err.to_string();
                if failing.as_ref() != Some(&said) {
                    eprintln!("{said}");
                    failing = Some(said);
                    shown = None;
                }
            }
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// How often `--watch` examines the target again.
const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

fn show(report: &Report, output: Output, terminal: bool, redraw: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if redraw && terminal {
        // Home, then clear the screen.
        write!(out, "\x1b[H\x1b[2J")?;
    }
    match output {
        Output::Json => writeln!(
            out,
            "{}",
            k8s_openapi::serde_json::to_string_pretty(report)?
        )?,
        Output::Text => {
            let now = k8s_openapi::jiff::Timestamp::now();
            write!(out, "{}", krust_doctor::render::text(report, terminal, now))?;
        }
    }
    out.flush()?;
    Ok(())
}
