//! Launchers for the OCI registry and the S3 server.
//!
//! Each starts on a port [`free_port`] found, which is free only until someone binds it. Tests run
//! in parallel processes, so another test's service may take it first and answer in this one's
//! place until that test ends; a service is ready only when the socket answering is its own, and
//! one that lost its port starts again on another.

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
                let log = self.log_tail();
                if log.to_lowercase().contains("address already in use") {
                    return Err(SupportError::PortTaken {
                        service: self.name,
                        port: self.port,
                    });
                }
                return Err(SupportError::Start {
                    service: self.name,
                    detail: format!("exited with {status}; its log:\n{log}"),
                });
            }
            if let Ok(resp) = client.get(&url).send().await
                && resp.status().as_u16() == ready_status
            {
                // A port from `free_port` is free only until someone binds it: another test's
                // service may have, and answer in this one's place until that test ends.
                if !listens_on(self.child.id(), self.port) {
                    return Err(SupportError::PortTaken {
                        service: self.name,
                        port: self.port,
                    });
                }
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

/// `start` again, each time on another free port, while it loses its port to another process
/// (twice at most).
async fn on_a_free_port<T, Started: Future<Output = Result<T, SupportError>>>(
    start: impl Fn() -> Started,
) -> Result<T, SupportError> {
    let mut lost = 0;
    loop {
        match start().await {
            Err(SupportError::PortTaken { .. }) if lost < 2 => lost += 1,
            started => return started,
        }
    }
}

/// Whether the socket listening on 127.0.0.1:`port` belongs to process `pid` or one of its
/// descendants (read from `/proc`).
fn listens_on(pid: u32, port: u16) -> bool {
    let Some(inode) = listening_socket_inode(port) else {
        return false;
    };
    let socket = format!("socket:[{inode}]");
    process_tree(pid).into_iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|target| target == Path::new(&socket))
            })
    })
}

/// The inode of the IPv4 socket listening on 127.0.0.1:`port` or 0.0.0.0:`port`.
fn listening_socket_inode(port: u16) -> Option<String> {
    const LISTEN: &str = "0A";
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let wanted = [
        format!("0100007F:{port:04X}"),
        format!("00000000:{port:04X}"),
    ];
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
        (wanted.iter().any(|w| w == local) && *state == LISTEN).then(|| (*inode).to_owned())
    })
}

/// `pid` and every process descended from it.
fn process_tree(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command name, which may hold spaces and parentheses: state, then ppid.
            let parent = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((child, parent))
        })
        .collect();
    let mut tree = vec![pid];
    let mut at = 0;
    while let Some(&parent) = tree.get(at) {
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        at += 1;
    }
    tree
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

/// The account of [`Registry::start_requiring_login`].
pub const REGISTRY_USER: &str = "labforge";
pub const REGISTRY_PASSWORD: &str = "labforge-registry-test";
/// bcrypt of [`REGISTRY_PASSWORD`] (cost 5), as docker-registry's htpasswd file wants it.
const REGISTRY_PASSWORD_BCRYPT: &str =
    "$2b$05$tZXeikZC3h4rOndWRHGj2uXp1Yx8HGgZKLuq3InzTOWNeLBabqIaW";

impl Registry {
    pub async fn start() -> Result<Self, SupportError> {
        on_a_free_port(|| Self::start_once(false)).await
    }

    /// A registry that answers only [`REGISTRY_USER`] with [`REGISTRY_PASSWORD`] (Basic auth).
    pub async fn start_requiring_login() -> Result<Self, SupportError> {
        on_a_free_port(|| Self::start_once(true)).await
    }

    async fn start_once(login: bool) -> Result<Self, SupportError> {
        let binary = locate("docker-registry")?;
        let state = state_dir("registry")?;
        let port = free_port()?;
        let config = state.path().join("config.yml");
        let htpasswd = state.path().join("htpasswd");
        let auth = if login {
            format!(
                "auth:\n  htpasswd:\n    realm: labforge-test\n    path: {}\n",
                htpasswd.display()
            )
        } else {
            String::new()
        };
        let written = std::fs::write(
            &htpasswd,
            format!("{REGISTRY_USER}:{REGISTRY_PASSWORD_BCRYPT}\n"),
        )
        .and_then(|()| {
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                     delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                    state.path().join("storage").display()
                ),
            )
        });
        written.map_err(|source| SupportError::Io {
            doing: "writing the registry config".into(),
            source,
        })?;
        let mut command = Command::new(binary);
        command.arg("serve").arg(&config);
        let mut process = ServiceProcess::spawn("docker-registry", &mut command, port, state)?;
        process
            .wait_ready("/v2/", if login { 401 } else { 200 })
            .await?;
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
            // The account of a registry that requires one; others ignore it.
            .basic_auth(REGISTRY_USER, Some(REGISTRY_PASSWORD))
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
        on_a_free_port(|| Self::start_once(false)).await
    }

    /// A server that checks request signatures: keys it does not know are refused, as S3
    /// refuses wrong credentials.
    pub async fn start_checking_credentials() -> Result<Self, SupportError> {
        on_a_free_port(|| Self::start_once(true)).await
    }

    async fn start_once(checking: bool) -> Result<Self, SupportError> {
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
        if checking {
            command.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_told_apart_by_its_owner() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut other = Command::new("sleep").arg("5").spawn().unwrap();
        assert!(
            listens_on(std::process::id(), port),
            "this process holds it"
        );
        assert!(
            !listens_on(other.id(), port),
            "a process that does not hold the port"
        );
        drop(listener);
        assert!(
            !listens_on(std::process::id(), port),
            "nobody listens anymore"
        );
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn a_process_tree_holds_the_process_and_its_descendants() {
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5; wait"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let tree = eventually_tree(shell.id(), 3);
        assert_eq!(tree[0], shell.id());
        assert!(tree.len() >= 3, "the shell and its two sleeps: {tree:?}");
        assert!(!tree.contains(&std::process::id()));
        let _ = Command::new("kill")
            .args(tree.iter().map(u32::to_string))
            .status();
        let _ = shell.wait();
    }

    /// The tree of `pid` once it has at least `size` processes (children start a moment later).
    fn eventually_tree(pid: u32, size: usize) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let tree = process_tree(pid);
            if tree.len() >= size || Instant::now() > deadline {
                return tree;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
