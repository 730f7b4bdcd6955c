//! The embedded mode's kubelet: realizes each stored Notebook's pod, as the controller's builders
//! produce it, as one podman (or docker) container, and registers its route with the proxy.
//!
//! The plan for a container ([`ContainerPlan`]) is a pure function of the Notebook, tested without
//! podman. Containers carry labels naming their notebook and a digest of their plan, so after a
//! restart of `labforge up` the runtime adopts what is running instead of starting it twice, and
//! replaces a container whose notebook changed (a new image, say). Workspaces are named volumes,
//! kept on stop and on delete.

use crate::model::{AUTO_SAVE_ANNOTATION, SERVER_TYPE_ANNOTATION, ServerType};
use crate::notebook_secret::NotebookSecrets;
use crate::store::{Change, Store};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, PodSpec,
};
use labforge_crds::istio::VirtualService;
use labforge_crds::notebook::{
    Notebook, NotebookCondition, NotebookStatus, REWRITE_URI_ANNOTATION,
};
use labforge_notebook_controller::builders::{self, BuilderConfig};
use labforge_proxy::source::RouteStore;
use sha2::Digest as _;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::Command;

/// Names the labforge instance (its data dir) that manages a container: several instances on one
/// machine must never adopt or remove each other's notebooks.
pub const MANAGED_LABEL: &str = "dev.labforge.managed";
pub const NOTEBOOK_LABEL: &str = "dev.labforge.notebook";
pub const PLAN_LABEL: &str = "dev.labforge.plan";
pub const PORT_LABEL: &str = "dev.labforge.port";
pub const DEVICES_LABEL: &str = "dev.labforge.devices";
/// Where the agent directory is mounted (read-only) in every notebook container.
pub const AGENT_MOUNT: &str = "/.labforge/agent";
/// How often everything is looked at even when nothing was announced (containers that exited).
const RESYNC: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(transparent)]
    Build(#[from] builders::BuildError),
    #[error("{0}")]
    Unsupported(String),
}

/// One notebook's container, as `<engine> run` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPlan {
    /// The container's name, and its network's: each notebook has a network of its own, which
    /// no other notebook's container can reach.
    pub name: String,
    pub image: String,
    /// Everything between `run -d` and the image, except the published port.
    pub options: Vec<String>,
    pub command: Vec<String>,
    pub container_port: i32,
    /// Digest of all of the above: a container with another digest is replaced.
    pub digest: String,
}

/// The container name of a notebook, which is also the name of its network. Namespaces and
/// notebook names are DNS labels, which never hold `_`: no two notebooks share a name (with `-`
/// between them, `alice`'s `x-lab` and `alice-x`'s `lab` did).
pub fn container_name(namespace: &str, name: &str) -> String {
    format!("labforge-{namespace}_{name}")
}

/// The podman volume standing in for a PersistentVolumeClaim; injective as [`container_name`].
pub fn volume_name(namespace: &str, claim: &str) -> String {
    format!("labforge-{namespace}_{claim}")
}

/// The name [`volume_name`] gave before names were injective: `labforge-<ns>-<claim>`.
fn legacy_volume_name(namespace: &str, claim: &str) -> String {
    format!("labforge-{namespace}-{claim}")
}

/// The claim a legacy volume name can only have meant for `namespace`, or `None` when another of
/// `namespaces` could have made the same name (`labforge-alice-x-ws` is `alice`'s `x-ws` or
/// `alice-x`'s `ws`).
fn unambiguous_legacy_claim<'n>(
    legacy: &str,
    namespace: &str,
    namespaces: impl IntoIterator<Item = &'n str>,
) -> Option<String> {
    let claim = legacy.strip_prefix(&format!("labforge-{namespace}-"))?;
    let ambiguous = namespaces.into_iter().any(|other| {
        other != namespace
            && legacy
                .strip_prefix(&format!("labforge-{other}-"))
                .is_some_and(|rest| !rest.is_empty())
    });
    (!ambiguous && !claim.is_empty()).then(|| claim.to_owned())
}

/// A CPU limit as `--cpus` wants it. Raised to [`validate::MIN_CPU`](crate::validate::MIN_CPU)
/// and never dropped: a notebook stored before validation refused less (or written to the store
/// directly) must not get `--cpus 0.000`, which podman reads as no limit.
fn cpus(quantity: &str) -> Result<String, PlanError> {
    let value = crate::validate::quantity("cpu", quantity)
        .map_err(|err| PlanError::Unsupported(format!("the CPU limit: {err}")))?;
    Ok(format!("{:.3}", value.max(crate::validate::MIN_CPU)))
}

#[cfg(test)]
mod quantity_tests;

/// A memory limit as `--memory` wants it, in bytes, raised to
/// [`validate::MIN_MEMORY`](crate::validate::MIN_MEMORY): `--memory 0` is no limit.
fn memory_bytes(quantity: &str) -> Result<String, PlanError> {
    let value = crate::validate::quantity("memory", quantity)
        .map_err(|err| PlanError::Unsupported(format!("the memory limit: {err}")))?;
    Ok(format!(
        "{}",
        value.max(crate::validate::MIN_MEMORY).round() as u64
    ))
}

fn bytes(quantity: &str) -> Option<String> {
    let value = crate::validate::quantity("memory", quantity).ok()?;
    Some(format!("{}", value.round() as u64))
}

