//! GPUs in the embedded mode: CDI devices handed out exclusively, like a kubelet's device plugin.
//!
//! The devices of each configured vendor are read from the CDI spec files (`/etc/cdi`,
//! `/var/run/cdi`); a notebook asking for N GPUs of a vendor (its container limit) gets N free
//! ones, passed to podman as `--device <kind>=<name>`, and gives them back when it stops or is
//! deleted. When too few are free the notebook waits with an error saying so.

use labforge_crds::notebook::Notebook;
use labforge_web::config::GpuVendor;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GpuError {
    #[error("{requested} {vendor} requested, but {free} of {total} are free")]
    NotEnough {
        vendor: String,
        requested: usize,
        free: usize,
        total: usize,
    },
    #[error("{0} GPUs cannot be given here: no CDI kind is configured for that vendor")]
    NoDevices(String),
}

/// Devices per vendor limits key, and who holds which.
#[derive(Default)]
pub struct GpuPool {
    /// limits key → fully qualified CDI device names (`kind=name`).
    devices: BTreeMap<String, Vec<String>>,
    /// (namespace, notebook) → devices held.
    held: Mutex<HashMap<(String, String), Vec<String>>>,
    /// limits key → the program that reports its devices' use (`nvidia-smi`'s queries).
    smi: BTreeMap<String, PathBuf>,
}

/// One device's use, as `nvidia-smi --query-gpu` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceUse {
    pub index: String,
    pub uuid: String,
    pub utilization_percent: f64,
    pub memory_bytes: u64,
}

/// The arguments that make `nvidia-smi` print one CSV line per device.
pub const SMI_QUERY: [&str; 2] = [
    "--query-gpu=index,uuid,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
];

/// `nvidia-smi`'s answer to [`SMI_QUERY`]: `index, uuid, utilization %, memory MiB` per line;
/// lines it cannot read (`[N/A]` on some boards) are left out.
pub fn parse_smi(output: &str) -> Vec<DeviceUse> {
    output
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, uuid, utilization, memory] = fields[..] else {
                return None;
            };
            Some(DeviceUse {
                index: index.to_owned(),
                uuid: uuid.to_owned(),
                utilization_percent: utilization.parse().ok()?,
                memory_bytes: memory.parse::<u64>().ok()?.checked_mul(1 << 20)?,
            })
        })
        .collect()
}

#[derive(serde::Deserialize)]
struct CdiSpec {
    kind: String,
    #[serde(default)]
    devices: Vec<CdiDevice>,
}

#[derive(serde::Deserialize)]
struct CdiDevice {
    name: String,
}

impl GpuPool {
    /// Reads the devices of `vendors` from the CDI spec files in `dirs`; unreadable files are
    /// skipped with a warning, as podman does.
    pub fn discover(vendors: &[GpuVendor], dirs: &[PathBuf]) -> Self {
        let mut by_kind: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for file in files {
                match read_spec(&file) {
                    Ok(spec) => by_kind.entry(spec.kind.clone()).or_default().extend(
                        spec.devices
                            .iter()
                            .map(|d| format!("{}={}", spec.kind, d.name)),
                    ),
                    Err(err) => {
                        tracing::warn!(file = %file.display(), error = %err, "CDI spec skipped")
                    }
                }
            }
        }
        let devices = vendors
            .iter()
            .map(|v| {
                let kind = v.cdi_kind.clone().unwrap_or_else(|| v.limits_key.clone());
                (
                    v.limits_key.clone(),
                    by_kind.get(&kind).cloned().unwrap_or_default(),
                )
            })
            .collect();
        let smi = vendors
            .iter()
            .filter_map(|v| {
                let program = v.smi.clone().or_else(|| {
                    (v.limits_key == "nvidia.com/gpu").then(|| PathBuf::from("nvidia-smi"))
                })?;
                Some((v.limits_key.clone(), program))
            })
            .collect();
        Self {
            devices,
            held: Mutex::default(),
            smi,
        }
    }

    /// The devices notebook `namespace/name` holds (`kind=name`).
    pub fn held_by(&self, namespace: &str, name: &str) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    /// The program that reports `device`'s use, when its vendor has one.
    pub fn smi_for(&self, device: &str) -> Option<&Path> {
        let (vendor, _) = self
            .devices
            .iter()
            .find(|(_, d)| d.iter().any(|d| d == device))?;
        self.smi.get(vendor).map(PathBuf::as_path)
    }

    /// Vendors that have at least one device.
    pub fn available_vendors(&self) -> Vec<String> {
        self.devices
            .iter()
            .filter(|(_, d)| !d.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The most devices any one vendor has here.
    pub fn most_devices(&self) -> u32 {
        let most = self.devices.values().map(Vec::len).max().unwrap_or(0);
        u32::try_from(most).unwrap_or(u32::MAX)
    }

    /// The devices for `notebook`'s GPU limits: those it holds, those in `preferred` (what its
    /// running container has, after a restart) when free, else the first free ones.
    pub fn assign(
        &self,
        notebook: &Notebook,
        preferred: &[String],
    ) -> Result<Vec<String>, GpuError> {
        let key = (
            notebook.metadata.namespace.clone().unwrap_or_default(),
            notebook.metadata.name.clone().unwrap_or_default(),
        );
        let wanted = gpu_limits(notebook);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut assigned = Vec::new();
        for (vendor, count) in &wanted {
            let all = self.devices.get(vendor).cloned().unwrap_or_default();
            if all.is_empty() {
                return Err(GpuError::NoDevices(vendor.clone()));
            }
            let in_use: Vec<&String> = held
                .iter()
                .filter(|(k, _)| **k != key)
                .flat_map(|(_, d)| d)
                .collect();
            let free: Vec<&String> = all.iter().filter(|d| !in_use.contains(d)).collect();
            if free.len() < *count {
                return Err(GpuError::NotEnough {
                    vendor: vendor.clone(),
                    requested: *count,
                    free: free.len(),
                    total: all.len(),
                });
            }
            let mine = held.get(&key).cloned().unwrap_or_default();
            let mut ordered: Vec<&String> = free
                .iter()
                .copied()
                .filter(|d| mine.contains(d) || preferred.contains(d))
                .collect();
            let rest: Vec<&String> = free
                .iter()
                .copied()
                .filter(|d| !ordered.contains(d))
                .collect();
            ordered.extend(rest);
            assigned.extend(ordered.into_iter().take(*count).cloned());
        }
        if assigned.is_empty() {
            held.remove(&key);
        } else {
            held.insert(key, assigned.clone());
        }
        Ok(assigned)
    }

    pub fn release(&self, namespace: &str, name: &str) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.remove(&(namespace.to_owned(), name.to_owned()));
    }
}

