//! `krust agent`: the node side — containerd (started as a child, and again whenever
//! it exits, unless `--container-runtime-endpoint` names a CRI socket), the images krust builds itself
//! (pause, busybox) plus every image bundle in `<data-dir>/agent/images/` (at start and
//! whenever one is dropped in), and the kubelet.
//! `krust server` runs the same in-process unless `--disable-agent`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use krust_api::cidr::Ipv4Cidr;
use krust_client::connect;
use krust_cri::containerd::{Containerd, Layout, default_dir};
use krust_cri::image;

/// The cluster DNS address of the default service range (k3s's).
const DEFAULT_CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 43, 0, 10);

/// Where a node's `registries.yaml` is looked for: krust's, then k3s's.
const REGISTRIES_PATHS: [&str; 2] = [
    "/etc/krust/registries.yaml",
    "/etc/rancher/k3s/registries.yaml",
];

/// What the agent needs besides a data dir and credentials.
#[derive(Args, Clone, Debug)]
pub struct AgentArgs {
    /// This node's name (default: the hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// The address other nodes reach this one on (default: the default route's source).
    #[arg(long)]
    node_ip: Option<Ipv4Addr>,
    /// A CRI socket to use instead of starting containerd (e.g.
    /// unix:///run/containerd/containerd.sock).
    #[arg(long)]
    container_runtime_endpoint: Option<String>,
    /// The runtime handler of pods without a RuntimeClass (k3s's flag): `runc`, or
    /// `crun` where it is installed. Both are offered to RuntimeClasses.
    #[arg(long, env = "KRUST_DEFAULT_RUNTIME", default_value = "runc")]
    default_runtime: String,
    /// The cluster DNS service's address, given to ClusterFirst pods (default: the
    /// tenth address of the service range, as k3s; 10.43.0.10 for a lone agent).
    #[arg(long)]
    pub(crate) cluster_dns: Option<Ipv4Addr>,
    #[arg(long, default_value = "cluster.local")]
    pub(crate) cluster_domain: String,
    /// The port of the kubelet's HTTPS server (logs, exec, attach, port-forward); 0
    /// picks a free one.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// Hard eviction thresholds, as upstream's kubelet takes them
    /// (`signal<quantity` or `signal<percent%`, comma-separated).
    #[arg(long, default_value = krust_kubelet::eviction::DEFAULT_HARD)]
    eviction_hard: String,
    /// How often eviction signals are measured.
    #[arg(long, default_value = "10s", value_parser = crate::cli::parse_duration)]
    housekeeping_interval: std::time::Duration,
    /// Where the built-in CSI driver (`local.csi.krust.io`) keeps its volumes (k3s's
    /// flag; default `<data-dir>/storage`).
    #[arg(long)]
    default_local_storage_path: Option<PathBuf>,
    /// How pods on different nodes reach each other (k3s's flag): `vxlan` (an overlay,
    /// works across any network), `host-gw` (routes via the nodes' addresses; nodes
    /// share a link) or `none` (another CNI joins the nodes). Every node must use the
    /// same.
    #[arg(long, default_value = "vxlan")]
    flannel_backend: krust_net::cluster::Backend,
    /// Do not enforce NetworkPolicies on this node (k3s's flag): they are then stored
    /// and mean nothing, unless another network plugin enforces them.
    #[arg(long)]
    disable_network_policy: bool,
    /// The node's registry configuration, in k3s's `registries.yaml` format (mirrors,
    /// credentials, TLS), read at start (default: `/etc/krust/registries.yaml`, else
    /// k3s's `/etc/rancher/k3s/registries.yaml`).
    #[arg(long, alias = "registry-config", env = "KRUST_PRIVATE_REGISTRY")]
    private_registry: Option<PathBuf>,
    /// Percent of the image filesystem used above which unused images are collected
    /// (upstream's kubelet flag).
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u8).range(0..=100))]
    image_gc_high_threshold: u8,
    /// Percent of the image filesystem used that collection brings usage down to.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    image_gc_low_threshold: u8,
    /// Images younger than this are never collected.
    #[arg(long, default_value = "2m", value_parser = crate::cli::parse_duration)]
    image_minimum_gc_age: std::time::Duration,
    /// How often image usage is checked (upstream's kubelet: every 5 minutes, fixed).
    #[arg(long, default_value = "5m", value_parser = crate::cli::parse_duration)]
    image_gc_interval: std::time::Duration,
    /// Pull one image at a time (upstream's default).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    serialize_image_pulls: bool,
    /// With `--serialize-image-pulls=false`, how many pulls may run at once (none: no
    /// limit).
    #[arg(long)]
    max_parallel_image_pulls: Option<usize>,
    #[command(flatten)]
    proxy: crate::proxy::ProxyArgs,
}

