//! Registry credentials as upstream's kubelet finds them (its credential keyring): the
//! `kubernetes.io/dockerconfigjson` and `kubernetes.io/dockercfg` Secrets a pod names
//! in `imagePullSecrets` (the ServiceAccount admission plugin copies its account's),
//! each entry keyed by registry host, port and path. An image gets every credential
//! whose key matches it — most specific key first (keys in reverse lexical order), a
//! `*` matching within one label of the host, the key's path a prefix of the image's —
//! and the kubelet tries them in that order until a pull succeeds.

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
const DOCKER_CFG: &str = "kubernetes.io/dockercfg";
/// Docker Hub's key in docker's own configuration files.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One credential for a registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

#[derive(Debug, Default)]
pub struct Keyring {
    /// By key (`host[:port][/path]`), most specific first.
    entries: Vec<(String, Credential)>,
}

impl Keyring {
    /// The credentials of `secrets`, and the reasons some could not be read.
    pub fn from_secrets<'a>(
        secrets: impl IntoIterator<Item = &'a Secret>,
    ) -> (Keyring, Vec<String>) {
        let mut keyring = Keyring::default();
        let mut errors = Vec::new();
        for secret in secrets {
            let name = secret.metadata.name.as_deref().unwrap_or_default();
            let data = |key: &str| {
                (secret.data.as_ref())
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
            };
            let config = match secret.type_.as_deref() {
                Some(DOCKER_CONFIG_JSON) => data(".dockerconfigjson")
                    .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                    .map(|v| v["auths"].clone()),
                Some(DOCKER_CFG) => data(".dockercfg").and_then(|b| serde_json::from_slice(b).ok()),
                // Upstream reads only these two types; others hold no registry auth.
                _ => continue,
            };
            match config {
                Some(Value::Object(entries)) => {
                    for (location, entry) in entries {
                        keyring.add(&location, &entry);
                    }
                }
                _ => errors.push(format!("secret {name} holds no docker configuration")),
            }
        }
        // Most specific first; a key twice keeps both its credentials in order.
        keyring.entries.sort_by(|a, b| b.0.cmp(&a.0));
        (keyring, errors)
    }

    /// One entry of a docker configuration: its location normalized as upstream does
    /// (no scheme, `/v1/` and `/v2/` meaning the registry itself).
    fn add(&mut self, location: &str, entry: &Value) {
        let text = |k: &str| entry[k].as_str().unwrap_or_default().to_string();
        let (mut username, mut password) = (text("username"), text("password"));
        if let Some(auth) = entry["auth"].as_str().filter(|a| !a.is_empty())
            && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(auth)
            && let Some((user, pass)) = String::from_utf8_lossy(&decoded).split_once(':')
        {
            (username, password) = (user.to_string(), pass.to_string());
        }
        let schemeless = location
            .strip_prefix("https://")
            .or_else(|| location.strip_prefix("http://"))
            .unwrap_or(location);
        let (host, path) = match schemeless.find('/') {
            Some(i) => schemeless.split_at(i),
            None => (schemeless, ""),
        };
        let path = path
            .strip_prefix("/v2")
            .or_else(|| path.strip_prefix("/v1"))
            .filter(|rest| rest.starts_with('/'))
            .unwrap_or(path);
        let key = if path.is_empty() || path == "/" {
            host.to_string()
        } else {
            format!("{host}{path}")
        };
        if key.is_empty() {
            return;
        }
        self.entries.push((key, Credential { username, password }));
    }

    /// The credentials for `image`, most specific first (none: pull anonymously).
    pub fn lookup(&self, image: &str) -> Vec<&Credential> {
        let repository = repository(image);
        let found: Vec<&Credential> = (self.entries.iter())
            .filter(|(key, _)| matches(key, &repository))
            .map(|(_, c)| c)
            .collect();
        if !found.is_empty() || !is_docker_hub(&repository) {
            return found;
        }
        (self.entries.iter())
            .filter(|(key, _)| key == DEFAULT_REGISTRY_HOST)
            .map(|(_, c)| c)
            .collect()
    }
}

/// The repository an image reference pulls from, normalized as the container tools
/// do: `busybox:1.36` → `docker.io/library/busybox`.
pub fn repository(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    match name.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => name.to_string(),
        Some(_) => format!("docker.io/{name}"),
        None => format!("docker.io/library/{name}"),
    }
}

fn is_docker_hub(repository: &str) -> bool {
    repository.starts_with("docker.io/")
}

