//! The generic machinery of krust's apiserver, as upstream's k8s.io/apiserver: request
//! parsing ([`request`]), the REST verbs and the interfaces a kind is served through
//! ([`rest`]), the [`watch_cache`], responses and tables, authentication ([`auth`]) and
//! authorization ([`authz`]), the [`admission`] interface, [`audit`], and the [`webhook`]
//! and [`cel`] machinery. It knows no particular kind: the built-in kinds, the admission
//! plugins, CustomResourceDefinitions and the assembled server live in krust-apiserver,
//! above it, and reach it through [`rest::Scope`] and the traits it names.

pub mod admission;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod cel;
pub mod compactor;
pub mod encryption;
pub mod health;
pub mod json;
pub mod loopback;
pub mod metrics;
pub mod outbound;
pub mod pki;
pub mod recover;
pub mod request;
pub mod response;
pub mod rest;
pub mod schema;
pub mod table;
pub mod token_file;
pub mod tokens;
pub mod validation;
pub mod watch_cache;
pub mod webhook;
