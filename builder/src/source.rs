//! Where a change set comes from: a directory scanned in this process, or a running container
//! scanned by the agent inside it.
//!
//! Both give the same thing, a [`ChangeSetHeader`] and a reader of the uncompressed layer tar, so
//! compression, caching and push never know which it was. The container path exists so that
//! credentials stay outside the notebook: the agent inside only reads files and writes the change
//! set out (to a pipe the builder hands it with podman, to stdout otherwise).

use command_fds::{CommandFdExt, FdMapping};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess};
use labforge_snapshot::guard::StreamViolation;
use labforge_snapshot::protocol::ChangeSetHeader;
use labforge_snapshot::{
    BaselineIndex, ScanError, ScanOptions, WriteError, scan, write_change_set,
};
use std::future::Future;
use std::io::{self, BufReader, Read, Write};
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::SyncIoBridge;

/// Where the agent is mounted inside notebook containers.
pub const AGENT_PATH: &str = "/.labforge/agent/labforge-agent";

/// Read buffer of a change-set stream.
pub(crate) const STREAM_BUFFER: usize = 256 * 1024;

/// What is kept of the agent's stderr: its last 64 KiB. It is read to its end all the same (a
/// full pipe would stop the agent), but whatever the container writes there costs no more.
const STDERR_TAIL: usize = 64 << 10;

/// How long an exec's exit status may take once its stream is closed.
const EXEC_STATUS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The container engine is not there to ask (web and CLI users meet this first).
    #[error(
        "{program} is not installed or not on PATH; install it, or name the engine with --engine"
    )]
    EngineMissing { program: String },
    #[error("starting {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("the agent in container {container} failed: {message}")]
    Agent { container: String, message: String },
    #[error("the change-set stream: {0}")]
    Stream(#[source] io::Error),
    /// The change set broke the rules of the stream (see `labforge_snapshot::guard`).
    #[error("the change set from the agent was refused: {0}")]
    ChangeSet(#[source] StreamViolation),
    #[error("exec into pod {pod}: {source}")]
    Exec {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// A root to save.
#[derive(Clone, Debug)]
pub enum ChangeSource {
    /// A directory on this machine.
    Directory { root: PathBuf, scan: ScanOptions },
    /// A running container, through `<engine> exec` and the agent mounted at [`AGENT_PATH`].
    Container {
        /// `podman` or `docker` (a path or a name on PATH).
        engine: PathBuf,
        container: String,
        /// Extra paths to leave out, besides the agent's defaults and the container's mounts.
        ignore: Vec<String>,
        verify_content: bool,
    },
    /// A container of a Kubernetes pod, through `pods/exec` and the agent the pod's init
    /// container copied to [`AGENT_PATH`]. The agent runs as the container's user, so a file that
    /// user cannot read is reported by path instead of saved.
    Pod {
        pod: PodContainer,
        ignore: Vec<String>,
        verify_content: bool,
    },
}

/// A container in a pod, with the client to reach it.
#[derive(Clone)]
pub struct PodContainer {
    pub client: kube::Client,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl std::fmt::Debug for PodContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} container {}",
            self.namespace, self.pod, self.container
        )
    }
}

/// A change set being produced: its header, and the tar to read.
pub struct RunningChangeSet {
    pub header: ChangeSetHeader,
    pub tar: Box<dyn Read + Send>,
    completion: Completion,
}

enum Completion {
    Thread(JoinHandle<Result<(), SourceError>>),
    Agent {
        child: Child,
        container: String,
        stderr: JoinHandle<String>,
    },
    Exec {
        /// Kept until the end: dropping it ends the exec's streams.
        process: AttachedProcess,
        status: Pin<Box<dyn Future<Output = Option<Status>> + Send>>,
        stderr: tokio::task::JoinHandle<String>,
        runtime: tokio::runtime::Handle,
        pod: String,
    },
}