impl AgentArgs {
    /// `--node-name`, else the machine's hostname, lowercased.
    pub(crate) fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(crate::cli::hostname)
    }

    /// The registry configuration: `--private-registry`, else the first default path
    /// that exists, else none.
    fn registries(&self) -> Result<krust_cri::registries::Registries> {
        let paths = match &self.private_registry {
            Some(path) if !path.exists() => {
                anyhow::bail!("--private-registry {}: no such file", path.display())
            }
            Some(path) => vec![path.clone()],
            None => REGISTRIES_PATHS.iter().map(PathBuf::from).collect(),
        };
        Ok(krust_cri::registries::Registries::load(&paths)?)
    }

    /// The image GC policy, checked as upstream's kubelet checks its flags.
    fn image_gc(&self) -> Result<krust_kubelet::images::Policy> {
        anyhow::ensure!(
            self.image_gc_low_threshold < self.image_gc_high_threshold,
            "--image-gc-low-threshold ({}) must be less than --image-gc-high-threshold ({})",
            self.image_gc_low_threshold,
            self.image_gc_high_threshold
        );
        Ok(krust_kubelet::images::Policy {
            high_threshold: self.image_gc_high_threshold,
            low_threshold: self.image_gc_low_threshold,
            minimum_age: self.image_minimum_gc_age,
            interval: self.image_gc_interval,
        })
    }

    /// How many pulls may run at once (`None`: any number).
    fn parallel_pulls(&self) -> Result<Option<usize>> {
        match (self.serialize_image_pulls, self.max_parallel_image_pulls) {
            (true, Some(n)) if n > 1 => {
                anyhow::bail!("--max-parallel-image-pulls={n} needs --serialize-image-pulls=false")
            }
            (true, _) => Ok(Some(1)),
            (false, limit) => Ok(limit.filter(|&n| n > 0)),
        }
    }

    /// `--node-ip`, else the default route's source address.
    pub(crate) fn node_ip(&self) -> Ipv4Addr {
        self.node_ip.unwrap_or_else(krust_kubelet::machine::node_ip)
    }
}

#[derive(Args)]
pub struct AgentCommand {
    /// The server to join (k3s's flag), e.g. https://10.0.0.1:6443; with `--token` the
    /// agent obtains its own credentials. Without it, `--kubeconfig` says whom to reach.
    #[arg(long, env = "KRUST_URL", requires = "token")]
    server: Option<String>,
    /// The token to join with: the server's `<data-dir>/server/token` or one from
    /// `krust token create` (`K10<CA hash>::<credential>`).
    #[arg(long, env = "KRUST_TOKEN", requires = "server")]
    token: Option<String>,
    /// The loopback port of the agent's apiserver load balancer, through which its
    /// components reach whichever server is alive (k3s's flag; 0 picks a free one).
    #[arg(long, default_value_t = 6444)]
    lb_server_port: u16,
    #[command(flatten)]
    kubeconfig: crate::cli::Kubeconfig,
    #[arg(long, env = "KRUST_DATA_DIR", default_value = "/var/lib/krust")]
    data_dir: PathBuf,
    /// The pods' address range (the server's `--cluster-cidr`): the Service proxy
    /// masquerades traffic from outside it.
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: Ipv4Cidr,
    #[command(flatten)]
    agent: AgentArgs,
}

/// `krust agent`: runs until SIGTERM or Ctrl-C.
pub async fn run(args: AgentCommand) -> Result<()> {
    let (yaml, client_rotation) = match (&args.server, &args.token) {
        (Some(server), Some(token)) => {
            let (yaml, rotation, lb) = crate::join::node_kubeconfig(
                server,
                token,
                &args.data_dir.join("agent"),
                &args.agent.node_name(),
                (std::net::Ipv4Addr::LOCALHOST, args.lb_server_port).into(),
            )
            .await?;
            let (client, _) = krust_client::connect::from_kubeconfig_with_certificate(
                &yaml,
                Some(rotation.certificate.clone()),
            )
            .await?;
            tokio::spawn(lb.follow(client));
            (yaml, Some(rotation))
        }
        _ => (args.kubeconfig.read()?, None),
    };
    let kubeconfigs = Kubeconfigs {
        kubelet: yaml.clone(),
        proxy: yaml,
        storage: None,
        client_rotation,
    };
    run_with_kubeconfig(
        &kubeconfigs,
        &args.data_dir,
        &args.agent,
        args.cluster_cidr,
        None,
        None,
        crate::cli::shutdown_signal(),
    )
    .await
}

