//! kube-rs's own cluster tests pass against krust: the `#[ignore = "needs cluster"]` tests
//! that ship in the crates.io packages of kube, kube-client and kube-runtime (pods with
//! exec, logs and eviction, ephemeral containers, certificate signing requests, token
//! requests and reviews, aggregated discovery, custom resources, events on a component
//! status), run unchanged by `scripts/kube-rs-suite.sh` against a real node.

use std::process::Command;

use crate::common::Server;

/// Every cluster test of kube-rs 5.0 (the version krust builds with): all must run and
/// pass, so a newer kube-rs with more tests shows up here rather than passing unseen.
const EXPECTED: &[&str] = &[
    "test::custom_resource_generates_correct_core_structs",
    "test::api_get_opt_handles_404",
    "test::custom_serialized_objects_are_queryable_and_iterable",
    "test::derived_resource_queryable_and_has_subresources",
    "test::pod_can_await_conditions",
    "api::entry::tests::entry_create_missing_object",
    "api::entry::tests::entry_create_dry_run",
    "api::entry::tests::entry_update_existing_object",
    "api::util::test::node_cordon_and_uncordon_works",
    "api::util::test::create_token_request",
    "client::auth::test::exec_auth_command",
    "client::auth::test::exec_token_refresh_via_to_header",
    "client::auth::test::exec_token_refresh_does_not_block_runtime",
    "test::aggregated_discovery_apis",
    "test::aggregated_discovery_core",
    "test::discovery_run_aggregated",
    "test::group_discovery_oneshot",
    "test::can_operate_on_ephemeral_containers",
    "test::can_operate_on_pod_metadata",
    "test::csr_can_be_approved",
    "test::can_get_pod_logs_and_evict",
    "test::pod_can_use_core_apis",
    "test::pod_can_exec_and_write_to_stdin",
    "events::test::event_recorder_attaches_events",
    "events::test::event_recorder_attaches_events_without_namespace",
    "events::test::event_recorder_cache_retain",
];

#[test]
fn kube_rs_cluster_tests_pass() {
    let s = Server::with_agent(&["--cluster-cidr=10.72.0.0/16"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/kube-rs-suite.sh"
    );
    let out = Command::new(script)
        .arg("run")
        .env("KUBECONFIG", s.kubeconfig())
        .output()
        .expect("running scripts/kube-rs-suite.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = || {
        format!(
            "{stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            s.diagnostics()
        )
    };
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test ")?.strip_suffix(" ... ok"))
        .collect();
    let missing: Vec<&&str> = EXPECTED.iter().filter(|t| !passed.contains(t)).collect();
    assert!(
        out.status.success() && missing.is_empty(),
        "kube-rs's cluster tests that did not pass: {missing:?}\n{}",
        report()
    );
    assert_eq!(
        passed.len(),
        EXPECTED.len(),
        "tests ran that this list lacks:\n{}",
        report()
    );
}