impl RunningChangeSet {
    /// Waits for the producer after the tar was read to its end; its failure, if any, wins.
    pub fn finish(self) -> Result<(), SourceError> {
        drop(self.tar);
        match self.completion {
            Completion::Thread(handle) => handle.join().unwrap_or_else(|_| {
                Err(SourceError::Stream(io::Error::other(
                    "the change-set writer stopped unexpectedly",
                )))
            }),
            Completion::Agent {
                mut child,
                container,
                stderr,
            } => {
                let status = child.wait().map_err(SourceError::Stream)?;
                let message = stderr.join().unwrap_or_default();
                if status.success() {
                    warn_each(&message);
                    Ok(())
                } else {
                    Err(SourceError::Agent {
                        container,
                        message: agent_message(&message, &status.to_string()),
                    })
                }
            }
            Completion::Exec {
                process,
                status,
                stderr,
                runtime,
                pod,
            } => {
                // Read to its end, the stream is followed by the status at once. Cut short (the
                // builder failed first), the exec may be stuck on a full pipe nobody reads: it
                // is dropped after a grace period instead of being waited for.
                let (status, message) = runtime.block_on(async move {
                    let status = tokio::time::timeout(EXEC_STATUS_GRACE, status)
                        .await
                        .ok()
                        .flatten();
                    drop(process);
                    let message = tokio::time::timeout(EXEC_STATUS_GRACE, stderr)
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or_default();
                    (status, message)
                });
                match status {
                    Some(status) if status.status.as_deref() == Some("Success") => {
                        warn_each(&message);
                        Ok(())
                    }
                    status => Err(SourceError::Agent {
                        container: pod,
                        message: agent_message(&message, &exec_failure(status)),
                    }),
                }
            }
        }
    }

    /// Stops the producer without reading the tar (the change set is already saved).
    pub fn abandon(self) {
        drop(self.tar);
        match self.completion {
            Completion::Thread(handle) => {
                // The writer fails on the closed pipe and ends.
                let _ = handle.join();
            }
            Completion::Agent { mut child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
            // Dropping the process closes the websocket; the kubelet ends the exec.
            Completion::Exec { .. } => {}
        }
    }
}

/// Lines the agent wrote to stderr while succeeding: files it could not read, and the like.
fn warn_each(stderr: &str) {
    for line in stderr.lines() {
        tracing::warn!("{line}");
    }
}

/// How an exec ended without success, from the `Status` the API server sent.
fn exec_failure(status: Option<Status>) -> String {
    let Some(status) = status else {
        return "the exec ended without an exit status".into();
    };
    let code = status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|causes| {
            causes
                .iter()
                .find(|c| c.reason.as_deref() == Some("ExitCode"))
        })
        .and_then(|c| c.message.clone());
    match code {
        Some(code) => format!("exit status: {code}"),
        None => status.message.unwrap_or_else(|| "failed".into()),
    }
}

/// The last [`STDERR_TAIL`] bytes of a stream, and how many came before them.
#[derive(Default)]
struct Tail {
    kept: std::collections::VecDeque<u8>,
    dropped: u64,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.kept.extend(bytes);
        let excess = self.kept.len().saturating_sub(STDERR_TAIL);
        self.kept.drain(..excess);
        self.dropped += excess as u64;
    }

    fn into_text(self) -> String {
        let kept: Vec<u8> = self.kept.into();
        let text = String::from_utf8_lossy(&kept);
        if self.dropped == 0 {
            text.into_owned()
        } else {
            format!(
                "[{} earlier bytes of output left out]\n{text}",
                self.dropped
            )
        }
    }
}

/// The agent's stderr to its end, keeping its tail.
fn read_tail(mut pipe: impl Read) -> String {
    let mut tail = Tail::default();
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => tail.push(&buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    tail.into_text()
}

/// [`read_tail`] for an exec's stream.
async fn read_tail_async(mut pipe: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut tail = Tail::default();
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.push(&buf[..n]);
    }
    tail.into_text()
}

/// Why the builder gave up on the agent, followed by what the agent said, if anything.
fn failure_message(why: String, stderr: &str) -> String {
    if stderr.trim().is_empty() {
        why
    } else {
        format!("{why}; {}", agent_message(stderr, ""))
    }
}

fn agent_message(stderr: &str, status: &str) -> String {
    let text = stderr
        .lines()
        .map(|l| l.trim_start_matches("labforge-agent: "))
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        format!("exited with {status}")
    } else {
        text
    }
}

