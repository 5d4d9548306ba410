//! The crate graph follows the map in docs/architecture.md: no component depends on the
//! apiserver, the store or another component. Read from `cargo metadata`, so a new
//! dependency that breaks the rule fails here, not in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Each workspace crate and the krust crates it may depend on (normal, build and dev
/// dependencies alike), as the table in docs/architecture.md. `krust` may use all.
const ALLOWED: &[(&str, &[&str])] = &[
    ("api", &[]),
    ("apimachinery", &[]),
    ("store", &["api"]),
    ("httpstream", &[]),
    ("client", &["api"]),
    (
        "generic-apiserver",
        &["api", "apimachinery", "store", "httpstream"],
    ),
    (
        "apiserver",
        &[
            "api",
            "apimachinery",
            "store",
            "httpstream",
            "generic-apiserver",
        ],
    ),
    ("controllers", &["api", "client"]),
    ("scheduler", &["api", "client"]),
    ("cri", &[]),
    ("csi", &["client"]),
    ("net", &["api", "client"]),
    (
        "kubelet",
        &["api", "client", "cri", "csi", "net", "httpstream"],
    ),
    ("proxy", &["api", "client", "net"]),
    ("dns", &["api", "client"]),
    ("ingress", &["api", "client", "httpstream"]),
    ("sim", &["api", "client"]),
    ("doctor", &["client"]),
];

/// Workspace crate (without the `krust-` prefix) → the workspace crates it depends on.
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let short = |name: &str| name.strip_prefix("krust-").map(str::to_string);
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap();
            let name = short(name).unwrap_or_else(|| name.to_string());
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["path"].is_string())
                .filter_map(|d| short(d["name"].as_str().unwrap()))
                .collect();
            (name, deps)
        })
        .collect()
}

#[test]
fn crates_depend_only_on_what_the_map_allows() {
    let graph = workspace_graph();
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(c, deps)| (*c, deps.iter().copied().collect()))
        .collect();
    let mut broken = Vec::new();
    for (krate, deps) in &graph {
        if krate == "krust" {
            continue;
        }
        let Some(ok) = allowed.get(krate.as_str()) else {
            broken.push(format!(
                "crate {krate} is not on the map: add it to docs/architecture.md and ALLOWED"
            ));
            continue;
        };
        // A crate may name itself as a dev-dependency to turn on a feature in its own
        // tests (the store's `testing`): that is no edge of the graph.
        for dep in deps
            .iter()
            .filter(|d| *d != krate && !ok.contains(d.as_str()))
        {
            broken.push(format!("{krate} depends on {dep}, which the map forbids"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    // The table names only crates that exist, so it cannot silently allow nothing.
    for krate in allowed.keys() {
        assert!(
            graph.contains_key(*krate),
            "ALLOWED names {krate}, not a crate"
        );
    }
}

#[test]
fn the_map_lists_every_crate() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"),
    )
    .expect("docs/architecture.md");
    for krate in workspace_graph().keys() {
        assert!(
            doc.contains(&format!("| `{krate}` |")),
            "docs/architecture.md has no row for crate {krate}"
        );
    }
}

/// The apiserver's modules by layer, lowest first, in the shape of upstream's split:
/// generic machinery (k8s.io/apiserver: request path, REST verbs and the strategy
/// interfaces, watch cache, responses, audit, authn/authz, the admission interface,
/// webhook and CEL machinery; the crate krust-generic-apiserver, re-exported by
/// krust-apiserver under the same names) → the registry (per-kind strategies and REST
/// storage, the built-in kind list) → admission plugins → extensions (CRDs, the metrics
/// API) → the assembled server, aggregation outermost as upstream's kube-aggregator.
/// `lib` is krust-apiserver's crate root (`Api`, `start`). The crate boundary keeps the
/// generic layer from naming anything above it; this table keeps the order of the rest.
const APISERVER_LAYERS: &[(&str, &[&str])] = &[
    (
        "generic",
        &[
            "admission",
            "audit",
            "auth",
            "authz",
            "cel",
            "compactor",
            "encryption",
            "health",
            "json",
            "loopback",
            "metrics",
            "outbound",
            "pki",
            "recover",
            "request",
            "response",
            "rest",
            "schema",
            "table",
            "token_file",
            "tokens",
            "validation",
            "watch_cache",
            "webhook",
        ],
    ),
    (
        "registry",
        &["allocator", "component_status", "connect", "kinds"],
    ),
    ("admission plugins", &["admission::plugins"]),
    ("extensions", &["custom", "resource_metrics"]),
    (
        "server",
        &[
            "aggregator",
            "bootstrap",
            "discovery",
            "event_ttl",
            "join",
            "kubernetes_service",
            "lib",
            "openapi",
            "openapi_v2",
            "server",
            "server_bootstrap",
            "snapshots",
        ],
    ),
];

/// The module of the apiserver a source file belongs to.
fn module_of(relative: &Path) -> String {
    let parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [first, second, ..] if first == "admission" && second == "plugins" => {
            "admission::plugins".into()
        }
        [first, ..] => first.clone(),
        [] => unreachable!("a file has a name"),
    }
}

