//! Where a request that reached a Gateway listener goes: the matches of the routes
//! attached to the listeners of one port, in the precedence the Gateway API specifies.
//!
//! - Hostnames first: an exact hostname beats wildcards, a longer wildcard beats a
//!   shorter one (`*.example.com` matches any number of labels before `example.com`),
//!   and both beat routes without a hostname; only when no match of a more specific
//!   hostname takes the request do the less specific ones get a say.
//! - Then, among the matches of one hostname: an `Exact` path, the longest
//!   `PathPrefix` (whole path elements), a regular expression; then a method match;
//!   the most header matches; the most query parameter matches; the oldest route; the
//!   route first in `namespace/name` order; the first rule and match in the route.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{HeaderMap, HeaderName, Method, StatusCode};
use regex::Regex;

use crate::annotations::Options;
use crate::gateway::api::HeaderModifier;
use crate::routes::Backend;

/// The hostnames a match answers for, from a route's hostname and its listener's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    Exact(String),
    /// `*.<suffix>`.
    Wildcard(String),
    Any,
}

impl Host {
    pub fn parse(name: Option<&str>) -> Host {
        match name.map(str::to_ascii_lowercase) {
            None => Host::Any,
            Some(name) => match name.strip_prefix("*.") {
                Some(suffix) => Host::Wildcard(suffix.to_string()),
                None => Host::Exact(name),
            },
        }
    }

    /// Whether a request for `host` is covered.
    pub fn covers(&self, host: &str) -> bool {
        match self {
            Host::Any => true,
            Host::Exact(name) => name == host,
            Host::Wildcard(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|label| label.len() > 1 && label.ends_with('.')),
        }
    }

    /// The hostnames both `self` (a listener's) and `route` (a route's) answer for, if
    /// any: the more specific of the two when one covers the other.
    pub fn intersect(&self, route: &Host) -> Option<Host> {
        match (self, route) {
            (Host::Any, other) | (other, Host::Any) => Some(other.clone()),
            (Host::Exact(a), Host::Exact(b)) => (a == b).then(|| self.clone()),
            (Host::Wildcard(_), Host::Exact(name)) => self.covers(name).then(|| route.clone()),
            (Host::Exact(name), Host::Wildcard(_)) => route.covers(name).then(|| self.clone()),
            (Host::Wildcard(a), Host::Wildcard(b)) => {
                if a == b || Host::Wildcard(a.clone()).covers(b) {
                    Some(route.clone())
                } else if Host::Wildcard(b.clone()).covers(a) {
                    Some(self.clone())
                } else {
                    None
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
pub enum PathRule {
    Exact(String),
    /// Without its trailing `/`; empty for `/`.
    Prefix(String),
    Regex(Regex),
}

impl PathRule {
    fn matches(&self, path: &str) -> bool {
        match self {
            PathRule::Exact(p) => path == p,
            PathRule::Prefix(p) => {
                p.is_empty()
                    || path
                        .strip_prefix(p.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            PathRule::Regex(re) => re.is_match(path),
        }
    }

    /// Exact first, then prefixes by length, then expressions.
    fn rank(&self) -> (u8, usize) {
        match self {
            PathRule::Exact(p) => (2, p.len()),
            PathRule::Prefix(p) => (1, p.len()),
            PathRule::Regex(_) => (0, 0),
        }
    }
}

#[derive(Clone, Debug)]
pub enum ValueRule {
    Exact(String),
    Regex(Regex),
}

impl ValueRule {
    fn matches(&self, value: &str) -> bool {
        match self {
            ValueRule::Exact(v) => v == value,
            ValueRule::Regex(re) => re.is_match(value),
        }
    }
}

/// One match of a route rule: every condition must hold.
#[derive(Clone, Debug)]
pub struct Match {
    pub path: PathRule,
    pub method: Option<Method>,
    pub headers: Vec<(HeaderName, ValueRule)>,
    pub query: Vec<(String, ValueRule)>,
}

impl Match {
    fn matches(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> bool {
        self.path.matches(path)
            && self.method.as_ref().is_none_or(|m| m == method)
            && self.headers.iter().all(|(name, rule)| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| rule.matches(v))
            })
            && self.query.iter().all(|(name, rule)| {
                // The first value of a repeated parameter counts, as the API says.
                query
                    .into_iter()
                    .flat_map(|q| q.split('&'))
                    .find_map(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        (key == name).then_some(value)
                    })
                    .is_some_and(|v| rule.matches(v))
            })
    }
}

/// How a path is changed on its way (a redirect's or a rewrite's `path`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathChange {
    Full(String),
    /// The matched prefix replaced by this.
    Prefix(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathChange>,
    pub port: Option<u16>,
    pub status: StatusCode,
}

/// What a route rule does with the requests it matches.
#[derive(Debug, Default)]
pub struct Rule {
    /// `namespace/name` of the route, for logs and metrics.
    pub route: String,
    /// Each backend with its weight; an unusable reference holds the status its share
    /// of requests gets (500, as the API says).
    pub backends: Vec<(Result<Backend, String>, u32)>,
    pub redirect: Option<Redirect>,
    pub rewrite_host: Option<String>,
    pub rewrite_path: Option<PathChange>,
    pub request_headers: Option<HeaderModifier>,
    pub response_headers: Option<HeaderModifier>,
    pub options: Options,
    /// A filter krust cannot apply: its requests get 500 rather than pass unfiltered.
    pub unsupported: Option<String>,
    /// Turns taken, for the weights.
    pub turn: AtomicUsize,
}

/// Where a request goes after its rule's weights are taken into account.
pub enum Pick<'r> {
    Backend(&'r Backend),
    Fail(StatusCode, String),
}

impl Rule {
    /// The backend for the next request, by weight.
    pub fn pick(&self) -> Pick<'_> {
        if let Some(filter) = &self.unsupported {
            return Pick::Fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("filter {filter} is not supported"),
            );
        }
        let total: u64 = self.backends.iter().map(|(_, w)| u64::from(*w)).sum();
        if total == 0 {
            return Pick::Fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("route {} has no backend to send to", self.route),
            );
        }
        let mut turn = self.turn.fetch_add(1, Ordering::Relaxed) as u64 % total;
        for (backend, weight) in &self.backends {
            if turn < u64::from(*weight) {
                return match backend {
                    Ok(backend) => Pick::Backend(backend),
                    Err(why) => Pick::Fail(StatusCode::INTERNAL_SERVER_ERROR, why.clone()),
                };
            }
            turn -= u64::from(*weight);
        }
        unreachable!("the turn is below the sum of the weights")
    }
}

/// A match and the rule it belongs to, found for a request.
pub struct Found<'t> {
    pub rule: &'t Rule,
    path: &'t PathRule,
}

impl Found<'_> {
    /// `path` changed as `change` says: a full replacement, or the matched prefix
    /// replaced (whole path elements, without doubling or losing a `/`).
    pub fn changed_path(&self, change: &PathChange, path: &str) -> String {
        match change {
            PathChange::Full(full) => full.clone(),
            PathChange::Prefix(replacement) => {
                let rest = match self.path {
                    PathRule::Prefix(prefix) => &path[prefix.len().min(path.len())..],
                    _ => "",
                };
                let head = replacement.trim_end_matches('/');
                match (head.is_empty(), rest.is_empty()) {
                    (true, true) => "/".to_string(),
                    (true, false) => rest.to_string(),
                    (false, _) => format!("{head}{rest}"),
                }
            }
        }
    }
}