/// Whether key `glob` covers `target` (both `host[:port][/path]`): the same port, as
/// many host labels each matching its pattern, the key's path a prefix.
fn matches(glob: &str, target: &str) -> bool {
    let split = |s: &str| -> (String, String) {
        match s.find('/') {
            Some(i) => (s[..i].to_string(), s[i..].to_string()),
            None => (s.to_string(), String::new()),
        }
    };
    let ((glob_host, glob_path), (target_host, target_path)) = (split(glob), split(target));
    let host_port = |h: &str| match h.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
            (host.to_string(), port.to_string())
        }
        _ => (h.to_string(), String::new()),
    };
    let ((glob_host, glob_port), (target_host, target_port)) =
        (host_port(&glob_host), host_port(&target_host));
    let (glob_labels, target_labels): (Vec<&str>, Vec<&str>) = (
        glob_host.split('.').collect(),
        target_host.split('.').collect(),
    );
    glob_port == target_port
        && glob_labels.len() == target_labels.len()
        && target_path.starts_with(&glob_path)
        && (glob_labels.iter().zip(&target_labels)).all(|(g, t)| label_matches(g, t))
}

/// A shell pattern (`*`, `?`) against one host label.
fn label_matches(pattern: &str, label: &str) -> bool {
    let (p, l): (Vec<char>, Vec<char>) = (pattern.chars().collect(), label.chars().collect());
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < l.len() {
        if i < p.len() && (p[i] == '?' || p[i] == l[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    fn secret(kind: &str, key: &str, config: Value) -> Secret {
        let mut s = Secret {
            type_: Some(kind.to_string()),
            ..Secret::default()
        };
        s.data = Some(
            [(key.to_string(), ByteString(config.to_string().into_bytes()))]
                .into_iter()
                .collect(),
        );
        s
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(image).iter().map(|c| c.username.clone()).collect()
    }

    #[test]
    fn images_are_normalized_as_the_container_tools_do() {
        assert_eq!(repository("busybox"), "docker.io/library/busybox");
        assert_eq!(repository("busybox:1.36"), "docker.io/library/busybox");
        assert_eq!(repository("me/app@sha256:abc"), "docker.io/me/app");
        assert_eq!(repository("localhost:5000/app:v1"), "localhost:5000/app");
        assert_eq!(
            repository("registry.example/team/app"),
            "registry.example/team/app"
        );
    }

    #[test]
    fn the_most_specific_key_comes_first_and_every_match_is_tried() {
        let auth = base64::engine::general_purpose::STANDARD.encode("team:s3cret");
        let json = secret(
            DOCKER_CONFIG_JSON,
            ".dockerconfigjson",
            json!({"auths": {
                "registry.example:5000": {"username": "host", "password": "p"},
                "https://registry.example:5000/v2/": {"username": "v2", "password": "p"},
                "registry.example:5000/team": {"auth": auth},
                "*.example": {"username": "wild", "password": "p"},
                "https://index.docker.io/v1/": {"username": "hub", "password": "p"},
            }}),
        );
        let cfg = secret(
            DOCKER_CFG,
            ".dockercfg",
            json!({"registry.example:5000/team/app": {"username": "app", "password": "p"}}),
        );
        let (k, errors) = Keyring::from_secrets([&json, &cfg]);
        assert!(errors.is_empty());
        assert_eq!(
            users(&k, "registry.example:5000/team/app:1.0"),
            ["app", "team", "host", "v2"]
        );
        assert_eq!(
            k.lookup("registry.example:5000/team/x")[0],
            &Credential {
                username: "team".into(),
                password: "s3cret".into()
            }
        );
        // Without the port, only the wildcard (one label) covers it.
        assert_eq!(users(&k, "registry.example/team/app"), ["wild"]);
        assert_eq!(users(&k, "cache.example/app"), ["wild"]);
        assert!(users(&k, "a.cache.example/app").is_empty());
        // Docker Hub's key for Docker Hub's images.
        assert_eq!(users(&k, "busybox"), ["hub"]);
        assert!(users(&k, "quay.io/app").is_empty());
    }

    #[test]
    fn secrets_of_other_types_hold_no_credentials_and_broken_ones_are_reported() {
        let opaque = secret("Opaque", "x", json!({}));
        let broken = Secret {
            type_: Some(DOCKER_CONFIG_JSON.into()),
            ..Secret::default()
        };
        let (k, errors) = Keyring::from_secrets([&opaque, &broken]);
        assert!(k.lookup("busybox").is_empty());
        assert_eq!(errors.len(), 1);
        assert!(label_matches("*", "anything"));
        assert!(label_matches("reg?stry*", "registry-1"));
        assert!(!label_matches("a*b", "acbx"));
    }
}
