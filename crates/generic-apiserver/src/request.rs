//! Request parsing: which resource, object and verb a URL and method name (upstream's
//! `RequestInfo`), and the query parameters the REST verbs understand.

use std::collections::HashMap;

use http::Method;
use krust_api::status::ApiError;
use krust_httpstream::params;

/// What a resource request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    pub verb: Verb,
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` resource paths. Returns `None`
/// for paths that are not resource requests (discovery, health, ...).
pub fn parse(method: &Method, path: &str, query: &Query) -> Option<Result<RequestInfo, ApiError>> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return None,
    };
    let mut rest = rest.to_vec();
    let mut watch_path = false;
    if rest.first() == Some(&"watch") {
        // Deprecated `/watch/` path prefix, still served upstream.
        watch_path = true;
        rest.remove(0);
    }
    let mut namespace = None;
    if rest.len() >= 3 && rest[0] == "namespaces" && !["status", "finalize"].contains(&rest[2]) {
        // `/namespaces/<ns>/<resource>...`; `/namespaces/<name>[/status|/finalize]` is the
        // namespace object itself, as upstream's RequestInfoFactory decides.
        namespace = Some(rest[1].to_string());
        rest.drain(..2);
    }
    let (resource, name, subresource) = match rest.as_slice() {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(*n), None),
        [r, n, s] => (*r, Some(*n), Some(*s)),
        _ => return Some(Err(ApiError::path_not_found())),
    };
    let watch = watch_path || query.flag("watch");
    let verb = match (method, name.is_some()) {
        (&Method::GET, _) if watch => Verb::Watch,
        (&Method::GET, true) => Verb::Get,
        (&Method::GET, false) => Verb::List,
        (&Method::POST, _) => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        (m, _) => {
            return Some(Err(ApiError::method_not_allowed(m.as_str(), resource)));
        }
    };
    Some(Ok(RequestInfo {
        verb,
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        resource: resource.to_string(),
        name: name.map(str::to_string),
        subresource: subresource.map(str::to_string),
    }))
}

/// Decoded query parameters.
#[derive(Debug, Default, Clone)]
pub struct Query(HashMap<String, String>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let mut map = HashMap::new();
        for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.insert(params::decode(k), params::decode(v));
        }
        Query(map)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// A boolean parameter, as Go's `strconv.ParseBool` reads it (`true`, `True`, `1`, ...).
    pub fn flag(&self, key: &str) -> bool {
        self.get(key).is_some_and(params::flag)
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        self.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid {key} parameter: {v:?}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str, query: &str) -> RequestInfo {
        parse(&method, path, &Query::parse(Some(query)))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn parses_resource_paths() {
        let i = info(
            Method::GET,
            "/api/v1/namespaces/default/pods/web/status",
            "",
        );
        assert_eq!(
            (
                i.verb,
                i.namespace.as_deref(),
                i.resource.as_str(),
                i.name.as_deref(),
                i.subresource.as_deref()
            ),
            (
                Verb::Get,
                Some("default"),
                "pods",
                Some("web"),
                Some("status")
            )
        );
        let i = info(Method::GET, "/apis/apps/v1/deployments", "watch=1");
        assert_eq!(
            (i.verb, i.group.as_str(), i.namespace),
            (Verb::Watch, "apps", None)
        );
        let i = info(Method::GET, "/api/v1/namespaces/kube-system", "");
        assert_eq!(
            (i.resource.as_str(), i.name.as_deref(), i.namespace),
            ("namespaces", Some("kube-system"), None)
        );
        let i = info(Method::PUT, "/api/v1/namespaces/x/finalize", "");
        assert_eq!(
            (i.verb, i.subresource.as_deref()),
            (Verb::Update, Some("finalize"))
        );
        let i = info(Method::DELETE, "/api/v1/namespaces/a/configmaps", "");
        assert_eq!(i.verb, Verb::DeleteCollection);
        let i = info(Method::GET, "/api/v1/watch/namespaces/a/pods", "");
        assert_eq!(i.verb, Verb::Watch);
        assert!(parse(&Method::GET, "/apis/apps/v1", &Query::default()).is_none());
        assert!(parse(&Method::GET, "/version", &Query::default()).is_none());
    }

    #[test]
    fn decodes_query() {
        let q = Query::parse(Some(
            "labelSelector=app%3Dweb%2Ctier+in+(a)&limit=5&watch=true",
        ));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(q.int("limit").unwrap(), Some(5));
        assert!(q.flag("watch"));
        assert!(Query::parse(Some("limit=x")).int("limit").is_err());
    }
}
