//! Samples the embedded mode's running notebooks: each container's cgroup counters
//! ([`CgroupFiles`]), a few small files, where asking the engine (`podman stats`) would start a
//! process of its own each time; and their GPUs' use from the vendor's program, once per sample.

use crate::cgroup::CgroupFiles;
use labforge_web::usage::{GpuUse, Key, Reading, UsageBoard};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often the running notebooks are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(3);

/// How long a GPU vendor's program may take to report.
const SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// The machine's memory, from `/proc/meminfo`; `u64::MAX` when it cannot be read (every limit
/// is then taken as one).
fn machine_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(u64::MAX)
}

/// How long a container whose cgroup could not be found is left before it is looked up again.
const LOOKUP_RETRY: Duration = Duration::from_secs(30);

/// A running container's counters, found once from its main process.
#[derive(Clone, Debug)]
struct Tracked {
    pid: u32,
    files: CgroupFiles,
}

impl Tracked {
    /// The cgroup of container `id`'s process `pid`: refused unless the container has one of its
    /// own (its path names the container), since a shared one counts others' use too.
    fn find(id: &str, pid: u32) -> io::Result<Self> {
        let files = CgroupFiles::of_process(Path::new("/"), pid)?;
        let own = match &files {
            CgroupFiles::V1 { memory, .. } => memory.to_string_lossy().contains(id),
            CgroupFiles::V2 { dir } => dir.to_string_lossy().contains(id),
        };
        if !own {
            return Err(io::Error::other(format!(
                "the container's process is not in a cgroup of its own: {files:?}"
            )));
        }
        Ok(Self { pid, files })
    }

    /// Its counters, while its process lives: a replaced container's old cgroup may linger.
    fn read(&self) -> io::Result<Reading> {
        if !Path::new(&format!("/proc/{}", self.pid)).exists() {
            return Err(io::Error::other(format!("process {} is gone", self.pid)));
        }
        self.files.read()
    }
}

/// Samples the running notebooks' containers every [`SAMPLE_INTERVAL`], forever, and tells the
/// namespaces' watchers (a [`labforge_web::backend::Change::Usage`]) when their use changed. Each
/// container's cgroup is found once (one `inspect`); a container replaced since is found again,
/// and one that cannot be found is left for [`LOOKUP_RETRY`].
pub async fn sample_forever(runtime: Arc<crate::runtime::Runtime>, board: Arc<UsageBoard>) {
    let machine_memory = machine_memory_bytes();
    let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
    let mut retry_after: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut smi_retry_after: BTreeMap<PathBuf, tokio::time::Instant> = BTreeMap::new();
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let running: Vec<(Key, String)> = runtime
            .store
            .list(None)
            .iter()
            .filter_map(|nb| {
                let ns = nb.metadata.namespace.clone().unwrap_or_default();
                let name = nb.metadata.name.clone().unwrap_or_default();
                runtime.port_of(&ns, &name)?;
                let container = crate::runtime::container_name(&ns, &name);
                Some(((ns, name), container))
            })
            .collect();
        let is_running = |container: &String| running.iter().any(|(_, c)| c == container);
        tracked.retain(|container, _| is_running(container));
        retry_after.retain(|container, _| is_running(container));
        let now = tokio::time::Instant::now();
        for (_, container) in &running {
            if tracked.contains_key(container)
                || retry_after.get(container).is_some_and(|t| *t > now)
            {
                continue;
            }
            let found = match runtime.engine.process_of(container).await {
                Ok((id, pid)) => tokio::task::spawn_blocking(move || Tracked::find(&id, pid))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|found| found.map_err(|e| e.to_string())),
                Err(err) => Err(err.to_string()),
            };
            match found {
                Ok(found) => {
                    retry_after.remove(container);
                    tracked.insert(container.clone(), found);
                }
                Err(err) => {
                    tracing::debug!(%container, error = %err, "finding its cgroup");
                    retry_after.insert(container.clone(), now + LOOKUP_RETRY);
                }
            }
        }
        let to_read: Vec<(Key, String, Tracked)> = running
            .into_iter()
            .filter_map(|(key, container)| {
                let found = tracked.get(&container)?.clone();
                Some((key, container, found))
            })
            .collect();
        let Ok(read) = tokio::task::spawn_blocking(move || {
            to_read
                .into_iter()
                .map(|(key, container, found)| (key, container, found.read()))
                .collect::<Vec<_>>()
        })
        .await
        else {
            continue;
        };
        let mut readings = Vec::new();
        for (key, container, reading) in read {
            match reading {
                Ok(reading) => readings.push((key, reading)),
                Err(err) => {
                    // Gone or replaced: looked up again next time.
                    tracing::debug!(%container, error = %err, "reading its cgroup");
                    tracked.remove(&container);
                }
            }
        }
        let keys: Vec<Key> = readings.iter().map(|(key, _)| key.clone()).collect();
        let gpu_use = gpu_use(&runtime.gpus, &keys, &mut smi_retry_after).await;
        for namespace in board.record(readings, &gpu_use, machine_memory) {
            runtime.store.notify_usage(&namespace);
        }
    }
}