/// Precedence, smallest first.
type Order = (
    Reverse<(u8, usize)>,
    Reverse<bool>,
    Reverse<usize>,
    Reverse<usize>,
    Option<jiff::Timestamp>,
    String,
    usize,
    usize,
);

#[derive(Debug)]
struct Entry {
    order: Order,
    matcher: Match,
    rule: std::sync::Arc<Rule>,
}

/// The matches of one port's listeners, by hostname.
#[derive(Debug, Default)]
pub struct Table {
    exact: HashMap<String, Vec<Entry>>,
    wildcard: HashMap<String, Vec<Entry>>,
    any: Vec<Entry>,
}

/// Where a match comes from, for its precedence among equals.
pub struct Origin<'a> {
    pub created: Option<jiff::Timestamp>,
    /// `namespace/name`.
    pub route: &'a str,
    pub rule: usize,
    pub index: usize,
}

impl Table {
    pub fn add(&mut self, host: Host, matcher: Match, rule: std::sync::Arc<Rule>, origin: Origin) {
        let order = (
            Reverse(matcher.path.rank()),
            Reverse(matcher.method.is_some()),
            Reverse(matcher.headers.len()),
            Reverse(matcher.query.len()),
            origin.created,
            origin.route.to_string(),
            origin.rule,
            origin.index,
        );
        let list = match host {
            Host::Exact(name) => self.exact.entry(name).or_default(),
            Host::Wildcard(suffix) => self.wildcard.entry(suffix).or_default(),
            Host::Any => &mut self.any,
        };
        let at = list.partition_point(|e| e.order <= order);
        list.insert(
            at,
            Entry {
                order,
                matcher,
                rule,
            },
        );
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.any.is_empty()
    }

