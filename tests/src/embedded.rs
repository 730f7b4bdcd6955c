//! `labforge up` as users run it: the binary, its own registry and data dir, driven over HTTP.

use crate::tools::{SupportError, free_port, locate};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `labforge up`; stopped (SIGTERM, as Ctrl-C would) on drop.
pub struct LabforgeUp {
    child: Child,
    binary: PathBuf,
    args: Vec<String>,
    pub data_dir: PathBuf,
    /// The URL it printed, `http(s)://localhost:PORT` (no trailing slash).
    pub url: String,
    pub registry: String,
    /// The first admin's password, when this start created it.
    pub admin_password: Option<String>,
    stdout: Arc<Mutex<String>>,
}

impl LabforgeUp {
    /// Starts `binary up` on free ports with `data_dir`, its local registry, and `agent`.
    pub async fn start(binary: &Path, data_dir: &Path, agent: &Path) -> Result<Self, SupportError> {
        Self::start_with(binary, data_dir, agent, &[]).await
    }

    /// Like [`LabforgeUp::start`], with more `labforge up` arguments.
    pub async fn start_with(
        binary: &Path,
        data_dir: &Path,
        agent: &Path,
        extra: &[&str],
    ) -> Result<Self, SupportError> {
        let mut args = vec![
            "up".to_owned(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", free_port()?),
            "--registry-listen".into(),
            format!("127.0.0.1:{}", free_port()?),
            "--registry-program".into(),
            locate("docker-registry")?.display().to_string(),
            "--agent".into(),
            agent.display().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        Self::launch(binary, args, data_dir).await
    }

    async fn launch(
        binary: &Path,
        args: Vec<String>,
        data_dir: &Path,
    ) -> Result<Self, SupportError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.with_extension("log"))
            .map_err(|source| SupportError::Io {
                doing: "opening the labforge up log".into(),
                source,
            })?;
        let mut child = Command::new(binary)
            .args(&args)
            .env("LABFORGE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|source| SupportError::Io {
                doing: format!("starting {}", binary.display()),
                source,
            })?;
        let stdout = Arc::new(Mutex::new(String::new()));
        if let Some(out) = child.stdout.take() {
            let sink = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Ok(mut text) = sink.lock() {
                        text.push_str(&line);
                        text.push('\n');
                    }
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let printed = loop {
            let text = stdout.lock().map(|t| t.clone()).unwrap_or_default();
            if text.contains("Ctrl-C stops labforge") {
                break text;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log =
                    std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default();
                return Err(SupportError::Start {
                    service: "labforge up",
                    detail: format!("exited with {status}; stdout:\n{text}\nlog:\n{log}"),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(SupportError::Start {
                    service: "labforge up",
                    detail: format!("no URL printed within 60 s; stdout:\n{text}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let word_after = |marker: &str| {
            printed
                .split(marker)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned)
        };
        let url = word_after("labforge is running:")
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_owned();
        let registry = word_after("Registry:")
            .unwrap_or_default()
            .trim_start_matches("http://")
            .to_owned();
        Ok(Self {
            child,
            binary: binary.to_owned(),
            args,
            data_dir: data_dir.to_owned(),
            url,
            registry,
            admin_password: word_after("with password"),
            stdout,
        })
    }

    /// The certificate it serves (PEM), when it serves HTTPS with one it made itself.
    pub fn certificate(&self) -> Option<Vec<u8>> {
        if !self.url.starts_with("https://") {
            return None;
        }
        std::fs::read(self.data_dir.join("tls").join("cert.pem")).ok()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident set size in KiB (`VmRSS` in `/proc/<pid>/status`).
    pub fn resident_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// What it printed so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Its log (stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Kills it with SIGKILL, as a crash or the kernel's OOM killer would, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it as Ctrl-C would, and waits for the exit; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        // Already gone (killed): its pid may be another process's by now.
        if let Ok(Some(status)) = self.child.try_wait() {
            return status.success();
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    /// Stops it and starts it again with the same arguments (and so the same ports and data).
    pub async fn restart(mut self) -> Result<Self, SupportError> {
        self.stop();
        let (binary, args, dir) = (
            self.binary.clone(),
            self.args.clone(),
            self.data_dir.clone(),
        );
        Self::launch(&binary, args, &dir).await
    }

    /// `labforge user <args> --data-dir <dir>`; returns what it printed.
    pub fn user_command(&self, args: &[&str]) -> Result<String, SupportError> {
        let output = Command::new(&self.binary)
            .arg("user")
            .args(args)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .output()
            .map_err(|source| SupportError::Io {
                doing: "running labforge user".into(),
                source,
            })?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(text)
        } else {
            Err(SupportError::Command {
                command: format!("labforge user {}", args.join(" ")),
                detail: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        }
    }
}

impl Drop for LabforgeUp {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes the podman containers, networks and volumes of these namespaces (`labforge-<ns>_*`)
/// when dropped, however a test ends. Declare it before the [`LabforgeUp`], so that labforge is stopped
/// first and does not start containers again while they are removed.
pub struct RemoveNotebooksOnDrop(pub Vec<String>);

impl Drop for RemoveNotebooksOnDrop {
    fn drop(&mut self) {
        for ns in &self.0 {
            let prefix = format!("labforge-{ns}_");
            for (list, remove) in [
                (
                    &["ps", "-a", "--format", "{{.Names}}"][..],
                    &["rm", "-f", "-t", "0"][..],
                ),
                (
                    &["network", "ls", "--format", "{{.Name}}"][..],
                    &["network", "rm", "-f"][..],
                ),
                (
                    &["volume", "ls", "--format", "{{.Name}}"][..],
                    &["volume", "rm", "-f"][..],
                ),
            ] {
                let Ok(out) = Command::new("podman").args(list).output() else {
                    continue;
                };
                for name in String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|n| n.starts_with(&prefix))
                {
                    let _ = Command::new("podman").args(remove).arg(name).output();
                }
            }
        }
    }
}

impl LabforgeUp {
    /// `labforge user add NAME`; returns the password it printed (once).
    pub fn add_user(&self, name: &str) -> Result<String, SupportError> {
        let printed = self.user_command(&["add", name])?;
        printed
            .split_whitespace()
            .last()
            .map(str::to_owned)
            .ok_or_else(|| SupportError::Command {
                command: format!("labforge user add {name}"),
                detail: format!("no password printed: {printed:?}"),
            })
    }

    /// Signs in through the API; returns the session cookie (`__Host-labforge_session=…`, or
    /// `labforge_session=…` where browsers keep no `__Host-` cookie).
    pub async fn sign_in(&self, user: &str, password: &str) -> Result<String, SupportError> {
        let failed = |detail: String| SupportError::Command {
            command: format!("POST {}/api/login as {user}", self.url),
            detail,
        };
        let response = reqwest::Client::new()
            .post(format!("{}/api/login", self.url))
            .json(&serde_json::json!({"username": user, "password": password}))
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !response.status().is_success() {
            return Err(failed(format!("HTTP {}", response.status())));
        }
        response
            .headers()
            .get(reqwest::header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .filter(|c| {
                c.starts_with("labforge_session=") || c.starts_with("__Host-labforge_session=")
            })
            .map(str::to_owned)
            .ok_or_else(|| failed("no session cookie".into()))
    }
}
