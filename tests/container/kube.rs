//! docs/deploy.md's Kubernetes example, run as written under `podman kube play`: its
//! Secret, Deployment and Service (only the image name substituted, as the doc says),
//! with a ConfigMap of this machine's NATS and ClickHouse addresses in place of the
//! doc's. Each pod gets a network namespace of its own (slirp4netns), as in a cluster,
//! where the host's loopback is 10.0.2.2; the test reaches a pod from inside its
//! namespace, as a kubelet or a Service would.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use serde_json::{json, Value};
use sluice_harness::{loopback_client, wait_for, wait_until, Stack, StackOptions};

use crate::engine::Engine;
use crate::{repo_root, rows, DEADLINE, EVENTS, POLL};

/// The image name the example names, which a user replaces with their own.
pub const EXAMPLE_IMAGE: &str = "registry.example.com/sluice:0.1.0";

/// The network of the pods: a namespace each, with the host's 127.0.0.1 at 10.0.2.2.
const POD_NETWORK: &str = "slirp4netns:allow_host_loopback=true";
const HOST_FROM_POD: &str = "10.0.2.2";

/// The YAML documents of the code block in docs/deploy.md that holds `kind: {kind}`.
fn doc_block(kind: &str) -> Result<String> {
    let path = repo_root().join("docs/deploy.md");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let needle = format!("kind: {kind}\n");
    text.split("```yaml\n")
        .skip(1)
        .filter_map(|rest| {
            rest.split_once("\n```")
                .map(|(block, _)| format!("{block}\n"))
        })
        .find(|block| block.contains(&needle))
        .with_context(|| format!("docs/deploy.md has no yaml block with {needle:?}"))
}

/// A block's documents, each as its text and parsed.
fn documents(block: &str) -> Result<Vec<(String, Value)>> {
    block
        .split("\n---\n")
        .map(|text| {
            let value: Value = serde_yaml_ng::from_str(text)
                .with_context(|| format!("docs/deploy.md: not YAML:\n{text}"))?;
            Ok((format!("{}\n", text.trim_end()), value))
        })
        .collect()
}

fn of_kind<'a>(docs: &'a [(String, Value)], kind: &str) -> Result<&'a (String, Value)> {
    docs.iter()
        .find(|(_, d)| d["kind"] == kind)
        .with_context(|| format!("the example has no {kind}"))
}

/// The first container of a Deployment's pod template.
fn first_container(deployment: &Value) -> Result<&Value> {
    deployment["spec"]["template"]["spec"]["containers"]
        .get(0)
        .context("the Deployment has no container")
}

/// The value of an `env` entry of a container.
fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// An HTTP probe's (path, port).
fn probe(container: &Value, which: &str) -> Result<(String, u64)> {
    let get = &container[which]["httpGet"];
    let path = get["path"].as_str();
    let port = get["port"].as_u64();
    match (path, port) {
        (Some(path), Some(port)) => Ok((path.to_owned(), port)),
        _ => bail!("{which} is not an httpGet on a numbered port: {get}"),
    }
}

/// The Secret in the form podman 4.3 reads for `secretRef`: a JSON object of base64
/// values. (A Secret in a kube file is stored as YAML, which its own `secretRef` then
/// fails to read: "secret ... is not valid JSON".)
fn podman_secret(secret: &Value) -> Result<(String, String)> {
    let name = secret["metadata"]["name"]
        .as_str()
        .context("the Secret has no name")?;
    let data = secret["stringData"]
        .as_object()
        .context("the Secret has no stringData")?;
    let encoded: BTreeMap<&String, String> = data
        .iter()
        .map(|(k, v)| {
            let v = v.as_str().with_context(|| format!("Secret value {k}"))?;
            Ok((k, base64::engine::general_purpose::STANDARD.encode(v)))
        })
        .collect::<Result<_>>()?;
    Ok((name.to_owned(), serde_json::to_string(&encoded)?))
}

/// Adds a ClickHouse user through a file of `users.d` beside the harness's users.xml,
/// which clickhouse-server reloads on its own; waits until the user can log in.
async fn add_clickhouse_user(stack: &Stack, user: &str, password: &str) -> Result<()> {
    let dir = stack.clickhouse.dir().join("users.d");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let xml = format!(
        "<?xml version=\"1.0\"?>\n<yandex><users><{user}><password>{password}</password>\
         <networks><ip>::/0</ip></networks><profile>default</profile><quota>default</quota>\
         </{user}></users></yandex>\n"
    );
    std::fs::write(dir.join(format!("{user}.xml")), xml)?;
    let ch = &stack.clickhouse;
    wait_for(
        &format!("ClickHouse user {user}"),
        DEADLINE,
        POLL,
        || async move { ch.exec_as(user, password, "SELECT 1").await },
    )
    .await?;
    Ok(())
}

