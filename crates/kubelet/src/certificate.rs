//! The node's certificates, obtained and renewed through the CSR API as upstream's
//! kubelet does. The client certificate (TLS bootstrap): with nothing but a bootstrap
//! credential, the agent generates a key, sends a CertificateSigningRequest for
//! `system:node:<name>` in `system:nodes` to `kubernetes.io/kube-apiserver-client-kubelet`
//! and waits until the controllers have approved and signed it. The serving certificate:
//! a request to `kubernetes.io/kubelet-serving` for the node's name and address, which
//! the controllers approve when they are the Node's. Both are kept in the agent's
//! directory, used again at the next start while valid, and renewed once 70–90 % of
//! their lifetime has passed ([`Rotation`]); the new one replaces the old in place.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use krust_client::certificate::RotatingCertificate;
pub use krust_client::csr::Issued;
use x509_parser::pem::parse_x509_pem;

/// The signer of kubelets' client certificates.
pub const CLIENT_KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelets' serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error(transparent)]
    Request(#[from] krust_client::csr::Error),
    #[error("keeping the certificate: {0}")]
    Store(#[source] std::io::Error),
    #[error("the issued certificate: {0}")]
    Issued(#[source] krust_client::certificate::CertificateError),
}

/// The user a node's client certificate names.
pub fn node_user(node_name: &str) -> String {
    format!("system:node:{node_name}")
}

/// What a node certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Authenticating to the apiserver as `system:node:<name>`.
    Client,
    /// Serving the kubelet's port under these DNS names and IP addresses.
    Serving { names: Vec<String> },
}

impl Purpose {
    fn signer(&self) -> &'static str {
        match self {
            Purpose::Client => CLIENT_KUBELET_SIGNER,
            Purpose::Serving { .. } => SERVING_SIGNER,
        }
    }

    /// The key usages upstream's kubelet asks for with an ECDSA key.
    fn usages(&self) -> &'static [&'static str] {
        match self {
            Purpose::Client => &["digital signature", "client auth"],
            Purpose::Serving { .. } => &["digital signature", "server auth"],
        }
    }

    fn names(&self) -> &[String] {
        match self {
            Purpose::Client => &[],
            Purpose::Serving { names } => names,
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Purpose::Client => "client",
            Purpose::Serving { .. } => "serving",
        }
    }
}

/// Whether `cert_pem` names `system:node:<node_name>` (and every name `purpose` needs),
/// was signed by `ca_pem` and stays valid for at least `margin`.
pub fn still_valid(
    cert_pem: &str,
    ca_pem: &str,
    node_name: &str,
    purpose: &Purpose,
    margin: Duration,
) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        parse_x509_pem(cert_pem.as_bytes()),
        parse_x509_pem(ca_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok(cert), Ok(ca)) = (cert.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    let user = node_user(node_name);
    let names_node = cert
        .subject()
        .iter_common_name()
        .any(|cn| cn.as_str() == Ok(user.as_str()));
    let alt_names: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.iter().filter_map(name_of).collect())
        .unwrap_or_default();
    let covers = purpose.names().iter().all(|n| alt_names.contains(n));
    let deadline = x509_parser::time::ASN1Time::now().timestamp() + margin.as_secs() as i64;
    names_node
        && covers
        && cert.validity().not_after.timestamp() > deadline
        && cert.verify_signature(Some(ca.public_key())).is_ok()
}

fn name_of(name: &x509_parser::extensions::GeneralName<'_>) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    match name {
        GeneralName::DNSName(dns) => Some(dns.to_string()),
        GeneralName::IPAddress(ip) => match ip.len() {
            4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).ok()?).to_string()),
            16 => Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).ok()?).to_string()),
            _ => None,
        },
        _ => None,
    }
}

/// Requests a certificate for `system:node:<node_name>` with a new key and waits (up to
/// `timeout`) until it is issued.
pub async fn request_certificate(
    client: &kube::Client,
    node_name: &str,
    purpose: &Purpose,
    timeout: Duration,
) -> Result<Issued, CertificateError> {
    let request = krust_client::csr::Request {
        common_name: &node_user(node_name),
        organization: "system:nodes",
        names: purpose.names(),
        signer: purpose.signer(),
        usages: purpose.usages(),
        generate_name: match purpose {
            Purpose::Client => "node-csr-",
            Purpose::Serving { .. } => "csr-",
        },
    };
    let pending = krust_client::csr::create(client, &request).await?;
    tracing::info!(csr = %pending.name, purpose = purpose.describe(), "requested a node certificate");
    Ok(pending.issued(client, timeout).await?)
}

/// Where a node certificate and its key are kept (PEM files, the key mode 0600).
#[derive(Clone, Debug)]
pub struct Kept {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Kept {
    /// `<dir>/<base>.crt` and `<dir>/<base>.key`, k3s's names being `client-kubelet`
    /// and `serving-kubelet`.
    pub fn in_dir(dir: &std::path::Path, base: &str) -> Kept {
        Kept {
            cert: dir.join(format!("{base}.crt")),
            key: dir.join(format!("{base}.key")),
        }
    }

