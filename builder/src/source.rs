//! Where a change set comes from: a directory scanned in this process, or a running container
//! scanned by the agent inside it.
//!
//! Both give the same thing, a [`ChangeSetHeader`] and a reader of the uncompressed layer tar, so
//! compression, caching and push never know which it was. The container path exists so that
//! credentials stay outside the notebook: the agent inside only reads files and writes to stdout.

use labforge_snapshot::protocol::ChangeSetHeader;
use labforge_snapshot::{
    BaselineIndex, ScanError, ScanOptions, WriteError, scan, write_change_set,
};
use std::io::{self, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Where the agent is mounted inside notebook containers.
pub const AGENT_PATH: &str = "/.labforge/agent/labforge-agent";

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Write(#[from] WriteError),
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
                    for line in message.lines() {
                        tracing::warn!("{line}");
                    }
                    Ok(())
                } else {
                    Err(SourceError::Agent {
                        container,
                        message: agent_message(&message, status),
                    })
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
        }
    }
}

fn agent_message(stderr: &str, status: std::process::ExitStatus) -> String {
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
                let buffered = io::BufWriter::with_capacity(1 << 20, writer);
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
    }
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
    command.args([
        "exec", "-i", "--user", "0", container, AGENT_PATH, "scan", "--parent", parent,
    ]);
    for path in ignore {
        command.args(["--ignore", path]);
    }
    if verify_content {
        command.arg("--verify-content");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SourceError::Spawn {
            program: engine.display().to_string(),
            source,
        })?;
    let mut stderr_pipe = child.stderr.take();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stderr_pipe.as_mut() {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let failed = |mut child: Child, stderr: JoinHandle<String>, fallback: String| {
        let _ = child.kill();
        let status = child.wait();
        let message = stderr.join().unwrap_or_default();
        SourceError::Agent {
            container: container.to_owned(),
            message: match status {
                Ok(status) if !message.trim().is_empty() => agent_message(&message, status),
                _ => fallback,
            },
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
    let Some(stdout) = child.stdout.take() else {
        return Err(failed(child, stderr, "no stdout".into()));
    };
    let mut reader: BufReader<ChildStdout> = BufReader::with_capacity(1 << 20, stdout);
    let header = match ChangeSetHeader::read_line(&mut reader) {
        Ok(header) => header,
        Err(err) => return Err(failed(child, stderr, err.to_string())),
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
