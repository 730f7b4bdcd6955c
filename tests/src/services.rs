//! Launchers for the OCI registry and the S3 server.

use crate::tools::{SupportError, free_port, locate};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A service process with its own state directory, killed on drop.
struct ServiceProcess {
    name: &'static str,
    child: Child,
    port: u16,
    log: PathBuf,
    _state: tempfile::TempDir,
}

impl ServiceProcess {
    fn spawn(
        name: &'static str,
        command: &mut Command,
        port: u16,
        state: tempfile::TempDir,
    ) -> Result<Self, SupportError> {
        let log = state.path().join("service.log");
        let io = |source| SupportError::Io {
            doing: format!("starting {name}"),
            source,
        };
        let log_file = File::create(&log).map_err(io)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(io)?)
            .stderr(log_file)
            .spawn()
            .map_err(io)?;
        Ok(Self {
            name,
            child,
            port,
            log,
            _state: state,
        })
    }

    /// Polls `path` until it answers with `ready_status`, the process dies, or time runs out.
    async fn wait_ready(&mut self, path: &str, ready_status: u16) -> Result<(), SupportError> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        crate::init_crypto();
        let client = reqwest::Client::new();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(SupportError::Start {
                    service: self.name,
                    detail: format!("exited with {status}; its log:\n{}", self.log_tail()),
                });
            }
            if let Ok(resp) = client.get(&url).send().await
                && resp.status().as_u16() == ready_status
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(SupportError::Start {
                    service: self.name,
                    detail: format!(
                        "{url} did not answer {ready_status} within {START_TIMEOUT:?}; its log:\n{}",
                        self.log_tail()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn state_dir(name: &str) -> Result<tempfile::TempDir, SupportError> {
    tempfile::Builder::new()
        .prefix(&format!("labforge-{name}-"))
        .tempdir()
        .map_err(|source| SupportError::Io {
            doing: format!("creating a state directory for {name}"),
            source,
        })
}

/// A real OCI registry (Debian's `docker-registry`, distribution 2.8) with throw-away storage.
pub struct Registry {
    process: ServiceProcess,
}

impl Registry {
    pub async fn start() -> Result<Self, SupportError> {
        let binary = locate("docker-registry")?;
        let state = state_dir("registry")?;
        let port = free_port()?;
        let config = state.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                 delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                state.path().join("storage").display()
            ),
        )
        .map_err(|source| SupportError::Io {
            doing: "writing the registry config".into(),
            source,
        })?;
        let mut command = Command::new(binary);
        command.arg("serve").arg(&config);
        let mut process = ServiceProcess::spawn("docker-registry", &mut command, port, state)?;
        process.wait_ready("/v2/", 200).await?;
        Ok(Self { process })
    }

    /// `127.0.0.1:PORT`, the registry part of image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.process.port)
    }

    /// Whether `repository:tag` names a manifest (a save that failed must have written none).
    pub async fn has_tag(&self, repository: &str, tag: &str) -> bool {
        let url = format!("http://{}/v2/{repository}/manifests/{tag}", self.host());
        // Without a manifest type it accepts, the registry answers 404 for an OCI manifest too.
        let status = reqwest::Client::new()
            .get(&url)
            .header(
                "accept",
                "application/vnd.oci.image.manifest.v1+json, \
                 application/vnd.docker.distribution.manifest.v2+json",
            )
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
            .status();
        assert!(status == 200 || status == 404, "GET {url}: HTTP {status}");
        status == 200
    }

    /// Stops the registry now (to inject "registry down" faults).
    pub fn stop(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
    }
}

/// Where `scripts/setup` puts the S3 test server.
pub const MOTO_SERVER: &str = "/opt/labforge/moto-venv/bin/moto_server";

/// A real S3 server (moto) with in-memory state.
pub struct S3Server {
    process: ServiceProcess,
}

impl S3Server {
    pub async fn start() -> Result<Self, SupportError> {
        let binary = std::env::var_os("LABFORGE_MOTO_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(MOTO_SERVER));
        if !Path::new(&binary).exists() {
            return Err(SupportError::MissingFile {
                what: "the S3 test server (moto_server)",
                path: binary,
                hint: crate::tools::SETUP_HINT,
            });
        }
        let state = state_dir("s3")?;
        let port = free_port()?;
        let mut command = Command::new(binary);
        command
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("AWS_ACCESS_KEY_ID", "labforge-test")
            .env("AWS_SECRET_ACCESS_KEY", "labforge-test-secret");
        let mut process = ServiceProcess::spawn("moto S3 server", &mut command, port, state)?;
        process.wait_ready("/moto-api/", 200).await?;
        Ok(Self { process })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.process.port)
    }

    /// Stops the server now (to inject "S3 down" faults).
    pub fn stop(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
    }
}