/// What `podman kube play` made; `podman kube down` and the secret's removal on drop.
struct Played {
    engine: Engine,
    file: PathBuf,
    secret: String,
    /// The pods podman names after the Deployment (`sluice-pod-0`, ...): removed by
    /// name too, since `kube down` leaves the pods of a play that failed half-way.
    pods: Vec<String>,
    containers: Vec<String>,
}

impl Drop for Played {
    fn drop(&mut self) {
        // Drop cannot await; podman's command line is run and waited for as it is.
        let file = self.file.to_string_lossy().into_owned();
        let mut pod_rm = vec!["pod", "rm", "--force", "--ignore"];
        pod_rm.extend(self.pods.iter().map(String::as_str));
        for args in [
            vec!["kube", "down", file.as_str()],
            pod_rm,
            vec!["secret", "rm", self.secret.as_str()],
        ] {
            let _ = std::process::Command::new("podman")
                .args(self.engine.remote_args())
                .args(&args)
                .output();
        }
    }
}

/// The container ids in `podman kube play`'s output ("Container:" then one id a line).
fn played_containers(output: &str) -> Vec<String> {
    let mut ids = vec![];
    let mut in_containers = false;
    for line in output.lines().map(str::trim) {
        match line {
            "Container:" => in_containers = true,
            "" | "Pod:" => in_containers = false,
            id if in_containers => ids.push(id.to_owned()),
            _ => {}
        }
    }
    ids
}

/// Runs `task` with an HTTP client inside the network namespace of process `pid`, on a
/// thread of its own (a namespace is a thread's; this one ends with the task).
async fn in_netns<F, Fut, T>(pid: u32, task: F) -> Result<T>
where
    F: FnOnce(reqwest::Client) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = (|| {
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
                .with_context(|| format!("opening the network namespace of pid {pid}"))?;
            // SAFETY: setns on a descriptor this thread owns changes the namespace of
            // this thread alone; every socket of the task below is made on it.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns: {}", std::io::Error::last_os_error());
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async { task(loopback_client(Duration::from_secs(10))?).await })
        })();
        let _ = tx.send(result);
    });
    rx.await
        .map_err(|_| anyhow!("the thread in pid {pid}'s namespace died"))?
}

