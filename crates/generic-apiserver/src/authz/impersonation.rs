//! Impersonation (`kubectl --as`, `--as-group`): a request carrying `Impersonate-*`
//! headers acts as the user they name, once the authenticated user is allowed the
//! `impersonate` verb on each thing asked for — `users`, `groups`, `serviceaccounts`,
//! `uids` and `userextras/<key>` — as upstream's impersonation filter.

use http::HeaderMap;
use krust_api::status::ApiError;

use super::{Attributes, ResourceAttributes, Target, authorize};
use crate::auth::User;
use crate::rest::Scope;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";

/// The user a request acts as: `user`, or whom its headers impersonate.
pub async fn acting_user(scope: &Scope, user: User, headers: &HeaderMap) -> Result<User, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect()
    };
    let name = values(USER).into_iter().next();
    let groups = values(GROUP);
    let uid = values(UID).into_iter().next();
    let extras: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| {
            let key = k.as_str().strip_prefix(EXTRA_PREFIX)?;
            Some((
                krust_httpstream::params::decode(key),
                v.to_str().ok()?.to_string(),
            ))
        })
        .collect();
    let Some(name) = name else {
        if groups.is_empty() && uid.is_none() && extras.is_empty() {
            return Ok(user);
        }
        return Err(ApiError::internal(
            "requested impersonation of groups, a UID or extras without impersonating a user",
        ));
    };
    // What each `impersonate` check is about.
    let check = |group, resource, subresource, namespace, name| ResourceAttributes {
        group,
        resource,
        subresource,
        namespace,
        name: Some(name),
    };
    let mut wanted = Vec::new();
    match name
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, sa)) => wanted.push(check("", "serviceaccounts", None, Some(ns), sa)),
        None => wanted.push(check("", "users", None, None, &name)),
    }
    for g in &groups {
        wanted.push(check("", "groups", None, None, g));
    }
    if let Some(uid) = &uid {
        wanted.push(check("authentication.k8s.io", "uids", None, None, uid));
    }
    for (key, value) in &extras {
        wanted.push(check(
            "authentication.k8s.io",
            "userextras",
            Some(key),
            None,
            value,
        ));
    }
    for target in wanted {
        let attrs = Attributes {
            user: &user,
            verb: "impersonate",
            target: Target::Resource(target),
        };
        authorize(scope, &attrs).await?;
    }
    Ok(impersonated(name, groups))
}

/// The impersonated user with the groups upstream adds: a service account's groups, and
/// `system:authenticated` (or `system:unauthenticated` for the anonymous user).
fn impersonated(name: String, mut groups: Vec<String>) -> User {
    if let Some((ns, _)) = name
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        groups.insert(0, format!("system:serviceaccounts:{ns}"));
        groups.insert(0, "system:serviceaccounts".into());
    }
    let has = |g: &str| groups.iter().any(|x| x == g);
    if name == "system:anonymous" {
        if !has("system:unauthenticated") {
            groups.push("system:unauthenticated".into());
        }
    } else if !has("system:authenticated") && !has("system:unauthenticated") {
        groups.push("system:authenticated".into());
    }
    User { name, groups }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impersonated_users_get_upstreams_implicit_groups() {
        let sa = impersonated("system:serviceaccount:ns:robot".into(), vec![]);
        assert_eq!(
            sa.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                "system:authenticated"
            ]
        );
        let bob = impersonated("bob".into(), vec!["devs".into()]);
        assert_eq!(bob.groups, ["devs", "system:authenticated"]);
        let anon = impersonated("system:anonymous".into(), vec![]);
        assert!(anon.is_anonymous());
        assert_eq!(anon.groups, ["system:unauthenticated"]);
    }
}
