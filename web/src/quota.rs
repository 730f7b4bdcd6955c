//! Quotas per namespace: how much CPU, memory and how many GPUs and running notebooks one
//! namespace's notebooks may hold at once, as an admin sets them (Kubeflow gives each profile a
//! ResourceQuota). Checked when a notebook is created to run and when one is started; a refusal
//! names the quota, what is in use and what was asked.
//!
//! What counts is what running notebooks hold: their limits (the request where no limit is
//! set), as a ResourceQuota counts `limits.cpu` and `limits.memory`. Stopped notebooks hold
//! nothing.

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
}

/// What running notebooks hold, or what one asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub cpu: f64,
    pub memory_bytes: f64,
    pub gpus: u32,
    pub notebooks: u32,
}

impl Held {
    /// What `notebook` holds while it runs.
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
        }
    }

    /// What the running ones of `notebooks` hold, leaving out `except` (the one being changed).
    pub fn running<'a>(notebooks: impl IntoIterator<Item = &'a Notebook>, except: &str) -> Self {
        notebooks
            .into_iter()
            .filter(|nb| !nb.is_stopped() && nb.metadata.name.as_deref() != Some(except))
            .map(Held::of)
            .fold(Held::default(), |sum, held| Held {
                cpu: sum.cpu + held.cpu,
                memory_bytes: sum.memory_bytes + held.memory_bytes,
                gpus: sum.gpus + held.gpus,
                notebooks: sum.notebooks + held.notebooks,
            })
    }
}

/// Why a notebook may not run: the first quota it would exceed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "namespace {namespace}'s quota for {resource} is {quota}: {in_use} in use, {asked} asked; stop a notebook or ask an admin for more"
)]
pub struct QuotaExceeded {
    pub namespace: String,
    /// `cpu`, `memory`, `gpus` or `notebooks`.
    pub resource: &'static str,
    pub quota: String,
    pub in_use: String,
    pub asked: String,
}

impl Quota {
    /// Whether `asked` fits beside `in_use` in `namespace`.
    pub fn admits(&self, namespace: &str, in_use: Held, asked: Held) -> Result<(), QuotaExceeded> {
        let exceeded = |resource, quota: String, in_use: String, asked: String| QuotaExceeded {
            namespace: namespace.to_owned(),
            resource,
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
        Ok(())
    }

    /// What is wrong with this quota as an admin wrote it, field by field.
    pub fn problems(&self) -> crate::validate::FieldErrors {
        let mut problems = crate::validate::FieldErrors::default();
        for (field, value) in [("cpu", &self.cpu), ("memory", &self.memory)] {
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

fn cores(n: f64) -> String {
    format!("{}", (n * 1000.0).round() / 1000.0)
}

fn gibibytes(bytes: f64) -> String {
    format!("{:.2}Gi", bytes / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(cpu: f64, gib: f64, gpus: u32, notebooks: u32) -> Held {
        Held {
            cpu,
            memory_bytes: gib * f64::from(1u32 << 30),
            gpus,
            notebooks,
        }
    }

    #[test]
    fn a_quota_names_what_is_exceeded_with_use_and_ask() {
        let quota = Quota {
            cpu: Some("2".into()),
            memory: Some("4Gi".into()),
            gpus: Some(1),
            notebooks: Some(3),
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
            (memory.resource, memory.in_use.as_str()),
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
    fn a_quota_that_does_not_parse_says_which_field() {
        let quota = Quota {
            cpu: Some("lots".into()),
            ..Default::default()
        };
        assert_eq!(quota.problems().as_slice()[0].field, "cpu");
    }
}
