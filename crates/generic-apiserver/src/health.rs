//! `/healthz`, `/livez` and `/readyz`, as upstream's healthz handlers answer them: each
//! runs its checks (`ping`, and `etcd`: a read of the store within a deadline), `ok`
//! when all pass, the list of checks with `?verbose` or when one fails (then 500), one
//! check alone at `/readyz/<name>`, and `?exclude=<name>` leaving checks out.

use std::time::Duration;

use http::StatusCode;
use krust_store::Store;

/// How long the store may take to answer the `etcd` check (upstream: 2 s by default).
const STORE_DEADLINE: Duration = Duration::from_secs(2);

const CHECKS: [&str; 2] = ["ping", "etcd"];

/// The answer to `/<endpoint>[/<check>]?<query>`: `endpoint` is healthz, livez or readyz.
pub async fn serve(
    endpoint: &str,
    check: Option<&str>,
    query: Option<&str>,
    store: &dyn Store,
) -> (StatusCode, String) {
    // Check names need no decoding; `exclude` may come more than once.
    let params: Vec<(&str, &str)> = (query.unwrap_or_default().split('&'))
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    if let Some(name) = check {
        return match CHECKS.iter().find(|c| **c == name) {
            None => (StatusCode::NOT_FOUND, "404 page not found\n".into()),
            Some(name) => match run(name, store).await {
                Ok(()) => (StatusCode::OK, "ok".into()),
                Err(why) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("internal server error: {why}\n"),
                ),
            },
        };
    }
    let verbose = params.iter().any(|(k, _)| *k == "verbose");
    let excluded: Vec<&str> = (params.iter())
        .filter(|(k, _)| *k == "exclude")
        .map(|(_, v)| *v)
        .collect();
    let mut lines = String::new();
    let mut failed = false;
    for name in CHECKS {
        if excluded.contains(&name) {
            lines.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match run(name, store).await {
            Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
            Err(why) => {
                tracing::warn!(check = name, %why, "{endpoint} check failed");
                failed = true;
                lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    if failed {
        lines.push_str(&format!("{endpoint} check failed\n"));
        (StatusCode::INTERNAL_SERVER_ERROR, lines)
    } else if verbose {
        lines.push_str(&format!("{endpoint} check passed\n"));
        (StatusCode::OK, lines)
    } else {
        (StatusCode::OK, "ok".into())
    }
}

async fn run(check: &str, store: &dyn Store) -> Result<(), String> {
    match check {
        "etcd" => match tokio::time::timeout(STORE_DEADLINE, store.current_revision()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "the store did not answer within {}s",
                STORE_DEADLINE.as_secs()
            )),
        },
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn checks_are_listed_when_asked_and_one_can_be_asked_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = krust_store::embedded::EmbeddedStore::open(dir.path().join("db")).unwrap();
        assert_eq!(
            serve("readyz", None, None, &store).await,
            (StatusCode::OK, "ok".into())
        );
        let (code, body) = serve("readyz", None, Some("verbose&exclude=ping"), &store).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "[+]ping excluded: ok\n[+]etcd ok\nreadyz check passed\n"
        );
        assert_eq!(
            serve("livez", Some("etcd"), None, &store).await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            serve("livez", Some("nope"), None, &store).await.0,
            StatusCode::NOT_FOUND
        );
    }
}
