//! Quotas per namespace: how much CPU, memory and how many GPUs and running notebooks one
//! namespace's notebooks may hold at once, and how much workspace storage its volumes may ask
//! for, as an admin sets them (Kubeflow gives each profile a ResourceQuota). Checked when a
//! notebook is created, started or resized; a refusal names the quota, what is in use and what
//! was asked.
//!
//! CPU, memory and GPUs count what running notebooks hold: their limits (the request where no
//! limit is set), as a ResourceQuota counts `limits.cpu` and `limits.memory`; stopped notebooks
//! hold none. Storage counts every volume of the namespace, running or not, deleted notebooks'
//! kept volumes included, by the size each was asked with, as `requests.storage` does.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use labforge_crds::notebook::Notebook;
use serde::{Deserialize, Serialize};

/// A namespace's quota; an absent field is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quota {
    /// CPU cores, as a quantity (`4`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory, as a quantity (`16Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Notebooks running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notebooks: Option<u32>,
    /// Workspace and data volumes together, as a quantity (`100Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
}

/// What a namespace's notebooks and volumes hold, or what one notebook asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub cpu: f64,
    pub memory_bytes: f64,
    pub gpus: u32,
    pub notebooks: u32,
    /// The sizes of volumes, whether their notebooks run or not.
    pub storage_bytes: f64,
}

impl std::ops::Add for Held {
    type Output = Held;
    fn add(self, other: Held) -> Held {
        Held {
            cpu: self.cpu + other.cpu,
            memory_bytes: self.memory_bytes + other.memory_bytes,
            gpus: self.gpus + other.gpus,
            notebooks: self.notebooks + other.notebooks,
            storage_bytes: self.storage_bytes + other.storage_bytes,
        }
    }
}

impl Held {
    /// What `notebook` holds while it runs (its volumes are counted apart: they stay when it
    /// stops).
    pub fn of(notebook: &Notebook) -> Self {
        let resources = notebook.container().and_then(|c| c.resources.as_ref());
        let amount = |key: &str| -> f64 {
            let limits = resources.and_then(|r| r.limits.as_ref());
            let requests = resources.and_then(|r| r.requests.as_ref());
            limits
                .and_then(|l| l.get(key))
                .or_else(|| requests.and_then(|r| r.get(key)))
                .and_then(|q| crate::validate::quantity(key, &q.0).ok())
                .unwrap_or(0.0)
        };
        let gpus = resources
            .and_then(|r| r.limits.as_ref())
            .into_iter()
            .flatten()
            .filter(|(key, _)| key.contains('/'))
            .filter_map(|(_, q)| q.0.parse::<u32>().ok())
            .sum();
        Held {
            cpu: amount("cpu"),
            memory_bytes: amount("memory"),
            gpus,
            notebooks: 1,
            storage_bytes: 0.0,
        }
    }

    /// The storage a new notebook asks for: the sizes of the volumes it makes, leaving out
    /// those of `claims` (which exist already: a deleted notebook's kept workspace is taken
    /// over by a new one of its name).
    pub fn new_volumes(notebook: &Notebook, claims: &[crate::workloads::Claim]) -> Self {
        Held {
            storage_bytes: notebook
                .volume_sizes()
                .iter()
                .filter(|(name, _)| !claims.iter().any(|claim| &claim.name == *name))
                .filter_map(|(_, size)| crate::validate::quantity("storage", size).ok())
                .sum(),
            ..Held::default()
        }
    }

    /// The storage a namespace holds: each of its `claims`, and each volume one of its
    /// `notebooks` asked for that is not made yet (a notebook made stopped, or still starting).
    /// A claim counts the size it has; one whose platform keeps none (a podman volume made
    /// before sizes were labelled) counts the size a notebook asked it with, or nothing.
    pub fn claims<'a>(
        claims: &[crate::workloads::Claim],
        notebooks: impl IntoIterator<Item = &'a Notebook>,
    ) -> Self {
        let mut sizes: std::collections::BTreeMap<String, String> = notebooks
            .into_iter()
            .flat_map(Notebook::volume_sizes)
            .collect();
        for claim in claims {
            if !claim.size.is_empty() || !sizes.contains_key(&claim.name) {
                sizes.insert(claim.name.clone(), claim.size.clone());
            }
        }
        Held {
            storage_bytes: sizes
                .values()
                .filter_map(|size| crate::validate::quantity("storage", size).ok())
                .sum(),
            ..Held::default()
        }
    }

    /// What the running ones of `notebooks` hold, leaving out `except` (the one being changed).
    pub fn running<'a>(notebooks: impl IntoIterator<Item = &'a Notebook>, except: &str) -> Self {
        notebooks
            .into_iter()
            .filter(|nb| !nb.is_stopped() && nb.metadata.name.as_deref() != Some(except))
            .map(Held::of)
            .fold(Held::default(), |sum, held| sum + held)
    }
}

