//! One `labforge up` for a drill: its own data dir and ports, the JupyterLab image in its
//! registry, users signed in through the API, and everything it made in podman removed at the end.

use anyhow::{Context, bail};
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Lab {
    pub up: LabforgeUp,
    /// Dropped after `up` (fields drop in order), so labforge is stopped before its notebooks
    /// are removed.
    _cleanup: RemoveNotebooksOnDrop,
    _dir: tempfile::TempDir,
    pub labforge: PathBuf,
}

impl Lab {
    /// `labforge up` with `extra` arguments; `namespaces` are the users the drill will add, whose
    /// containers, networks and volumes go with the lab.
    pub async fn start(
        labforge: &Path,
        namespaces: &[String],
        extra: &[&str],
    ) -> anyhow::Result<Lab> {
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        Self::start_in(dir, &data, labforge, namespaces, extra).await
    }

    /// Like [`Lab::start`], with its data in `data` (which `dir`, kept with the lab, may hold).
    pub async fn start_in(
        dir: tempfile::TempDir,
        data: &Path,
        labforge: &Path,
        namespaces: &[String],
        extra: &[&str],
    ) -> anyhow::Result<Lab> {
        let agent = labforge_tests::agent::agent_binary()?;
        let cleanup = RemoveNotebooksOnDrop(namespaces.to_vec());
        let up = LabforgeUp::start_with(labforge, data, &agent, extra).await?;
        labforge_tests::push_layout("jupyterlab", &up.registry, "labforge/jupyterlab:latest")?;
        Ok(Lab {
            up,
            _cleanup: cleanup,
            _dir: dir,
            labforge: labforge.to_owned(),
        })
    }

    /// A lab serving notebooks under its own host's paths (`--notebook-paths`), whose one user
    /// (namespace `<drill>-<pid>`) has notebook `name` ready; with that notebook's URL.
    pub async fn with_notebook_at_path(
        labforge: &Path,
        drill: &str,
        name: &str,
    ) -> anyhow::Result<(Lab, Session, String)> {
        let namespace = format!("{drill}-{:x}", std::process::id());
        let lab = Lab::start(
            labforge,
            std::slice::from_ref(&namespace),
            &["--notebook-paths"],
        )
        .await?;
        let user = lab.user(&namespace).await?;
        user.ready_notebook(name).await?;
        let url = format!("{}/notebook/{namespace}/{name}", lab.up.url);
        Ok((lab, user, url))
    }

    /// A new user, signed in.
    pub async fn user(&self, name: &str) -> anyhow::Result<Session> {
        let password = self.up.add_user(name)?;
        Session::sign_in(&self.up.url, name, &password).await
    }

    /// Kills labforge with SIGKILL and starts it again on the same data and ports.
    pub async fn kill_and_restart(self) -> anyhow::Result<Lab> {
        let Lab {
            mut up,
            _cleanup,
            _dir,
            labforge,
        } = self;
        up.kill();
        let up = up.restart().await?;
        Ok(Lab {
            up,
            _cleanup,
            _dir,
            labforge,
        })
    }

    /// labforge's open file descriptors.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.up.pid()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    }

    /// The CPU labforge has used so far, in seconds (its own process, not its containers).
    pub fn cpu_seconds(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/stat", self.up.pid()))
            .ok()
            .and_then(|stat| {
                // After the command's name in parentheses: utime and stime are the 12th and 13th.
                let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                let ticks: u64 =
                    fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
                Some(ticks as f64 / CLOCK_TICKS)
            })
            .unwrap_or(f64::NAN)
    }

    /// labforge's resident memory in MiB.
    pub fn resident_mib(&self) -> f64 {
        self.up.resident_kib().unwrap_or(0) as f64 / 1024.0
    }
}

/// Linux's USER_HZ, the unit of `/proc`'s CPU times on every architecture it runs on.
const CLOCK_TICKS: f64 = 100.0;