    /// The kept certificate and key, and when they were written.
    pub fn load(&self) -> Option<(Issued, SystemTime)> {
        let cert = std::fs::read_to_string(&self.cert).ok()?;
        let key = std::fs::read_to_string(&self.key).ok()?;
        let written = std::fs::metadata(&self.cert).ok()?.modified().ok()?;
        Some((Issued { cert, key }, written))
    }

    /// The kept certificate, its key and when they were written, if the certificate
    /// names `node_name` (and what `purpose` needs), was signed by `ca_pem`, stays valid
    /// for `margin` and goes with the key (a crash between writing the two can leave a
    /// new key beside an old certificate).
    pub fn load_valid(
        &self,
        ca_pem: &str,
        node_name: &str,
        purpose: &Purpose,
        margin: Duration,
    ) -> Option<(Issued, SystemTime, RotatingCertificate)> {
        let (issued, written) = self.load()?;
        if !still_valid(&issued.cert, ca_pem, node_name, purpose, margin) {
            return None;
        }
        let certificate = RotatingCertificate::from_pem(&issued.cert, &issued.key).ok()?;
        Some((issued, written, certificate))
    }

    /// Writes the key, then the certificate, each through a temporary file.
    pub fn store(&self, issued: &Issued) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        for (path, contents) in [(&self.key, &issued.key), (&self.cert, &issued.cert)] {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            let _ = std::fs::remove_file(&tmp);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(contents.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
        }
        Ok(())
    }
}

/// When to renew `cert_pem`, obtained at `since`: at a random point between 70 % and
/// 90 % of its lifetime, as upstream's certificate manager does. The lifetime counts
/// from the later of its NotBefore and `since`, since signers backdate NotBefore (by
/// 5 minutes, more than a short-lived certificate lives).
pub fn rotation_deadline(cert_pem: &str, since: SystemTime) -> SystemTime {
    let Some((not_before, not_after)) = validity(cert_pem) else {
        return SystemTime::now();
    };
    let start = not_before.max(since);
    let Ok(lifetime) = not_after.duration_since(start) else {
        return SystemTime::now();
    };
    // Jitter spreads nodes' renewals; it needs no better randomness than the clock's.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let fraction = 0.7 + 0.2 * f64::from(nanos % 1000) / 1000.0;
    start + lifetime.mul_f64(fraction)
}

fn validity(cert_pem: &str) -> Option<(SystemTime, SystemTime)> {
    let (_, pem) = parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let at = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    Some((
        at(cert.validity().not_before),
        at(cert.validity().not_after),
    ))
}

/// Keeps a node certificate renewed: requests a new one at each
/// [`rotation_deadline`], keeps it in `kept` and puts it in `certificate`'s place.
#[derive(Clone)]
pub struct Rotation {
    pub node_name: String,
    pub purpose: Purpose,
    pub kept: Kept,
    pub certificate: RotatingCertificate,
    /// When to request the first renewal.
    pub renew_at: SystemTime,
    /// How long a request may wait for approval before it is made again.
    pub issue_timeout: Duration,
}

impl Rotation {
    /// Runs for ever, through `client` (whose identity may be the one rotated).
    pub async fn run(self, client: kube::Client) {
        const RETRY_MIN: Duration = Duration::from_secs(2);
        const RETRY_MAX: Duration = Duration::from_secs(300);
        let mut renew_at = self.renew_at;
        let mut retry = RETRY_MIN;
        loop {
            if let Ok(wait) = renew_at.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait).await;
            }
            let renewed = async {
                let issued = request_certificate(
                    &client,
                    &self.node_name,
                    &self.purpose,
                    self.issue_timeout,
                )
                .await?;
                self.kept.store(&issued).map_err(CertificateError::Store)?;
                self.certificate
                    .replace(&issued.cert, &issued.key)
                    .map_err(CertificateError::Issued)?;
                Ok::<_, CertificateError>(issued)
            };
            match renewed.await {
                Ok(issued) => {
                    renew_at = rotation_deadline(&issued.cert, SystemTime::now());
                    retry = RETRY_MIN;
                    tracing::info!(
                        purpose = self.purpose.describe(),
                        cert = %self.kept.cert.display(),
                        "rotated the node certificate"
                    );
                }
                Err(err) => {
                    tracing::warn!(
                        purpose = self.purpose.describe(),
                        error = %err,
                        retry_in = ?retry,
                        "renewing the node certificate"
                    );
                    renew_at = SystemTime::now() + retry;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// How long a serving request waits for approval before it is made again: one the
/// controllers do not approve waits for `kubectl certificate approve`.
const SERVING_ISSUE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The kubelet's serving certificate and what keeps it renewed: the one `config` gives
/// (never rotated), else the one kept from an earlier start while it is valid for the
/// node's names, else a self-signed one until the first request is issued.
pub fn serving(
    config: &crate::Config,
) -> Result<(RotatingCertificate, Option<Rotation>), crate::Error> {
    let fail =
        |e: &dyn std::fmt::Display| crate::Error::Server(format!("the serving certificate: {e}"));
    if let Some((cert, key)) = &config.serving_cert {
        return Ok((
            RotatingCertificate::from_pem(cert, key).map_err(|e| fail(&e))?,
            None,
        ));
    }
    let purpose = Purpose::Serving {
        names: vec![config.node_name.clone(), config.node_ip.to_string()],
    };
    let kept = Kept::in_dir(&config.data_dir, "serving-kubelet");
    let reusable = kept.load_valid(
        &config.client_ca,
        &config.node_name,
        &purpose,
        Duration::ZERO,
    );
    let (certificate, renew_at) = match reusable {
        Some((issued, written, certificate)) => {
            (certificate, rotation_deadline(&issued.cert, written))
        }
        None => {
            let self_signed = rcgen::generate_simple_self_signed(purpose.names().to_vec())
                .map_err(|e| fail(&e))?;
            let certificate = RotatingCertificate::from_pem(
                &self_signed.cert.pem(),
                &self_signed.signing_key.serialize_pem(),
            )
            .map_err(|e| fail(&e))?;
            (certificate, SystemTime::now())
        }
    };
    let rotation = Rotation {
        node_name: config.node_name.clone(),
        purpose,
        kept,
        certificate: certificate.clone(),
        renew_at,
        issue_timeout: SERVING_ISSUE_TIMEOUT,
    };
    Ok((certificate, Some(rotation)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        (pem, rcgen::Issuer::new(params, key))
    }

    fn issue(
        ca: &rcgen::Issuer<'_, rcgen::KeyPair>,
        cn: &str,
        names: &[&str],
        until_year: i32,
    ) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
        params.signed_by(&key, ca).unwrap().pem()
    }

    #[test]
    fn a_kept_certificate_is_reused_only_for_its_node_names_ca_and_lifetime() {
        let (ca_pem, ca) = ca();
        let day = Duration::from_secs(86_400);
        let client = Purpose::Client;
        let good = issue(&ca, "system:node:n1", &[], 2100);
        assert!(still_valid(&good, &ca_pem, "n1", &client, day));
        assert!(
            !still_valid(&good, &ca_pem, "n2", &client, day),
            "another node"
        );
        let expired = issue(&ca, "system:node:n1", &[], 2001);
        assert!(
            !still_valid(&expired, &ca_pem, "n1", &client, day),
            "expired"
        );
        let (other_pem, _) = self::ca();
        assert!(
            !still_valid(&good, &other_pem, "n1", &client, day),
            "another CA"
        );
        assert!(!still_valid("junk", &ca_pem, "n1", &client, day));

        let serving = |names: &[&str]| Purpose::Serving {
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        let cert = issue(&ca, "system:node:n1", &["n1", "10.0.0.1"], 2100);
        assert!(still_valid(
            &cert,
            &ca_pem,
            "n1",
            &serving(&["n1", "10.0.0.1"]),
            day
        ));
        assert!(
            !still_valid(&cert, &ca_pem, "n1", &serving(&["n1", "10.0.0.2"]), day),
            "the node's address changed"
        );
    }

    #[test]
    fn renewal_falls_between_70_and_90_percent_of_the_lifetime_since_issue() {
        let (_, ca) = ca();
        let cert = issue(&ca, "system:node:n1", &[], 2100);
        let (not_before, not_after) = validity(&cert).unwrap();
        let lifetime = not_after.duration_since(not_before).unwrap();
        let deadline = rotation_deadline(&cert, SystemTime::UNIX_EPOCH);
        assert!(deadline >= not_before + lifetime.mul_f64(0.7));
        assert!(deadline <= not_before + lifetime.mul_f64(0.9));
        // Obtained long after its (backdated) NotBefore: the lifetime counts from then.
        let since = not_after - Duration::from_secs(100);
        let deadline = rotation_deadline(&cert, since);
        assert!(deadline >= since + Duration::from_secs(70));
        assert!(deadline <= since + Duration::from_secs(90));
        assert!(rotation_deadline("junk", since) <= SystemTime::now());
    }

    #[test]
    fn kept_certificates_are_private_files_read_back_with_their_time() {
        let dir = tempfile::tempdir().unwrap();
        let kept = Kept::in_dir(&dir.path().join("agent"), "serving-kubelet");
        assert!(kept.load().is_none());
        let issued = Issued {
            cert: "CERT".into(),
            key: "KEY".into(),
        };
        kept.store(&issued).unwrap();
        let (back, written) = kept.load().unwrap();
        assert_eq!((back.cert.as_str(), back.key.as_str()), ("CERT", "KEY"));
        assert!(written <= SystemTime::now());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&kept.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
