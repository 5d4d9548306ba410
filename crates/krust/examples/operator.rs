//! A kube-rs operator written the way operators are written, run unchanged against
//! krust (`tests/e2e/operator.rs` runs it): a `Greeting` kind from
//! `#[derive(CustomResource)]`, its CustomResourceDefinition installed with server-side
//! apply, and a kube-runtime controller that keeps one ConfigMap per Greeting (owned
//! by it), reports progress in the status subresource, and cleans up behind a
//! finalizer.
//!
//! `cargo run --example operator -- [--kubeconfig PATH]` (else `$KUBECONFIG`, else
//! `~/.kube/config`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, Resource, ResourceExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::{conditions, wait::await_condition, watcher};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A greeting repeated `times` times into a ConfigMap.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "demo.krust.io",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus",
    shortname = "greet",
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".spec.message"}"#
)]
pub struct GreetingSpec {
    pub message: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 5))]
    pub times: u32,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GreetingStatus {
    pub config_map: Option<String>,
    pub observed_generation: Option<i64>,
}

const FINALIZER: &str = "demo.krust.io/cleanup";
const MANAGER: &str = "greeting-operator";

struct State {
    client: Client,
}

async fn client(kubeconfig: Option<String>) -> anyhow::Result<Client> {
    match kubeconfig {
        Some(path) => {
            let config = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("reading {path}"))?;
            let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await?;
            Ok(Client::try_from(config)?)
        }
        None => Ok(Client::try_default().await?),
    }
}

/// Installs (or updates) the Greeting definition with server-side apply and waits
/// until it is served.
async fn install(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Greeting::crd();
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("applying the Greeting definition")?;
    let established = await_condition(crds, &name, conditions::is_crd_established());
    tokio::time::timeout(Duration::from_secs(30), established)
        .await
        .context("waiting for the Greeting definition")??;
    Ok(())
}

async fn reconcile(greeting: Arc<Greeting>, ctx: Arc<State>) -> Result<Action, kube::Error> {
    let ns = greeting.namespace().unwrap_or_default();
    let greetings: Api<Greeting> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&greetings, FINALIZER, greeting, |event| async {
        match event {
            Event::Apply(g) => apply(&g, &ctx.client).await,
            Event::Cleanup(g) => cleanup(&g, &ctx.client).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => kube::Error::Service(Box::new(other)),
    })
}

fn config_map_name(g: &Greeting) -> String {
    format!("{}-greeting", g.name_any())
}

async fn apply(g: &Greeting, client: &Client) -> Result<Action, kube::Error> {
    let ns = g.namespace().unwrap_or_default();
    let owner = g
        .controller_owner_ref(&())
        .expect("a stored Greeting has a UID");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name(g)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(
            [(
                "greeting".to_string(),
                vec![g.spec.message.as_str(); g.spec.times as usize].join(" "),
            )]
            .into(),
        ),
        ..Default::default()
    };
    let params = PatchParams::apply(MANAGER).force();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch(&config_map_name(g), &params, &Patch::Apply(&cm))
        .await?;
    let status = json!({
        "apiVersion": Greeting::api_version(&()),
        "kind": Greeting::kind(&()),
        "status": {"configMap": config_map_name(g), "observedGeneration": g.metadata.generation},
    });
    Api::<Greeting>::namespaced(client.clone(), &ns)
        .patch_status(&g.name_any(), &params, &Patch::Apply(&status))
        .await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Runs before the Greeting goes: its ConfigMap goes first (the owner reference would
/// see to it later; an operator with outside state cleans up here).
async fn cleanup(g: &Greeting, client: &Client) -> Result<Action, kube::Error> {
    let ns = g.namespace().unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    match cms.delete(&config_map_name(g), &Default::default()).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e),
    }
}

fn error_policy(_g: Arc<Greeting>, err: &kube::Error, _ctx: Arc<State>) -> Action {
    eprintln!("reconcile failed: {err}");
    Action::requeue(Duration::from_secs(1))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut kubeconfig = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kubeconfig" => kubeconfig = args.next(),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let client = client(kubeconfig).await?;
    install(&client).await?;
    println!("greeting operator running");
    let greetings: Api<Greeting> = Api::all(client.clone());
    let config_maps: Api<ConfigMap> = Api::all(client.clone());
    Controller::new(greetings, watcher::Config::default())
        .owns(config_maps, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(State { client }))
        .for_each(|result| async move {
            if let Ok((obj, _)) = result {
                println!(
                    "reconciled {}/{}",
                    obj.namespace.unwrap_or_default(),
                    obj.name
                );
            }
        })
        .await;
    Ok(())
}