/// Whom the agent's parts authenticate as (kubeconfig YAML each): inside `krust
/// server` the kubelet is `system:node:<name>`, the proxy `system:kube-proxy` and the
/// local volume provisioner `system:krust-local-storage`; a standalone agent uses its
/// one kubeconfig for the kubelet and the proxy, and provisions no volumes (a node's
/// credentials may not create PersistentVolumes).
pub struct Kubeconfigs {
    pub kubelet: String,
    pub proxy: String,
    pub storage: Option<String>,
    /// A joined agent's client certificate (the kubelet's and the proxy's), which the
    /// node renews while it runs.
    pub client_rotation: Option<krust_kubelet::certificate::Rotation>,
}

/// Runs the node agent (kubelet and Service proxy) against the apiserver of
/// `kubeconfigs` until `shutdown`; `fallback_pod_cidr` is used when node IPAM gives the
/// node no range. With the
/// cluster's `pki` at hand (inside `krust server`), the kubelet's serving certificate is
/// signed by the cluster CA; otherwise it is self-signed, as upstream's kubelet does
/// without one.
pub async fn run_with_kubeconfig(
    kubeconfigs: &Kubeconfigs,
    data_dir: &Path,
    args: &AgentArgs,
    cluster_cidr: Ipv4Cidr,
    fallback_pod_cidr: Option<Ipv4Cidr>,
    pki: Option<&krust_apiserver::pki::Pki>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let agent_dir = data_dir.join("agent");
    let layout = Layout::new(default_dir(data_dir));
    let (mut containerd, socket) = match &args.container_runtime_endpoint {
        Some(endpoint) => (None, endpoint.clone()),
        None => {
            let registries = args.registries()?;
            let runtimes = krust_cri::runtimes::Runtimes::detect(&args.default_runtime)?;
            let c = Containerd::start(layout.clone(), image::PAUSE_IMAGE, &registries, &runtimes)
                .await
                .context("starting containerd")?;
            let socket = c.socket().display().to_string();
            (Some(c), socket)
        }
    };
    // The sandbox, built-in and air-gap images are never garbage-collected (k3s pins
    // what it imports too).
    let pinned = krust_kubelet::images::Pinned::default();
    pinned.add([image::PAUSE_IMAGE.to_string()]);
    if let Some(c) = &containerd {
        let builtin = image::import_builtin(&c.socket(), &agent_dir.join("builtin-images"))
            .context("importing the built-in images")?;
        pinned.add(builtin);
    }
    // The airgap images directory: what is there now before the kubelet starts, then
    // whatever is dropped in.
    let bundles = containerd.as_ref().map(|c| {
        let mut watcher = krust_cri::bundle::Watcher::new(&c.socket(), &agent_dir.join("images"));
        pinned.add(watcher.scan());
        import_new_bundles(watcher, pinned.clone())
    });
    let runtime = krust_cri::Runtime::connect(&socket)
        .await
        .context("connecting to the container runtime")?;
    let identity = kubeconfigs
        .client_rotation
        .as_ref()
        .map(|r| r.certificate.clone());
    let (client, ca) =
        connect::from_kubeconfig_with_certificate(&kubeconfigs.kubelet, identity.clone()).await?;
    let (proxy_client, _) =
        connect::from_kubeconfig_with_certificate(&kubeconfigs.proxy, identity).await?;
    let client_rotation = {
        let (rotation, client) = (kubeconfigs.client_rotation.clone(), client.clone());
        async move {
            match rotation {
                Some(rotation) => rotation.run(client).await,
                None => std::future::pending().await,
            }
        }
    };
    let client_ca = ca.context("the kubeconfig names no cluster CA for the kubelet server")?;
    let node_name = args.node_name();
    let node_ip = args.node_ip();
    let serving_cert = pki
        .map(|pki| pki.kubelet_serving_cert(&[node_name.clone(), node_ip.to_string()]))
        .transpose()?;
    let config = krust_kubelet::Config {
        node_name: node_name.clone(),
        node_ip,
        data_dir: agent_dir,
        cluster_dns: args.cluster_dns.unwrap_or(DEFAULT_CLUSTER_DNS),
        cluster_domain: args.cluster_domain.clone(),
        fallback_pod_cidr,
        pod_mtu: krust_net::cluster::pod_mtu(args.flannel_backend, node_ip),
        cni_conf_dir: layout.cni_conf_dir(),
        kubelet_port: args.kubelet_port,
        client_ca,
        serving_cert,
        eviction_hard: krust_kubelet::eviction::parse_thresholds(&args.eviction_hard)
            .map_err(|e| anyhow::anyhow!("--eviction-hard: {e}"))?,
        housekeeping_interval: args.housekeeping_interval,
        image_fs: layout.root(),
        image_gc: args.image_gc()?,
        pinned_images: pinned,
        parallel_pulls: args.parallel_pulls()?,
        local_storage: Some(
            args.default_local_storage_path
                .clone()
                .unwrap_or_else(|| data_dir.join("storage")),
        ),
    };
    let network = krust_net::cluster::run(
        client.clone(),
        krust_net::cluster::Config {
            node_name: node_name.clone(),
            node_ip,
            cluster_cidr,
            backend: args.flannel_backend,
            resync: std::time::Duration::from_secs(30),
        },
    );
    let network_policy = optional((!args.disable_network_policy).then(|| {
        krust_net::policy::run(
            proxy_client.clone(),
            krust_net::policy::Config {
                node_name: node_name.clone(),
                resync: std::time::Duration::from_secs(30),
            },
        )
    }));
    let proxy = optional(
        (args.proxy.config(cluster_cidr, &node_name))
            .map(|config| krust_proxy::run(proxy_client, config)),
    );
    let provisioner = match (&kubeconfigs.storage, &config.local_storage) {
        (Some(kubeconfig), Some(_)) => {
            let (client, _) = krust_client::connect::from_kubeconfig(kubeconfig).await?;
            let socket = krust_csi::socket_path(&config.csi_plugins_dir(), krust_csi::local::NAME);
            Some(krust_csi::provisioner::Provisioner::run(
                client,
                node_name.clone(),
                socket,
            ))
        }
        _ => None,
    };
    let provisioner = optional(provisioner.map(|provisioner| async move {
        if let Err(err) = provisioner.await {
            tracing::error!(error = %err, "the local volume provisioner stopped");
        }
    }));
    let supervised = async {
        match containerd.as_mut() {
            Some(c) => c.keep_running().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = krust_kubelet::run(client, runtime, config) => result.context("kubelet")?,
        _ = network => {}
        _ = proxy => {}
        _ = network_policy => {}
        _ = provisioner => {}
        _ = optional(bundles) => {}
        _ = supervised => {}
        _ = client_rotation => {}
        _ = shutdown => {}
    }
    // Containers keep running under their shims; only containerd itself stops.
    if let Some(c) = containerd {
        c.stop().await;
    }
    Ok(())
}

/// Runs `part` if there is one. A part that is off, or has ended, never ends the
/// `select!` it is in: the agent stops only with the kubelet or on shutdown.
async fn optional(part: Option<impl std::future::Future<Output = ()>>) {
    if let Some(part) = part {
        part.await;
    }
    std::future::pending::<()>().await
}

/// How often the airgap images directory is looked at for new bundles (k3s watches
/// it; a scan of a directory of a few files costs nothing).
const BUNDLE_SCAN: std::time::Duration = std::time::Duration::from_secs(5);

/// Imports the bundles that appear in `<data-dir>/agent/images/` while the agent runs.
async fn import_new_bundles(
    mut watcher: krust_cri::bundle::Watcher,
    pinned: krust_kubelet::images::Pinned,
) {
    let mut ticker = tokio::time::interval(BUNDLE_SCAN);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        watcher = match tokio::task::spawn_blocking(move || {
            let imported = watcher.scan();
            (watcher, imported)
        })
        .await
        {
            Ok((watcher, imported)) => {
                pinned.add(imported);
                watcher
            }
            Err(err) => {
                tracing::error!(error = %err, "importing image bundles panicked; no more scans");
                return;
            }
        };
    }
}