/// Why a notebook may not run: the first quota it would exceed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "namespace {namespace}'s quota for {resource} is {quota}: {in_use} in use, {asked} asked; {} or ask an admin for more",
    if *.resource == "storage" { "delete a volume" } else { "stop a notebook" }
)]
pub struct QuotaExceeded {
    pub namespace: String,
    /// `cpu`, `memory`, `gpus`, `running notebooks`, `storage`, or the ResourceQuota's own
    /// name for what the API server refused.
    pub resource: String,
    pub quota: String,
    pub in_use: String,
    pub asked: String,
}

impl Quota {
    /// Whether `asked` fits beside `in_use` in `namespace`.
    pub fn admits(&self, namespace: &str, in_use: Held, asked: Held) -> Result<(), QuotaExceeded> {
        let exceeded =
            |resource: &str, quota: String, in_use: String, asked: String| QuotaExceeded {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
                quota,
                in_use,
                asked,
            };
        if let Some(max) = self.notebooks
            && in_use.notebooks + asked.notebooks > max
        {
            return Err(exceeded(
                "running notebooks",
                max.to_string(),
                in_use.notebooks.to_string(),
                asked.notebooks.to_string(),
            ));
        }
        if let Some(quota) = &self.cpu
            && let Ok(max) = crate::validate::quantity("cpu", quota)
            && in_use.cpu + asked.cpu > max + 1e-9
        {
            return Err(exceeded(
                "cpu",
                quota.clone(),
                cores(in_use.cpu),
                cores(asked.cpu),
            ));
        }
        if let Some(quota) = &self.memory
            && let Ok(max) = crate::validate::quantity("memory", quota)
            && in_use.memory_bytes + asked.memory_bytes > max
        {
            return Err(exceeded(
                "memory",
                quota.clone(),
                gibibytes(in_use.memory_bytes),
                gibibytes(asked.memory_bytes),
            ));
        }
        if let Some(max) = self.gpus
            && in_use.gpus + asked.gpus > max
        {
            return Err(exceeded(
                "gpus",
                max.to_string(),
                in_use.gpus.to_string(),
                asked.gpus.to_string(),
            ));
        }
        if let Some(quota) = &self.storage
            && let Ok(max) = crate::validate::quantity("storage", quota)
            && asked.storage_bytes > 0.0
            && in_use.storage_bytes + asked.storage_bytes > max
        {
            return Err(exceeded(
                "storage",
                quota.clone(),
                gibibytes(in_use.storage_bytes),
                gibibytes(asked.storage_bytes),
            ));
        }
        Ok(())
    }

    /// The quota a namespace's ResourceQuotas set, in the terms labforge checks (the tightest
    /// where several set one): `limits.cpu`, `limits.memory`, `requests.<vendor>/<gpu>`,
    /// `count/pods` (each running notebook is a pod) and `requests.storage`. `None` when they
    /// set none of these.
    pub fn from_resource_quotas<'a>(
        hards: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, Quantity>>,
    ) -> Option<Quota> {
        let mut quota = Quota::default();
        let tighter_text = |slot: &mut Option<String>, field: &str, value: &str| {
            let Ok(amount) = crate::validate::quantity(field, value) else {
                return;
            };
            let current = slot
                .as_deref()
                .and_then(|q| crate::validate::quantity(field, q).ok());
            if current.is_none_or(|current| amount < current) {
                *slot = Some(value.to_owned());
            }
        };
        let tighter_count = |slot: &mut Option<u32>, value: &str| {
            if let Ok(count) = value.parse::<u32>() {
                *slot = Some(slot.map_or(count, |current| current.min(count)));
            }
        };
        for hard in hards {
            for (key, value) in hard {
                let value = value.0.as_str();
                match key.as_str() {
                    "limits.cpu" => tighter_text(&mut quota.cpu, "cpu", value),
                    "limits.memory" => tighter_text(&mut quota.memory, "memory", value),
                    "requests.storage" => tighter_text(&mut quota.storage, "storage", value),
                    "count/pods" | "pods" => tighter_count(&mut quota.notebooks, value),
                    key if key.starts_with("requests.") && key.contains('/') => {
                        tighter_count(&mut quota.gpus, value)
                    }
                    _ => {}
                }
            }
        }
        (quota != Quota::default()).then_some(quota)
    }

    /// What is wrong with this quota as an admin wrote it, field by field.
    pub fn problems(&self) -> crate::validate::FieldErrors {
        let mut problems = crate::validate::FieldErrors::default();
        for (field, value) in [
            ("cpu", &self.cpu),
            ("memory", &self.memory),
            ("storage", &self.storage),
        ] {
            if let Some(Err(problem)) = value
                .as_deref()
                .map(|v| crate::validate::quantity(field, v))
            {
                problems.push(problem);
            }
        }
        problems
    }
}

