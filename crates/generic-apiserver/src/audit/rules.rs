//! The audit policy (audit.k8s.io/v1 `Policy`): rules matched in order, the first that
//! matches a request gives its level and the stages to leave out; no match means
//! level `None`. Matching is upstream's: users, user groups and verbs narrow a rule;
//! `resources`/`namespaces` make it match only resource requests, `nonResourceURLs`
//! only the others.

use serde::Deserialize;

/// How much of a request the log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

/// The points in a request's life at which an event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    api_version: String,
    kind: String,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    omit_managed_fields: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

/// What a request is, as the policy sees it.
pub struct Request<'a> {
    pub user: Option<(&'a str, &'a [String])>,
    pub verb: &'a str,
    pub target: Target<'a>,
}

pub enum Target<'a> {
    Resource {
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
        namespace: &'a str,
        name: &'a str,
    },
    NonResource {
        path: &'a str,
    },
}

/// What the policy says of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub level: Level,
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: bool,
}

impl Policy {
    pub fn parse(text: &str) -> Result<Policy, String> {
        let policy: Policy = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if policy.kind != "Policy" || policy.api_version != "audit.k8s.io/v1" {
            return Err(format!(
                "expected apiVersion audit.k8s.io/v1 and kind Policy, found {} {}",
                policy.api_version, policy.kind
            ));
        }
        Ok(policy)
    }

    pub fn decide(&self, req: &Request<'_>) -> Decision {
        match self.rules.iter().find(|r| r.matches(req)) {
            None => Decision {
                level: Level::None,
                omit_stages: Vec::new(),
                omit_managed_fields: false,
            },
            Some(rule) => Decision {
                level: rule.level,
                omit_stages: self
                    .omit_stages
                    .iter()
                    .chain(&rule.omit_stages)
                    .copied()
                    .collect(),
                omit_managed_fields: rule.omit_managed_fields.unwrap_or(self.omit_managed_fields),
            },
        }
    }
}

fn has(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == value)
}

impl Rule {
    fn matches(&self, req: &Request<'_>) -> bool {
        if !self.users.is_empty() && !req.user.is_some_and(|(name, _)| has(&self.users, name)) {
            return false;
        }
        if !self.user_groups.is_empty()
            && !req
                .user
                .is_some_and(|(_, groups)| groups.iter().any(|g| has(&self.user_groups, g)))
        {
            return false;
        }
        if !self.verbs.is_empty() && !has(&self.verbs, req.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(&req.target);
        }
        if !self.non_resource_urls.is_empty() {
            return match req.target {
                Target::NonResource { path } => self.non_resource_urls.iter().any(|spec| {
                    spec == "*"
                        || spec == path
                        || spec
                            .strip_suffix('*')
                            .is_some_and(|prefix| path.starts_with(prefix))
                }),
                Target::Resource { .. } => false,
            };
        }
        true
    }

    fn matches_resource(&self, target: &Target<'_>) -> bool {
        let Target::Resource {
            group,
            resource,
            subresource,
            namespace,
            name,
        } = *target
        else {
            return false;
        };
        if !self.namespaces.is_empty() && !has(&self.namespaces, namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let combined = match subresource {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        self.resources
            .iter()
            .filter(|gr| gr.group == group)
            .any(|gr| {
                gr.resources.is_empty()
                    || gr.resources.iter().any(|res| {
                        (gr.resource_names.is_empty() || has(&gr.resource_names, name))
                            && (*res == combined
                                || res == "*"
                                || subresource
                                    .is_some_and(|sub| res.strip_prefix("*/") == Some(sub))
                                || res.strip_suffix("/*") == Some(resource))
                    })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: ["system:kube-proxy"]
    verbs: ["watch"]
  - level: None
    nonResourceURLs: ["/healthz*", "/version"]
  - level: Metadata
    resources:
      - group: ""
        resources: ["secrets", "pods/log", "*/status"]
  - level: RequestResponse
    namespaces: ["audited"]
    omitStages: [ResponseStarted]
  - level: Request
    resources:
      - group: apps
        resources: ["deployments/*"]
        resourceNames: ["web"]
"#;

    fn resource<'a>(
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
        name: &'a str,
    ) -> Target<'a> {
        Target::Resource {
            group,
            resource,
            subresource,
            namespace: "default",
            name,
        }
    }

    fn level(policy: &Policy, user: &str, verb: &str, target: Target<'_>) -> Level {
        let groups = vec!["system:authenticated".to_string()];
        policy
            .decide(&Request {
                user: Some((user, &groups)),
                verb,
                target,
            })
            .level
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let p = Policy::parse(POLICY).unwrap();
        let proxy = "system:kube-proxy";
        let pods = || resource("", "pods", None, "p");
        assert_eq!(level(&p, proxy, "watch", pods()), Level::None);
        assert_eq!(level(&p, proxy, "list", pods()), Level::None);
        let secrets = resource("", "secrets", None, "s");
        assert_eq!(level(&p, "alice", "get", secrets), Level::Metadata);
        let log = resource("", "pods", Some("log"), "p");
        assert_eq!(level(&p, "alice", "get", log), Level::Metadata);
        let status = resource("apps", "deployments", Some("status"), "web");
        assert_eq!(level(&p, "alice", "update", status), Level::Request);
        let scale = resource("apps", "deployments", Some("scale"), "other");
        assert_eq!(level(&p, "alice", "update", scale), Level::None);
        let health = Target::NonResource {
            path: "/healthz/ready",
        };
        assert_eq!(level(&p, "alice", "get", health), Level::None);
        let api = Target::NonResource { path: "/api" };
        assert_eq!(level(&p, "alice", "get", api), Level::None);
        let in_ns = Target::Resource {
            group: "",
            resource: "configmaps",
            subresource: None,
            namespace: "audited",
            name: "c",
        };
        let groups = vec![];
        let decision = p.decide(&Request {
            user: Some(("alice", &groups)),
            verb: "create",
            target: in_ns,
        });
        assert_eq!(decision.level, Level::RequestResponse);
        assert_eq!(
            decision.omit_stages,
            [Stage::RequestReceived, Stage::ResponseStarted]
        );
    }

    #[test]
    fn other_documents_are_refused() {
        let err = Policy::parse("apiVersion: v1\nkind: ConfigMap").unwrap_err();
        assert!(err.contains("expected apiVersion audit.k8s.io/v1"), "{err}");
        assert!(
            Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud")
                .is_err()
        );
    }
}
