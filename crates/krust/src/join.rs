//! `krust agent --server URL --token TOKEN`: joining a cluster with nothing but a token,
//! as a k3s agent does. The agent downloads the cluster CA from `/cacerts`, checks it
//! against the hash the token pins, then authenticates with the token as a bootstrapper
//! and obtains the node's client certificate through a CertificateSigningRequest (the
//! kubelet's TLS bootstrap). The certificate is kept in the agent's data dir, used
//! again at the next start while it stays valid (a restart needs no token round) and
//! renewed by the node itself before it expires.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use krust_apiserver::join::{JoinToken, ca_hash};
use krust_apiserver::pki::{KubeconfigUser, kubeconfig};
use krust_client::certificate::RotatingCertificate;
use krust_client::loadbalancer::LoadBalancer;
use krust_kubelet::certificate::{self, CertificateError, Issued, Kept, Purpose, Rotation};

/// How long the agent waits for its request to be approved and signed.
const ISSUE_TIMEOUT: Duration = Duration::from_secs(300);

/// The kubeconfig (YAML) of the node `node_name` in the cluster at `server`, joined
/// with `token`, and the rotation that keeps its client certificate renewed. The
/// kubeconfig reaches the servers through the load balancer started on `lb_bind` once
/// the credentials are there.
pub async fn node_kubeconfig(
    server: &str,
    token: &str,
    agent_dir: &Path,
    node_name: &str,
    lb_bind: std::net::SocketAddr,
) -> Result<(String, Rotation, LoadBalancer)> {
    let token: JoinToken = token.parse().context("--token")?;
    let ca = verified_ca(server, &token).await?;
    let kept = Kept::in_dir(agent_dir, "client-kubelet");
    // Any kept certificate that has not expired will do: the node renews it itself
    // (at once if its renewal time has passed), so the token is needed only once.
    let (issued, written, certificate) = match kept.load_valid(
        &ca,
        node_name,
        &Purpose::Client,
        Duration::ZERO,
    ) {
        Some(reused) => {
            tracing::info!(cert = %kept.cert.display(), "using the node's kept client certificate");
            reused
        }
        None => {
            let issued = bootstrap(server, &ca, &token, node_name).await?;
            kept.store(&issued)
                .with_context(|| format!("keeping {}", kept.cert.display()))?;
            tracing::info!(node = node_name, "the node's client certificate was issued");
            let certificate = RotatingCertificate::from_pem(&issued.cert, &issued.key)?;
            (issued, std::time::SystemTime::now(), certificate)
        }
    };
    let lb = LoadBalancer::start(
        lb_bind,
        server,
        Some(agent_dir.join("etc").join("krust-agent-load-balancer.json")),
    )
    .await
    .with_context(|| format!("starting the apiserver load balancer on {lb_bind}"))?;
    let yaml = kubeconfig(
        &ca,
        &lb.url(),
        KubeconfigUser::Certificate {
            cert: &issued.cert,
            key: &issued.key,
        },
    );
    let rotation = Rotation {
        node_name: node_name.to_string(),
        purpose: Purpose::Client,
        certificate,
        renew_at: certificate::rotation_deadline(&issued.cert, written),
        kept,
        issue_timeout: ISSUE_TIMEOUT,
    };
    Ok((yaml, rotation, lb))
}

/// The CA bundle of the server at `server`, checked against the hash `token` pins.
async fn verified_ca(server: &str, token: &JoinToken) -> Result<String> {
    let ca = fetch_ca(server).await?;
    if !token.pins(&ca) {
        bail!(
            "the server's CA (sha256 {}) is not the one the token pins ({}): the token \
             belongs to another cluster, or {server} is not the server it came from",
            ca_hash(&ca),
            token.ca_hash.as_deref().unwrap_or_default()
        );
    }
    if token.ca_hash.is_none() {
        tracing::warn!("the token pins no CA (not in K10 form): trusting the CA {server} presents");
    }
    Ok(ca)
}

/// What a joining server is handed (`/v1-krust/server-bootstrap`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerBootstrap {
    /// File contents by path relative to the data dir.
    pub files: std::collections::BTreeMap<String, String>,
    #[serde(rename = "etcdClientURLs")]
    pub etcd_client_urls: Vec<String>,
}

/// The server bootstrap data of the cluster at `server`, fetched with the server token
/// after the CA was checked against it.
pub async fn server_bootstrap(server: &str, token: &str) -> Result<ServerBootstrap> {
    let token: JoinToken = token.parse().context("--token")?;
    let ca = verified_ca(server, &token).await?;
    let config = kubeconfig(&ca, server, KubeconfigUser::Token(&token.credential));
    let (client, _) = krust_client::connect::from_kubeconfig(&config).await?;
    let path = krust_apiserver::server_bootstrap::PATH;
    let request = http::Request::get(path).body(Vec::new())?;
    let text = client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => anyhow::anyhow!(
            "{server} refused the token for joining a server ({}): a server joins with the \
             server token (`<data-dir>/server/token` of a server), not an agent's bootstrap token",
            status.message
        ),
        e => anyhow::Error::new(e).context(format!("fetching {server}{path}")),
    })?;
    serde_json::from_str(&text).with_context(|| format!("the answer of {server}{path}"))
}

/// The node's first client certificate, requested with the join token's credential.
async fn bootstrap(server: &str, ca: &str, token: &JoinToken, node_name: &str) -> Result<Issued> {
    let bootstrap = kubeconfig(ca, server, KubeconfigUser::Token(&token.credential));
    let (client, _) = krust_client::connect::from_kubeconfig(&bootstrap).await?;
    match certificate::request_certificate(&client, node_name, &Purpose::Client, ISSUE_TIMEOUT)
        .await
    {
        Ok(issued) => Ok(issued),
        Err(CertificateError::Request(krust_client::csr::Error::Create(kube::Error::Api(
            status,
        )))) if status.code == 401 => bail!(
            "{server} refused the join token (401 Unauthorized): check --token, or create \
             a new one with `krust token create` on the server"
        ),
        Err(e) => Err(e).context("obtaining the node's client certificate"),
    }
}

/// The CA bundle the server at `url` publishes, fetched without trusting anything yet
/// (the caller checks it against the token's hash).
async fn fetch_ca(url: &str) -> Result<String> {
    let uri: http::Uri = url.parse().with_context(|| format!("--server {url:?}"))?;
    let mut config = kube::Config::new(uri);
    config.accept_invalid_certs = true;
    let client = krust_client::connect::client(config)?;
    let request = http::Request::get("/cacerts").body(Vec::new())?;
    let ca = client
        .request_text(request)
        .await
        .with_context(|| format!("fetching the cluster CA from {url}/cacerts"))?;
    if !ca.contains("BEGIN CERTIFICATE") {
        bail!("{url}/cacerts answered something that is not a certificate");
    }
    Ok(ca)
}
