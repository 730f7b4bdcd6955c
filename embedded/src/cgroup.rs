//! Where a container's CPU and memory counters are and what they say, under cgroup v1 or v2:
//! reading a few small files per sample costs nothing next to asking the engine, which starts a
//! process each time.

use labforge_web::usage::Reading;
use std::io;
use std::path::{Path, PathBuf};

/// Where a process's CPU and memory counters are, under cgroup v1 or v2.
#[derive(Clone, Debug, PartialEq)]
pub enum CgroupFiles {
    V1 { cpuacct: PathBuf, memory: PathBuf },
    V2 { dir: PathBuf },
}

impl CgroupFiles {
    /// The cgroup of process `pid`, from `/proc/<pid>/cgroup`, with `root` the filesystem's root
    /// (`/`, but for tests). With both, the v1 controllers are read: on a hybrid machine the v2
    /// hierarchy has none.
    pub fn of_process(root: &Path, pid: u32) -> io::Result<Self> {
        let text = std::fs::read_to_string(root.join(format!("proc/{pid}/cgroup")))?;
        let (mut cpuacct, mut memory, mut unified) = (None, None, None);
        for line in text.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let path = path.trim_start_matches('/');
            if controllers.is_empty() {
                unified = Some(path);
            }
            for controller in controllers.split(',') {
                match controller {
                    "cpuacct" => cpuacct = Some((controllers, path)),
                    "memory" => memory = Some(path),
                    _ => {}
                }
            }
        }
        let mounts = root.join("sys/fs/cgroup");
        match (cpuacct, memory, unified) {
            (Some((controllers, cpu_path)), Some(memory_path), _) => {
                // Mounted under its controllers' names ("cpu,cpuacct"), often with a link for each.
                let cpu_mount = [controllers, "cpuacct", "cpu,cpuacct"]
                    .iter()
                    .map(|name| mounts.join(name))
                    .find(|dir| dir.is_dir())
                    .ok_or_else(|| io::Error::other("no cpuacct hierarchy under /sys/fs/cgroup"))?;
                Ok(Self::V1 {
                    cpuacct: cpu_mount.join(cpu_path),
                    memory: mounts.join("memory").join(memory_path),
                })
            }
            (_, _, Some(path)) => Ok(Self::V2 {
                dir: mounts.join(path),
            }),
            _ => Err(io::Error::other(format!(
                "process {pid} has neither cgroup v1 cpuacct and memory nor a v2 cgroup"
            ))),
        }
    }

    /// The counters now.
    pub fn read(&self) -> io::Result<Reading> {
        let number = |path: PathBuf| -> io::Result<u64> {
            let text = std::fs::read_to_string(&path)?;
            text.trim().parse().map_err(|_| {
                io::Error::other(format!(
                    "{}: not a number: {:?}",
                    path.display(),
                    text.trim()
                ))
            })
        };
        let stat = |path: PathBuf, key: &str| -> io::Result<u64> {
            let text = std::fs::read_to_string(&path)?;
            text.lines()
                .find_map(|line| {
                    line.strip_prefix(key)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
                .ok_or_else(|| io::Error::other(format!("{}: no {key}", path.display())))
        };
        let at = std::time::Instant::now();
        match self {
            Self::V1 { cpuacct, memory } => {
                let usage = number(memory.join("memory.usage_in_bytes"))?;
                let inactive = stat(memory.join("memory.stat"), "total_inactive_file")?;
                Ok(Reading {
                    cpu_nanos: number(cpuacct.join("cpuacct.usage"))?,
                    at,
                    memory_bytes: usage.saturating_sub(inactive),
                    // No limit is the largest page-aligned value: larger than the machine.
                    memory_limit_bytes: Some(number(memory.join("memory.limit_in_bytes"))?),
                })
            }
            Self::V2 { dir } => {
                let usage = number(dir.join("memory.current"))?;
                let inactive = stat(dir.join("memory.stat"), "inactive_file")?;
                let limit = std::fs::read_to_string(dir.join("memory.max"))?;
                Ok(Reading {
                    cpu_nanos: stat(dir.join("cpu.stat"), "usage_usec")?.saturating_mul(1000),
                    at,
                    memory_bytes: usage.saturating_sub(inactive),
                    memory_limit_bytes: limit.trim().parse().ok(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filesystem root with `/proc/<pid>/cgroup` and the files under `/sys/fs/cgroup`.
    fn root_with(cgroup: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("proc/42/cgroup", cgroup);
        for (path, text) in files {
            write(&format!("sys/fs/cgroup/{path}"), text);
        }
        root
    }

    #[test]
    fn cgroup_v1_counters_are_read_from_the_cpuacct_and_memory_hierarchies() {
        let c = "libpod_parent/libpod-898b";
        let root = root_with(
            &format!("9:name=systemd:/{c}\n4:memory:/{c}\n2:cpu,cpuacct:/{c}\n0::/{c}\n"),
            &[
                (&format!("cpu,cpuacct/{c}/cpuacct.usage"), "40124421\n"),
                (&format!("memory/{c}/memory.usage_in_bytes"), "5000000\n"),
                (
                    &format!("memory/{c}/memory.stat"),
                    "cache 1\ninactive_file 7\ntotal_inactive_file 1000000\n",
                ),
                (&format!("memory/{c}/memory.limit_in_bytes"), "536870912\n"),
            ],
        );
        let files = CgroupFiles::of_process(root.path(), 42).unwrap();
        assert!(matches!(files, CgroupFiles::V1 { .. }), "{files:?}");
        let reading = files.read().unwrap();
        assert_eq!(reading.cpu_nanos, 40_124_421);
        assert_eq!(
            reading.memory_bytes, 4_000_000,
            "the page cache it could drop is left out"
        );
        assert_eq!(reading.memory_limit_bytes, Some(536_870_912));
    }

    #[test]
    fn cgroup_v2_counters_are_read_from_the_unified_hierarchy() {
        let c = "machine.slice/libpod-898b.scope/container";
        let root = root_with(
            &format!("0::/{c}\n"),
            &[
                (
                    &format!("{c}/cpu.stat"),
                    "usage_usec 1500\nuser_usec 1000\n",
                ),
                (&format!("{c}/memory.current"), "3000\n"),
                (&format!("{c}/memory.stat"), "anon 1\ninactive_file 1000\n"),
                (&format!("{c}/memory.max"), "max\n"),
            ],
        );
        let files = CgroupFiles::of_process(root.path(), 42).unwrap();
        assert!(matches!(files, CgroupFiles::V2 { .. }), "{files:?}");
        let reading = files.read().unwrap();
        assert_eq!(reading.cpu_nanos, 1_500_000);
        assert_eq!(reading.memory_bytes, 2000);
        assert_eq!(reading.memory_limit_bytes, None, "max is no limit");

        // The container gone: an error, so the sampler looks for it again.
        std::fs::remove_file(
            root.path()
                .join(format!("sys/fs/cgroup/{c}/memory.current")),
        )
        .unwrap();
        assert!(files.read().is_err());
        assert!(CgroupFiles::of_process(root.path(), 43).is_err());
    }
}
