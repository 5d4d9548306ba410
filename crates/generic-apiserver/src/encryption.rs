//! Encryption at rest, configured as upstream's `--encryption-provider-config`: an
//! `EncryptionConfiguration` (apiserver.config.k8s.io/v1, YAML or JSON) names resources
//! (`secrets`, `deployments.apps`, `*.apps`, `*.` for the core group, `*.*`) and, for
//! each, providers in order (`aesgcm`, `aescbc`, `secretbox` with named base64 keys, or
//! `identity`). The first provider writes; every listed one reads. The store does the
//! work (`krust_store::encrypted`); this module turns the file into its rules, and
//! writes the file k3s's `--secrets-encryption` generates.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use krust_store::encrypted::{Rule, Transformer};
use serde::{Deserialize, Serialize};

/// Why an EncryptionConfiguration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid EncryptionConfiguration: {0}")]
    Invalid(String),
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct EncryptionConfiguration {
    api_version: String,
    kind: String,
    resources: Vec<ResourceConfiguration>,
}

#[derive(Deserialize, Serialize)]
struct ResourceConfiguration {
    resources: Vec<String>,
    providers: Vec<ProviderConfiguration>,
}

#[derive(Deserialize, Serialize, Default)]
struct ProviderConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    aesgcm: Option<Keys>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aescbc: Option<Keys>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secretbox: Option<Keys>,
    #[serde(skip_serializing_if = "Option::is_none")]
    identity: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kms: Option<serde_json::Value>,
}

#[derive(Deserialize, Serialize)]
struct Keys {
    keys: Vec<Key>,
}

#[derive(Deserialize, Serialize)]
struct Key {
    name: String,
    secret: String,
}

/// Reads an EncryptionConfiguration file into the store's rules.
pub fn load(path: &Path) -> Result<Vec<Rule>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text)
}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

/// Parses an EncryptionConfiguration into the store's rules: one per storage prefix,
/// from the first entry that names its resource, as upstream.
pub fn parse(text: &str) -> Result<Vec<Rule>, ConfigError> {
    let config: EncryptionConfiguration =
        serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
    if config.kind != "EncryptionConfiguration"
        || !matches!(
            config.api_version.as_str(),
            "apiserver.config.k8s.io/v1" | "apiserver.k8s.io/v1"
        )
    {
        return Err(invalid(format!(
            "expected apiVersion apiserver.config.k8s.io/v1 and kind EncryptionConfiguration, found {} {}",
            config.api_version, config.kind
        )));
    }
    let mut rules: Vec<Rule> = Vec::new();
    for (i, entry) in config.resources.iter().enumerate() {
        if entry.providers.is_empty() {
            return Err(invalid(format!(
                "resources[{i}].providers: must not be empty"
            )));
        }
        for resource in &entry.resources {
            for prefix in prefixes(resource) {
                if rules.iter().any(|r| r.prefix == prefix) {
                    continue;
                }
                rules.push(Rule {
                    prefix,
                    transformers: transformers(i, &entry.providers)?,
                });
            }
        }
    }
    Ok(rules)
}

fn transformers(
    entry: usize,
    providers: &[ProviderConfiguration],
) -> Result<Vec<Transformer>, ConfigError> {
    let mut out = Vec::new();
    for (j, p) in providers.iter().enumerate() {
        let at = format!("resources[{entry}].providers[{j}]");
        let named = [
            ("aesgcm", &p.aesgcm),
            ("aescbc", &p.aescbc),
            ("secretbox", &p.secretbox),
        ];
        let given = named.iter().filter(|(_, k)| k.is_some()).count()
            + usize::from(p.identity.is_some())
            + usize::from(p.kms.is_some());
        if given != 1 {
            return Err(invalid(format!("{at}: exactly one provider must be given")));
        }
        if p.kms.is_some() {
            return Err(invalid(format!(
                "{at}: kms providers are not supported; use aesgcm, aescbc or secretbox"
            )));
        }
        if p.identity.is_some() {
            out.push(Transformer::identity());
        }
        for (provider, keys) in named {
            let Some(keys) = keys else { continue };
            if keys.keys.is_empty() {
                return Err(invalid(format!("{at}.{provider}.keys: must not be empty")));
            }
            for key in &keys.keys {
                let secret = STANDARD.decode(key.secret.trim()).map_err(|e| {
                    invalid(format!("{at}.{provider}.keys[{}].secret: {e}", key.name))
                })?;
                out.push(
                    Transformer::new(provider, &key.name, &secret)
                        .map_err(|e| invalid(format!("{at}: {e}")))?,
                );
            }
        }
    }
    Ok(out)
}