/// Starts producing the change set of `source` against `baseline`. Blocking: call it from a
/// blocking task. `parent` identifies the baseline image in the change-set key.
pub fn start(
    source: &ChangeSource,
    baseline: Arc<BaselineIndex>,
    parent: &str,
    progress: impl FnMut(u64) + Send,
) -> Result<RunningChangeSet, SourceError> {
    match source {
        ChangeSource::Directory {
            root,
            scan: options,
        } => {
            let changes = scan(root, &baseline, options, progress)?;
            let header = ChangeSetHeader::new(&changes, parent);
            let (reader, writer) = io::pipe().map_err(SourceError::Stream)?;
            let root = root.clone();
            let handle = std::thread::spawn(move || -> Result<(), SourceError> {
                let buffered = io::BufWriter::with_capacity(STREAM_BUFFER, writer);
                let (mut out, summary) = write_change_set(&root, &changes, buffered, |_, _| {})?;
                out.flush().map_err(SourceError::Stream)?;
                for path in summary.changed_while_writing {
                    tracing::warn!("{} changed while it was saved", path.display());
                }
                Ok(())
            });
            Ok(RunningChangeSet {
                header,
                tar: Box::new(reader),
                completion: Completion::Thread(handle),
            })
        }
        ChangeSource::Container {
            engine,
            container,
            ignore,
            verify_content,
        } => start_agent(
            engine,
            container,
            ignore,
            *verify_content,
            &baseline,
            parent,
        ),
        ChangeSource::Pod {
            pod,
            ignore,
            verify_content,
        } => start_exec(pod, ignore, *verify_content, &baseline, parent),
    }
}

/// The agent's command line: scan the root, the baseline index arriving on stdin.
fn agent_command(
    parent: &str,
    ignore: &[String],
    verify_content: bool,
    output: Option<&str>,
) -> Vec<String> {
    let mut command = vec![
        AGENT_PATH.to_owned(),
        "scan".into(),
        "--parent".into(),
        parent.to_owned(),
    ];
    for path in ignore {
        command.extend(["--ignore".to_owned(), path.clone()]);
    }
    if verify_content {
        command.push("--verify-content".into());
    }
    if let Some(output) = output {
        command.extend(["--output".to_owned(), output.to_owned()]);
    }
    command
}

/// The descriptor the change set arrives on when the engine can pass one into the exec.
const CHANGE_SET_FD: i32 = 3;

/// Whether `engine` is podman, whose `exec --preserve-fds` hands descriptors to the process
/// inside. docker's exec cannot, so the change set then crosses its stdout relay.
fn passes_descriptors(engine: &std::path::Path) -> bool {
    engine
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("podman"))
}

/// The agent through the Kubernetes API: the same streams as `podman exec`, over a websocket.
/// Runs on a blocking thread and drives the exec on the runtime that thread came from.
fn start_exec(
    target: &PodContainer,
    ignore: &[String],
    verify_content: bool,
    baseline: &BaselineIndex,
    parent: &str,
) -> Result<RunningChangeSet, SourceError> {
    let name = format!("{}/{}", target.namespace, target.pod);
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|err| SourceError::Stream(io::Error::other(format!("no async runtime: {err}"))))?;
    let pods: Api<Pod> = Api::namespaced(target.client.clone(), &target.namespace);
    let params = AttachParams::default()
        .container(target.container.clone())
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .max_stdin_buf_size(1 << 20)
        .max_stdout_buf_size(STREAM_BUFFER);
    let mut process = runtime
        .block_on(pods.exec(
            &target.pod,
            agent_command(parent, ignore, verify_content, None),
            &params,
        ))
        .map_err(|source| SourceError::Exec {
            pod: name.clone(),
            source,
        })?;
    let missing = |what: &str| SourceError::Stream(io::Error::other(format!("exec has no {what}")));
    let stdin = process.stdin().ok_or_else(|| missing("stdin"))?;
    let stdout = process.stdout().ok_or_else(|| missing("stdout"))?;
    let mut stderr_pipe = process.stderr().ok_or_else(|| missing("stderr"))?;
    let status = process.take_status().ok_or_else(|| missing("status"))?;
    // Drained all along: the exec stops relaying every stream when one pipe is full.
    let stderr = runtime.spawn(async move { read_tail_async(&mut stderr_pipe).await });
    // Ends the exec and says why, with what the agent wrote to stderr.
    let failed =
        |process: AttachedProcess, stderr: tokio::task::JoinHandle<String>, why: String| {
            drop(process);
            // After the drop the stderr pipe may never close: what it said so far, in a grace.
            let said = runtime
                .block_on(tokio::time::timeout(EXEC_STATUS_GRACE, stderr))
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            SourceError::Agent {
                container: name.clone(),
                message: failure_message(why, &said),
            }
        };
    let mut writer = io::BufWriter::with_capacity(
        1 << 20,
        SyncIoBridge::new_with_handle(stdin, runtime.clone()),
    );
    let sent = serde_json::to_writer(&mut writer, baseline)
        .map_err(io::Error::from)
        .and_then(|()| writer.flush());
    // The agent reads the index to its end: close stdin.
    let closed = match writer.into_inner() {
        Ok(bridge) => runtime.block_on(bridge.into_inner().shutdown()),
        Err(err) => Err(err.into_error()),
    };
    if let Err(err) = sent.and(closed) {
        return Err(failed(
            process,
            stderr,
            format!("sending the baseline index: {err}"),
        ));
    }
    let mut reader = BufReader::with_capacity(
        STREAM_BUFFER,
        SyncIoBridge::new_with_handle(stdout, runtime.clone()),
    );
    let header = match ChangeSetHeader::read_line(&mut reader) {
        Ok(header) => header,
        Err(err) => return Err(failed(process, stderr, err.to_string())),
    };
    let completion = Completion::Exec {
        process,
        status: Box::pin(status),
        stderr,
        runtime,
        pod: name,
    };
    Ok(RunningChangeSet {
        header,
        tar: Box::new(reader),
        completion,
    })
}

