//! `krust sim`: simulated nodes (see `krust_sim`) against any apiserver reachable
//! through a kubeconfig.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cli::parse_duration;

#[derive(Args)]
pub struct SimArgs {
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    /// How many nodes to simulate.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Node names are this prefix and an index from 0.
    #[arg(long, default_value = "sim-node-")]
    name_prefix: String,
    #[arg(long, default_value = "32")]
    node_cpu: String,
    #[arg(long, default_value = "256Gi")]
    node_memory: String,
    #[arg(long, default_value_t = 110)]
    node_pods: u32,
    /// More capacity, NAME=QUANTITY (e.g. example.com/gpu=4); repeatable.
    #[arg(long = "node-resource", value_name = "NAME=QUANTITY")]
    node_resources: Vec<String>,
    /// A label on every node, KEY=VALUE; repeatable.
    #[arg(long = "node-label", value_name = "KEY=VALUE")]
    node_labels: Vec<String>,
    /// A taint on every node, KEY[=VALUE]:EFFECT; repeatable.
    #[arg(long = "node-taint", value_name = "KEY[=VALUE]:EFFECT")]
    node_taints: Vec<String>,
    /// Spread the nodes over this many zones (topology.kubernetes.io/zone=zone-N).
    #[arg(long, default_value_t = 0)]
    zones: usize,
    /// How long a bound pod takes to become Running and Ready.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pod_ready_delay: Duration,
    /// How often each node renews its Lease.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease_interval: Duration,
    /// How often each node refreshes its Ready condition.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    status_interval: Duration,
    /// The port on which the simulated kubelets serve their resource metrics (each node
    /// on its own loopback address); 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    kubelet_port: u16,
}

impl SimArgs {
    fn config(&self) -> Result<krust_sim::Config> {
        let mut config = krust_sim::Config {
            nodes: self.nodes,
            name_prefix: self.name_prefix.clone(),
            zones: self.zones,
            pod_ready_delay: self.pod_ready_delay,
            lease_interval: self.lease_interval,
            status_interval: self.status_interval,
            kubelet_port: self.kubelet_port,
            ..krust_sim::Config::default()
        };
        let q = |s: &str| Quantity(s.to_string());
        config.capacity.insert("cpu".into(), q(&self.node_cpu));
        config
            .capacity
            .insert("memory".into(), q(&self.node_memory));
        config
            .capacity
            .insert("pods".into(), q(&self.node_pods.to_string()));
        config.capacity.extend(
            pairs(&self.node_resources, "--node-resource")?
                .into_iter()
                .map(|(k, v)| (k, q(&v))),
        );
        config.labels = pairs(&self.node_labels, "--node-label")?;
        config.taints = self
            .node_taints
            .iter()
            .map(|t| taint(t))
            .collect::<Result<_>>()?;
        Ok(config)
    }
}

fn pairs(items: &[String], flag: &str) -> Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|i| {
            i.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("{flag} {i:?}: expected KEY=VALUE"))
        })
        .collect()
}

/// `key[=value]:Effect`, as `kubectl taint` writes it.
fn taint(s: &str) -> Result<Taint> {
    let Some((kv, effect)) = s.rsplit_once(':') else {
        bail!("--node-taint {s:?}: expected KEY[=VALUE]:EFFECT");
    };
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        bail!("--node-taint {s:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute");
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    Ok(Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
        time_added: None,
    })
}

/// `krust sim`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: SimArgs) -> Result<()> {
    let mut config = args.config()?;
    let yaml = args.kubeconfig.read()?;
    let (client, ca) = krust_client::connect::from_kubeconfig(&yaml).await?;
    // The apiserver's kubelet client certificate comes from the cluster CA.
    config.client_ca = ca;
    krust_sim::run(client, config, crate::cli::shutdown_signal())
        .await
        .context("simulating nodes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_as_kubectl_writes_them() {
        let t = taint("dedicated=gpu:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("dedicated", Some("gpu"), "NoSchedule")
        );
        let t = taint("node-role:PreferNoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value, t.effect.as_str()),
            ("node-role", None, "PreferNoSchedule")
        );
        assert!(taint("x=y").is_err());
        assert!(taint("x=y:Sometimes").is_err());
    }
}