/// The crate modules a file's code names through `crate::` paths (`lib` for the crate
/// root's own items), leaving out comments and the tests at the end of the file.
fn named_modules(source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code: String = source
        .split("#[cfg(test)]")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let to_module = |name: &str, rest: &str| {
        if name == "admission" && rest.starts_with("::plugins") {
            "admission::plugins".to_string()
        } else if modules.contains(name) {
            name.to_string()
        } else {
            "lib".to_string()
        }
    };
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let after = &code[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let item = item.trim();
                let name = ident(item);
                if !name.is_empty() {
                    named.insert(to_module(&name, &item[name.len()..]));
                }
            }
        } else {
            let name = ident(after);
            named.insert(to_module(&name, &after[name.len()..]));
        }
    }
    named
}

#[test]
fn the_apiserver_imports_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../apiserver/src");
    let layer: BTreeMap<&str, usize> = APISERVER_LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, modules))| modules.iter().map(move |m| (*m, i)))
        .collect();
    // Every module of both crate roots has its layer, and the table names no other.
    let modules_of = |lib: &Path| -> BTreeSet<String> {
        std::fs::read_to_string(lib)
            .expect("a crate root")
            .lines()
            .filter_map(|l| {
                let l = l.trim_start_matches("pub ").strip_prefix("mod ")?;
                let name = l.strip_suffix(';').or_else(|| l.strip_suffix(" {"))?;
                (name != "tests").then(|| name.to_string())
            })
            .collect()
    };
    let generic = modules_of(&src.join("../../generic-apiserver/src/lib.rs"));
    let generic_layer: BTreeSet<String> = APISERVER_LAYERS[0]
        .1
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(
        generic, generic_layer,
        "the generic layer is krust-generic-apiserver"
    );
    let mut declared = modules_of(&src.join("lib.rs"));
    declared.extend(generic);
    declared.insert("lib".into());
    declared.insert("admission::plugins".into());
    let placed: BTreeSet<String> = layer.keys().map(|m| m.to_string()).collect();
    assert_eq!(declared, placed, "every module in exactly one layer");

    let mut files = vec![src.clone()];
    let mut imports: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("reading the sources") {
                files.push(entry.expect("a directory entry").path());
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(&src).expect("under src");
        let from = module_of(relative);
        let source = std::fs::read_to_string(&path).expect("a source file");
        for to in named_modules(&source, &declared) {
            if to != from && layer[to.as_str()] > layer[from.as_str()] {
                imports
                    .entry((from.clone(), to))
                    .or_default()
                    .insert(relative.display().to_string());
            }
        }
    }
    let broken: Vec<String> = imports
        .iter()
        .map(|((from, to), files)| format!("{from} imports {to}, a layer above it, in {files:?}"))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