fn start_agent(
    engine: &PathBuf,
    container: &str,
    ignore: &[String],
    verify_content: bool,
    baseline: &BaselineIndex,
    parent: &str,
) -> Result<RunningChangeSet, SourceError> {
    let mut command = Command::new(engine);
    // As root inside the container (not privileged): files only root can read get saved too.
    command.args(["exec", "-i", "--user", "0"]);
    // With podman the change set comes through a pipe of ours that the agent writes directly:
    // the exec's stdout is copied by conmon and then by podman, each copy costing time and CPU
    // for every byte of the layer, where a pipe passes it straight through.
    let direct = if passes_descriptors(engine) {
        let (reader, writer) = io::pipe().map_err(SourceError::Stream)?;
        command
            .fd_mappings(vec![FdMapping {
                parent_fd: writer.into(),
                child_fd: CHANGE_SET_FD,
            }])
            .map_err(|err| SourceError::Stream(io::Error::other(err.to_string())))?;
        command.args(["--preserve-fds", "1"]);
        Some(reader)
    } else {
        None
    };
    let output = direct
        .as_ref()
        .map(|_| format!("/proc/self/fd/{CHANGE_SET_FD}"));
    command
        .arg(container)
        .args(agent_command(
            parent,
            ignore,
            verify_content,
            output.as_deref(),
        ))
        .stdin(Stdio::piped())
        .stdout(if direct.is_some() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stderr(Stdio::piped());
    let spawned = command.spawn();
    // The command owns our copy of the pipe's writing end: dropped, the pipe ends when the agent
    // (and the engine's processes that inherited it) are done.
    drop(command);
    let mut child = spawned.map_err(|source| {
        let program = engine.display().to_string();
        if source.kind() == io::ErrorKind::NotFound {
            SourceError::EngineMissing { program }
        } else {
            SourceError::Spawn { program, source }
        }
    })?;
    let mut stderr_pipe = child.stderr.take();
    let stderr = std::thread::spawn(move || stderr_pipe.take().map(read_tail).unwrap_or_default());
    let failed = |mut child: Child, stderr: JoinHandle<String>, why: String| {
        let _ = child.kill();
        let _ = child.wait();
        let message = stderr.join().unwrap_or_default();
        SourceError::Agent {
            container: container.to_owned(),
            message: failure_message(why, &message),
        }
    };
    let stdin_written = child.stdin.take().map(|stdin| {
        let mut stdin = io::BufWriter::new(stdin);
        serde_json::to_writer(&mut stdin, baseline)
            .map_err(io::Error::from)
            .and_then(|()| stdin.flush())
    });
    if let Some(Err(err)) = stdin_written {
        return Err(failed(
            child,
            stderr,
            format!("sending the baseline index: {err}"),
        ));
    }
    let stream: Box<dyn Read + Send> = match (direct, child.stdout.take()) {
        (Some(pipe), _) => Box::new(pipe),
        (None, Some(stdout)) => Box::new(stdout),
        (None, None) => return Err(failed(child, stderr, "no stdout".into())),
    };
    // Pipes move 64 KiB at a time; a larger buffer only adds to the save's peak memory.
    let mut reader = BufReader::with_capacity(STREAM_BUFFER, stream);
    let header = match ChangeSetHeader::read_line(&mut reader) {
        Ok(header) => header,
        Err(err) => {
            // Closed first: whatever still writes to it (the agent, or anything in the
            // container that opened its descriptor) then ends instead of holding stderr open.
            drop(reader);
            return Err(failed(child, stderr, err.to_string()));
        }
    };
    Ok(RunningChangeSet {
        header,
        tar: Box::new(reader),
        completion: Completion::Agent {
            child,
            container: container.to_owned(),
            stderr,
        },
    })
}
