//! The ingress-nginx annotations krust honours, read from an Ingress into the
//! [`Options`] of its paths. Names, defaults and meanings are ingress-nginx's, so that
//! manifests written for it keep working:
//!
//! - `rewrite-target`: the path sent to the backend, with `$1`… from the rule's path,
//!   which is then a regular expression (as with `use-regex: "true"`); the query stays;
//! - `proxy-body-size` (default `1m`, `0` for no limit): larger bodies get 413;
//! - `proxy-connect-timeout` (5 s) and `proxy-read-timeout` (60 s): 504 when exceeded;
//! - `allowlist-source-range` / `whitelist-source-range`: other clients get 403;
//! - `backend-protocol: GRPC`: HTTP/2 without TLS to the backend;
//! - `affinity: cookie` with `session-cookie-name` (`INGRESSCOOKIE`),
//!   `session-cookie-path` and `session-cookie-max-age`: a client keeps its endpoint;
//! - `canary: "true"` with `canary-by-header` (+ `-value`), `canary-by-cookie` and
//!   `canary-weight` (+ `-total`): the Ingress is an alternative backend for the paths
//!   another Ingress serves, taken by header, then cookie, then weight.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use krust_api::cidr::Ipv4Block;

const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// How the requests of one Ingress's paths are handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The path sent instead (`$n` refers to the rule path's groups).
    pub rewrite_target: Option<String>,
    /// Whether the rule's paths are regular expressions.
    pub regex: bool,
    /// The largest request body accepted; `None`: any.
    pub body_limit: Option<u64>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The clients allowed; empty: all.
    pub allowed_sources: Vec<Ipv4Block>,
    /// The backend speaks gRPC (HTTP/2 in clear text).
    pub grpc: bool,
    pub affinity: Option<Affinity>,
}

impl Default for Options {
    /// ingress-nginx's defaults.
    fn default() -> Options {
        Options {
            rewrite_target: None,
            regex: false,
            body_limit: Some(1024 * 1024),
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(60),
            allowed_sources: Vec::new(),
            grpc: false,
            affinity: None,
        }
    }
}

/// Cookie affinity: the endpoint a client got first keeps its requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Affinity {
    pub cookie: String,
    /// `None`: the rule's path.
    pub path: Option<String>,
    pub max_age: Option<u64>,
}

/// When a request goes to a canary Ingress's backend instead of the main one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canary {
    pub header: Option<String>,
    /// The header's value that means "canary"; without it, `always` does.
    pub header_value: Option<String>,
    pub cookie: Option<String>,
    /// Requests out of `weight_total` that go to the canary.
    pub weight: u32,
    pub weight_total: u32,
}

/// A request's say on the canary: from its header or cookie, else nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Canary,
    Main,
    Undecided,
}

impl Canary {
    /// What the header and the cookie (in that order) decide for a request: `header`
    /// and `cookie` look the request's values up by name.
    pub fn verdict<'a>(
        &self,
        header: impl Fn(&str) -> Option<&'a str>,
        cookie: impl Fn(&str) -> Option<&'a str>,
    ) -> Verdict {
        if let Some(value) = self.header.as_deref().and_then(&header) {
            match (&self.header_value, value) {
                (Some(wanted), value) if value == wanted => return Verdict::Canary,
                (Some(_), _) => {}
                (None, "always") => return Verdict::Canary,
                (None, "never") => return Verdict::Main,
                (None, _) => {}
            }
        }
        match self.cookie.as_deref().and_then(&cookie) {
            Some("always") => Verdict::Canary,
            Some("never") => Verdict::Main,
            _ => Verdict::Undecided,
        }
    }
}

fn get<'a>(annotations: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    annotations
        .get(&format!("{PREFIX}{name}"))
        .map(|v| v.trim())
}

/// The options of an Ingress with `annotations`; what cannot be read keeps its default
/// (ingress-nginx ignores an annotation it cannot parse).
pub fn options(annotations: &BTreeMap<String, String>) -> Options {
    let mut o = Options::default();
    let seconds = |name: &str| {
        get(annotations, name)
            .and_then(|v| v.trim_end_matches('s').parse::<u64>().ok())
            .map(Duration::from_secs)
    };
    o.rewrite_target = get(annotations, "rewrite-target").map(str::to_string);
    o.regex = o.rewrite_target.is_some() || get(annotations, "use-regex") == Some("true");
    if let Some(size) = get(annotations, "proxy-body-size").and_then(size) {
        o.body_limit = (size > 0).then_some(size);
    }
    o.connect_timeout = seconds("proxy-connect-timeout").unwrap_or(o.connect_timeout);
    o.read_timeout = seconds("proxy-read-timeout").unwrap_or(o.read_timeout);
    let ranges = get(annotations, "allowlist-source-range")
        .or_else(|| get(annotations, "whitelist-source-range"));
    o.allowed_sources = ranges
        .into_iter()
        .flat_map(|r| r.split(','))
        .filter_map(|r| r.parse().ok())
        .collect();
    o.grpc = get(annotations, "backend-protocol").is_some_and(|p| p.eq_ignore_ascii_case("grpc"));
    o.affinity = (get(annotations, "affinity") == Some("cookie")).then(|| Affinity {
        cookie: get(annotations, "session-cookie-name")
            .unwrap_or("INGRESSCOOKIE")
            .to_string(),
        path: get(annotations, "session-cookie-path").map(str::to_string),
        max_age: get(annotations, "session-cookie-max-age").and_then(|v| v.parse().ok()),
    });
    o
}