fn read_spec(path: &Path) -> Result<CdiSpec, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    // JSON is YAML too.
    serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())
}

/// The GPU limits of a notebook's container: vendor key → count (non-GPU keys left out).
pub fn gpu_limits(notebook: &Notebook) -> BTreeMap<String, usize> {
    let Some(container) = notebook.container() else {
        return BTreeMap::new();
    };
    container
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .map(|limits| {
            limits
                .iter()
                .filter(|(k, _)| k.contains('/'))
                .filter_map(|(k, q)| Some((k.clone(), q.0.parse::<usize>().ok()?)))
                .filter(|(_, n)| *n > 0)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use labforge_crds::notebook::{NotebookSpec, NotebookTemplateSpec};

    fn notebook(name: &str, gpus: u32) -> Notebook {
        let mut nb = Notebook::new(
            name,
            NotebookSpec {
                template: NotebookTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            resources: Some(ResourceRequirements {
                                limits: Some(
                                    [("example.com/gpu".to_owned(), Quantity(gpus.to_string()))]
                                        .into(),
                                ),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
            },
        );
        nb.metadata.namespace = Some("alice".into());
        nb
    }

    #[test]
    fn nvidia_smis_query_lines_are_read_and_unreadable_ones_left_out() {
        let out = "0, GPU-3b1c, 37, 1024\n1, GPU-9f00, [N/A], 512\n2, GPU-77aa, 5, 0\n\n";
        assert_eq!(
            parse_smi(out),
            [
                DeviceUse {
                    index: "0".into(),
                    uuid: "GPU-3b1c".into(),
                    utilization_percent: 37.0,
                    memory_bytes: 1 << 30,
                },
                DeviceUse {
                    index: "2".into(),
                    uuid: "GPU-77aa".into(),
                    utilization_percent: 5.0,
                    memory_bytes: 0,
                },
            ]
        );
    }

    #[test]
    fn nvidia_devices_are_reported_by_nvidia_smi_unless_told_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("specs.yaml"),
            "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("other.yaml"),
            "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n",
        )
        .unwrap();
        let vendor = |key: &str, smi: Option<&str>| GpuVendor {
            limits_key: key.into(),
            name: key.into(),
            cdi_kind: None,
            smi: smi.map(PathBuf::from),
        };
        let pool = GpuPool::discover(
            &[
                vendor("nvidia.com/gpu", None),
                vendor("example.com/gpu", None),
            ],
            &[dir.path().to_owned()],
        );
        assert_eq!(
            pool.smi_for("nvidia.com/gpu=0"),
            Some(Path::new("nvidia-smi"))
        );
        assert_eq!(
            pool.smi_for("example.com/gpu=0"),
            None,
            "unknown, not guessed"
        );
        let told = GpuPool::discover(
            &[vendor("example.com/gpu", Some("/opt/smi"))],
            &[dir.path().to_owned()],
        );
        assert_eq!(
            told.smi_for("example.com/gpu=0"),
            Some(Path::new("/opt/smi"))
        );
    }

    #[test]
    fn devices_are_exclusive_and_come_back_on_release() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("fake.yaml"),
            "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n- name: \"1\"\n  containerEdits: {}\n",
        )
        .unwrap();
        let vendors = [GpuVendor {
            limits_key: "example.com/gpu".into(),
            name: "Example".into(),
            cdi_kind: None,
            smi: None,
        }];
        let pool = GpuPool::discover(&vendors, &[dir.path().to_owned()]);
        assert_eq!(pool.available_vendors(), ["example.com/gpu"]);
        assert_eq!(pool.most_devices(), 2);
        assert_eq!(GpuPool::default().most_devices(), 0);
        let a = pool.assign(&notebook("a", 1), &[]).unwrap();
        let b = pool.assign(&notebook("b", 1), &[]).unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.held_by("alice", "a"), a);
        // Asking again keeps what it holds.
        assert_eq!(pool.assign(&notebook("a", 1), &[]).unwrap(), a);
        let err = pool.assign(&notebook("c", 1), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "1 example.com/gpu requested, but 0 of 2 are free"
        );
        pool.release("alice", "a");
        assert_eq!(pool.assign(&notebook("c", 1), &[]).unwrap(), a);
        assert!(pool.assign(&notebook("d", 0), &[]).unwrap().is_empty());
    }
}
