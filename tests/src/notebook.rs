//! A real JupyterLab notebook for suites: the cached image pushed to a test registry, pulled and
//! run with podman under its notebook prefix, and ready (its API answers) when `start` returns.

use crate::podman::{Container, Podman};
use crate::services::Registry;
use crate::tools::{SupportError, free_port};
use std::time::{Duration, Instant};

const READY_TIMEOUT: Duration = Duration::from_secs(90);

pub struct JupyterLab {
    container: Container,
    podman: Podman,
    reference: String,
    port: u16,
    prefix: String,
}

impl JupyterLab {
    /// Runs the JupyterLab image as notebook `namespace/name` and waits for `/api/status`.
    pub async fn start(
        registry: &Registry,
        namespace: &str,
        name: &str,
    ) -> Result<Self, SupportError> {
        Self::start_with(registry, namespace, name, &[]).await
    }

    /// Like [`JupyterLab::start`], with more `podman run` arguments (mounts, say).
    pub async fn start_with(
        registry: &Registry,
        namespace: &str,
        name: &str,
        extra: &[&str],
    ) -> Result<Self, SupportError> {
        crate::init_crypto();
        let podman = Podman::locate()?;
        let reference = crate::images::push_layout(
            "jupyterlab",
            &registry.host(),
            &format!("labforge/jupyterlab:{namespace}-{name}"),
        )?;
        let image_id = podman.pull(&reference, false)?;
        let port = free_port()?;
        let prefix = format!("/notebook/{namespace}/{name}");
        let publish = format!("127.0.0.1:{port}:8888");
        let nb_prefix = format!("NB_PREFIX={prefix}");
        let mut args = vec!["-p", &publish, "-e", &nb_prefix];
        args.extend_from_slice(extra);
        let container = podman.run_detached(&args, &image_id)?;
        let notebook = Self {
            container,
            podman,
            reference,
            port,
            prefix,
        };
        notebook.wait_ready().await?;
        Ok(notebook)
    }

    async fn wait_ready(&self) -> Result<(), SupportError> {
        let url = format!("{}/api/status", self.base_url());
        let http = reqwest::Client::new();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(response) = http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(SupportError::Start {
                    service: "JupyterLab",
                    detail: format!(
                        "{url} did not answer 200 within {READY_TIMEOUT:?}; container log:\n{}",
                        self.container.logs()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `http://127.0.0.1:PORT/notebook/<ns>/<name>` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}{}", self.port, self.prefix)
    }

    /// `http://127.0.0.1:PORT`, the server without the prefix.
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The image reference the notebook runs (in the test registry).
    pub fn image(&self) -> &str {
        &self.reference
    }

    pub fn container(&self) -> &Container {
        &self.container
    }
}

impl Drop for JupyterLab {
    fn drop(&mut self) {
        // The image stays in podman's store for the next run; only this run's tag goes.
        let _ = self
            .podman
            .command()
            .args(["untag", &self.reference])
            .output();
    }
}