/// Each running notebook's GPU use, from its devices' vendor's program (`nvidia-smi`), run once
/// per sample whatever the number of notebooks. A notebook any of whose devices is not reported
/// is left out: its use is unknown, never guessed.
async fn gpu_use(
    gpus: &crate::gpus::GpuPool,
    running: &[Key],
    retry_after: &mut BTreeMap<PathBuf, tokio::time::Instant>,
) -> BTreeMap<Key, GpuUse> {
    let held: Vec<(Key, Vec<String>)> = running
        .iter()
        .map(|key| (key.clone(), gpus.held_by(&key.0, &key.1)))
        .filter(|(_, devices)| !devices.is_empty())
        .collect();
    let programs: BTreeSet<PathBuf> = held
        .iter()
        .flat_map(|(_, devices)| devices.iter())
        .filter_map(|device| gpus.smi_for(device).map(Path::to_owned))
        .collect();
    let mut reported: BTreeMap<PathBuf, Vec<crate::gpus::DeviceUse>> = BTreeMap::new();
    let now = tokio::time::Instant::now();
    for program in programs {
        // One that failed (a wedged GPU can hang it) is left alone for a while.
        if retry_after.get(&program).is_some_and(|t| *t > now) {
            continue;
        }
        match run_smi(&program).await {
            Ok(devices) => {
                retry_after.remove(&program);
                reported.insert(program, devices);
            }
            Err(err) => {
                tracing::debug!(program = %program.display(), error = %err, "reading GPU use");
                retry_after.insert(program, now + LOOKUP_RETRY);
            }
        }
    }
    held.into_iter()
        .filter_map(|(key, devices)| {
            let uses = devices
                .iter()
                .map(|device| {
                    let (_, name) = device.split_once('=')?;
                    reported
                        .get(gpus.smi_for(device)?)?
                        .iter()
                        .find(|u| u.index == name || u.uuid == name)
                })
                .collect::<Option<Vec<_>>>()?;
            let utilization =
                uses.iter().map(|u| u.utilization_percent).sum::<f64>() / uses.len() as f64;
            let memory = uses.iter().map(|u| u.memory_bytes).sum();
            Some((
                key,
                GpuUse {
                    utilization_percent: utilization,
                    memory_bytes: memory,
                },
            ))
        })
        .collect()
}

async fn run_smi(program: &Path) -> Result<Vec<crate::gpus::DeviceUse>, String> {
    let output = tokio::process::Command::new(program)
        .args(crate::gpus::SMI_QUERY)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SMI_TIMEOUT, output)
        .await
        .map_err(|_| format!("no answer within {SMI_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(crate::gpus::parse_smi(&String::from_utf8_lossy(
        &output.stdout,
    )))
}
