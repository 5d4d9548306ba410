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
    ("apiserver", &["api", "apimachinery", "store", "httpstream"]),
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
    ("ingress", &["api", "client"]),
    ("sim", &["api", "client"]),
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
