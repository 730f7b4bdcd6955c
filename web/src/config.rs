//! What the admin decides for the spawner: the image catalog, GPU vendors and defaults. Served at
//! `/api/config` so the form offers exactly what the API accepts.

use crate::model::ServerType;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpawnerConfig {
    pub images: Vec<CatalogImage>,
    /// Whether users may type an image that is not in the catalog.
    #[serde(default = "yes")]
    pub allow_custom_images: bool,
    #[serde(default)]
    pub gpu_vendors: Vec<GpuVendor>,
    #[serde(default)]
    pub defaults: Defaults,
    /// Choices only Kubeflow's form makes (affinity, tolerations, PodDefaults, limit factors).
    #[serde(default)]
    pub kubeflow: crate::kubeflow::KubeflowChoices,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogImage {
    pub image: String,
    pub server_type: ServerType,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub default: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuVendor {
    /// The limits key, e.g. `nvidia.com/gpu`.
    pub limits_key: String,
    pub name: String,
    /// Embedded mode: the CDI kind whose devices are handed out, e.g. `nvidia.com/gpu`.
    #[serde(default)]
    pub cdi_kind: Option<String>,
    /// Embedded mode: the program that reports the devices' use as `nvidia-smi` does; default
    /// `nvidia-smi` for `nvidia.com/gpu`, none for other vendors (their use is shown as unknown).
    /// Not sent to browsers.
    #[serde(default, skip_serializing)]
    pub smi: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Defaults {
    pub cpu: String,
    pub memory: String,
    pub workspace_size: String,
    pub shm_size: String,
    /// Upper bounds a user may ask for.
    pub max_cpu: String,
    pub max_memory: String,
    pub max_gpus: u32,
    pub max_volume_size: String,
    /// Notebooks save their environment before each stop unless their owner says otherwise.
    #[serde(default)]
    pub auto_save: bool,
    /// Saved images kept per notebook (the newest); 0 keeps all.
    #[serde(default)]
    pub keep_saved_images: usize,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            cpu: "0.5".into(),
            memory: "1Gi".into(),
            workspace_size: "5Gi".into(),
            shm_size: "256Mi".into(),
            max_cpu: "16".into(),
            max_memory: "64Gi".into(),
            max_gpus: 8,
            max_volume_size: "1Ti".into(),
            auto_save: false,
            keep_saved_images: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnerConfigError {
    #[error("neither JSON nor YAML: {0}")]
    Syntax(#[from] serde_yaml_ng::Error),
    #[error("Kubeflow's spawner_ui_config: {0}")]
    Kubeflow(#[from] crate::kubeflow::SpawnerYamlError),
    #[error("{0}")]
    Fields(#[from] serde_json::Error),
}

impl SpawnerConfig {
    /// A spawner config file: labforge's own (JSON, or the same as YAML), or Kubeflow's
    /// `spawner_ui_config.yaml` (a `spawnerFormDefaults` document).
    pub fn parse(text: &str) -> Result<Self, SpawnerConfigError> {
        let document: serde_json::Value = serde_yaml_ng::from_str(text)?;
        if crate::kubeflow::is_spawner_ui_config(&document) {
            Ok(crate::kubeflow::spawner_config_from_yaml(&document)?)
        } else {
            Ok(serde_json::from_value(document)?)
        }
    }

    /// The catalog's default image for `server_type`: the one flagged default, else the first.
    pub fn default_image(&self, server_type: ServerType) -> Option<&str> {
        let of_type = || self.images.iter().filter(|i| i.server_type == server_type);
        of_type()
            .find(|i| i.default)
            .or_else(|| of_type().next())
            .map(|i| i.image.as_str())
    }

    pub fn in_catalog(&self, image: &str) -> bool {
        self.images.iter().any(|i| i.image == image)
    }
}

/// The default catalog: the JupyterLab (and, when pushed, code-server) images of the registry.
pub fn default_spawner(registry: &str) -> SpawnerConfig {
    SpawnerConfig {
        images: vec![
            CatalogImage {
                image: format!("{registry}/labforge/jupyterlab:latest"),
                server_type: ServerType::Jupyter,
                description: "JupyterLab with Python 3".into(),
                default: true,
            },
            CatalogImage {
                image: format!("{registry}/labforge/codeserver:latest"),
                server_type: ServerType::Vscode,
                description: "VSCode in the browser (code-server)".into(),
                default: true,
            },
        ],
        allow_custom_images: true,
        gpu_vendors: Vec::new(),
        defaults: Default::default(),
        kubeflow: Default::default(),
    }
}