    /// The match that takes a request for `host` (lowercase, without a port).
    pub fn route(
        &self,
        host: &str,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<Found<'_>> {
        // Longer suffixes first: `*.b.example.com` before `*.example.com`.
        let suffixes = host.match_indices('.').map(|(i, _)| &host[i + 1..]);
        let wildcards = suffixes.filter_map(|suffix| self.wildcard.get(suffix));
        std::iter::once(self.exact.get(host))
            .flatten()
            .chain(wildcards)
            .chain(std::iter::once(&self.any))
            .find_map(|entries| {
                entries
                    .iter()
                    .find(|e| e.matcher.matches(method, path, query, headers))
            })
            .map(|e| Found {
                rule: &e.rule,
                path: &e.matcher.path,
            })
    }
}

/// The `Location` of a redirect for a request that came as `scheme://host:port` with
/// `path` (and `query`), the port left out where it is the scheme's own.
pub fn location(
    redirect: &Redirect,
    found: &Found,
    scheme: &str,
    host: &str,
    port: u16,
    path: &str,
    query: Option<&str>,
) -> String {
    let to_scheme = redirect.scheme.as_deref().unwrap_or(scheme);
    let well_known = |s: &str| if s == "https" { 443 } else { 80 };
    let to_port = match (redirect.port, &redirect.scheme) {
        (Some(port), _) => port,
        (None, Some(s)) => well_known(s),
        (None, None) => port,
    };
    let to_host = redirect.hostname.as_deref().unwrap_or(host);
    let to_path = match &redirect.path {
        Some(change) => found.changed_path(change, path),
        None => path.to_string(),
    };
    let port = if to_port == well_known(to_scheme) {
        String::new()
    } else {
        format!(":{to_port}")
    };
    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
    format!("{to_scheme}://{to_host}{port}{to_path}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rule(route: &str) -> Arc<Rule> {
        Arc::new(Rule {
            route: route.to_string(),
            ..Rule::default()
        })
    }

    fn prefix(p: &str) -> Match {
        Match {
            path: PathRule::Prefix(p.trim_end_matches('/').to_string()),
            method: None,
            headers: Vec::new(),
            query: Vec::new(),
        }
    }

    fn origin(route: &str, secs: i64) -> Origin<'_> {
        Origin {
            created: Some(jiff::Timestamp::from_second(secs).unwrap()),
            route,
            rule: 0,
            index: 0,
        }
    }

    fn to(t: &Table, host: &str, path: &str, headers: &[(&str, &str)]) -> Option<String> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let (path, query) = path
            .split_once('?')
            .map_or((path, None), |(p, q)| (p, Some(q)));
        t.route(host, &Method::GET, path, query, &map)
            .map(|f| f.rule.route.clone())
    }

    #[test]
    fn hostnames_intersect_as_listeners_and_routes_say() {
        let listener = Host::parse(Some("*.example.com"));
        assert_eq!(
            listener.intersect(&Host::parse(Some("a.b.example.com"))),
            Some(Host::Exact("a.b.example.com".into()))
        );
        assert_eq!(listener.intersect(&Host::parse(Some("example.com"))), None);
        assert_eq!(
            listener.intersect(&Host::parse(Some("*.shop.example.com"))),
            Some(Host::Wildcard("shop.example.com".into()))
        );
        assert_eq!(
            listener.intersect(&Host::parse(Some("*.com"))),
            Some(Host::Wildcard("example.com".into()))
        );
        assert_eq!(listener.intersect(&Host::Any), Some(listener.clone()));
        assert_eq!(
            Host::parse(Some("Web.Example.com")).intersect(&Host::parse(Some("other.example.com"))),
            None
        );
    }

    #[test]
    fn exact_hosts_then_longer_wildcards_then_any_host() {
        let mut t = Table::default();
        t.add(Host::Any, prefix("/"), rule("any"), origin("any", 1));
        t.add(
            Host::parse(Some("*.example.com")),
            prefix("/"),
            rule("wide"),
            origin("wide", 1),
        );
        t.add(
            Host::parse(Some("*.b.example.com")),
            prefix("/"),
            rule("narrow"),
            origin("narrow", 1),
        );
        t.add(
            Host::parse(Some("a.b.example.com")),
            prefix("/only"),
            rule("exact"),
            origin("exact", 1),
        );
        assert_eq!(
            to(&t, "a.b.example.com", "/only/x", &[]).as_deref(),
            Some("exact")
        );
        // The exact host has no match for this path: the next hostname takes it.
        assert_eq!(
            to(&t, "a.b.example.com", "/other", &[]).as_deref(),
            Some("narrow")
        );
        assert_eq!(to(&t, "c.example.com", "/", &[]).as_deref(), Some("wide"));
        assert_eq!(to(&t, "example.com", "/", &[]).as_deref(), Some("any"));
    }

    #[test]
    fn exact_paths_longest_prefixes_headers_then_age_decide() {
        let mut t = Table::default();
        t.add(Host::Any, prefix("/"), rule("root"), origin("root", 1));
        t.add(Host::Any, prefix("/api/"), rule("api"), origin("api", 1));
        let exact = Match {
            path: PathRule::Exact("/api/v1".into()),
            ..prefix("/")
        };
        t.add(Host::Any, exact, rule("exact"), origin("exact", 1));
        let with_header = Match {
            headers: vec![(
                HeaderName::from_static("x-canary"),
                ValueRule::Exact("1".into()),
            )],
            ..prefix("/api")
        };
        t.add(Host::Any, with_header, rule("canary"), origin("canary", 5));
        t.add(
            Host::Any,
            prefix("/api"),
            rule("younger"),
            origin("younger", 9),
        );
        let with_query = Match {
            query: vec![(
                "v".into(),
                ValueRule::Regex(Regex::new("^[0-9]+$").unwrap()),
            )],
            ..prefix("/api")
        };
        t.add(Host::Any, with_query, rule("query"), origin("query", 9));
        assert_eq!(
            to(&t, "h", "/api/v1", &[("x-canary", "1")]).as_deref(),
            Some("exact")
        );
        assert_eq!(
            to(&t, "h", "/api/v2", &[("x-canary", "1")]).as_deref(),
            Some("canary")
        );
        assert_eq!(
            to(&t, "h", "/api/v2?a=b&v=12&v=x", &[]).as_deref(),
            Some("query")
        );
        assert_eq!(to(&t, "h", "/api/v2?v=x&v=12", &[]).as_deref(), Some("api"));
        assert_eq!(to(&t, "h", "/apiv2", &[]).as_deref(), Some("root"));
    }

    #[test]
    fn prefixes_are_replaced_on_whole_elements_and_redirects_keep_ports_that_matter() {
        let found = |p: &str| Found {
            rule: Box::leak(Box::new(Rule::default())),
            path: Box::leak(Box::new(PathRule::Prefix(p.to_string()))),
        };
        let change = |s: &str| PathChange::Prefix(s.to_string());
        assert_eq!(
            found("/foo").changed_path(&change("/bar"), "/foo/baz"),
            "/bar/baz"
        );
        assert_eq!(found("/foo").changed_path(&change("/"), "/foo/baz"), "/baz");
        assert_eq!(found("/foo").changed_path(&change("/"), "/foo"), "/");
        assert_eq!(found("/foo").changed_path(&change("/bar/"), "/foo"), "/bar");
        assert_eq!(found("").changed_path(&change("/v2"), "/x"), "/v2/x");
        let redirect = Redirect {
            scheme: Some("https".into()),
            hostname: None,
            path: None,
            port: None,
            status: StatusCode::FOUND,
        };
        let f = found("");
        assert_eq!(
            location(
                &redirect,
                &f,
                "http",
                "web.example",
                8080,
                "/a",
                Some("q=1")
            ),
            "https://web.example/a?q=1"
        );
        let same_scheme = Redirect {
            scheme: None,
            hostname: Some("other.example".into()),
            ..redirect
        };
        assert_eq!(
            location(&same_scheme, &f, "http", "web.example", 8080, "/a", None),
            "http://other.example:8080/a"
        );
    }

    #[test]
    fn weights_share_requests_and_unusable_backends_answer_500() {
        let backend = |name: &str| Backend {
            name: name.to_string(),
            ingress: String::new(),
            namespace: String::new(),
            service: String::new(),
            endpoints: Vec::new(),
        };
        let rule = Rule {
            backends: vec![
                (Ok(backend("a")), 3),
                (Ok(backend("never")), 0),
                (Err("missing".into()), 1),
            ],
            ..Rule::default()
        };
        let mut counts = HashMap::new();
        for _ in 0..400 {
            let key = match rule.pick() {
                Pick::Backend(b) => b.name.clone(),
                Pick::Fail(status, _) => status.to_string(),
            };
            *counts.entry(key).or_insert(0) += 1;
        }
        assert_eq!(counts.get("a"), Some(&300));
        assert_eq!(counts.get("500 Internal Server Error"), Some(&100));
        assert!(!counts.contains_key("never"));
        assert!(
            matches!(Rule::default().pick(), Pick::Fail(s, _) if s == StatusCode::INTERNAL_SERVER_ERROR)
        );
    }
}
