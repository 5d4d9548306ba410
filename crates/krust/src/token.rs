//! Join tokens, server side: the server's own token in `<data-dir>/server/token`
//! (written at every start, pinned to the cluster CA) and `krust token
//! create|list|delete`, which manage bootstrap tokens as kubeadm and k3s keep them:
//! Secrets `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use krust_api::well_known::BOOTSTRAP_TOKEN_SECRET_TYPE;
use krust_apiserver::join::{BOOTSTRAP_TOKEN_PREFIX, JoinToken, parse_bootstrap_token};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::cli::{Kubeconfig, parse_duration};

/// Where the server keeps its join token.
pub fn server_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("token")
}

/// The secret of the server's token: `--token` (a whole K10 token or a bare secret),
/// else the one kept from an earlier start, else a new one.
pub fn server_secret(data_dir: &Path, given: Option<&str>) -> Result<String> {
    if let Some(given) = given {
        let token: JoinToken = given.parse().context("--token")?;
        return Ok(token.server_secret().to_string());
    }
    let path = server_token_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(kept) => {
            let token: JoinToken = kept
                .parse()
                .with_context(|| format!("the token in {}", path.display()))?;
            Ok(token.server_secret().to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(random_chars(32)),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes the server's token, pinned to `ca_pem`, readable by root only.
pub fn write_server_token(data_dir: &Path, ca_pem: &str, secret: &str) -> Result<()> {
    let token = JoinToken::server(ca_pem, secret);
    crate::cli::write_private_file(&server_token_path(data_dir), &format!("{token}\n"))
}

/// `n` random characters of `[a-z0-9]` (the bootstrap token alphabet), without bias.
fn random_chars(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(n);
    let mut buf = [0u8; 64];
    while out.len() < n {
        getrandom::fill(&mut buf).expect("the kernel gives random bytes");
        // 252 = 7 × 36: bytes above it would favour the alphabet's start.
        for b in buf.iter().filter(|b| **b < 252) {
            if out.len() < n {
                out.push(ALPHABET[(*b % 36) as usize] as char);
            }
        }
    }
    out
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a bootstrap token that lets agents join (printed in K10 form).
    Create(CreateArgs),
    /// List the bootstrap tokens.
    List {
        #[command(flatten)]
        kubeconfig: Kubeconfig,
    },
    /// Delete bootstrap tokens (by id or whole token).
    Delete {
        #[arg(required = true)]
        tokens: Vec<String>,
        #[command(flatten)]
        kubeconfig: Kubeconfig,
    },
}

#[derive(Args)]
pub struct CreateArgs {
    /// How long the token is accepted (0: forever), as kubeadm's flag.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    ttl: Duration,
    /// A human-readable description.
    #[arg(long)]
    description: Option<String>,
    /// What the token may be used for.
    #[arg(long, value_delimiter = ',', default_value = "signing,authentication")]
    usages: Vec<String>,
    /// Extra groups the token authenticates into (each `system:bootstrappers:...`).
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
    #[command(flatten)]
    kubeconfig: Kubeconfig,
}

pub async fn run(command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create(args) => {
            let (api, ca) = secrets(&args.kubeconfig).await?;
            let token = create(&api, &ca, &args).await?;
            println!("{token}");
        }
        TokenCommand::List { kubeconfig } => {
            let (api, _) = secrets(&kubeconfig).await?;
            print!("{}", list(&api).await?);
        }
        TokenCommand::Delete { tokens, kubeconfig } => {
            let (api, _) = secrets(&kubeconfig).await?;
            for token in tokens {
                let id = token
                    .parse::<JoinToken>()
                    .ok()
                    .and_then(|t| {
                        parse_bootstrap_token(&t.credential).map(|(id, _)| id.to_string())
                    })
                    .unwrap_or(token);
                api.delete(
                    &format!("{BOOTSTRAP_TOKEN_PREFIX}{id}"),
                    &DeleteParams::default(),
                )
                .await
                .with_context(|| format!("deleting bootstrap token {id}"))?;
                println!("bootstrap token {id:?} deleted");
            }
        }
    }
    Ok(())
}

/// The Secrets of kube-system, and the cluster CA the kubeconfig trusts.
async fn secrets(kubeconfig: &Kubeconfig) -> Result<(Api<Secret>, String)> {
    let (client, ca) = krust_client::connect::from_kubeconfig(&kubeconfig.read()?).await?;
    let ca = ca.context("the kubeconfig names no cluster CA, which tokens pin")?;
    Ok((Api::namespaced(client, "kube-system"), ca))
}

async fn create(api: &Api<Secret>, ca: &str, args: &CreateArgs) -> Result<JoinToken> {
    for group in &args.groups {
        if !group.starts_with("system:bootstrappers:") {
            bail!("--groups: {group:?} must start with \"system:bootstrappers:\"");
        }
    }
    let (id, secret) = (random_chars(6), random_chars(16));
    let mut data = BTreeMap::from([
        ("token-id".to_string(), id.clone()),
        ("token-secret".to_string(), secret.clone()),
    ]);
    for usage in &args.usages {
        data.insert(format!("usage-bootstrap-{usage}"), "true".into());
    }
    if !args.ttl.is_zero() {
        let expires = jiff::Timestamp::now() + args.ttl;
        data.insert(
            "expiration".into(),
            expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        );
    }
    if let Some(description) = &args.description {
        data.insert("description".into(), description.clone());
    }
    if !args.groups.is_empty() {
        data.insert("auth-extra-groups".into(), args.groups.join(","));
    }
    let object = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{BOOTSTRAP_TOKEN_PREFIX}{id}")),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some(BOOTSTRAP_TOKEN_SECRET_TYPE.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    };
    api.create(&PostParams::default(), &object)
        .await
        .context("creating the bootstrap token Secret")?;
    Ok(JoinToken::bootstrap(ca, &id, &secret))
}

/// kubeadm's `token list` table.
async fn list(api: &Api<Secret>) -> Result<String> {
    let secrets = api
        .list(&ListParams::default().fields(&format!("type={BOOTSTRAP_TOKEN_SECRET_TYPE}")))
        .await
        .context("listing bootstrap tokens")?;
    let mut out = String::from(
        "TOKEN                     TTL         EXPIRES                USAGES                   DESCRIPTION   EXTRA GROUPS\n",
    );
    let now = jiff::Timestamp::now();
    for secret in secrets {
        let data = secret.data.unwrap_or_default();
        let get = |k: &str| {
            data.get(k)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .unwrap_or_default()
        };
        let expires = get("expiration");
        let ttl = match expires.parse::<jiff::Timestamp>() {
            Ok(t) if t > now => format!("{}h", (t.as_second() - now.as_second()) / 3600),
            Ok(_) => "expired".into(),
            Err(_) => "<forever>".into(),
        };
        let usages: Vec<&str> = data
            .keys()
            .filter_map(|k| k.strip_prefix("usage-bootstrap-"))
            .collect();
        out.push_str(&format!(
            "{:<25} {:<11} {:<22} {:<24} {:<13} {}\n",
            format!("{}.{}", get("token-id"), get("token-secret")),
            ttl,
            if expires.is_empty() {
                "<never>".into()
            } else {
                expires
            },
            usages.join(","),
            if get("description").is_empty() {
                "<none>".into()
            } else {
                get("description")
            },
            get("auth-extra-groups"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_secret_comes_from_the_flag_else_the_kept_token_else_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = server_secret(dir.path(), None).unwrap();
        assert_eq!(fresh.len(), 32);
        write_server_token(dir.path(), "CA", &fresh).unwrap();
        assert_eq!(server_secret(dir.path(), None).unwrap(), fresh);
        let given = JoinToken::server("CA", "given").to_string();
        assert_eq!(server_secret(dir.path(), Some(&given)).unwrap(), "given");
        assert_eq!(server_secret(dir.path(), Some("bare")).unwrap(), "bare");
        let kept = std::fs::read_to_string(server_token_path(dir.path())).unwrap();
        assert!(kept.trim().parse::<JoinToken>().unwrap().pins("CA"));
    }

    #[test]
    fn random_tokens_have_the_bootstrap_shape() {
        let token = format!("{}.{}", random_chars(6), random_chars(16));
        assert!(parse_bootstrap_token(&token).is_some(), "{token}");
        assert_ne!(random_chars(16), random_chars(16));
    }
}
