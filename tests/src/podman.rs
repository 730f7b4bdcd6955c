//! Running real containers with podman; every container is removed when its guard drops.

use crate::tools::{SupportError, locate, run};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Clone, Debug)]
pub struct Podman {
    binary: PathBuf,
}

static CONTAINER_SEQ: AtomicU32 = AtomicU32::new(0);

impl Podman {
    /// Finds podman, or says to run setup.
    pub fn locate() -> Result<Self, SupportError> {
        Ok(Self {
            binary: locate("podman")?,
        })
    }

    pub fn command(&self) -> Command {
        Command::new(&self.binary)
    }

    /// Pulls `reference` and returns the pulled image's ID; `tls_verify` off for loopback test
    /// registries.
    ///
    /// Run what was pulled by this ID, not by `reference`: other tests pull the same image under
    /// other names and untag it meanwhile, and podman's name lookup can miss an image while
    /// another process rewrites its names ("image not known", podman's troubleshooting guide).
    pub fn pull(&self, reference: &str, tls_verify: bool) -> Result<String, SupportError> {
        let id = run(self.command().args([
            "pull",
            "-q",
            &format!("--tls-verify={tls_verify}"),
            reference,
        ]))?;
        Ok(id.trim().to_owned())
    }

    /// `podman run -d` with `args` placed before the image; the container is removed on drop.
    pub fn run_detached(&self, args: &[&str], image: &str) -> Result<Container, SupportError> {
        let name = format!(
            "labforge-test-{}-{}",
            std::process::id(),
            CONTAINER_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        run(self
            .command()
            .args(["run", "-d", "--name", &name])
            .args(args)
            .arg(image))?;
        Ok(Container {
            podman: self.clone(),
            name,
        })
    }
}

/// A running container, force-removed on drop.
pub struct Container {
    podman: Podman,
    name: String,
}

impl Container {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs a command inside the container and returns its stdout.
    pub fn exec(&self, argv: &[&str]) -> Result<String, SupportError> {
        run(self.podman.command().args(["exec", &self.name]).args(argv))
    }

    /// The container's log so far, for failure messages.
    pub fn logs(&self) -> String {
        self.podman
            .command()
            .args(["logs", &self.name])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command()
            .args(["rm", "-f", "-t", "0", &self.name])
            .output();
    }
}
