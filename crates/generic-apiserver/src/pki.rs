//! The cluster's certificates: a CA generated at first start and kept in the data dir, the
//! apiserver's serving certificate, and the admin client certificate (user `admin`, group
//! `system:masters`) that the admin kubeconfig carries.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// PEM-encoded certificates and keys the apiserver and its clients use.
#[derive(Clone)]
pub struct Pki {
    pub dir: PathBuf,
    pub ca_cert: String,
    pub serving_cert: String,
    pub serving_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    /// The apiserver's client certificate towards kubelets.
    pub kubelet_client_cert: String,
    pub kubelet_client_key: String,
    /// The ECDSA P-256 key that signs service-account tokens (PKCS#8) and its public
    /// half (SPKI), both PEM.
    pub service_account_key: String,
    pub service_account_public: String,
    /// The CA of the front proxy's client certificate (upstream's requestheader client
    /// CA), and that certificate, which the apiserver presents to aggregated apiservers.
    pub front_proxy_ca: String,
    pub front_proxy_client_cert: String,
    pub front_proxy_client_key: String,
}

/// The user of the front proxy's client certificate (upstream's requestheader allowed
/// name).
pub const FRONT_PROXY_USER: &str = "front-proxy-client";

/// The user of the apiserver's client certificate towards kubelets (kubeadm's name).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

impl Pki {
    /// Loads the PKI from `dir`, creating whatever is missing. The serving certificate is
    /// re-issued when it lacks one of `sans`.
    pub fn load_or_create(dir: &Path, sans: &[String]) -> Result<Pki> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        let (ca_key, ca_cert) = load_or_create_ca(dir, "ca", "krust-ca")?;
        let ca_keypair = KeyPair::from_pem(&ca_key).context("parsing CA key")?;
        let issuer = Issuer::from_ca_cert_pem(&ca_cert, &ca_keypair).context("parsing CA cert")?;

        let serving_cert_path = dir.join("serving.crt");
        let serving_key_path = dir.join("serving.key");
        let serving_ok = serving_cert_path.exists()
            && serving_key_path.exists()
            && covers(&read(&serving_cert_path)?, sans);
        if !serving_ok {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(sans.to_vec())?;
            params.distinguished_name = name("kube-apiserver", None);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            params.not_after = rcgen::date_time_ymd(2036, 1, 1);
            let cert = params.signed_by(&key, &issuer)?;
            write_private(&serving_key_path, &key.serialize_pem())?;
            write_public(&serving_cert_path, &cert.pem())?;
        }

        let admin_cert_path = dir.join("admin.crt");
        let admin_key_path = dir.join("admin.key");
        if !(admin_cert_path.exists() && admin_key_path.exists()) {
            let (cert, key) = client_cert(&issuer, "admin", &["system:masters"])?;
            write_private(&admin_key_path, &key)?;
            write_public(&admin_cert_path, &cert)?;
        }

        let kubelet_cert_path = dir.join("kubelet-client.crt");
        let kubelet_key_path = dir.join("kubelet-client.key");
        if !(kubelet_cert_path.exists() && kubelet_key_path.exists()) {
            let (cert, key) = client_cert(&issuer, KUBELET_CLIENT_USER, &[])?;
            write_private(&kubelet_key_path, &key)?;
            write_public(&kubelet_cert_path, &cert)?;
        }

        // The front proxy's own CA, as upstream's requestheader CA: extension apiservers
        // trust `X-Remote-*` headers only from certificates it signed, so no cluster
        // client certificate can claim another user through them.
        let (front_key, front_ca) =
            load_or_create_ca(dir, "front-proxy-ca", "krust-front-proxy-ca")?;
        let front_cert_path = dir.join("front-proxy-client.crt");
        let front_key_path = dir.join("front-proxy-client.key");
        if !(front_cert_path.exists() && front_key_path.exists()) {
            let keypair = KeyPair::from_pem(&front_key).context("parsing front-proxy CA key")?;
            let issuer = Issuer::from_ca_cert_pem(&front_ca, &keypair)
                .context("parsing front-proxy CA cert")?;
            let (cert, key) = client_cert(&issuer, FRONT_PROXY_USER, &[])?;
            write_private(&front_key_path, &key)?;
            write_public(&front_cert_path, &cert)?;
        }