/// Plans the container of `notebook`, from the pod template the controller would give Kubernetes;
/// `secret` is the notebook's own ([`crate::notebook_secret`]), given to its server.
pub fn plan(
    notebook: &Notebook,
    config: &BuilderConfig,
    agent_dir: Option<&std::path::Path>,
    gpu_devices: &[String],
    secret: Option<&str>,
) -> Result<ContainerPlan, PlanError> {
    let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
    let name = notebook.metadata.name.clone().unwrap_or_default();
    let stateful_set = builders::stateful_set(notebook, config)?;
    let pod: PodSpec = stateful_set
        .spec
        .and_then(|s| s.template.spec)
        .ok_or(builders::BuildError::NoContainers)?;
    let container = pod
        .containers
        .first()
        .ok_or(builders::BuildError::NoContainers)?;
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| PlanError::Unsupported("the notebook's container has no image".into()))?;
    let container_port = builders::container_port(notebook);
    let mut options: Vec<String> = vec![
        "--name".into(),
        container_name(&namespace, &name),
        "--label".into(),
        format!("{NOTEBOOK_LABEL}={namespace}/{name}"),
        "--hostname".into(),
        name.clone(),
        "--network".into(),
        container_name(&namespace, &name),
    ];
    if let Some(dir) = &container.working_dir {
        options.extend(["--workdir".into(), dir.clone()]);
    }
    for var in container.env.iter().flatten() {
        match &var.value {
            Some(value) => options.extend(["--env".into(), format!("{}={value}", var.name)]),
            None if var.value_from.is_some() => {
                return Err(PlanError::Unsupported(format!(
                    "env {} comes from a reference, which the embedded mode cannot resolve",
                    var.name
                )));
            }
            None => options.extend(["--env".into(), format!("{}=", var.name)]),
        }
    }
    let volumes: HashMap<&str, &k8s_openapi::api::core::v1::Volume> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    for mount in container.volume_mounts.iter().flatten() {
        if mount.mount_path == AGENT_MOUNT {
            continue;
        }
        let volume = volumes.get(mount.name.as_str()).ok_or_else(|| {
            PlanError::Unsupported(format!("volume mount {} names no volume", mount.name))
        })?;
        let read_only = if mount.read_only == Some(true) {
            ":ro"
        } else {
            ""
        };
        if let Some(claim) = &volume.persistent_volume_claim {
            options.extend([
                "--volume".into(),
                format!(
                    "{}:{}{read_only}",
                    volume_name(&namespace, &claim.claim_name),
                    mount.mount_path
                ),
            ]);
        } else if let Some(empty) = &volume.empty_dir {
            if empty.medium.as_deref() == Some("Memory") && mount.mount_path == "/dev/shm" {
                let size = empty
                    .size_limit
                    .as_ref()
                    .and_then(|q| bytes(&q.0))
                    .unwrap_or_else(|| "67108864".into());
                options.extend(["--shm-size".into(), size]);
            } else {
                options.extend(["--tmpfs".into(), mount.mount_path.clone()]);
            }
        } else {
            return Err(PlanError::Unsupported(format!(
                "volume {} is neither a PersistentVolumeClaim nor an emptyDir",
                mount.name
            )));
        }
    }
    if let Some(resources) = &container.resources
        && let Some(limits) = &resources.limits
    {
        if let Some(cpu) = limits.get("cpu") {
            options.extend(["--cpus".into(), cpus(&cpu.0)?]);
        }
        if let Some(memory) = limits.get("memory") {
            options.extend(["--memory".into(), memory_bytes(&memory.0)?]);
        }
    }
    if let Some(secret) = secret {
        // Last, so that it wins over a variable of that name in the spec.
        options.extend([
            "--env".into(),
            format!("{}={secret}", crate::notebook_secret::SECRET_ENV),
        ]);
    }
    for device in gpu_devices {
        options.extend(["--device".into(), device.clone()]);
    }
    if !gpu_devices.is_empty() {
        options.extend([
            "--label".into(),
            format!("{DEVICES_LABEL}={}", gpu_devices.join(",")),
        ]);
    }
    if let Some(dir) = agent_dir {
        options.extend([
            "--volume".into(),
            format!("{}:{AGENT_MOUNT}:ro", dir.display()),
        ]);
    }
    if let Some(user) = pod
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| {
            container
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
        })
    {
        options.extend(["--user".into(), user.to_string()]);
    }
    let mut command = Vec::new();
    if let Some(entrypoint) = &container.command {
        options.extend([
            "--entrypoint".into(),
            serde_json::to_string(entrypoint).unwrap_or_default(),
        ]);
    }
    command.extend(container.args.iter().flatten().cloned());

    let mut hasher = sha2::Sha256::new();
    for part in options.iter().chain([&image]).chain(&command) {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hex::encode(&hasher.finalize()[..12]);
    options.extend(["--label".into(), format!("{PLAN_LABEL}={digest}")]);
    Ok(ContainerPlan {
        name: container_name(&namespace, &name),
        image,
        options,
        command,
        container_port,
        digest,
    })
}

/// The route of `notebook`, pointed at its container's published port, presenting `secret` (the
/// notebook's own) to its server.
pub fn route(
    notebook: &Notebook,
    config: &BuilderConfig,
    host_port: u16,
    secret: Option<&str>,
) -> Result<VirtualService, builders::BuildError> {
    let mut vs = builders::virtual_service(notebook, config)?;
    let code_server = notebook.annotation(crate::model::SERVER_TYPE_ANNOTATION)
        == Some(crate::model::ServerType::Vscode.annotation());
    for rule in &mut vs.spec.http {
        for destination in &mut rule.route {
            destination.destination.host = PUBLISH_ADDRESS.into();
            if let Some(port) = destination.destination.port.as_mut() {
                port.number = u32::from(host_port);
            }
        }
        if let Some(secret) = secret {
            let operations = rule
                .headers
                .get_or_insert_with(Default::default)
                .request
                .get_or_insert_with(Default::default);
            operations
                .set
                .extend(crate::notebook_secret::upstream_headers(
                    secret,
                    code_server,
                ));
        }
    }
    // Merge order among VirtualServices is by creation time, as in Istio.
    vs.metadata.creation_timestamp = notebook.metadata.creation_timestamp.clone();
    Ok(vs)
}

/// Where a notebook's server says it is up, and what it answers there: Jupyter's version at
/// `<prefix>/api`, code-server's heartbeat at `<root>/healthz`. Any other answer (an image that
/// serves the other IDE, or nothing like either) is not ready, so "ready" means the server the
/// user chose answers. RStudio has no such endpoint: any answer at `<root>` but a server error
/// counts.
pub fn readiness_check(notebook: &Notebook) -> (ServerType, String, &'static str) {
    let namespace = notebook.metadata.namespace.as_deref().unwrap_or_default();
    let name = notebook.metadata.name.as_deref().unwrap_or_default();
    let root = notebook
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REWRITE_URI_ANNOTATION))
        .filter(|uri| !uri.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("{}/", builders::route_prefix(namespace, name)));
    let server = ServerType::from_annotation(notebook.annotation(SERVER_TYPE_ANNOTATION));
    match server {
        ServerType::Jupyter => (server, format!("{root}api"), "version"),
        ServerType::Vscode => (server, format!("{root}healthz"), "status"),
        ServerType::Rstudio => (server, root, ""),
    }
}

