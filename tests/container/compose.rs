//! deploy/compose.yaml, the laptop trial, and deploy/compose.nats-cluster.yaml, the same
//! trial on a three-node NATS cluster: each parses, builds the Dockerfile's default
//! target, publishes on loopback only, names in the docs every image it pulls, and its
//! Sluice environment (on top of the image's own) is a valid configuration. The cluster
//! file's nodes form one cluster that Sluice lists whole, and its other services are the
//! trial's but for the NATS settings.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::dockerfile::Dockerfile;
use crate::{repo_root, SLUICE};

const TRIAL: &str = "deploy/compose.yaml";
const NATS_CLUSTER: &str = "deploy/compose.nats-cluster.yaml";

/// A compose file as compose reads it (YAML merge keys `<<` applied).
fn compose(file: &str) -> Result<Value> {
    let path = repo_root().join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("{file} is not YAML"))?;
    yaml.apply_merge()
        .with_context(|| format!("{file}: a merge key does not resolve"))?;
    serde_json::to_value(yaml).with_context(|| format!("{file} has no JSON form"))
}

/// A service's `environment` (a map, as compose.yaml writes it) as strings.
fn environment(service: &Value) -> Result<BTreeMap<String, String>> {
    service["environment"]
        .as_object()
        .context("environment is not a map")?
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Number(_) | Value::Bool(_) => v.to_string(),
                other => anyhow::bail!("{k}: {other} is not a scalar"),
            };
            Ok((k.clone(), v))
        })
        .collect()
}

#[test]
fn the_compose_files_build_the_image_and_pull_only_documented_images() -> Result<()> {
    for (file, expected) in [
        (TRIAL, &["clickhouse", "nats", "sluice"][..]),
        (
            NATS_CLUSTER,
            &["clickhouse", "nats-0", "nats-1", "nats-2", "sluice"][..],
        ),
    ] {
        let compose = compose(file)?;
        let services = compose["services"].as_object().context("no services")?;
        let mut names: Vec<&str> = services.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, expected, "{file}");
        builds_the_image_and_pulls_only_documented_images(services)?;
    }
    Ok(())
}

fn builds_the_image_and_pulls_only_documented_images(
    services: &serde_json::Map<String, Value>,
) -> Result<()> {
    let build = &services["sluice"]["build"];
    assert_eq!(build["context"], "..");
    let dockerfile = Dockerfile::read()?;
    assert_eq!(build["target"], dockerfile.default_target()?);

    let deploy_md = std::fs::read_to_string(repo_root().join("docs/deploy.md"))?;
    for (name, service) in services {
        if name != "sluice" {
            let image = service["image"]
                .as_str()
                .with_context(|| format!("{name} has no image"))?;
            assert!(
                deploy_md.contains(image),
                "docs/deploy.md does not name {image}, which the compose file pulls"
            );
        }
        for port in service["ports"].as_array().into_iter().flatten() {
            let port = port.as_str().context("a port is not a string")?;
            assert!(
                port.starts_with("127.0.0.1:"),
                "{name} publishes {port} beyond loopback"
            );
        }
    }
    Ok(())
}

/// `sluice check-config` of a compose file's Sluice service: its summary.
fn check_config(file: &str) -> Result<String> {
    let compose = compose(file)?;
    let dockerfile = Dockerfile::read()?;
    // What the container's process sees: the image's ENV, then the service's.
    let mut env = dockerfile.stage("runtime-base")?.env();
    env.extend(environment(&compose["services"]["sluice"])?);
    let mut command = Command::new(SLUICE);
    command.arg("check-config").env_clear().envs(&env);
    let out = command.output().context("running sluice check-config")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{file}: {stdout}{stderr}");
    assert!(stdout.trim_end().ends_with("ok"), "{file}: {stdout}");
    // The trial's tenant and target are there, as the header of the file shows them.
    assert!(stdout.contains("demo"), "{file}: {stdout}");
    Ok(stdout)
}

#[test]
fn the_compose_environment_is_a_valid_configuration() -> Result<()> {
    let summary = check_config(TRIAL)?;
    assert!(
        summary.contains("nats: seeds nats://nats:4222 replicas 1 "),
        "{summary}"
    );
    Ok(())
}

/// The cluster file's three nodes: each its own name and store, one cluster name, and
/// routes to every other node; Sluice lists each as a seed and asks for three replicas.
#[test]
fn the_nats_cluster_compose_file_makes_one_cluster_that_sluice_lists_whole() -> Result<()> {
    let compose = compose(NATS_CLUSTER)?;
    let nodes = ["nats-0", "nats-1", "nats-2"];
    for node in nodes {
        let args: Vec<&str> = compose["services"][node]["command"]
            .as_array()
            .with_context(|| format!("{node} has no command"))?
            .iter()
            .map(|a| a.as_str().context("an argument is not a string"))
            .collect::<Result<_>>()?;
        let flag = |name: &str| {
            args.iter()
                .position(|a| *a == name)
                .and_then(|i| args.get(i + 1).copied())
                .with_context(|| format!("{node} has no {name}"))
        };
        assert_eq!(flag("--name")?, node);
        assert_eq!(flag("--cluster_name")?, "sluice", "{node}");
        assert!(args.contains(&"--jetstream"), "{node}: JetStream off");
        let mut routes: Vec<&str> = flag("--routes")?.split(',').collect();
        routes.sort_unstable();
        let others: Vec<String> = nodes
            .iter()
            .filter(|n| **n != node)
            .map(|n| format!("nats://{n}:6222"))
            .collect();
        assert_eq!(routes, others, "{node}'s routes");
        let volume = compose["services"][node]["volumes"][0].as_str();
        assert_eq!(
            volume,
            Some(format!("{node}-data:/data").as_str()),
            "{node}"
        );
    }
    let summary = check_config(NATS_CLUSTER)?;
    assert!(
        summary.contains(
            "nats: seeds nats://nats-0:4222, nats://nats-1:4222, nats://nats-2:4222 replicas 3 "
        ),
        "{summary}"
    );
    Ok(())
}

/// The cluster file's ClickHouse and Sluice are the trial's, but for what NATS is: one
/// trial written twice would drift apart.
#[test]
fn the_nats_cluster_compose_file_differs_from_the_trial_only_in_nats() -> Result<()> {
    let trial = compose(TRIAL)?;
    let cluster = compose(NATS_CLUSTER)?;
    assert_eq!(
        trial["services"]["clickhouse"],
        cluster["services"]["clickhouse"]
    );
    let mut trial_sluice = trial["services"]["sluice"].clone();
    let mut cluster_sluice = cluster["services"]["sluice"].clone();
    for sluice in [&mut trial_sluice, &mut cluster_sluice] {
        let service = sluice.as_object_mut().context("sluice is not a map")?;
        service.remove("depends_on");
        let env = service
            .get_mut("environment")
            .and_then(Value::as_object_mut)
            .context("sluice has no environment")?;
        env.remove("SLUICE_NATS_URL");
        env.remove("SLUICE_NATS_REPLICAS");
    }
    assert_eq!(trial_sluice, cluster_sluice);
    Ok(())
}