/// The CPU every core of the machine has spent busy so far, in seconds (`/proc/stat`).
pub fn machine_busy_seconds() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|stat| {
            let cpu = stat.lines().find(|line| line.starts_with("cpu "))?;
            let ticks: Vec<u64> = cpu
                .split_whitespace()
                .skip(1)
                .filter_map(|t| t.parse().ok())
                .collect();
            // user, nice, system, irq, softirq, steal: everything but idle and iowait.
            let busy = [0, 1, 2, 5, 6, 7]
                .iter()
                .filter_map(|&i| ticks.get(i))
                .sum::<u64>();
            Some(busy as f64 / CLOCK_TICKS)
        })
        .unwrap_or(f64::NAN)
}

/// A signed-in API client.
#[derive(Clone)]
pub struct Session {
    pub http: reqwest::Client,
    pub base: String,
    pub cookie: String,
    pub user: String,
}

impl Session {
    pub async fn sign_in(base: &str, user: &str, password: &str) -> anyhow::Result<Session> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(60))
            // Let go of idle connections before the proxy closes them (after 30 s).
            .pool_idle_timeout(Duration::from_secs(20))
            .build()?;
        let response = http
            .post(format!("{base}/api/login"))
            .json(&json!({"username": user, "password": password}))
            .send()
            .await?;
        if response.status() != 200 {
            bail!("sign-in of {user}: {}", response.status());
        }
        let cookie = response
            .headers()
            .get("set-cookie")
            .and_then(|c| c.to_str().ok())
            .and_then(|c| c.split(';').next())
            .context("no session cookie")?
            .to_owned();
        Ok(Session {
            http,
            base: base.to_owned(),
            cookie,
            user: user.to_owned(),
        })
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("cookie", &self.cookie);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub fn notebook_path(&self, name: &str) -> String {
        format!("/api/namespaces/{}/notebooks/{name}", self.user)
    }

    pub async fn create(&self, name: &str) -> anyhow::Result<(u16, Value)> {
        self.call(
            reqwest::Method::POST,
            &format!("/api/namespaces/{}/notebooks", self.user),
            Some(json!({"name": name, "workspace": "none"})),
        )
        .await
    }

    /// Creates notebook `name` (without a workspace) and waits until it is ready.
    pub async fn ready_notebook(&self, name: &str) -> anyhow::Result<()> {
        let (status, body) = self.create(name).await?;
        anyhow::ensure!(status == 201, "create of {name} answered {status}: {body}");
        self.wait_for(name, "ready", Duration::from_secs(180))
            .await?;
        Ok(())
    }

    /// The notebook's state, `None` when it does not exist.
    pub async fn state(&self, name: &str) -> anyhow::Result<Option<(String, String)>> {
        let (status, body) = self.get(&self.notebook_path(name)).await?;
        match status {
            404 => Ok(None),
            200 => Ok(Some((
                body["notebook"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                body["notebook"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ))),
            other => bail!("GET {}: {other} {body}", self.notebook_path(name)),
        }
    }

    /// Waits until the notebook's state is `want` (`"gone"`: it does not exist); returns how
    /// long that took.
    pub async fn wait_for(
        &self,
        name: &str,
        want: &str,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let state = self.state(name).await?;
            let now = state.as_ref().map_or("gone", |(s, _)| s.as_str());
            if now == want {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{}/{name} is {state:?}, not {want}, after {timeout:?}",
                    self.user
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `podman <args>`: its standard output, or the error it printed.
pub fn podman(args: &[&str]) -> anyhow::Result<String> {
    let output = std::process::Command::new("podman").args(args).output()?;
    if !output.status.success() {
        bail!(
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The podman containers whose names start with `labforge-<namespace>_`.
pub fn containers_of(namespace: &str) -> anyhow::Result<Vec<String>> {
    let prefix = format!("labforge-{namespace}_");
    Ok(podman(&["ps", "-a", "--format", "{{.Names}}"])?
        .lines()
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

/// The `p`th percentile of `values` (sorted here), in seconds.
pub fn percentile(values: &mut [Duration], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort();
    let at = ((values.len() - 1) as f64 * p).round() as usize;
    values[at].as_secs_f64()
}
