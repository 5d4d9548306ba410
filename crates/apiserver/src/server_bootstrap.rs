//! What a joining server needs from the cluster, as k3s's `/v1-k3s/server-bootstrap`
//! hands it over: the CAs and their keys (cluster, front proxy, etcd), the
//! service-account signing key, the encryption configuration, and where the etcd
//! members serve. Each server then issues its own certificates from the shared CAs.
//!
//! Only the server token opens it (not bootstrap tokens, which make agents; not even
//! an administrator's certificate): whoever holds these keys is the cluster.

use std::path::PathBuf;

use http::StatusCode;
use krust_api::status::ApiError;
use krust_generic_apiserver::auth::User;
use krust_generic_apiserver::response::{self, Response};
use serde_json::{Map, Value, json};

use crate::join::SERVER_TOKEN_USER;

/// Where it is served.
pub const PATH: &str = "/v1-krust/server-bootstrap";

/// The files handed over, relative to the data dir; those that do not exist (no
/// encryption configuration) are left out.
pub const FILES: &[&str] = &[
    "server/tls/ca.crt",
    "server/tls/ca.key",
    "server/tls/front-proxy-ca.crt",
    "server/tls/front-proxy-ca.key",
    "server/tls/sa.key",
    "server/tls/sa.pub",
    "server/tls/etcd/ca.crt",
    "server/tls/etcd/ca.key",
    "server/cred/encryption-config.json",
];

/// This server's part.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// The client URLs of this server's etcd member.
    pub etcd_client_urls: Vec<String>,
}

/// Answers `user`'s request for the bootstrap data.
pub fn serve(config: Option<&Config>, user: &User) -> Result<Response, ApiError> {
    if user.is_anonymous() {
        return Err(ApiError::unauthorized());
    }
    if user.name != SERVER_TOKEN_USER {
        return Err(ApiError::forbidden(format!(
            "forbidden: User \"{}\" cannot get the server bootstrap data: only the server token can",
            user.name
        )));
    }
    let Some(config) = config else {
        return Err(ApiError::new(
            404,
            "NotFound",
            "this server keeps its store embedded: servers join a server started with --cluster-init",
        ));
    };
    let mut files = Map::new();
    for name in FILES {
        match std::fs::read_to_string(config.data_dir.join(name)) {
            Ok(text) => {
                files.insert((*name).to_owned(), Value::String(text));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ApiError::internal(format!("reading {name}: {e}"))),
        }
    }
    Ok(response::json(
        StatusCode::OK,
        &json!({"files": files, "etcdClientURLs": config.etcd_client_urls}),
    ))
}
