//! The container engine of these tests: podman's Docker-compatible API at `DOCKER_HOST`,
//! driven by testcontainers, and podman's command line, pointed at the same service,
//! for the few things testcontainers has no call for (a kill with a signal, running
//! the HEALTHCHECK, `podman kube play`).

use std::process::Output;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sluice_harness::available;
use testcontainers::GenericImage;

/// The image under test, as `name:tag` (scripts/image prints it; scripts/test sets it).
pub const IMAGE_ENV: &str = "SLUICE_TEST_IMAGE";

/// Where podman's API listens (`unix:///path/podman.sock`); testcontainers reads it too.
pub const HOST_ENV: &str = "DOCKER_HOST";

/// How long one podman command may take (a `kube play` starts a pod).
const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);

/// The engine and the image of this run.
#[derive(Clone, Debug)]
pub struct Engine {
    /// The image's repository, e.g. `localhost/sluice`.
    pub name: String,
    pub tag: String,
    /// `DOCKER_HOST`, for podman's `--url`.
    host: String,
}

// === impl Engine ===

impl Engine {
    /// The engine of this run. Where no image or engine is configured it is a missing
    /// server like any other (`sluice_harness::available`): a failure, unless skipping
    /// is allowed (`SLUICE_TEST_ALLOW_SKIP=1`), then `None` after a counted skip.
    pub fn from_env(test: &str) -> Result<Option<Engine>> {
        let image = std::env::var(IMAGE_ENV).ok().filter(|v| !v.is_empty());
        let host = std::env::var(HOST_ENV).ok().filter(|v| !v.is_empty());
        let (image, host) = match (image, host) {
            (Some(image), Some(host)) => (image, host),
            _ => {
                let missing = Err(anyhow!(
                    "needs {IMAGE_ENV} (the image scripts/image built) and {HOST_ENV} \
                     (podman system service's socket): scripts/test sets both, see docs/deploy.md"
                ));
                return available(test, missing).map(|_| None);
            }
        };
        let (name, tag) = split_image(&image)?;
        Ok(Some(Engine { name, tag, host }))
    }

    /// The image as testcontainers starts it.
    pub fn image(&self) -> GenericImage {
        GenericImage::new(self.name.clone(), self.tag.clone())
    }

    /// `name:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }

    /// The arguments that point podman's command line at the service.
    pub fn remote_args(&self) -> [&str; 3] {
        ["--remote", "--url", &self.host]
    }

    /// Runs `podman ARGS` against the same service as testcontainers; fails with its
    /// stderr when it exits non-zero.
    pub async fn podman(&self, args: &[&str]) -> Result<String> {
        let output = self.podman_output(args).await?;
        if !output.status.success() {
            bail!(
                "podman {} failed ({}): {}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The main process of a container, as the host numbers it.
    pub async fn pid(&self, container: &str) -> Result<u32> {
        let pid = self
            .podman(&["inspect", "--format", "{{.State.Pid}}", container])
            .await?;
        pid.trim()
            .parse()
            .with_context(|| format!("container {container}: pid {pid:?}"))
    }

    /// Runs `podman ARGS` and returns its output whatever its exit status.
    pub async fn podman_output(&self, args: &[&str]) -> Result<Output> {
        let mut command = tokio::process::Command::new("podman");
        command
            .args(self.remote_args())
            .args(args)
            .kill_on_drop(true);
        tokio::time::timeout(PODMAN_TIMEOUT, command.output())
            .await
            .with_context(|| format!("podman {} took over {PODMAN_TIMEOUT:?}", args.join(" ")))?
            .with_context(|| format!("running podman {}", args.join(" ")))
    }
}

/// `localhost/sluice:dev` → (`localhost/sluice`, `dev`); a colon inside the registry
/// part (`host:5000/sluice`) is not the tag's.
fn split_image(image: &str) -> Result<(String, String)> {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') && !name.is_empty() && !tag.is_empty() => {
            Ok((name.to_owned(), tag.to_owned()))
        }
        _ => bail!("{IMAGE_ENV}={image} is not name:tag"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_reference_splits_at_its_tag() -> Result<()> {
        assert_eq!(
            split_image("localhost/sluice:dev")?,
            ("localhost/sluice".into(), "dev".into())
        );
        assert_eq!(
            split_image("registry:5000/sluice:0.1.0")?,
            ("registry:5000/sluice".into(), "0.1.0".into())
        );
        assert!(split_image("registry:5000/sluice").is_err());
        Ok(())
    }
}