/// The most of a readiness answer read; a longer one is not the expected server's.
const READINESS_ANSWER_LIMIT: usize = 64 * 1024;

/// Whether an answer to [`readiness_check`]'s path is the expected server's: a 200 with a JSON
/// object holding `key`; with no key (RStudio's page), any answer but a server error.
fn answers_as_expected(status: u16, body: &[u8], key: &str) -> bool {
    if key.is_empty() {
        return (200..500).contains(&status);
    }
    status == 200
        && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v.get(key).is_some())
}

/// A container as `<engine> ps` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningContainer {
    pub name: String,
    pub notebook: (String, String),
    pub plan: String,
    pub port: Option<u16>,
    /// CDI devices it was given.
    pub devices: Vec<String>,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub state: String,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed; caused by: {}", last_error_line(stderr))]
    Failed { command: String, stderr: String },
    #[error(
        "cannot pull image {image}; check its name and tag, and that its registry is reachable; caused by: {}",
        last_error_line(stderr)
    )]
    Pull { image: String, stderr: String },
    #[error("{0}")]
    Output(String),
}

/// Whether `volume rm` failed because a container still uses the volume (podman: "being used",
/// docker: "volume is in use").
pub fn volume_in_use(stderr: &str) -> bool {
    stderr.contains("being used") || stderr.contains("in use")
}

/// The engine's own reason on one line: its last `Error:` line (podman and docker print progress
/// before it), else its last line; a long one keeps its end, where podman's chain of causes
/// names the first (`…: dial tcp 127.0.0.1:5000: connect: connection refused`).
fn last_error_line(stderr: &str) -> String {
    let mut lines = stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = lines
        .clone()
        .rev()
        .find_map(|l| {
            l.strip_prefix("Error: ")
                .or_else(|| l.strip_prefix("Error response from daemon: "))
        })
        .or_else(|| lines.next_back())
        .unwrap_or("no message");
    const KEPT_CHARS: usize = 120;
    let chars = line.chars().count();
    if chars <= KEPT_CHARS {
        return line.to_owned();
    }
    let tail: String = line.chars().skip(chars - KEPT_CHARS).collect();
    format!("…{tail}")
}

/// podman or docker, through its CLI.
#[derive(Clone, Debug)]
pub struct Engine {
    pub program: PathBuf,
    /// Registries pulled from over plain HTTP (the local registry).
    pub insecure_registries: Vec<String>,
    /// This labforge instance's id (see [`MANAGED_LABEL`]).
    pub instance: String,
}