/// The canary rules of an Ingress marked `canary: "true"`, else `None`.
pub fn canary(annotations: &BTreeMap<String, String>) -> Option<Canary> {
    if get(annotations, "canary") != Some("true") {
        return None;
    }
    let weight_total = get(annotations, "canary-weight-total")
        .and_then(|v| v.parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100);
    Some(Canary {
        header: get(annotations, "canary-by-header").map(str::to_string),
        header_value: get(annotations, "canary-by-header-value").map(str::to_string),
        cookie: get(annotations, "canary-by-cookie").map(str::to_string),
        weight: get(annotations, "canary-weight")
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
            .min(weight_total),
        weight_total,
    })
}

impl Options {
    /// Whether a client at `ip` may be served.
    pub fn allows(&self, ip: Ipv4Addr) -> bool {
        self.allowed_sources.is_empty() || self.allowed_sources.iter().any(|b| b.contains(ip))
    }
}

/// An nginx size (`512`, `8k`, `1m`, `2g`; either case) in bytes.
fn size(value: &str) -> Option<u64> {
    let (digits, unit) = match value.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&value[..i], c.to_ascii_lowercase()),
        _ => (value, 'b'),
    };
    let n: u64 = digits.parse().ok()?;
    let factor = match unit {
        'b' => 1,
        'k' => 1024,
        'm' => 1024 * 1024,
        'g' => 1024 * 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_ingress_nginx_s() {
        let o = options(&BTreeMap::new());
        assert_eq!(o, Options::default());
        assert_eq!(o.body_limit, Some(1 << 20));
        assert!(o.allows("203.0.113.9".parse().unwrap()));
        assert_eq!(canary(&BTreeMap::new()), None);
    }

    #[test]
    fn every_option_is_read() {
        let o = options(&annotations(&[
            ("rewrite-target", "/$2"),
            ("proxy-body-size", "8M"),
            ("proxy-connect-timeout", "2"),
            ("proxy-read-timeout", "30s"),
            (
                "whitelist-source-range",
                "10.0.0.0/8, 192.168.1.7/32, fd00::/8",
            ),
            ("backend-protocol", "GRPC"),
            ("affinity", "cookie"),
            ("session-cookie-max-age", "3600"),
        ]));
        assert_eq!(o.rewrite_target.as_deref(), Some("/$2"));
        assert!(o.regex, "a rewrite makes the paths regular expressions");
        assert_eq!(o.body_limit, Some(8 << 20));
        assert_eq!(o.connect_timeout, Duration::from_secs(2));
        assert_eq!(o.read_timeout, Duration::from_secs(30));
        assert!(o.allows("10.9.9.9".parse().unwrap()));
        assert!(o.allows("192.168.1.7".parse().unwrap()));
        assert!(!o.allows("192.168.1.8".parse().unwrap()));
        assert!(o.grpc);
        let affinity = o.affinity.unwrap();
        assert_eq!(
            (affinity.cookie.as_str(), affinity.max_age),
            ("INGRESSCOOKIE", Some(3600))
        );
        assert_eq!(
            options(&annotations(&[("proxy-body-size", "0")])).body_limit,
            None
        );
        assert_eq!(size("512"), Some(512));
        assert_eq!(size("8k"), Some(8192));
        assert_eq!(size("1x"), None);
    }

    #[test]
    fn canaries_decide_by_header_then_cookie_then_weight() {
        let c = canary(&annotations(&[
            ("canary", "true"),
            ("canary-by-header", "x-canary"),
            ("canary-by-cookie", "canary"),
            ("canary-weight", "30"),
        ]))
        .unwrap();
        assert_eq!((c.weight, c.weight_total), (30, 100));
        let ask = |header: Option<&'static str>, cookie: Option<&'static str>| {
            c.verdict(|_| header, |_| cookie)
        };
        assert_eq!(ask(Some("always"), Some("never")), Verdict::Canary);
        assert_eq!(ask(Some("never"), Some("always")), Verdict::Main);
        assert_eq!(ask(Some("maybe"), Some("always")), Verdict::Canary);
        assert_eq!(ask(None, Some("never")), Verdict::Main);
        assert_eq!(ask(None, None), Verdict::Undecided);
        let by_value = canary(&annotations(&[
            ("canary", "true"),
            ("canary-by-header", "x-region"),
            ("canary-by-header-value", "eu"),
        ]))
        .unwrap();
        assert_eq!(by_value.verdict(|_| Some("eu"), |_| None), Verdict::Canary);
        assert_eq!(
            by_value.verdict(|_| Some("always"), |_| None),
            Verdict::Undecided
        );
    }
}
