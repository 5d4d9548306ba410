//! RBAC policy rules: what one rule allows (upstream's `RuleAllows`), whether a set of
//! rules covers another (escalation prevention), and the compact forms rules are written
//! in — the bootstrap policy's one-line syntax and upstream's `CompactString` for messages.

use serde::{Deserialize, Serialize};

use super::{Attributes, Target};

/// An rbac.authorization.k8s.io/v1 `PolicyRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(
        default,
        rename = "nonResourceURLs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub non_resource_urls: Vec<String>,
}

const ALL: &str = "*";

fn has(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item)
}

fn has_or_all(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item || s == ALL)
}

/// A rule's `nonResourceURLs` entry matches a path exactly, as `*`, or as a prefix
/// ending in `*`.
fn url_matches(rule_url: &str, path: &str) -> bool {
    rule_url == ALL
        || rule_url == path
        || rule_url
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

impl Rule {
    /// Whether this rule allows the request, as upstream's `RuleAllows`.
    pub fn allows(&self, attrs: &Attributes<'_>) -> bool {
        if !has_or_all(&self.verbs, attrs.verb) {
            return false;
        }
        match &attrs.target {
            Target::NonResource { path } => {
                self.non_resource_urls.iter().any(|u| url_matches(u, path))
            }
            Target::Resource(r) => {
                has_or_all(&self.api_groups, r.group)
                    && self.matches_resource(r.resource, r.subresource)
                    && (self.resource_names.is_empty()
                        || r.name
                            .is_some_and(|n| !n.is_empty() && has(&self.resource_names, n)))
            }
        }
    }

    /// `pods`, `pods/log`, `*` and `*/log` style matching of `resource[/subresource]`.
    fn matches_resource(&self, resource: &str, subresource: Option<&str>) -> bool {
        self.resources.iter().any(|r| {
            if r == ALL {
                return true;
            }
            match subresource {
                None => r == resource,
                Some(sub) => {
                    r.strip_prefix(resource)
                        .and_then(|rest| rest.strip_prefix('/'))
                        .is_some_and(|s| s == sub)
                        || r.strip_prefix("*/").is_some_and(|s| s == sub)
                }
            }
        })
    }

    /// The rule split into rules of one verb, group, resource and name each (or one verb
    /// and URL), as upstream breaks rules down before checking coverage.
    pub fn atoms(&self) -> Vec<Rule> {
        let one = |s: &String| vec![s.clone()];
        let mut out = Vec::new();
        for verb in &self.verbs {
            for url in &self.non_resource_urls {
                out.push(Rule {
                    verbs: one(verb),
                    non_resource_urls: one(url),
                    ..Rule::default()
                });
            }
            for group in &self.api_groups {
                for resource in &self.resources {
                    if self.resource_names.is_empty() {
                        out.push(Rule {
                            verbs: one(verb),
                            api_groups: one(group),
                            resources: one(resource),
                            ..Rule::default()
                        });
                    }
                    for name in &self.resource_names {
                        out.push(Rule {
                            verbs: one(verb),
                            api_groups: one(group),
                            resources: one(resource),
                            resource_names: one(name),
                            ..Rule::default()
                        });
                    }
                }
            }
        }
        out
    }

    /// Whether this rule grants everything `atom` (from [`Rule::atoms`]) does.
    fn covers_atom(&self, atom: &Rule) -> bool {
        let all_in = |owner: &[String], wanted: &[String]| {
            has(owner, ALL) || wanted.iter().all(|w| has(owner, w))
        };
        if !all_in(&self.verbs, &atom.verbs) {
            return false;
        }
        if !atom.non_resource_urls.is_empty() {
            return atom
                .non_resource_urls
                .iter()
                .all(|url| self.non_resource_urls.iter().any(|o| url_matches(o, url)));
        }
        let resources_covered = atom.resources.iter().all(|r| {
            has_or_all(&self.resources, r)
                || r.split_once('/')
                    .is_some_and(|(_, sub)| has(&self.resources, &format!("*/{sub}")))
        });
        all_in(&self.api_groups, &atom.api_groups)
            && resources_covered
            && (self.resource_names.is_empty()
                || (!atom.resource_names.is_empty()
                    && atom
                        .resource_names
                        .iter()
                        .all(|n| has(&self.resource_names, n))))
    }

    /// Upstream's `CompactString`: `{APIGroups:["apps"], Resources:["deployments"],
    /// Verbs:["get"]}`, naming only the fields that are set.
    pub fn compact(&self) -> String {
        let quoted = |items: &[String]| {
            let inner: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
            format!("[{}]", inner.join(" "))
        };
        let mut parts = Vec::new();
        for (name, items) in [
            ("APIGroups", &self.api_groups),
            ("Resources", &self.resources),
            ("ResourceNames", &self.resource_names),
            ("NonResourceURLs", &self.non_resource_urls),
            ("Verbs", &self.verbs),
        ] {
            if !items.is_empty() {
                parts.push(format!("{name}:{}", quoted(items)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }

    /// Parses the bootstrap policy's one-line form, `verbs | groups | resources [| names]`
    /// with comma-separated lists, `core` for the core group and `url` in the group slot
    /// for non-resource URLs.
    pub fn parse_line(line: &str) -> Result<Rule, String> {
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    if p == "core" {
                        String::new()
                    } else {
                        p.to_string()
                    }
                })
                .collect()
        };
        match fields.as_slice() {
            [verbs, "url", urls] => Ok(Rule {
                verbs: list(verbs),
                non_resource_urls: list(urls),
                ..Rule::default()
            }),
            [verbs, groups, resources] | [verbs, groups, resources, _] => Ok(Rule {
                verbs: list(verbs),
                api_groups: list(groups),
                resources: list(resources),
                resource_names: fields.get(3).map(|n| list(n)).unwrap_or_default(),
                ..Rule::default()
            }),
            _ => Err(format!("malformed rule {line:?}")),
        }
    }
}

/// The atoms of `wanted` that no rule of `held` covers (empty: `held` covers `wanted`),
/// as upstream's `Covers`.
pub fn uncovered(held: &[&Rule], wanted: &[Rule]) -> Vec<Rule> {
    wanted
        .iter()
        .flat_map(Rule::atoms)
        .filter(|atom| !held.iter().any(|h| h.covers_atom(atom)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::User;
    use crate::authz::ResourceAttributes;

    fn rule(line: &str) -> Rule {
        Rule::parse_line(line).unwrap()
    }

    fn resource<'a>(
        user: &'a User,
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            user,
            verb,
            target: Target::Resource(ResourceAttributes {
                group,
                resource,
                subresource,
                namespace: Some("ns"),
                name,
            }),
        }
    }

    #[test]
    fn rules_match_as_upstreams_rule_allows() {
        let u = User::anonymous();
        let pods = rule("get,list | core | pods");
        assert!(pods.allows(&resource(&u, "get", "", "pods", None, None)));
        assert!(!pods.allows(&resource(&u, "delete", "", "pods", None, None)));
        assert!(!pods.allows(&resource(&u, "get", "apps", "pods", None, None)));
        assert!(!pods.allows(&resource(&u, "get", "", "pods", Some("log"), None)));
        let log = rule("get | core | pods/log");
        assert!(log.allows(&resource(&u, "get", "", "pods", Some("log"), None)));
        assert!(!log.allows(&resource(&u, "get", "", "pods", None, None)));
        let any_status = rule("update | * | */status");
        assert!(any_status.allows(&resource(
            &u,
            "update",
            "apps",
            "deployments",
            Some("status"),
            None
        )));
        assert!(!any_status.allows(&resource(&u, "update", "apps", "deployments", None, None)));
        let named = rule("get | core | configmaps | a,b");
        assert!(named.allows(&resource(&u, "get", "", "configmaps", None, Some("b"))));
        assert!(!named.allows(&resource(&u, "get", "", "configmaps", None, Some("c"))));
        assert!(!named.allows(&resource(&u, "list", "", "configmaps", None, None)));
        let urls = rule("get | url | /healthz,/apis/*");
        let path = |p| Attributes {
            user: &u,
            verb: "get",
            target: Target::NonResource { path: p },
        };
        assert!(urls.allows(&path("/healthz")));
        assert!(urls.allows(&path("/apis/apps/v1")));
        assert!(!urls.allows(&path("/healthz/etcd")));
        assert!(!urls.allows(&path("/api")));
        assert!(!pods.allows(&path("/healthz")));
    }

    #[test]
    fn coverage_breaks_rules_into_atoms() {
        let view = rule("get,list,watch | core,apps | pods,deployments");
        let wanted = [rule("get,delete | core | pods")];
        let missing = uncovered(&[&view], &wanted);
        assert_eq!(missing, vec![rule("delete | core | pods")]);
        assert_eq!(
            missing[0].compact(),
            r#"{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}"#
        );
        let star = rule("* | * | *");
        assert!(uncovered(&[&star], &wanted).is_empty());
        let sub = rule("get | core | */log");
        assert!(uncovered(&[&sub], &[rule("get | core | pods/log")]).is_empty());
        assert!(!uncovered(&[&sub], &[rule("get | core | pods")]).is_empty());
        let named = rule("get | core | secrets | a");
        assert!(uncovered(&[&named], &[rule("get | core | secrets | a")]).is_empty());
        assert!(!uncovered(&[&named], &[rule("get | core | secrets")]).is_empty());
        let urls = rule("get | url | /logs/*");
        assert!(uncovered(&[&urls], &[rule("get | url | /logs/x")]).is_empty());
        assert!(!uncovered(&[&urls], &[rule("get | url | /metrics")]).is_empty());
    }
}