impl Engine {
    async fn run(&self, args: &[String]) -> Result<String, EngineError> {
        let output = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| EngineError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(EngineError::Failed {
                command: format!(
                    "{} {}",
                    self.program.display(),
                    args.first().map(String::as_str).unwrap_or_default()
                ),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    /// Every container labforge manages, running or not.
    pub async fn containers(&self) -> Result<Vec<RunningContainer>, EngineError> {
        let out = self
            .run(&[
                "ps".into(),
                "--all".into(),
                "--filter".into(),
                format!("label={MANAGED_LABEL}={}", self.instance),
                "--format".into(),
                "json".into(),
            ])
            .await?;
        let list: Vec<serde_json::Value> = if out.trim().is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&out).map_err(|e| EngineError::Output(e.to_string()))?
        };
        Ok(list
            .iter()
            .filter_map(|c| {
                let labels = &c["Labels"];
                let (ns, name) = labels[NOTEBOOK_LABEL].as_str()?.split_once('/')?;
                let state = c["State"].as_str().unwrap_or_default().to_owned();
                Some(RunningContainer {
                    name: c["Names"][0].as_str().unwrap_or_default().to_owned(),
                    notebook: (ns.to_owned(), name.to_owned()),
                    plan: labels[PLAN_LABEL].as_str().unwrap_or_default().to_owned(),
                    port: labels[PORT_LABEL].as_str().and_then(|p| p.parse().ok()),
                    devices: labels[DEVICES_LABEL]
                        .as_str()
                        .map(|d| d.split(',').map(str::to_owned).collect())
                        .unwrap_or_default(),
                    running: state == "running",
                    exit_code: c["ExitCode"].as_i64().map(|c| c as i32),
                    state,
                })
            })
            .collect())
    }

    /// The id and main process id (in this machine's process namespace) of running container
    /// `name`.
    pub async fn process_of(&self, name: &str) -> Result<(String, u32), EngineError> {
        let out = self
            .run(&[
                "inspect".into(),
                "--format".into(),
                "{{.Id}} {{.State.Pid}}".into(),
                name.into(),
            ])
            .await?;
        let mut words = out.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|p| p.parse::<u32>().ok()),
        ) {
            (Some(id), Some(pid)) if pid > 0 => Ok((id.to_owned(), pid)),
            _ => Err(EngineError::Output(format!(
                "{name} has no process: {}",
                out.trim()
            ))),
        }
    }

    fn insecure(&self, image: &str) -> bool {
        self.insecure_registries
            .iter()
            .any(|r| image.starts_with(&format!("{r}/")))
    }

    pub async fn image_present(&self, image: &str) -> bool {
        self.run(&["image".into(), "exists".into(), image.into()])
            .await
            .is_ok()
    }

    pub async fn pull(&self, image: &str) -> Result<(), EngineError> {
        let mut args = vec!["pull".to_owned(), "--quiet".to_owned()];
        if self.insecure(image) {
            args.push("--tls-verify=false".into());
        }
        args.push(image.into());
        match self.run(&args).await {
            Ok(_) => Ok(()),
            Err(EngineError::Failed { stderr, .. }) => Err(EngineError::Pull {
                image: image.to_owned(),
                stderr,
            }),
            Err(other) => Err(other),
        }
    }

    /// Creates the network `name` unless it exists: isolated, so that its containers reach no
    /// other isolated network's (podman; docker isolates its bridge networks from each other by
    /// itself).
    async fn ensure_network(&self, name: &str) -> Result<(), EngineError> {
        let exists = ["network".to_owned(), "exists".to_owned(), name.to_owned()];
        if self.run(&exists).await.is_ok() {
            return Ok(());
        }
        let mut create = vec![
            "network".to_owned(),
            "create".to_owned(),
            "--label".to_owned(),
            format!("{MANAGED_LABEL}={}", self.instance),
        ];
        if !self.is_docker() {
            create.extend(["--opt".to_owned(), "isolate=true".to_owned()]);
        }
        create.push(name.to_owned());
        match self.run(&create).await {
            Ok(_) => Ok(()),
            // Created meanwhile by another reconcile.
            Err(_) if self.run(&exists).await.is_ok() => Ok(()),
            Err(err) => Err(err),
        }
    }

    fn is_docker(&self) -> bool {
        self.program
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("docker"))
    }

    pub async fn start(&self, plan: &ContainerPlan, host_port: u16) -> Result<(), EngineError> {
        self.ensure_network(&plan.name).await?;
        let mut args = vec!["run".to_owned(), "--detach".to_owned()];
        args.extend(plan.options.iter().cloned());
        args.extend([
            "--label".into(),
            format!("{MANAGED_LABEL}={}", self.instance),
            "--label".into(),
            format!("{PORT_LABEL}={host_port}"),
            "--publish".into(),
            format!("{PUBLISH_ADDRESS}:{host_port}:{}", plan.container_port),
            plan.image.clone(),
        ]);
        args.extend(plan.command.iter().cloned());
        self.run(&args).await.map(|_| ())
    }

    /// The claims (PersistentVolumeClaim names) `namespace`'s volumes stand in for, sorted: the
    /// workspaces and data volumes its notebooks made, deleted notebooks' included.
    pub async fn claims(&self, namespace: &str) -> Result<Vec<String>, EngineError> {
        let prefix = volume_name(namespace, "");
        let listed = self
            .run(&[
                "volume".into(),
                "ls".into(),
                "--format".into(),
                "{{.Name}}".into(),
            ])
            .await?;
        let mut claims: Vec<String> = listed
            .lines()
            .filter_map(|line| line.trim().strip_prefix(&prefix))
            .filter(|claim| !claim.is_empty())
            .map(str::to_owned)
            .collect();
        claims.sort();
        claims.dedup();
        Ok(claims)
    }

    /// Removes the volume standing in for `namespace`'s claim `claim`, and its files. A deleted
    /// notebook's container may still hold it for a moment while the runtime removes it: that
    /// is waited for, up to 15 s.
    pub async fn remove_volume(&self, namespace: &str, claim: &str) -> Result<(), EngineError> {
        let args = ["volume".into(), "rm".into(), volume_name(namespace, claim)];
        let mut waited = 0;
        loop {
            match self.run(&args).await {
                Ok(_) => return Ok(()),
                Err(EngineError::Failed { stderr, .. })
                    if volume_in_use(&stderr) && waited < 30 =>
                {
                    waited += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    async fn volume_exists(&self, name: &str) -> bool {
        self.run(&["volume".into(), "exists".into(), name.into()])
            .await
            .is_ok()
    }

    /// Copies volume `from` into a new volume `to` (podman's `volume export` and `import`).
    async fn copy_volume(
        &self,
        from: &str,
        to: &str,
        scratch: &std::path::Path,
    ) -> Result<(), EngineError> {
        let archive = scratch.join(format!(".{to}.tar"));
        let archive_arg = archive.display().to_string();
        let result = async {
            self.run(&["volume".into(), "create".into(), to.into()])
                .await?;
            self.run(&[
                "volume".into(),
                "export".into(),
                "--output".into(),
                archive_arg.clone(),
                from.into(),
            ])
            .await?;
            self.run(&[
                "volume".into(),
                "import".into(),
                to.into(),
                archive_arg.clone(),
            ])
            .await
            .map(|_| ())
        }
        .await;
        let _ = std::fs::remove_file(&archive);
        if result.is_err() {
            // Nothing half-made: the next start tries again from the old volume.
            let _ = self
                .run(&["volume".into(), "rm".into(), "--force".into(), to.into()])
                .await;
        }
        result
    }

    /// Removes the container `name` and then its network.
    pub async fn remove(&self, name: &str) -> Result<(), EngineError> {
        self.run(&[
            "rm".into(),
            "--force".into(),
            "--time".into(),
            "10".into(),
            name.into(),
        ])
        .await?;
        // A container from before networks were per notebook has none of its own.
        if let Err(err) = self
            .run(&["network".into(), "rm".into(), name.into()])
            .await
        {
            tracing::debug!(error = %err, network = name, "removing a notebook's network");
        }
        Ok(())
    }

    /// `<engine> logs` of a container, stdout and stderr as one stream.
    pub fn logs(
        &self,
        name: &str,
        follow: bool,
        tail: u32,
    ) -> std::io::Result<tokio::process::Child> {
        let mut command = Command::new(&self.program);
        command.args(["logs", "--tail", &tail.to_string()]);
        if follow {
            command.arg("--follow");
        }
        let (reader, writer) = std::io::pipe()?;
        let child = command
            .arg(name)
            .stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer)
            .kill_on_drop(true)
            .spawn()?;
        // The reader end stays with the caller through the child's stdout slot.
        let mut child = child;
        child.stdout = Some(tokio::process::ChildStdout::from_std(
            std::process::ChildStdout::from(std::os::fd::OwnedFd::from(reader)),
        )?);
        Ok(child)
    }
}

/// What [`Runtime::migrate_legacy_volumes`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VolumeMigration {
    /// Volumes copied to their new names.
    pub copied: usize,
    /// Volumes left under their legacy names: not copied (failed, or ambiguous).
    pub left: usize,
}

/// What the runtime needs.
pub struct Runtime {
    pub engine: Engine,
    pub store: Arc<Store>,
    pub routes: Arc<RouteStore>,
    pub builder_config: BuilderConfig,
    pub agent_dir: Option<PathBuf>,
    pub gpus: crate::gpus::GpuPool,
    /// Saves before stops, for notebooks that ask for it.
    pub saves: Option<Arc<crate::saves::SaveJobs>>,
    /// Each notebook's secret, which only its server and the proxy know.
    pub secrets: Arc<NotebookSecrets>,
    http: reqwest::Client,
    /// Notebooks with a reconcile under way, so a slow pull does not get a second one.
    busy: Mutex<HashSet<(String, String)>>,
    /// Published port of each running notebook (for the culler's Jupyter API calls).
    ports: Mutex<HashMap<(String, String), u16>>,
}

impl Runtime {
    #[expect(
        clippy::too_many_arguments,
        reason = "each part the embedded mode wires in"
    )]
    pub fn new(
        engine: Engine,
        store: Arc<Store>,
        routes: Arc<RouteStore>,
        builder_config: BuilderConfig,
        agent_dir: Option<PathBuf>,
        gpus: crate::gpus::GpuPool,
        saves: Option<Arc<crate::saves::SaveJobs>>,
        secrets: Arc<NotebookSecrets>,
    ) -> Self {
        Self {
            engine,
            store,
            routes,
            builder_config,
            agent_dir,
            gpus,
            saves,
            secrets,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            busy: Mutex::new(HashSet::new()),
            ports: Mutex::default(),
        }
    }

    /// Where `namespace/name` is published on loopback, while it runs.
    pub fn port_of(&self, namespace: &str, name: &str) -> Option<u16> {
        let ports = self.ports.lock().ok()?;
        ports.get(&(namespace.to_owned(), name.to_owned())).copied()
    }

    fn set_port(&self, namespace: &str, name: &str, port: Option<u16>) {
        if let Ok(mut ports) = self.ports.lock() {
            let key = (namespace.to_owned(), name.to_owned());
            match port {
                Some(port) => ports.insert(key, port),
                None => ports.remove(&key),
            };
        }
    }

    /// Copies each workspace volume still under its legacy name (`labforge-<ns>-<claim>`) into
    /// its injective one, when none of `namespaces` (every user's, besides the store's) but the
    /// notebook's own could have made that legacy name; the old volume is kept. Only podman can
    /// copy volumes; `scratch` holds each copy's archive.
    pub async fn migrate_legacy_volumes(
        &self,
        scratch: &std::path::Path,
        namespaces: impl IntoIterator<Item = String>,
    ) -> VolumeMigration {
        let mut migration = VolumeMigration::default();
        if self.engine.is_docker() {
            return migration;
        }
        let notebooks = self.store.list(None);
        let namespaces: HashSet<String> = notebooks
            .iter()
            .filter_map(|nb| nb.metadata.namespace.clone())
            .chain(namespaces)
            .collect();
        for notebook in &notebooks {
            let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
            for claim in notebook.claim_names() {
                let (new, legacy) = (volume_name(ns, claim), legacy_volume_name(ns, claim));
                if self.engine.volume_exists(&new).await
                    || !self.engine.volume_exists(&legacy).await
                {
                    continue;
                }
                if unambiguous_legacy_claim(&legacy, ns, namespaces.iter().map(String::as_str))
                    .is_none()
                {
                    tracing::warn!(volume = %legacy, "not copied: another namespace could have made this name; copy it by hand");
                    migration.left += 1;
                    continue;
                }
                match self.engine.copy_volume(&legacy, &new, scratch).await {
                    Ok(()) => {
                        tracing::info!(from = %legacy, to = %new, "workspace volume copied to its new name; the old one is kept");
                        migration.copied += 1;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, volume = %legacy, "copying a workspace volume to its new name");
                        migration.left += 1;
                    }
                }
            }
        }
        migration
    }

    /// Routes to the containers that kept running while labforge was down, before anything is
    /// served, so their users see no gap; the first reconcile then checks them as usual.
    pub async fn adopt(&self) -> Result<usize, EngineError> {
        let mut adopted = 0;
        for container in self.engine.containers().await? {
            let (ns, name) = &container.notebook;
            let (Some(port), true) = (container.port, container.running) else {
                continue;
            };
            let Some(notebook) = self.store.get(ns, name).filter(|nb| !nb.is_stopped()) else {
                continue;
            };
            let secret = self.secrets.of(ns, name);
            if let Ok(vs) = route(&notebook, &self.builder_config, port, Some(&secret)) {
                self.routes.upsert(vs);
                self.set_port(ns, name, Some(port));
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    /// Reconciles on every change and every few seconds, forever.
    pub async fn run(self: Arc<Self>) {
        let mut changes = self.store.subscribe();
        loop {
            if let Err(err) = self.clone().reconcile_all().await {
                tracing::warn!(error = %err, "reconciling notebook containers");
            }
            let wake = tokio::time::sleep(RESYNC);
            tokio::pin!(wake);
            loop {
                tokio::select! {
                    () = &mut wake => break,
                    change = changes.recv() => match change {
                        Ok(Change::Notebook { .. }) | Err(_) => break,
                        Ok(_) => continue,
                    }
                }
            }
        }
    }

    /// One pass: every stored notebook against every managed container.
    pub async fn reconcile_all(self: Arc<Self>) -> Result<(), EngineError> {
        let containers = match self.engine.containers().await {
            Ok(containers) => containers,
            Err(err) => {
                self.engine_unavailable(&err);
                return Err(err);
            }
        };
        let mut by_notebook: BTreeMap<(String, String), RunningContainer> = BTreeMap::new();
        for container in containers {
            by_notebook.insert(container.notebook.clone(), container);
        }
        let notebooks = self.store.list(None);
        let known: HashSet<(String, String)> = notebooks
            .iter()
            .map(|nb| {
                (
                    nb.metadata.namespace.clone().unwrap_or_default(),
                    nb.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect();
        // Containers whose notebook was deleted.
        for (key, container) in &by_notebook {
            if !known.contains(key) {
                tracing::info!(container = %container.name, "removing the container of a deleted notebook");
                self.engine.remove(&container.name).await?;
                self.routes
                    .remove(&key.0, &builders::virtual_service_name(&key.0, &key.1));
                self.gpus.release(&key.0, &key.1);
                self.set_port(&key.0, &key.1, None);
            }
        }
        for notebook in notebooks {
            let key = (
                notebook.metadata.namespace.clone().unwrap_or_default(),
                notebook.metadata.name.clone().unwrap_or_default(),
            );
            if let Ok(mut busy) = self.busy.lock()
                && !busy.insert(key.clone())
            {
                continue;
            }
            let existing = by_notebook.remove(&key);
            let runtime = self.clone();
            tokio::spawn(async move {
                runtime.reconcile(&notebook, existing).await;
                if let Ok(mut busy) = runtime.busy.lock() {
                    busy.remove(&key);
                }
            });
        }
        Ok(())
    }

    /// The engine does not answer: every notebook meant to run says so (with one event each),
    /// since labforge cannot tell whether its container is still there.
    fn engine_unavailable(&self, err: &EngineError) {
        let message = format!("the container engine is not answering: {err}");
        for notebook in self.store.list(None) {
            if notebook.is_stopped() {
                continue;
            }
            if condition_reason(&notebook) != Some(ENGINE_UNAVAILABLE) {
                self.store.record_event(
                    notebook.metadata.namespace.as_deref().unwrap_or_default(),
                    notebook.metadata.name.as_deref().unwrap_or_default(),
                    "Warning",
                    ENGINE_UNAVAILABLE,
                    &message,
                );
            }
            self.set_status(&notebook, waiting_status(ENGINE_UNAVAILABLE, &message));
        }
    }

    fn set_status(&self, notebook: &Notebook, status: NotebookStatus) {
        let (ns, name) = (
            notebook.metadata.namespace.as_deref().unwrap_or_default(),
            notebook.metadata.name.as_deref().unwrap_or_default(),
        );
        // Against the stored status, not `notebook`'s: a pass may have written one since.
        let stored = self.store.get(ns, name);
        if stored.is_some_and(|nb| nb.status.as_ref() == Some(&status)) {
            return;
        }
        if let Err(err) = self.store.update(ns, name, |nb| nb.status = Some(status)) {
            tracing::debug!(error = %err, "status of a notebook deleted meanwhile");
        }
    }

    async fn reconcile(&self, notebook: &Notebook, existing: Option<RunningContainer>) {
        let ns = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let event = |kind: &str, reason: &str, message: &str| {
            self.store.record_event(&ns, &name, kind, reason, message)
        };
        let vs_name = builders::virtual_service_name(&ns, &name);
        if notebook.is_stopped() {
            if let Some(container) = existing {
                if container.running
                    && notebook.annotation(AUTO_SAVE_ANNOTATION) == Some("true")
                    && let Some(saves) = &self.saves
                {
                    self.save_before_stop(saves, notebook).await;
                }
                match self.engine.remove(&container.name).await {
                    Ok(()) => event(
                        "Normal",
                        "Stopped",
                        "the notebook's container was removed; its workspace is kept",
                    ),
                    Err(err) => event("Warning", "StopFailed", &err.to_string()),
                }
            }
            self.routes.remove(&ns, &vs_name);
            self.gpus.release(&ns, &name);
            self.set_port(&ns, &name, None);
            self.set_status(notebook, stopped_status());
            return;
        }
        let preferred = existing
            .as_ref()
            .map(|c| c.devices.clone())
            .unwrap_or_default();
        let devices = match self.gpus.assign(notebook, &preferred) {
            Ok(devices) => devices,
            Err(err) => {
                event("Warning", "FailedScheduling", &err.to_string());
                self.set_status(notebook, waiting_status("Unschedulable", &err.to_string()));
                return;
            }
        };
        let secret = self.secrets.of(&ns, &name);
        let plan = match plan(
            notebook,
            &self.builder_config,
            self.agent_dir.as_deref(),
            &devices,
            Some(&secret),
        ) {
            Ok(plan) => plan,
            Err(err) => {
                event("Warning", "InvalidSpec", &err.to_string());
                self.set_status(notebook, waiting_status("InvalidSpec", &err.to_string()));
                return;
            }
        };
        let was_ready = notebook
            .status
            .as_ref()
            .is_some_and(|s| s.ready_replicas > 0);
        // What happened to a container that went away outside labforge, told until the notebook
        // is ready again.
        let mut restarted = None;
        let port = match existing {
            Some(c) if c.plan == plan.digest && c.running && c.port.is_some() => c.port,
            Some(c) => {
                if c.plan != plan.digest {
                    event(
                        "Normal",
                        "Replacing",
                        "the notebook changed; its container is replaced",
                    );
                } else if !c.running {
                    restarted = Some((
                        "ContainerExited",
                        format!(
                            "its container {} stopped ({}{}); starting it again",
                            c.name,
                            c.state,
                            c.exit_code
                                .map(|code| format!(", exit code {code}"))
                                .unwrap_or_default()
                        ),
                    ));
                }
                if let Err(err) = self.engine.remove(&c.name).await {
                    event("Warning", "FailedRemove", &err.to_string());
                    return;
                }
                None
            }
            None if was_ready => {
                restarted = Some((
                    "ContainerGone",
                    format!(
                        "its container {} was removed outside labforge; starting it again",
                        container_name(&ns, &name)
                    ),
                ));
                None
            }
            None => None,
        };
        if let Some((reason, message)) = &restarted {
            event("Warning", reason, message);
            self.set_status(notebook, waiting_status(reason, message));
        }
        let port = match port {
            Some(port) => port,
            None => match self.create(notebook, &plan).await {
                Ok(port) => port,
                Err((reason, err)) => {
                    event("Warning", reason, &err.to_string());
                    self.set_status(notebook, waiting_status(reason, &err.to_string()));
                    return;
                }
            },
        };
        self.set_port(&ns, &name, Some(port));
        match route(notebook, &self.builder_config, port, Some(&secret)) {
            Ok(vs) => self.routes.upsert(vs),
            Err(err) => event("Warning", "InvalidSpec", &err.to_string()),
        }
        let (server, path, key) = readiness_check(notebook);
        let url = format!("http://{PUBLISH_ADDRESS}:{port}{path}");
        // Not answering yet is starting; answering as something else is told, since it will not
        // change by waiting (an image of the other IDE, say).
        let (ready, unexpected) = match self.http.get(&url).send().await {
            Ok(mut response) => {
                let status = response.status().as_u16();
                // The server is its owner's: its answer is read up to what a version or a
                // heartbeat takes, not as far as it cares to send.
                let mut body = Vec::new();
                while body.len() <= READINESS_ANSWER_LIMIT
                    && let Ok(Some(chunk)) = response.chunk().await
                {
                    body.extend_from_slice(&chunk);
                }
                if body.len() <= READINESS_ANSWER_LIMIT && answers_as_expected(status, &body, key) {
                    (true, String::new())
                } else {
                    (
                        false,
                        format!(
                            "{path} answered HTTP {status}, not as {} does: does the image serve {}?",
                            server.server_name(),
                            server.server_name()
                        ),
                    )
                }
            }
            Err(_) => (false, String::new()),
        };
        if ready && !was_ready {
            event("Normal", "Ready", "the notebook answers");
        }
        // Not ready yet after a restart of ours: still say why it restarted.
        let restarting = restarted.map(|(_, message)| message).or_else(|| {
            matches!(
                condition_reason(notebook),
                Some("ContainerExited" | "ContainerGone" | RESTARTING)
            )
            .then(|| condition_message(notebook))
            .flatten()
        });
        let status = match restarting {
            Some(message) if !ready && unexpected.is_empty() => {
                running_status(false, RESTARTING, &message)
            }
            _ => running_status(ready, "Starting", &unexpected),
        };
        self.set_status(notebook, status);
    }

    /// Saves the environment of a notebook being stopped and moves it to the new image. A failed
    /// save is recorded and never holds the stop back.
    async fn save_before_stop(&self, saves: &crate::saves::SaveJobs, notebook: &Notebook) {
        let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let name = notebook.metadata.name.as_deref().unwrap_or_default();
        self.store.record_event(
            ns,
            name,
            "Normal",
            "AutoSaving",
            "saving the environment before the stop",
        );
        match saves.save_before_stop(notebook).await {
            Ok(Some(saved)) => {
                let moved = self.store.update(ns, name, |nb| {
                    if let Some(container) = nb.container_mut() {
                        container.image = Some(saved.image.clone());
                    }
                });
                match moved {
                    Ok(_) => self.store.record_event(
                        ns,
                        name,
                        "Normal",
                        "AutoSaved",
                        &format!("the next start runs on {}", saved.image),
                    ),
                    Err(err) => {
                        tracing::warn!(error = %err, "moving a stopped notebook to its saved image")
                    }
                }
            }
            Ok(None) => {}
            Err(message) => self.store.record_event(
                ns,
                name,
                "Warning",
                "AutoSaveFailed",
                &format!("stopped without saving: {message}"),
            ),
        }
    }

    /// Pulls if needed and starts the container; returns its published port.
    async fn create(
        &self,
        notebook: &Notebook,
        plan: &ContainerPlan,
    ) -> Result<u16, (&'static str, EngineError)> {
        let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let name = notebook.metadata.name.as_deref().unwrap_or_default();
        if !self.engine.image_present(&plan.image).await {
            self.set_status(
                notebook,
                waiting_status("Pulling", &format!("pulling {}", plan.image)),
            );
            self.store.record_event(
                ns,
                name,
                "Normal",
                "Pulling",
                &format!("pulling image {}", plan.image),
            );
            self.engine
                .pull(&plan.image)
                .await
                .map_err(|e| ("ErrImagePull", e))?;
            self.store.record_event(
                ns,
                name,
                "Normal",
                "Pulled",
                &format!("pulled image {}", plan.image),
            );
        }
        let port = free_port().map_err(|e| ("FailedCreate", EngineError::Output(e.to_string())))?;
        self.engine
            .start(plan, port)
            .await
            .map_err(|e| ("FailedCreate", e))?;
        self.store.record_event(
            ns,
            name,
            "Normal",
            "Started",
            &format!("started container {} from {}", plan.name, plan.image),
        );
        Ok(port)
    }
}

/// Where notebook servers' ports are published: a loopback address of their own. Not
/// 127.0.0.1, which `localhost` and `*.localhost` (the web app's and the notebooks' hosts)
/// resolve to: cookies are not kept apart by port, so a notebook's server on `localhost:<port>`
/// would get every cookie the browser holds for `localhost` once a page navigated there.
pub const PUBLISH_ADDRESS: &str = "127.0.0.2";

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((PUBLISH_ADDRESS, 0))?
        .local_addr()?
        .port())
}

/// The Ready condition's reason when the engine does not answer.
const ENGINE_UNAVAILABLE: &str = "EngineUnavailable";
/// The Ready condition's reason while a container started again after going away is not ready.
const RESTARTING: &str = "Restarting";

/// A notebook's Ready condition.
fn ready_condition(notebook: &Notebook) -> Option<&NotebookCondition> {
    notebook
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The reason of a notebook's Ready condition.
fn condition_reason(notebook: &Notebook) -> Option<&str> {
    ready_condition(notebook)?.reason.as_deref()
}

fn condition_message(notebook: &Notebook) -> Option<String> {
    ready_condition(notebook)?.message.clone()
}

fn condition(kind: &str, status: bool, reason: &str, message: &str) -> NotebookCondition {
    NotebookCondition {
        type_: kind.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: (!reason.is_empty()).then(|| reason.to_owned()),
        message: (!message.is_empty()).then(|| message.to_owned()),
        last_probe_time: None,
        last_transition_time: None,
    }
}

fn stopped_status() -> NotebookStatus {
    NotebookStatus {
        conditions: Vec::new(),
        ready_replicas: 0,
        container_state: ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: Some("Stopped".into()),
                exit_code: 0,
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

fn waiting_status(reason: &str, message: &str) -> NotebookStatus {
    NotebookStatus {
        conditions: vec![condition("Ready", false, reason, message)],
        ready_replicas: 0,
        container_state: ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
            }),
            ..Default::default()
        },
    }
}

/// A running container's status; when not ready, `reason` and `why` (what its server answered
/// instead of being ready, or why it was started again).
fn running_status(ready: bool, reason: &str, why: &str) -> NotebookStatus {
    NotebookStatus {
        conditions: vec![condition(
            "Ready",
            ready,
            if ready { "" } else { reason },
            if ready { "" } else { why },
        )],
        ready_replicas: i32::from(ready),
        container_state: ContainerState {
            running: Some(ContainerStateRunning { started_at: None }),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NotebookRequest, ServerType, WorkspaceRequest};

    fn notebook(namespace: &str, request: NotebookRequest) -> Notebook {
        let config = crate::embedded::default_spawner("registry.local");
        crate::validate::notebook_from_request(&request, namespace, namespace, &config, &[])
            .unwrap()
    }

    fn request(name: &str) -> NotebookRequest {
        NotebookRequest {
            name: name.into(),
            ..Default::default()
        }
    }

    fn option_values<'p>(plan: &'p ContainerPlan, option: &str) -> Vec<&'p str> {
        plan.options
            .windows(2)
            .filter(|pair| pair[0] == option)
            .map(|pair| pair[1].as_str())
            .collect()
    }

    #[test]
    fn names_of_containers_networks_and_volumes_never_collide_across_namespaces() {
        // `alice`'s `x-lab` and `alice-x`'s `lab`: one string apart only in where the dash goes.
        let config = BuilderConfig::default();
        let mut existing = request("x-lab");
        existing.workspace = Some(WorkspaceRequest::Existing { name: "ws".into() });
        let a = plan(&notebook("alice", existing), &config, None, &[], None).unwrap();
        let mut other = request("lab");
        other.workspace = Some(WorkspaceRequest::Existing {
            name: "x-ws".into(),
        });
        let b = plan(&notebook("alice-x", other), &config, None, &[], None).unwrap();
        assert_ne!(a.name, b.name);
        assert_eq!(option_values(&a, "--network"), [a.name.as_str()]);
        assert_eq!(option_values(&b, "--network"), [b.name.as_str()]);
        assert_ne!(option_values(&a, "--volume"), option_values(&b, "--volume"));
        assert_eq!(
            option_values(&a, "--volume"),
            ["labforge-alice_ws:/home/jovyan"]
        );
        assert_ne!(volume_name("alice", "x-ws"), volume_name("alice-x", "ws"));
    }

    #[test]
    fn a_legacy_volume_name_is_taken_only_when_no_other_namespace_could_have_made_it() {
        let legacy = legacy_volume_name("alice", "x-ws");
        assert_eq!(
            unambiguous_legacy_claim(&legacy, "alice", ["alice", "bob"]).as_deref(),
            Some("x-ws")
        );
        assert_eq!(
            unambiguous_legacy_claim(&legacy, "alice", ["alice", "alice-x"]),
            None
        );
        assert_eq!(
            unambiguous_legacy_claim(&legacy, "bob", ["alice", "bob"]),
            None
        );
        assert_eq!(
            unambiguous_legacy_claim("labforge-alice-", "alice", ["alice"]),
            None
        );
    }

    #[test]
    fn the_secret_goes_to_the_server_and_onto_its_route_only() {
        let config = BuilderConfig::default();
        let lab = notebook("alice", request("lab"));
        let mut spec = lab.clone();
        // A variable of that name in the spec does not win over the notebook's own secret.
        if let Some(container) = spec.container_mut() {
            container
                .env
                .get_or_insert_with(Vec::new)
                .push(k8s_openapi::api::core::v1::EnvVar {
                    name: crate::notebook_secret::SECRET_ENV.into(),
                    value: Some("chosen".into()),
                    ..Default::default()
                });
        }
        let planned = plan(&spec, &config, None, &[], Some("s3cret")).unwrap();
        let envs = option_values(&planned, "--env");
        let position = |value: &str| envs.iter().position(|e| *e == value);
        assert!(
            position("LABFORGE_NOTEBOOK_SECRET=s3cret")
                > position("LABFORGE_NOTEBOOK_SECRET=chosen"),
            "{envs:?}"
        );
        // Same inputs, same plan: a running container is not replaced for its secret.
        assert_eq!(
            plan(&spec, &config, None, &[], Some("s3cret"))
                .unwrap()
                .digest,
            planned.digest
        );

        let headers = |nb: &Notebook| {
            let vs = route(nb, &config, 4000, Some("s3cret")).unwrap();
            vs.spec.http[0]
                .headers
                .clone()
                .and_then(|h| h.request)
                .unwrap()
                .set
        };
        let jupyter = headers(&lab);
        assert_eq!(jupyter["authorization"], "token s3cret");
        assert!(!jupyter.contains_key("cookie"));
        let mut code = request("code");
        code.server_type = ServerType::Vscode;
        let vscode = headers(&notebook("alice", code));
        assert_eq!(vscode["cookie"], "code-server-session=s3cret");
        let vs = route(&lab, &config, 4000, None).unwrap();
        assert!(
            vs.spec.http.iter().all(|r| r.headers.is_none()),
            "no secret, no headers"
        );
        assert_eq!(vs.spec.http[0].route[0].destination.host, PUBLISH_ADDRESS);
    }
}

#[cfg(test)]
mod error_line_tests {
    use super::last_error_line;

    #[test]
    fn the_engines_reason_is_its_error_line_and_a_long_one_keeps_its_cause() {
        let stderr = "Trying to pull x...\nError: initializing source docker://127.0.0.1:1/e2e/x:1: \
            pinging container registry 127.0.0.1:1: Get \"https://127.0.0.1:1/v2/\": \
            dial tcp 127.0.0.1:1: connect: connection refused\n";
        let line = last_error_line(stderr);
        assert!(line.starts_with('…'), "{line}");
        assert!(line.ends_with("connect: connection refused"), "{line}");
        assert_eq!(line.chars().count(), 121);
        assert_eq!(
            last_error_line("Error: manifest unknown\n"),
            "manifest unknown"
        );
        assert_eq!(last_error_line(""), "no message");
    }
}