/// The storage prefixes a resource name of the configuration covers.
fn prefixes(resource: &str) -> Vec<String> {
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let mut out: Vec<String> = krust_api::registry::RESOURCES
        .iter()
        .filter(|r| !r.is_virtual())
        .filter(|r| group == "*" || r.group == group)
        .filter(|r| plural == "*" || r.plural == plural)
        .map(|r| r.storage_prefix())
        .collect();
    out.dedup();
    if out.is_empty() {
        tracing::warn!(
            resource,
            "EncryptionConfiguration names a resource krust does not serve"
        );
    }
    out
}

/// Where `--secrets-encryption` keeps its generated configuration (k3s's path).
pub fn generated_config_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir
        .join("server")
        .join("cred")
        .join("encryption-config.json")
}

/// `--secrets-encryption`: the configuration at `path`, written first (as k3s does:
/// Secrets with an `aescbc` key named `aescbckey`, identity to read what was stored
/// before) if it does not exist. The file is readable by root only.
pub fn ensure_generated(path: &Path) -> Result<Vec<Rule>, ConfigError> {
    if !path.exists() {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| invalid(format!("no randomness for a key: {e}")))?;
        let config = EncryptionConfiguration {
            api_version: "apiserver.config.k8s.io/v1".into(),
            kind: "EncryptionConfiguration".into(),
            resources: vec![ResourceConfiguration {
                resources: vec!["secrets".into()],
                providers: vec![
                    ProviderConfiguration {
                        aescbc: Some(Keys {
                            keys: vec![Key {
                                name: "aescbckey".into(),
                                secret: STANDARD.encode(key),
                            }],
                        }),
                        ..Default::default()
                    },
                    ProviderConfiguration {
                        identity: Some(serde_json::json!({})),
                        ..Default::default()
                    },
                ],
            }],
        };
        let write_err = |source| ConfigError::Write {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(write_err)?;
        }
        let text = serde_json::to_vec_pretty(&config).map_err(|e| invalid(e.to_string()))?;
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(&text))
            .map_err(write_err)?;
        tracing::info!(path = %path.display(), "generated the secrets encryption key");
    }
    load(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_map_to_storage_prefixes_first_entry_first() {
        let key = STANDARD.encode([3u8; 32]);
        let rules = parse(&format!(
            r#"
apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets, deployments.apps]
    providers:
      - aesgcm: {{keys: [{{name: key1, secret: "{key}"}}]}}
      - identity: {{}}
  - resources: ["*.*"]
    providers:
      - secretbox: {{keys: [{{name: sb, secret: "{key}"}}]}}
"#
        ))
        .unwrap();
        let secrets = rules
            .iter()
            .find(|r| r.prefix == "/registry/secrets/")
            .unwrap();
        assert_eq!(
            format!("{:?}", secrets.transformers),
            "[aesgcm:v1:key1, identity]"
        );
        let deployments = rules
            .iter()
            .find(|r| r.prefix == "/registry/deployments/")
            .unwrap();
        assert_eq!(
            format!("{:?}", deployments.transformers[0]),
            "aesgcm:v1:key1"
        );
        let configmaps = rules
            .iter()
            .find(|r| r.prefix == "/registry/configmaps/")
            .unwrap();
        assert_eq!(
            format!("{:?}", configmaps.transformers),
            "[secretbox:v1:sb]"
        );
    }

    #[test]
    fn bad_configurations_are_refused_with_a_reason() {
        let short = STANDARD.encode([3u8; 10]);
        for (text, why) in [
            (
                "apiVersion: v1\nkind: ConfigMap\nresources: []".to_string(),
                "expected apiVersion",
            ),
            (
                format!(
                    "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc: {{keys: [{{name: k, secret: \"{short}\"}}]}}"
                ),
                "aescbc key \"k\": must be 16, 24 or 32 bytes, not 10",
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - kms: {name: x}".to_string(),
                "kms providers are not supported",
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - {}".to_string(),
                "exactly one provider",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn secrets_encryption_generates_an_aescbc_key_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = generated_config_path(dir.path());
        let first = ensure_generated(&path).unwrap();
        assert_eq!(first[0].prefix, "/registry/secrets/");
        assert_eq!(
            format!("{:?}", first[0].transformers),
            "[aescbc:v1:aescbckey, identity]"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        ensure_generated(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