        let sa_key_path = dir.join("sa.key");
        let sa_pub_path = dir.join("sa.pub");
        if !(sa_key_path.exists() && sa_pub_path.exists()) {
            let key = KeyPair::generate()?;
            write_private(&sa_key_path, &key.serialize_pem())?;
            write_public(&sa_pub_path, &key.public_key_pem())?;
        }

        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_cert,
            serving_cert: read(&serving_cert_path)?,
            serving_key: read(&serving_key_path)?,
            admin_cert: read(&admin_cert_path)?,
            admin_key: read(&admin_key_path)?,
            kubelet_client_cert: read(&kubelet_cert_path)?,
            kubelet_client_key: read(&kubelet_key_path)?,
            service_account_key: read(&sa_key_path)?,
            service_account_public: read(&sa_pub_path)?,
            front_proxy_ca: front_ca,
            front_proxy_client_cert: read(&front_cert_path)?,
            front_proxy_client_key: read(&front_key_path)?,
        })
    }

    /// The kubeconfig a component of this server uses: a fresh client certificate for
    /// `user` in `groups` (not kept: each start issues new ones).
    pub fn component_kubeconfig(
        &self,
        server_url: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<String> {
        let owned = self.issuer()?;
        let (cert, key) = client_cert(&owned.as_ref()?, user, groups)?;
        Ok(kubeconfig(
            &self.ca_cert,
            server_url,
            KubeconfigUser::Certificate {
                cert: &cert,
                key: &key,
            },
        ))
    }

    /// The CA's key and certificate, read from the data dir (only the CA's own
    /// operations need the key).
    fn issuer(&self) -> Result<OwnedIssuer> {
        let key = KeyPair::from_pem(&read(&self.dir.join("ca.key"))?).context("parsing CA key")?;
        Ok(OwnedIssuer {
            key,
            cert: self.ca_cert.clone(),
        })
    }

    /// A serving certificate for a kubelet on this machine (names and addresses in
    /// `sans`), signed by the cluster CA: (certificate, key) in PEM.
    pub fn kubelet_serving_cert(&self, sans: &[String]) -> Result<(String, String)> {
        let owned = self.issuer()?;
        let issuer = owned.as_ref()?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans.to_vec())?;
        let node = sans.first().map_or("kubelet", String::as_str);
        params.distinguished_name = name(&format!("system:node:{node}"), None);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The files of a managed etcd member's TLS, all issued by the cluster's etcd CA (kept
/// apart from the cluster CA, as kubeadm and k3s keep it: a certificate for the
/// apiserver's clients must never open etcd).
#[derive(Debug, Clone)]
pub struct EtcdPki {
    pub ca: PathBuf,
    /// Serves the client port; also the member's client identity.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Serves the peer port and authenticates to other members.
    pub peer_cert: PathBuf,
    pub peer_key: PathBuf,
    /// The apiserver's client certificate.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl EtcdPki {
    /// Loads the etcd PKI from `<dir>/etcd`, creating what is missing; the serving and
    /// peer certificates are issued again when they lack one of `sans`.
    pub fn load_or_create(dir: &Path, sans: &[String]) -> Result<EtcdPki> {
        let dir = dir.join("etcd");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        let (ca_key, ca_cert) = load_or_create_ca(&dir, "ca", "krust-etcd-ca")?;
        let ca_keypair = KeyPair::from_pem(&ca_key).context("parsing the etcd CA key")?;
        let issuer =
            Issuer::from_ca_cert_pem(&ca_cert, &ca_keypair).context("parsing the etcd CA cert")?;
        let both = [
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        for (base, common_name) in [("server", "etcd-server"), ("peer", "etcd-peer")] {
            let cert_path = dir.join(format!("{base}.crt"));
            let key_path = dir.join(format!("{base}.key"));
            if cert_path.exists() && key_path.exists() && covers(&read(&cert_path)?, sans) {
                continue;
            }
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(sans.to_vec())?;
            params.distinguished_name = name(common_name, None);
            params.extended_key_usages = both.to_vec();
            params.not_after = rcgen::date_time_ymd(2036, 1, 1);
            let cert = params.signed_by(&key, &issuer)?;
            write_private(&key_path, &key.serialize_pem())?;
            write_public(&cert_path, &cert.pem())?;
        }
        let client_cert_path = dir.join("client.crt");
        let client_key_path = dir.join("client.key");
        if !(client_cert_path.exists() && client_key_path.exists()) {
            let (cert, key) = client_cert(&issuer, "kube-apiserver-etcd-client", &[])?;
            write_private(&client_key_path, &key)?;
            write_public(&client_cert_path, &cert)?;
        }
        Ok(EtcdPki {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            peer_cert: dir.join("peer.crt"),
            peer_key: dir.join("peer.key"),
            client_cert: client_cert_path,
            client_key: client_key_path,
        })
    }
}

/// The key and certificate (PEM) of the CA `<base>.key`/`<base>.crt` in `dir`, made
/// on first use.
fn load_or_create_ca(dir: &Path, base: &str, common_name: &str) -> Result<(String, String)> {
    let key_path = dir.join(format!("{base}.key"));
    let cert_path = dir.join(format!("{base}.crt"));
    if key_path.exists() && cert_path.exists() {
        return Ok((read(&key_path)?, read(&cert_path)?));
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let cert = params.self_signed(&key)?;
    write_private(&key_path, &key.serialize_pem())?;
    write_public(&cert_path, &cert.pem())?;
    Ok((key.serialize_pem(), cert.pem()))
}

/// The CA's key with its certificate.
struct OwnedIssuer {
    key: KeyPair,
    cert: String,
}

impl OwnedIssuer {
    fn as_ref(&self) -> Result<Issuer<'_, &KeyPair>> {
        Issuer::from_ca_cert_pem(&self.cert, &self.key).context("parsing CA cert")
    }
}

/// Issues a client certificate: the common name is the user, organisations the groups.
fn client_cert(
    issuer: &Issuer<'_, &KeyPair>,
    user: &str,
    groups: &[&str],
) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(user, Some(groups));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn name(common_name: &str, orgs: Option<&[&str]>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for org in orgs.unwrap_or_default() {
        dn.push(DnType::OrganizationName, *org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// True when the PEM certificate lists every wanted subject alternative name.
fn covers(cert_pem: &str, sans: &[String]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return false;
    };
    let have: Vec<String> = ext
        .value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
            x509_parser::extensions::GeneralName::IPAddress(ip) => match ip.len() {
                4 => std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).to_string(),
                16 => {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(ip);
                    std::net::Ipv6Addr::from(b).to_string()
                }
                _ => String::new(),
            },
            _ => String::new(),
        })
        .collect();
    sans.iter().all(|s| have.contains(s))
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    write_atomic(path, contents, 0o600)
}

fn write_public(path: &Path, contents: &str) -> Result<()> {
    write_atomic(path, contents, 0o644)
}

/// Writes via a temporary file and rename, so a crash never leaves half a key behind.
fn write_atomic(path: &Path, contents: &str, mode: u32) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The admin kubeconfig for a server at `server_url`.
pub fn admin_kubeconfig(pki: &Pki, server_url: &str) -> String {
    kubeconfig(
        &pki.ca_cert,
        server_url,
        KubeconfigUser::Certificate {
            cert: &pki.admin_cert,
            key: &pki.admin_key,
        },
    )
}

/// How a kubeconfig's user authenticates.
pub enum KubeconfigUser<'a> {
    /// A client certificate and its key (PEM).
    Certificate { cert: &'a str, key: &'a str },
    /// A bearer token.
    Token(&'a str),
}

/// A kubeconfig trusting `ca` (PEM) for the server at `server_url`.
pub fn kubeconfig(ca: &str, server_url: &str, user: KubeconfigUser<'_>) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match user {
        KubeconfigUser::Certificate { cert, key } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert),
            b64(key)
        ),
        KubeconfigUser::Token(token) => format!("    token: {token}\n"),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: {server_url}
  name: default
contexts:
- context:
    cluster: default
    user: default
  name: default
current-context: default
preferences: {{}}
users:
- name: default
  user:
{user}",
        ca = b64(ca),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_once_and_reissues_serving_cert_for_new_names() {
        let dir = tempfile::tempdir().unwrap();
        let sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let first = Pki::load_or_create(dir.path(), &sans).unwrap();
        let again = Pki::load_or_create(dir.path(), &sans).unwrap();
        assert_eq!(first.ca_cert, again.ca_cert);
        assert_eq!(first.serving_cert, again.serving_cert);
        assert!(covers(&first.serving_cert, &sans));

        let more = vec!["127.0.0.1".to_string(), "10.43.0.1".to_string()];
        let third = Pki::load_or_create(dir.path(), &more).unwrap();
        assert_eq!(first.ca_cert, third.ca_cert);
        assert_ne!(first.serving_cert, third.serving_cert);
        assert!(covers(&third.serving_cert, &more));
        let mode = fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
