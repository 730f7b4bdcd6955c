//! The container engine (podman or docker) through its command line.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

use super::plan::{
    ContainerPlan, DEVICES_LABEL, MANAGED_LABEL, NOTEBOOK_LABEL, PLAN_LABEL, PORT_LABEL,
    PUBLISH_ADDRESS, SIZE_LABEL, volume_name,
};

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
        self.containers_labelled(None).await
    }

    /// The container of notebook `namespace/name`, running or not, if it has one.
    pub async fn container_of(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<RunningContainer>, EngineError> {
        let notebook = format!("label={NOTEBOOK_LABEL}={namespace}/{name}");
        let mut found = self.containers_labelled(Some(notebook)).await?;
        Ok(found.pop())
    }

    /// The managed containers, with one more label filter when given (both engines take every
    /// label filter as a condition of its own).
    async fn containers_labelled(
        &self,
        label: Option<String>,
    ) -> Result<Vec<RunningContainer>, EngineError> {
        let mut args = vec![
            "ps".into(),
            "--all".into(),
            "--filter".into(),
            format!("label={MANAGED_LABEL}={}", self.instance),
            "--format".into(),
            "json".into(),
        ];
        if let Some(label) = label {
            args.extend(["--filter".into(), label]);
        }
        let out = self.run(&args).await?;
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

    pub(super) fn is_docker(&self) -> bool {
        self.program
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("docker"))
    }

    pub async fn start(&self, plan: &ContainerPlan, host_port: u16) -> Result<(), EngineError> {
        self.ensure_network(&plan.name).await?;
        for (volume, size) in &plan.new_volumes {
            self.ensure_volume(volume, size).await?;
        }
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

    /// Creates volume `name` labelled with `size` unless it exists (then it is left as it is:
    /// a workspace kept from a deleted notebook is taken over with its files).
    async fn ensure_volume(&self, name: &str, size: &str) -> Result<(), EngineError> {
        if self.volume_exists(name).await {
            return Ok(());
        }
        let create = [
            "volume".to_owned(),
            "create".to_owned(),
            "--label".to_owned(),
            format!("{MANAGED_LABEL}={}", self.instance),
            "--label".to_owned(),
            format!("{SIZE_LABEL}={size}"),
            name.to_owned(),
        ];
        match self.run(&create).await {
            Ok(_) => Ok(()),
            Err(_) if self.volume_exists(name).await => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The claims (PersistentVolumeClaim names) `namespace`'s volumes stand in for, sorted, each
    /// with the size it was asked with (empty when unknown): the workspaces and data volumes
    /// its notebooks made, deleted notebooks' included.
    pub async fn claims(&self, namespace: &str) -> Result<Vec<(String, String)>, EngineError> {
        let prefix = volume_name(namespace, "");
        let listed = self
            .run(&[
                "volume".into(),
                "ls".into(),
                "--format".into(),
                // Docker's `volume ls` gives labels as one string, with a `Label` method;
                // podman's as a map.
                if self.is_docker() {
                    format!("{{{{.Name}}}}\t{{{{.Label \"{SIZE_LABEL}\"}}}}")
                } else {
                    format!("{{{{.Name}}}}\t{{{{index .Labels \"{SIZE_LABEL}\"}}}}")
                },
            ])
            .await?;
        let mut claims: Vec<(String, String)> = listed
            .lines()
            .filter_map(|line| {
                let (name, size) = line.trim().split_once('\t').unwrap_or((line.trim(), ""));
                let claim = name.strip_prefix(&prefix).filter(|c| !c.is_empty())?;
                // `index` of a missing label prints `<no value>` (Go templates).
                let size = if size.starts_with('<') {
                    ""
                } else {
                    size.trim()
                };
                Some((claim.to_owned(), size.to_owned()))
            })
            .collect();
        claims.sort();
        claims.dedup_by(|a, b| a.0 == b.0);
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

    pub(super) async fn volume_exists(&self, name: &str) -> bool {
        self.run(&["volume".into(), "exists".into(), name.into()])
            .await
            .is_ok()
    }

    /// Copies volume `from` into a new volume `to` (podman's `volume export` and `import`).
    pub(super) async fn copy_volume(
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

    /// `<engine> exec -i` of `command` in container `name`, as the container's user: its stdin
    /// and stdout are the caller's; what it says on stderr goes to the log.
    pub fn exec_stdio(
        &self,
        name: &str,
        command: &[&str],
    ) -> std::io::Result<tokio::process::Child> {
        let mut child = Command::new(&self.program)
            .args(["exec", "-i", name])
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        if let Some(stderr) = child.stderr.take() {
            let container = name.to_owned();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt as _;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(%container, "{line}");
                }
            });
        }
        Ok(child)
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
