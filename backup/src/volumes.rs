//! The notebooks' volumes as a backup reads and a restore writes them: through the container
//! engine's own `volume export` (a tar of the volume, taken while its notebook runs) and
//! `volume import`, so that ownership and modes come back as the engine keeps them, rootless
//! or not.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error(
        "{program} cannot export volumes (docker has no `volume export`): back up with podman as the engine"
    )]
    Unsupported { program: String },
}

/// The volumes a backup reads and a restore writes.
pub trait Volumes {
    /// Every volume's name.
    fn list(&self) -> Result<Vec<String>, VolumeError>;
    /// Writes volume `name` as a tar to `to`.
    fn export(&self, name: &str, to: &Path) -> Result<(), VolumeError>;
    fn exists(&self, name: &str) -> Result<bool, VolumeError>;
    /// Makes volume `name` and fills it from the tar at `from`.
    fn import(&self, name: &str, from: &Path) -> Result<(), VolumeError>;
    fn remove(&self, name: &str) -> Result<(), VolumeError>;
}

/// podman, through its command line.
pub struct Podman {
    pub program: PathBuf,
}

impl Podman {
    fn run(&self, args: &[&str]) -> Result<String, VolumeError> {
        let output = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| VolumeError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if args.get(1) == Some(&"export") && stderr.contains("unknown") {
            return Err(VolumeError::Unsupported {
                program: self.program.display().to_string(),
            });
        }
        Err(VolumeError::Failed {
            command: format!(
                "{} {}",
                self.program.display(),
                args[..2.min(args.len())].join(" ")
            ),
            stderr: stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message")
                .trim()
                .to_owned(),
        })
    }
}

impl Volumes for Podman {
    fn list(&self) -> Result<Vec<String>, VolumeError> {
        let listed = self.run(&["volume", "ls", "--format", "{{.Name}}"])?;
        Ok(listed
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    fn export(&self, name: &str, to: &Path) -> Result<(), VolumeError> {
        let to = to.display().to_string();
        self.run(&["volume", "export", "--output", &to, name])
            .map(|_| ())
    }

    fn exists(&self, name: &str) -> Result<bool, VolumeError> {
        let status = Command::new(&self.program)
            .args(["volume", "exists", name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|source| VolumeError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        // podman: 0 there, 1 not there, anything else an error.
        match status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(VolumeError::Failed {
                command: format!("{} volume exists", self.program.display()),
                stderr: format!("exited with {status}"),
            }),
        }
    }

    fn import(&self, name: &str, from: &Path) -> Result<(), VolumeError> {
        self.run(&["volume", "create", name])?;
        let from = from.display().to_string();
        self.run(&["volume", "import", name, &from]).map(|_| ())
    }

    fn remove(&self, name: &str) -> Result<(), VolumeError> {
        self.run(&["volume", "rm", "--force", name]).map(|_| ())
    }
}