/// GET `http://127.0.0.1:{port}{path}` inside the pod of `pid`; the status.
async fn pod_get(pid: u32, port: u64, path: &str) -> Result<u16> {
    let url = format!("http://127.0.0.1:{port}{path}");
    in_netns(pid, move |http| async move {
        Ok(http.get(&url).send().await?.status().as_u16())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_example_runs_under_podman_kube_play() -> Result<()> {
    let Some(engine) = Engine::from_env("the_kubernetes_example_runs_under_podman_kube_play")?
    else {
        return Ok(());
    };
    let block = doc_block("Deployment")?;
    let docs = documents(&block)?;
    let (secret_text, secret) = of_kind(&docs, "Secret")?;
    let (_, deployment) = of_kind(&docs, "Deployment")?;
    let (_, service) = of_kind(&docs, "Service")?;
    let container = first_container(deployment)?;
    let (ready_path, ready_port) = probe(container, "readinessProbe")?;
    let (live_path, live_port) = probe(container, "livenessProbe")?;
    let api_port = service["spec"]["ports"][0]["targetPort"]
        .as_u64()
        .context("the Service's targetPort is not a number")?;
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
    let name = deployment["metadata"]["name"]
        .as_str()
        .context("the Deployment has no name")?;
    let user = env_value(container, "SLUICE_CLICKHOUSE_TARGETS_MAIN_USER")
        .context("the example names no ClickHouse user")?;
    let password_var = env_value(container, "SLUICE_CLICKHOUSE_TARGETS_MAIN_PASSWORD_ENV")
        .context("the example names no password variable")?;
    let password = secret["stringData"][password_var]
        .as_str()
        .with_context(|| format!("the Secret has no {password_var}"))?;
    let token_var = env_value(container, "SLUICE_TENANTS_ACME_TOKEN_ENV")
        .context("the example names no tenant token variable")?;
    let token = secret["stringData"][token_var]
        .as_str()
        .with_context(|| format!("the Secret has no {token_var}"))?
        .to_owned();

    // The ClickHouse the example expects: its user, its password, a table.
    let stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    add_clickhouse_user(&stack, user, password).await?;

    // The Deployment and Service as written but for the image; the Secret as podman
    // 4.3 can read it; the ConfigMap the doc tells a user to write, for this machine.
    let dir = tempfile::tempdir()?;
    let example = block.replace(secret_text.trim_end(), "");
    assert_eq!(
        example.matches(EXAMPLE_IMAGE).count(),
        1,
        "the example names its image {EXAMPLE_IMAGE} once"
    );
    let example = example.replace(EXAMPLE_IMAGE, &engine.reference());
    // (podman's remote client has no --configmap: the ConfigMap goes first in the file.)
    let file = dir.path().join("sluice.yaml");
    std::fs::write(&file, format!("{}\n{example}", configmap(&stack)?))?;
    let (secret_name, secret_json) = podman_secret(secret)?;
    let secret_file = dir.path().join("secret.json");
    std::fs::write(&secret_file, secret_json)?;
    engine
        .podman(&[
            "secret",
            "create",
            &secret_name,
            &secret_file.to_string_lossy(),
        ])
        .await?;
    let mut played = Played {
        engine: engine.clone(),
        file: file.clone(),
        secret: secret_name,
        pods: (0..replicas).map(|i| format!("{name}-pod-{i}")).collect(),
        containers: vec![],
    };
    let output = engine
        .podman(&[
            "kube",
            "play",
            "--network",
            POD_NETWORK,
            &file.to_string_lossy(),
        ])
        .await?;
    played.containers = played_containers(&output);
    assert_eq!(
        played.containers.len() as u64,
        replicas,
        "one container a replica:\n{output}"
    );

    let mut sent = 0;
    for (i, id) in played.containers.iter().enumerate() {
        let pid = engine.pid(id).await?;
        // The securityContexts: uid 10001, a read-only root.
        let security = engine
            .podman(&[
                "inspect",
                "--format",
                "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}",
                id,
            ])
            .await?;
        assert_eq!(security.trim(), "10001 true");
        // The probes, as a kubelet sends them.
        let ready_path = &ready_path;
        let ready = wait_until(
            &format!("replica {i}: readinessProbe {ready_path} 200"),
            DEADLINE,
            POLL,
            || async move { matches!(pod_get(pid, ready_port, ready_path).await, Ok(200)) },
        )
        .await;
        if let Err(e) = ready {
            let logs = engine.podman(&["logs", id]).await.unwrap_or_default();
            bail!("{e:#}\n{logs}");
        }
        assert_eq!(pod_get(pid, live_port, &live_path).await?, 200);
        // Rows through the Service's port, with the tenant's token from the Secret.
        let body: String = rows(sent, 50).iter().map(|r| format!("{r}\n")).collect();
        let url = format!("http://127.0.0.1:{api_port}/v1/ingest/events");
        let token = token.clone();
        let (status, answer) = in_netns(pid, move |http| async move {
            let response = http
                .post(&url)
                .bearer_auth(&token)
                .header("Content-Type", "application/x-ndjson")
                .body(body)
                .send()
                .await?;
            Ok((response.status().as_u16(), response.text().await?))
        })
        .await?;
        assert_eq!(status, 202, "replica {i}: {answer}");
        sent += 50;
    }
    assert_eq!(stack.wait_for_count("events", sent, DEADLINE).await?, sent);
    drop(played);
    Ok(())
}

/// The ConfigMap docs/deploy.md shows (`sluice-endpoints`), with this machine's
/// addresses as a pod sees them, as a YAML document. Its keys must be the doc's.
fn configmap(stack: &Stack) -> Result<String> {
    let doc = doc_block("ConfigMap")?;
    let docs = documents(&doc)?;
    let (_, configmap) = of_kind(&docs, "ConfigMap")?;
    let keys: BTreeSet<&String> = configmap["data"]
        .as_object()
        .context("the ConfigMap has no data")?
        .keys()
        .collect();
    let data = json!({
        "SLUICE_NATS_URL": format!("nats://{HOST_FROM_POD}:{}", stack.nats.node(0)?.port()),
        "SLUICE_CLICKHOUSE_TARGETS_MAIN_URL":
            format!("http://{HOST_FROM_POD}:{}", stack.clickhouse.http_port()),
    });
    let ours: BTreeSet<&String> = data.as_object().context("data")?.keys().collect();
    assert_eq!(
        keys, ours,
        "the doc's ConfigMap has other keys than the test's"
    );
    let mine = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": configmap["metadata"],
        "data": data,
    });
    Ok(format!("{}---", serde_yaml_ng::to_string(&mine)?))
}
