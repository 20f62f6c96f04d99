//! deploy/compose.yaml, the laptop trial: it parses, builds the Dockerfile's default
//! target, publishes on loopback only, names in the docs every image it pulls, and its
//! Sluice environment (on top of the image's own) is a valid configuration.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::dockerfile::Dockerfile;
use crate::{repo_root, SLUICE};

fn compose() -> Result<Value> {
    let path = repo_root().join("deploy/compose.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))
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
fn the_compose_file_builds_the_image_and_pulls_only_documented_images() -> Result<()> {
    let compose = compose()?;
    let services = compose["services"].as_object().context("no services")?;
    let mut names: Vec<&str> = services.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["clickhouse", "nats", "sluice"]);

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

#[test]
fn the_compose_environment_is_a_valid_configuration() -> Result<()> {
    let compose = compose()?;
    let dockerfile = Dockerfile::read()?;
    // What the container's process sees: the image's ENV, then the service's.
    let mut env = dockerfile.stage("runtime-base")?.env();
    env.extend(environment(&compose["services"]["sluice"])?);
    let mut command = Command::new(SLUICE);
    command.arg("check-config").env_clear().envs(&env);
    let out = command.output().context("running sluice check-config")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    // The trial's tenant and target are there, as the header of the file shows them.
    assert!(stdout.contains("demo"), "{stdout}");
    Ok(())
}