impl QuotaExceeded {
    /// The API server's refusal of an object over a ResourceQuota, in the same words as
    /// labforge's own: its message reads `… is forbidden: exceeded quota: NAME, requested:
    /// K=V[,K=V], used: K=V[,…], limited: K=V[,…]`. `None` for any other message.
    pub fn from_api_refusal(namespace: &str, message: &str) -> Option<QuotaExceeded> {
        let (_, rest) = message.split_once("exceeded quota: ")?;
        let (_, rest) = rest.split_once(", requested: ")?;
        let (requested, rest) = rest.split_once(", used: ")?;
        let (used, limited) = rest.split_once(", limited: ")?;
        let pairs = |list: &str| -> Vec<(String, String)> {
            list.split(',')
                .filter_map(|pair| pair.trim().split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let value_of = |list: &[(String, String)], key: &str| {
            list.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| "0".to_owned())
        };
        let (key, limit) = pairs(limited).into_iter().next()?;
        let resource = match key.as_str() {
            "limits.cpu" => "cpu",
            "limits.memory" => "memory",
            "requests.storage" => "storage",
            "count/pods" | "pods" => "running notebooks",
            key if key.starts_with("requests.") && key.contains('/') => "gpus",
            key => key,
        };
        Some(QuotaExceeded {
            namespace: namespace.to_owned(),
            resource: resource.to_owned(),
            quota: limit,
            in_use: value_of(&pairs(used), &key),
            asked: value_of(&pairs(requested), &key),
        })
    }
}

fn cores(n: f64) -> String {
    format!("{}", (n * 1000.0).round() / 1000.0)
}

fn gibibytes(bytes: f64) -> String {
    format!("{:.2}Gi", bytes / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    fn held(cpu: f64, gib: f64, gpus: u32, notebooks: u32) -> Held {
        Held {
            cpu,
            memory_bytes: gib * GIB,
            gpus,
            notebooks,
            storage_bytes: 0.0,
        }
    }

    fn storage(gib: f64) -> Held {
        Held {
            storage_bytes: gib * GIB,
            ..Held::default()
        }
    }

    #[test]
    fn a_quota_names_what_is_exceeded_with_use_and_ask() {
        let quota = Quota {
            cpu: Some("2".into()),
            memory: Some("4Gi".into()),
            gpus: Some(1),
            notebooks: Some(3),
            storage: None,
        };
        assert_eq!(
            quota.admits("alice", held(1.5, 3.0, 1, 2), held(0.5, 1.0, 0, 1)),
            Ok(())
        );
        let cpu = quota
            .admits("alice", held(1.5, 1.0, 0, 1), held(1.0, 1.0, 0, 1))
            .unwrap_err();
        assert_eq!(
            cpu.to_string(),
            "namespace alice's quota for cpu is 2: 1.5 in use, 1 asked; stop a notebook or ask an admin for more"
        );
        let memory = quota
            .admits("alice", held(0.5, 3.5, 0, 1), held(0.5, 1.0, 0, 1))
            .unwrap_err();
        assert_eq!(
            (memory.resource.as_str(), memory.in_use.as_str()),
            ("memory", "3.50Gi")
        );
        let notebooks = quota
            .admits("alice", held(0.5, 1.0, 0, 3), held(0.1, 0.1, 0, 1))
            .unwrap_err();
        assert_eq!(notebooks.resource, "running notebooks");
        let gpus = quota
            .admits("alice", held(0.5, 1.0, 1, 1), held(0.5, 1.0, 1, 1))
            .unwrap_err();
        assert_eq!(gpus.resource, "gpus");
        assert_eq!(
            Quota::default().admits("alice", held(64.0, 512.0, 8, 50), held(16.0, 64.0, 8, 1)),
            Ok(())
        );
    }

    #[test]
    fn storage_counts_every_claim_and_only_new_volumes_ask_for_more() {
        let quota = Quota {
            storage: Some("10Gi".into()),
            ..Quota::default()
        };
        let claim = |name: &str, size: &str| crate::workloads::Claim {
            name: name.into(),
            size: size.into(),
            mode: "ReadWriteOnce".into(),
        };
        let mut notebook = Notebook::new("lab", Default::default());
        notebook.metadata.annotations = Some(
            [(
                crate::validate::VOLUME_SIZES_ANNOTATION.to_owned(),
                r#"{"lab-workspace":"3Gi","data":"2Gi"}"#.to_owned(),
            )]
            .into(),
        );
        // A claim without a size of its own counts what its notebook asked; one nobody asked
        // for counts nothing; a volume asked for and not made yet counts what was asked.
        let in_use = Held::claims(
            &[
                claim("kept", "4Gi"),
                claim("lab-workspace", ""),
                claim("unknown", ""),
            ],
            [&notebook],
        );
        assert_eq!(in_use.storage_bytes, 9.0 * GIB);
        let in_use = Held::claims(&[claim("kept", "4Gi"), claim("data", "2Gi")], [&notebook]);
        assert_eq!(in_use.storage_bytes, 9.0 * GIB);
        let in_use = Held::claims(&[claim("kept", "4Gi")], []);
        assert_eq!(Held::new_volumes(&notebook, &[]).storage_bytes, 5.0 * GIB);
        assert_eq!(
            Held::new_volumes(&notebook, &[claim("lab-workspace", "")]).storage_bytes,
            2.0 * GIB
        );
        assert_eq!(quota.admits("alice", in_use, storage(6.0)), Ok(()));
        let refused = quota.admits("alice", in_use, storage(6.5)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "namespace alice's quota for storage is 10Gi: 4.00Gi in use, 6.50Gi asked; delete a volume or ask an admin for more"
        );
        // Starting a notebook asks for no storage, even in a namespace already over its quota.
        assert_eq!(
            quota.admits("alice", storage(12.0), held(1.0, 1.0, 0, 1)),
            Ok(())
        );
    }

    #[test]
    fn a_namespaces_resource_quotas_become_the_tightest_quota_labforge_checks() {
        let hard = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, Quantity> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect()
        };
        let quotas = [
            hard(&[
                ("limits.cpu", "8"),
                ("limits.memory", "16Gi"),
                ("requests.nvidia.com/gpu", "2"),
                ("requests.cpu", "4"),
            ]),
            hard(&[
                ("limits.cpu", "6000m"),
                ("count/pods", "5"),
                ("requests.storage", "100Gi"),
            ]),
        ];
        assert_eq!(
            Quota::from_resource_quotas(&quotas),
            Some(Quota {
                cpu: Some("6000m".into()),
                memory: Some("16Gi".into()),
                gpus: Some(2),
                notebooks: Some(5),
                storage: Some("100Gi".into()),
            })
        );
        assert_eq!(
            Quota::from_resource_quotas(&[hard(&[("requests.cpu", "4")])]),
            None
        );
    }

    #[test]
    fn the_api_servers_quota_refusal_reads_as_labforges() {
        let refused = QuotaExceeded::from_api_refusal(
            "alice",
            "persistentvolumeclaims \"lab-workspace\" is forbidden: exceeded quota: kf-resource-quota, requested: requests.storage=10Gi, used: requests.storage=95Gi, limited: requests.storage=100Gi",
        )
        .unwrap();
        assert_eq!(
            refused.to_string(),
            "namespace alice's quota for storage is 100Gi: 95Gi in use, 10Gi asked; delete a volume or ask an admin for more"
        );
        assert_eq!(
            QuotaExceeded::from_api_refusal("alice", "pods \"x\" is forbidden: not allowed"),
            None
        );
    }

    #[test]
    fn a_quota_that_does_not_parse_says_which_field() {
        let quota = Quota {
            cpu: Some("lots".into()),
            ..Default::default()
        };
        assert_eq!(quota.problems().as_slice()[0].field, "cpu");
    }
}
