//! Every kind of the descriptor table against upstream's own example objects:
//! kubernetes/api keeps, for each kind, a fuzzer-filled object in Go's JSON and in
//! protobuf (`testdata/HEAD/<group>.<version>.<Kind>.{json,pb}`). Run by hand with a
//! checkout of kubernetes/api at the table's release (the files are not ours to copy):
//!
//! ```text
//! UPSTREAM_TESTDATA=path/to/api/testdata/HEAD \
//!     cargo test -p krust-apimachinery --lib -- --ignored upstream_testdata
//! ```

use serde_json::Value;

use super::fixture::sparse;
use super::{decode, encode, go_order, supports};

#[test]
#[ignore = "needs kubernetes/api's testdata/HEAD in UPSTREAM_TESTDATA"]
fn upstream_testdata() {
    let dir = std::env::var("UPSTREAM_TESTDATA").expect("UPSTREAM_TESTDATA names testdata/HEAD");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("UPSTREAM_TESTDATA is a directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let (mut checked, mut wrong) = (0, Vec::new());
    for path in paths {
        let go_json: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let (Some(v), Some(k)) = (go_json["apiVersion"].as_str(), go_json["kind"].as_str()) else {
            continue;
        };
        if !supports(v, k) {
            continue;
        }
        checked += 1;
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let pb = std::fs::read(path.with_extension("pb")).unwrap();
        if decode(&pb).map(|d| d.to_string()).ok() != Some(go_json.to_string()) {
            wrong.push(format!("{name}: decoding"));
        }
        if encode(&go_json).ok() != Some(pb) {
            wrong.push(format!("{name}: encoding"));
        }
        // A pointer to an empty struct, and a map whose values are null, mean something.
        let mut restored = sparse(go_json.clone(), &["fieldsV1", "disruptedPods"]);
        go_order(&mut restored);
        // As text: key order counts.
        let (ours, gos) = (restored.to_string(), go_json.to_string());
        if ours != gos {
            wrong.push(format!("{name}: Go's JSON from the sparse form"));
        }
    }
    println!("{checked} kinds checked");
    assert!(checked >= 60, "only {checked} kinds found in {dir}");
    assert!(wrong.is_empty(), "{wrong:#?}");
}
