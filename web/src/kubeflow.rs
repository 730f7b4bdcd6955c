//! Kubeflow's jupyter web app API, served by the same routes as labforge's own: scripts and the
//! central dashboard written against Kubeflow keep working. Its spawner form is read into a
//! labforge request ([`request_from_form`]), its `spawner_ui_config.yaml` into the spawner config
//! ([`spawner_config_from_yaml`]), and its answers' fields are added beside labforge's
//! ([`envelope`], [`list_item`], [`processed_status`]).

use crate::config::{CatalogImage, Defaults, GpuVendor, SpawnerConfig};
use crate::model::{
    DataVolumeRequest, GpuRequest, ImagePullPolicy, NotebookRequest, NotebookState, NotebookView,
    ServerType, WorkspaceRequest,
};
use crate::users::User;
use crate::validate::{FieldError, FieldErrors, HOME, workspace_claim};
use k8s_openapi::api::core::v1::{Affinity, PersistentVolumeClaim, Toleration};
use labforge_crds::notebook::Notebook;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// What Kubeflow's form offers beyond labforge's own: node affinities and toleration groups to
/// pick from, PodDefault labels set by default, limits as a factor of requests, and the fields
/// an admin fixed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeflowChoices {
    #[serde(default)]
    pub affinity_configs: Vec<AffinityConfig>,
    /// The affinity's `configKey` used when a request names none; empty: none.
    #[serde(default)]
    pub default_affinity_config: String,
    #[serde(default)]
    pub toleration_groups: Vec<TolerationGroup>,
    #[serde(default)]
    pub default_toleration_group: String,
    /// PodDefault labels a request without `configurations` gets.
    #[serde(default)]
    pub configurations: Vec<String>,
    /// Kubeflow form fields (`cpu`, `gpus`, `shm`...) a request may not set: the defaults hold.
    #[serde(default)]
    pub read_only: Vec<String>,
    /// A limit left out of a Kubeflow form is the request times this (Kubeflow's `limitFactor`);
    /// `None` or "none": the limit is the request.
    #[serde(default)]
    pub cpu_limit_factor: Option<String>,
    #[serde(default)]
    pub memory_limit_factor: Option<String>,
    /// Kubeflow's `spawnerFormDefaults` as the admin wrote them, served to its clients unchanged.
    #[serde(default, skip_serializing)]
    pub form_defaults: Option<Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AffinityConfig {
    pub config_key: String,
    #[serde(default)]
    pub display_name: String,
    pub affinity: Affinity,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TolerationGroup {
    pub group_key: String,
    #[serde(default)]
    pub display_name: String,
    pub tolerations: Vec<Toleration>,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnerYamlError {
    #[error("not YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("spawnerFormDefaults.{field}: {message}")]
    Field { field: String, message: String },
}

fn yaml_field(field: &str, message: impl ToString) -> SpawnerYamlError {
    SpawnerYamlError::Field {
        field: field.to_owned(),
        message: message.to_string(),
    }
}

/// Whether `text` is Kubeflow's `spawner_ui_config.yaml` (a `spawnerFormDefaults` document)
/// rather than labforge's own spawner config.
pub fn is_spawner_ui_config(document: &Value) -> bool {
    document.get("spawnerFormDefaults").is_some()
}

/// labforge's spawner config from Kubeflow's `spawner_ui_config.yaml`: its images by server type
/// (the `value` is the default), GPU vendors, defaults, affinity and toleration choices,
/// PodDefault labels and read-only fields. Fields labforge has no use for are kept for
/// Kubeflow's clients, which get the file's `spawnerFormDefaults` as it is.
pub fn spawner_config_from_yaml(document: &Value) -> Result<SpawnerConfig, SpawnerYamlError> {
    let form = FormDefaults(
        document
            .get("spawnerFormDefaults")
            .ok_or_else(|| yaml_field("", "missing"))?,
    );
    Ok(SpawnerConfig {
        images: form.catalog()?,
        allow_custom_images: form
            .0
            .get("allowCustomImage")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        gpu_vendors: form.gpu_vendors()?,
        defaults: form.defaults(),
        kubeflow: form.choices()?,
    })
}

/// A `spawnerFormDefaults` document: each key holds a `value`, some `options`, `readOnly`.
struct FormDefaults<'a>(&'a Value);

impl FormDefaults<'_> {
    fn field(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn value_of(&self, name: &str) -> Option<&Value> {
        self.field(name).and_then(|f| f.get("value"))
    }

    fn text_of(&self, name: &str) -> Option<String> {
        self.value_of(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// The images of each server type's group; a group's `value` is its default.
    fn catalog(&self) -> Result<Vec<CatalogImage>, SpawnerYamlError> {
        let mut images = Vec::new();
        for (key, server_type) in [
            ("image", ServerType::Jupyter),
            ("imageGroupOne", ServerType::Vscode),
            ("imageGroupTwo", ServerType::Rstudio),
        ] {
            let Some(group) = self.field(key) else {
                continue;
            };
            let default = group
                .get("value")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let options = group
                .get("options")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for (i, option) in options.iter().enumerate() {
                let image = option
                    .as_str()
                    .ok_or_else(|| yaml_field(&format!("{key}.options[{i}]"), "not a string"))?;
                images.push(CatalogImage {
                    image: image.to_owned(),
                    server_type,
                    description: String::new(),
                    default: image == default,
                });
            }
        }
        Ok(images)
    }

    fn gpu_vendors(&self) -> Result<Vec<GpuVendor>, SpawnerYamlError> {
        let Some(vendors) = self.value_of("gpus").and_then(|g| g.get("vendors")) else {
            return Ok(Vec::new());
        };
        let vendors = vendors
            .as_array()
            .ok_or_else(|| yaml_field("gpus.value.vendors", "not a list"))?;
        let mut out = Vec::new();
        for (i, vendor) in vendors.iter().enumerate() {
            let text = |key: &str| {
                vendor
                    .get(key)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| yaml_field(&format!("gpus.value.vendors[{i}].{key}"), "missing"))
            };
            out.push(GpuVendor {
                limits_key: text("limitsKey")?,
                name: text("uiName")?,
                cdi_kind: None,
                smi: None,
            });
        }
        Ok(out)
    }

    fn defaults(&self) -> Defaults {
        let mut defaults = Defaults::default();
        if let Some(cpu) = self.text_of("cpu") {
            defaults.cpu = cpu;
        }
        if let Some(memory) = self.text_of("memory") {
            defaults.memory = memory;
        }
        if let Some(size) = self
            .value_of("workspaceVolume")
            .and_then(|w| w.pointer("/newPvc/spec/resources/requests/storage"))
            .and_then(Value::as_str)
        {
            defaults.workspace_size = size.to_owned();
        }
        if self.value_of("shm").and_then(Value::as_bool) == Some(false) {
            defaults.shm_size = "0".into();
        }
        defaults
    }

    /// A list under `key`'s `options` (or `value`), read as `T`s.
    fn list<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        under: &str,
    ) -> Result<Vec<T>, SpawnerYamlError> {
        match self.field(key).and_then(|f| f.get(under)) {
            Some(list) => serde_json::from_value(list.clone())
                .map_err(|e| yaml_field(&format!("{key}.{under}"), e)),
            None => Ok(Vec::new()),
        }
    }

    fn choices(&self) -> Result<KubeflowChoices, SpawnerYamlError> {
        let read_only = self
            .0
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, f)| f.get("readOnly").and_then(Value::as_bool) == Some(true))
            .map(|(name, _)| body_field(name).to_owned())
            .collect();
        let factor = |name: &str| {
            self.field(name)
                .and_then(|f| f.get("limitFactor"))
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
        };
        Ok(KubeflowChoices {
            affinity_configs: self.list("affinityConfig", "options")?,
            default_affinity_config: self.text_of("affinityConfig").unwrap_or_default(),
            toleration_groups: self.list("tolerationGroup", "options")?,
            default_toleration_group: self.text_of("tolerationGroup").unwrap_or_default(),
            configurations: self.list("configurations", "value")?,
            read_only,
            cpu_limit_factor: factor("cpu"),
            memory_limit_factor: factor("memory"),
            form_defaults: Some(self.0.clone()),
        })
    }
}

/// The request field a `spawnerFormDefaults` key governs.
fn body_field(config_key: &str) -> &str {
    match config_key {
        "workspaceVolume" => "workspace",
        "dataVolumes" => "datavols",
        other => other,
    }
}

/// Kubeflow's `spawnerFormDefaults` for `config`: the admin's file when it came from one, else
/// labforge's config in that shape.
pub fn form_defaults(config: &SpawnerConfig) -> Value {
    if let Some(form) = &config.kubeflow.form_defaults {
        return form.clone();
    }
    let group = |server_type: ServerType| {
        let options: Vec<&str> = config
            .images
            .iter()
            .filter(|i| i.server_type == server_type)
            .map(|i| i.image.as_str())
            .collect();
        json!({ "value": config.default_image(server_type).unwrap_or_default(), "options": options })
    };
    let d = &config.defaults;
    let read_only = |key: &str| {
        config
            .kubeflow
            .read_only
            .iter()
            .any(|f| f == body_field(key))
    };
    json!({
        "image": group(ServerType::Jupyter),
        "imageGroupOne": group(ServerType::Vscode),
        "imageGroupTwo": group(ServerType::Rstudio),
        "allowCustomImage": config.allow_custom_images,
        "hideRegistry": false,
        "hideTag": false,
        "imagePullPolicy": { "value": "IfNotPresent", "readOnly": read_only("imagePullPolicy") },
        "cpu": {
            "value": d.cpu,
            "limitFactor": config.kubeflow.cpu_limit_factor.as_deref().unwrap_or("none"),
            "readOnly": read_only("cpu"),
        },
        "memory": {
            "value": d.memory,
            "limitFactor": config.kubeflow.memory_limit_factor.as_deref().unwrap_or("none"),
            "readOnly": read_only("memory"),
        },
        "gpus": {
            "value": {
                "num": "none",
                "vendor": "",
                "vendors": config.gpu_vendors.iter()
                    .map(|v| json!({ "limitsKey": v.limits_key, "uiName": v.name }))
                    .collect::<Vec<_>>(),
            },
            "readOnly": read_only("gpus"),
        },
        "workspaceVolume": {
            "value": {
                "mount": HOME,
                "newPvc": {
                    "metadata": { "name": "{notebook-name}-workspace" },
                    "spec": {
                        "resources": { "requests": { "storage": d.workspace_size } },
                        "accessModes": ["ReadWriteOnce"],
                    },
                },
            },
            "readOnly": read_only("workspaceVolume"),
        },
        "dataVolumes": { "value": [], "readOnly": read_only("dataVolumes") },
        "affinityConfig": {
            "value": config.kubeflow.default_affinity_config,
            "options": config.kubeflow.affinity_configs,
            "readOnly": read_only("affinityConfig"),
        },
        "tolerationGroup": {
            "value": config.kubeflow.default_toleration_group,
            "options": config.kubeflow.toleration_groups,
            "readOnly": read_only("tolerationGroup"),
        },
        "shm": { "value": d.shm_size != "0", "readOnly": read_only("shm") },
        "configurations": {
            "value": config.kubeflow.configurations,
            "readOnly": read_only("configurations"),
        },
        "environment": { "value": {}, "readOnly": false },
    })
}

/// Keys only Kubeflow's form has; a body with any of them is read as one.
const FORM_ONLY_KEYS: &[&str] = &[
    "namespace",
    "customImage",
    "customImageCheck",
    "allowCustomImage",
    "imageGroupOne",
    "imageGroupTwo",
    "noWorkspace",
    "datavols",
    "shm",
    "configurations",
    "affinityConfig",
    "tolerationGroup",
];

/// Whether a create request is Kubeflow's form rather than labforge's request: it has a key
/// only the form has, the form's GPU (`num`) or volume (`mount`) shape, or a server type only
/// Kubeflow names.
pub fn is_kubeflow_form(body: &Value) -> bool {
    let Some(fields) = body.as_object() else {
        return false;
    };
    FORM_ONLY_KEYS.iter().any(|k| fields.contains_key(*k))
        || body.pointer("/gpus/num").is_some()
        || body.pointer("/workspace/mount").is_some()
}

/// Kubeflow's spawner form (its Angular client's `getSubmitNotebook`, and scripts written
/// against it). Read as one when it has a key only it has (namespace, customImage, datavols, shm,
/// configurations, affinityConfig, tolerationGroup, ...), gpus.num, or workspace.mount. Fields the
/// admin made readOnly are refused.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeflowForm {
    pub name: String,
    /// Must be the path's.
    #[serde(default)]
    #[schema(nullable = false)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub image: String,
    /// The client copies the chosen group's image into `image`; these are read only when it
    /// did not.
    #[serde(default)]
    #[schema(nullable = false)]
    pub image_group_one: Option<String>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub image_group_two: Option<String>,
    /// Sent by the client, decided by the admin.
    #[serde(default)]
    #[schema(nullable = false)]
    pub allow_custom_image: Option<bool>,
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Used instead of `image` when not empty, as Kubeflow's backend does.
    #[serde(default)]
    pub custom_image: String,
    #[serde(default)]
    #[schema(nullable = false)]
    pub custom_image_check: Option<bool>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub server_type: Option<ServerType>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub cpu: Option<String>,
    /// Absent: cpu times the config's limitFactor.
    #[serde(default)]
    #[schema(nullable = false)]
    pub cpu_limit: Option<String>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub memory: Option<String>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub memory_limit: Option<String>,
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub gpus: Option<KubeflowGpus>,
    #[serde(default)]
    pub no_workspace: bool,
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub workspace: Option<KubeflowVolume>,
    #[serde(default)]
    #[schema(inline)]
    pub datavols: Vec<KubeflowVolume>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub shm: Option<bool>,
    /// PodDefault labels, each set to "true".
    #[serde(default)]
    #[schema(nullable = false)]
    pub configurations: Option<Vec<String>>,
    /// A configKey of the config's affinityConfig options; empty or none: none.
    #[serde(default)]
    #[schema(nullable = false)]
    pub affinity_config: Option<String>,
    /// A groupKey of the config's tolerationGroup options.
    #[serde(default)]
    #[schema(nullable = false)]
    pub toleration_group: Option<String>,
    /// Variables as an object, or as the JSON text of one (the client's type).
    #[serde(default)]
    #[schema(schema_with = crate::openapi::object_or_string)]
    pub environment: Option<Value>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KubeflowGpus {
    /// A count, or "none".
    #[schema(schema_with = crate::openapi::count_or_none)]
    pub num: Value,
    #[serde(default)]
    #[schema(nullable = false)]
    pub vendor: Option<String>,
    /// Sent back by clients that echo the config's value.
    #[serde(default)]
    #[schema(schema_with = crate::openapi::any_value)]
    pub vendors: Option<Value>,
}

/// A volume in Kubeflow's form: a new claim or an existing one, mounted at `mount`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeflowVolume {
    #[serde(default)]
    #[schema(nullable = false)]
    pub name: Option<String>,
    /// The workspace's must be /home/jovyan.
    pub mount: String,
    /// A PersistentVolumeClaim: metadata.name and spec.resources.requests.storage;
    /// ReadWriteOnce on the default storage class.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub new_pvc: Option<PersistentVolumeClaim>,
    /// `{persistentVolumeClaim: {claimName}}`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub existing_source: Option<Value>,
}

/// What a Kubeflow form asks for that labforge's request has no field for; [`apply_extras`]
/// puts it on the built Notebook.
#[derive(Debug, Default, PartialEq)]
pub struct Extras {
    /// PodDefault labels, each set to "true".
    pub labels: Vec<String>,
    pub affinity: Option<Affinity>,
    pub tolerations: Vec<Toleration>,
}

/// The claim a Kubeflow volume names: `(claim, size)`, size empty for an existing claim.
fn claim_of(volume: &KubeflowVolume, field: &str) -> Result<(String, String), FieldError> {
    match (&volume.new_pvc, &volume.existing_source) {
        (Some(pvc), None) => {
            let name = pvc.metadata.name.clone().ok_or_else(|| {
                FieldError::new(
                    format!("{field}.newPvc.metadata.name"),
                    "a new claim needs a name (generateName is not supported)",
                )
            })?;
            if pvc.metadata.namespace.is_some() {
                return Err(FieldError::new(
                    format!("{field}.newPvc.metadata.namespace"),
                    "a claim is made in the notebook's namespace; leave this out",
                ));
            }
            let spec = pvc.spec.clone().unwrap_or_default();
            if spec.storage_class_name.is_some() {
                return Err(FieldError::new(
                    format!("{field}.newPvc.spec.storageClassName"),
                    "claims are made on the default storage class; leave this out",
                ));
            }
            if spec
                .access_modes
                .iter()
                .flatten()
                .any(|m| m != "ReadWriteOnce")
            {
                return Err(FieldError::new(
                    format!("{field}.newPvc.spec.accessModes"),
                    "claims are ReadWriteOnce",
                ));
            }
            let size = spec
                .resources
                .and_then(|r| r.requests)
                .and_then(|r| r.get("storage").map(|q| q.0.clone()))
                .ok_or_else(|| {
                    FieldError::new(
                        format!("{field}.newPvc.spec.resources.requests.storage"),
                        "a new claim needs a size",
                    )
                })?;
            Ok((name, size))
        }
        (None, Some(source)) => source
            .pointer("/persistentVolumeClaim/claimName")
            .and_then(Value::as_str)
            .filter(|_| source.as_object().is_some_and(|o| o.len() == 1))
            .map(|claim| (claim.to_owned(), String::new()))
            .ok_or_else(|| {
                FieldError::new(
                    format!("{field}.existingSource"),
                    "only an existing persistentVolumeClaim (with its claimName) can be mounted",
                )
            }),
        (Some(_), Some(_)) => Err(FieldError::new(
            field,
            "has both existingSource and newPvc; give one",
        )),
        (None, None) => Err(FieldError::new(
            field,
            "has neither existingSource nor newPvc; give one",
        )),
    }
}

/// `request` times `factor` for a limit left out, Kubeflow's way: one decimal, in `Gi` when the
/// request is in `Gi`. `None` when there is no factor or the request is not a plain number.
fn limit_from_factor(request: &str, factor: Option<&str>) -> Option<String> {
    let factor: f64 = factor.filter(|f| *f != "none")?.parse().ok()?;
    let (number, unit) = match request.strip_suffix("Gi") {
        Some(number) => (number, "Gi"),
        None => (request, ""),
    };
    let value: f64 = number.parse().ok()?;
    let limit = (value * factor * 10.0).round() / 10.0;
    Some(format!("{limit}{unit}"))
}

/// A Kubeflow form as labforge's request for namespace `namespace`, with what labforge's
/// request has no field for. Every wrong field is named.
pub fn request_from_form(
    form: KubeflowForm,
    namespace: &str,
    config: &SpawnerConfig,
) -> Result<(NotebookRequest, Extras), FieldErrors> {
    let mut errors = FieldErrors::default();
    let choices = &config.kubeflow;
    for field in choices.read_only.iter().filter(|f| form.gives(f)) {
        errors.push(FieldError::new(
            field.clone(),
            "is fixed by the admin (readOnly); leave it out",
        ));
    }
    if let Some(asked) = form.namespace.as_deref().filter(|ns| *ns != namespace) {
        errors.push(FieldError::new(
            "namespace",
            format!("{asked:?} is not {namespace:?}, the namespace in the path"),
        ));
    }
    let limit = |asked: &Option<String>, request: &str, factor: &Option<String>| {
        asked
            .clone()
            .filter(|l| !l.is_empty())
            .or_else(|| limit_from_factor(request, factor.as_deref()))
            .unwrap_or_default()
    };
    let cpu = form
        .cpu
        .clone()
        .unwrap_or_else(|| config.defaults.cpu.clone());
    let memory = form
        .memory
        .clone()
        .unwrap_or_else(|| config.defaults.memory.clone());
    let cpu_limit = limit(&form.cpu_limit, &cpu, &choices.cpu_limit_factor);
    let memory_limit = limit(&form.memory_limit, &memory, &choices.memory_limit_factor);
    let gpus = form.gpus.as_ref().and_then(|g| g.request(&mut errors));
    let workspace = form.workspace_request(&mut errors);
    let mut data_volumes = Vec::new();
    for (i, volume) in form.datavols.iter().enumerate() {
        match claim_of(volume, &format!("datavols[{i}]")) {
            Ok((name, size)) => data_volumes.push(DataVolumeRequest {
                name,
                size,
                mount_path: volume.mount.clone(),
            }),
            Err(error) => errors.push(error),
        }
    }
    let environment = form.environment_variables(&mut errors);
    let extras = extras_for(
        form.configurations.clone(),
        form.affinity_config.clone(),
        form.toleration_group.clone(),
        choices,
        &mut errors,
    );
    if !errors.is_empty() {
        return Err(errors);
    }
    let request = NotebookRequest {
        server_type: form.server_type.unwrap_or_default(),
        image: form.image_reference(),
        name: form.name,
        cpu,
        cpu_limit,
        memory,
        memory_limit,
        gpus,
        workspace,
        data_volumes,
        shm_size: match form.shm {
            Some(false) => "0".into(),
            _ => String::new(),
        },
        environment,
        auto_save: None,
        image_pull_policy: form.image_pull_policy,
    };
    Ok((request, extras))
}

impl KubeflowForm {
    /// Whether the form sets `field` (a Kubeflow form field an admin may fix).
    fn gives(&self, field: &str) -> bool {
        match field {
            "imagePullPolicy" => self.image_pull_policy.is_some(),
            "cpu" => self.cpu.is_some() || self.cpu_limit.is_some(),
            "memory" => self.memory.is_some() || self.memory_limit.is_some(),
            "gpus" => self.gpus.is_some(),
            "workspace" => self.workspace.is_some(),
            "datavols" => !self.datavols.is_empty(),
            "shm" => self.shm.is_some(),
            "configurations" => self.configurations.is_some(),
            "affinityConfig" => self.affinity_config.is_some(),
            "tolerationGroup" => self.toleration_group.is_some(),
            _ => false,
        }
    }

    /// The image: `customImage` when given, as Kubeflow's backend decides, else `image`, else
    /// the server type's group image the client left in.
    fn image_reference(&self) -> String {
        let server_type = self.server_type.unwrap_or_default();
        if !self.custom_image.trim().is_empty() {
            self.custom_image.trim().to_owned()
        } else if !self.image.trim().is_empty() {
            self.image.trim().to_owned()
        } else {
            match server_type {
                ServerType::Vscode => self.image_group_one.clone().unwrap_or_default(),
                ServerType::Rstudio => self.image_group_two.clone().unwrap_or_default(),
                ServerType::Jupyter => String::new(),
            }
        }
    }

    /// The workspace: none unless the form has one, as Kubeflow's web app takes it: a claim of
    /// the name the user typed (its template `{notebook-name}-workspace` filled in), mounted
    /// where the form says (the home directory unless an admin set another path).
    fn workspace_request(&self, errors: &mut FieldErrors) -> Option<WorkspaceRequest> {
        let volume = match &self.workspace {
            Some(volume) if !self.no_workspace => volume,
            _ => return Some(WorkspaceRequest::None),
        };
        let mount = volume.mount.trim();
        let mount_path =
            (!mount.is_empty() && mount.trim_end_matches('/') != HOME).then(|| mount.to_owned());
        match claim_of(volume, "workspace") {
            Ok((claim, size)) if size.is_empty() => Some(WorkspaceRequest::Existing {
                name: claim,
                mount_path,
            }),
            Ok((claim, size)) => {
                let claim = claim.replace("{notebook-name}", &self.name);
                Some(WorkspaceRequest::New {
                    size,
                    name: (claim != workspace_claim(&self.name)).then_some(claim),
                    mount_path,
                })
            }
            Err(error) => {
                errors.push(error);
                None
            }
        }
    }

    /// `environment` as an object, or as the JSON text of one.
    fn environment_variables(&self, errors: &mut FieldErrors) -> BTreeMap<String, String> {
        let parsed = match &self.environment {
            None => return BTreeMap::new(),
            Some(Value::String(text)) if text.trim().is_empty() => return BTreeMap::new(),
            Some(Value::String(text)) => serde_json::from_str(text).ok(),
            Some(value) => serde_json::from_value(value.clone()).ok(),
        };
        parsed.unwrap_or_else(|| {
            errors.push(FieldError::new(
                "environment",
                "must be an object of names to values, or its JSON text",
            ));
            BTreeMap::new()
        })
    }
}

impl KubeflowGpus {
    /// labforge's GPU request: none for "none", else a count of the named vendor's devices.
    fn request(&self, errors: &mut FieldErrors) -> Option<GpuRequest> {
        if self.num == "none" {
            return None;
        }
        let count = match &self.num {
            Value::String(text) => text.parse::<u32>().ok(),
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        };
        match (count, self.vendor.as_deref().filter(|v| !v.is_empty())) {
            (None, _) => {
                errors.push(FieldError::new(
                    "gpus.num",
                    "must be a whole number of GPUs, or \"none\"",
                ));
                None
            }
            (Some(_), None) => {
                errors.push(FieldError::new(
                    "gpus.vendor",
                    "name the GPU vendor's limits key, e.g. nvidia.com/gpu",
                ));
                None
            }
            (Some(count), Some(vendor)) => Some(GpuRequest {
                vendor: vendor.to_owned(),
                count,
            }),
        }
    }
}

/// Labels the notebook's StatefulSet, pod and events are found by: no configuration may set them.
const RESERVED_LABELS: &[&str] = &["app", "notebook-name", "statefulset"];

/// The PodDefault labels, affinity and tolerations asked for (`None`: the admin's defaults),
/// looked up in the admin's choices; what cannot be is pushed to `errors`.
fn extras_for(
    configurations: Option<Vec<String>>,
    affinity_config: Option<String>,
    toleration_group: Option<String>,
    choices: &KubeflowChoices,
    errors: &mut FieldErrors,
) -> Extras {
    let mut extras = Extras::default();
    let labels = configurations.unwrap_or_else(|| choices.configurations.clone());
    for (i, label) in labels.into_iter().enumerate() {
        if !label_key_ok(&label) {
            errors.push(FieldError::new(
                format!("configurations[{i}]"),
                format!("{label:?} is not a label key (a PodDefault's selector label)"),
            ));
        } else if RESERVED_LABELS.contains(&label.as_str())
            || ["kubeflow.org/", "labforge.dev/", "notebooks.kubeflow.org/"]
                .iter()
                .any(|prefix| label.starts_with(prefix))
        {
            errors.push(FieldError::new(
                format!("configurations[{i}]"),
                format!("{label:?} is a label the notebook's own objects select by"),
            ));
        } else {
            extras.labels.push(label);
        }
    }
    let chosen = |asked: Option<String>, default: &str| {
        let key = asked.unwrap_or_else(|| default.to_owned());
        (!key.is_empty() && key != "none").then_some(key)
    };
    if let Some(key) = chosen(affinity_config, &choices.default_affinity_config) {
        match choices
            .affinity_configs
            .iter()
            .find(|a| a.config_key == key)
        {
            Some(found) => extras.affinity = Some(found.affinity.clone()),
            None => errors.push(FieldError::new(
                "affinityConfig",
                format!("{key:?} is not one of the admin's affinity choices"),
            )),
        }
    }
    if let Some(key) = chosen(toleration_group, &choices.default_toleration_group) {
        match choices
            .toleration_groups
            .iter()
            .find(|g| g.group_key == key)
        {
            Some(found) => extras.tolerations = found.tolerations.clone(),
            None => errors.push(FieldError::new(
                "tolerationGroup",
                format!("{key:?} is not one of the admin's toleration groups"),
            )),
        }
    }
    extras
}

/// What labforge's own request gets of Kubeflow's choices: the admin's default PodDefault
/// labels, affinity and tolerations, and no change to a field the admin fixed (`readOnly`), which
/// is taken only empty or at its default, as labforge's form fills it in.
pub fn own_request_extras(
    request: &NotebookRequest,
    config: &SpawnerConfig,
) -> Result<Extras, FieldErrors> {
    let mut errors = FieldErrors::default();
    let d = &config.defaults;
    let at_default = |value: &str, default: &str| value.is_empty() || value == default;
    for fixed in &config.kubeflow.read_only {
        let changed: &[(&str, bool)] = match fixed.as_str() {
            "cpu" => &[
                ("cpu", !at_default(&request.cpu, &d.cpu)),
                ("cpuLimit", !request.cpu_limit.is_empty()),
            ],
            "memory" => &[
                ("memory", !at_default(&request.memory, &d.memory)),
                ("memoryLimit", !request.memory_limit.is_empty()),
            ],
            "gpus" => &[("gpus", request.gpus.as_ref().is_some_and(|g| g.count > 0))],
            "imagePullPolicy" => &[(
                "imagePullPolicy",
                request
                    .image_pull_policy
                    .is_some_and(|p| p != ImagePullPolicy::IfNotPresent),
            )],
            "shm" => &[("shmSize", !at_default(&request.shm_size, &d.shm_size))],
            "workspace" => &[(
                "workspace",
                match &request.workspace {
                    None => false,
                    Some(WorkspaceRequest::New { size, .. }) => {
                        !at_default(size, &d.workspace_size)
                    }
                    Some(_) => true,
                },
            )],
            "datavols" => &[("dataVolumes", !request.data_volumes.is_empty())],
            _ => &[],
        };
        for (field, _) in changed.iter().filter(|(_, changed)| *changed) {
            errors.push(FieldError::new(
                *field,
                "is fixed by the admin (readOnly); leave it at its default",
            ));
        }
    }
    let extras = extras_for(None, None, None, &config.kubeflow, &mut errors);
    if errors.is_empty() {
        Ok(extras)
    } else {
        Err(errors)
    }
}

/// A Kubernetes label key: an optional DNS prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn label_key_ok(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.')
                .all(|l| crate::validate::dns_label("label", l).is_ok())
    });
    name_ok && prefix_ok
}

/// Puts a Kubeflow form's PodDefault labels, affinity and tolerations on `notebook`.
pub fn apply_extras(notebook: &mut Notebook, extras: Extras) {
    let labels = notebook.metadata.labels.get_or_insert_with(BTreeMap::new);
    for label in extras.labels {
        labels.entry(label).or_insert_with(|| "true".into());
    }
    if let Some(pod) = notebook.spec.template.spec.as_mut() {
        if extras.affinity.is_some() {
            pod.affinity = extras.affinity;
        }
        if !extras.tolerations.is_empty() {
            pod.tolerations
                .get_or_insert_with(Vec::new)
                .extend(extras.tolerations);
        }
    }
}

/// `body` (an object) with Kubeflow's success envelope: `success`, `status` and `user`.
pub fn envelope(user: &User, status: http::StatusCode, mut body: Value) -> Value {
    if let Some(fields) = body.as_object_mut() {
        fields.insert("success".into(), true.into());
        fields.insert("status".into(), status.as_u16().into());
        fields.insert("user".into(), user.name.clone().into());
    }
    body
}

/// Kubeflow's status of a notebook (`phase`, `message`, `state`), from labforge's.
pub fn processed_status(notebook: &Notebook, view: &NotebookView) -> Value {
    let (phase, message) = if notebook.metadata.deletion_timestamp.is_some() {
        ("terminating", "Deleting this Notebook Server.".to_owned())
    } else {
        match view.state {
            NotebookState::Ready => ("ready", "Running".to_owned()),
            NotebookState::Starting if view.reason.is_empty() => (
                "waiting",
                "Waiting for the notebook server to start.".to_owned(),
            ),
            NotebookState::Starting => ("waiting", view.reason.clone()),
            NotebookState::Stopping => ("waiting", "Notebook Server is stopping.".to_owned()),
            NotebookState::Stopped | NotebookState::Culled => (
                "stopped",
                "No Pods are currently running for this Notebook Server.".to_owned(),
            ),
            NotebookState::Error => ("warning", view.reason.clone()),
        }
    };
    json!({ "phase": phase, "message": message, "state": "" })
}

/// A notebook in a list, with the fields Kubeflow's list items have beside labforge's.
pub fn list_item(notebook: &Notebook, view: &NotebookView) -> Value {
    let mut item = serde_json::to_value(view).unwrap_or_default();
    if let Some(fields) = item.as_object_mut() {
        fields.extend(kubeflow_item_fields(notebook, view));
    }
    item
}

fn kubeflow_item_fields(notebook: &Notebook, view: &NotebookView) -> Map<String, Value> {
    let volumes: Vec<String> = notebook
        .container()
        .and_then(|c| c.volume_mounts.as_ref())
        .into_iter()
        .flatten()
        .map(|m| m.name.clone())
        .collect();
    let short_image = view.image.rsplit('/').next().unwrap_or_default().to_owned();
    Map::from_iter([
        (
            "age".to_owned(),
            json!(view.created.clone().unwrap_or_default()),
        ),
        (
            "last_activity".to_owned(),
            json!(view.last_activity.clone().unwrap_or_default()),
        ),
        ("shortImage".to_owned(), json!(short_image)),
        ("volumes".to_owned(), json!(volumes)),
        ("status".to_owned(), processed_status(notebook, view)),
        (
            "metadata".to_owned(),
            serde_json::to_value(&notebook.metadata).unwrap_or_default(),
        ),
    ])
}

/// A notebook event as Kubeflow's client reads it: labforge's fields, with the time also as
/// `metadata.creationTimestamp` and the notebook as `involvedObject`.
pub fn event_item(event: &crate::model::NotebookEvent, namespace: &str, name: &str) -> Value {
    let mut item = serde_json::to_value(event).unwrap_or_default();
    if let Some(fields) = item.as_object_mut() {
        fields.insert(
            "metadata".into(),
            json!({ "namespace": namespace, "creationTimestamp": event.time }),
        );
        fields.insert(
            "involvedObject".into(),
            json!({ "kind": "Notebook", "namespace": namespace, "name": name }),
        );
        fields.insert("lastTimestamp".into(), json!(event.time));
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SpawnerConfig {
        let yaml = r#"
spawnerFormDefaults:
  allowCustomImage: false
  image:
    value: lab:2
    options: [lab:1, lab:2]
  imageGroupOne:
    value: code:1
    options: [code:1]
  imageGroupTwo:
    value: rstudio:1
    options: [rstudio:1]
  cpu: {value: "0.5", limitFactor: "1.2", readOnly: false}
  memory: {value: "1.0Gi", limitFactor: "1.2"}
  gpus:
    readOnly: true
    value:
      num: none
      vendors: [{limitsKey: nvidia.com/gpu, uiName: NVIDIA}]
  workspaceVolume:
    value:
      mount: /home/jovyan
      newPvc:
        metadata: {name: "{notebook-name}-workspace"}
        spec: {resources: {requests: {storage: 7Gi}}, accessModes: [ReadWriteOnce]}
  affinityConfig:
    value: ""
    options:
      - configKey: big
        displayName: Big nodes
        affinity:
          nodeAffinity:
            requiredDuringSchedulingIgnoredDuringExecution:
              nodeSelectorTerms:
                - matchExpressions: [{key: size, operator: In, values: [big]}]
  tolerationGroup:
    value: gpu
    options:
      - groupKey: gpu
        displayName: GPU nodes
        tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
  shm: {value: true}
  configurations: {value: [access-ml-pipeline]}
"#;
        let document: Value = serde_yaml_ng::from_str(yaml).unwrap();
        spawner_config_from_yaml(&document).unwrap()
    }

    #[test]
    fn kubeflows_spawner_file_becomes_the_spawner_config() {
        let config = config();
        assert_eq!(config.default_image(ServerType::Jupyter), Some("lab:2"));
        assert_eq!(config.default_image(ServerType::Vscode), Some("code:1"));
        assert_eq!(config.default_image(ServerType::Rstudio), Some("rstudio:1"));
        assert!(!config.allow_custom_images);
        assert_eq!(config.defaults.memory, "1.0Gi");
        assert_eq!(config.defaults.workspace_size, "7Gi");
        assert_eq!(config.gpu_vendors[0].name, "NVIDIA");
        assert_eq!(config.kubeflow.read_only, ["gpus"]);
        assert_eq!(config.kubeflow.default_toleration_group, "gpu");
        // Served to Kubeflow's clients as written.
        assert_eq!(form_defaults(&config)["cpu"]["limitFactor"], "1.2");

        let bad: Value = serde_yaml_ng::from_str(
            "spawnerFormDefaults: {gpus: {value: {vendors: [{uiName: X}]}}}",
        )
        .unwrap();
        let error = spawner_config_from_yaml(&bad).unwrap_err().to_string();
        assert!(error.contains("gpus.value.vendors[0].limitsKey"), "{error}");
    }

    fn form(body: Value) -> KubeflowForm {
        assert!(is_kubeflow_form(&body), "{body}");
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn the_clients_form_becomes_a_request_with_kubeflows_limits_and_choices() {
        let body = json!({
            "name": "nb", "namespace": "team", "image": "lab:1", "allowCustomImage": true,
            "imagePullPolicy": "Always", "customImage": "", "customImageCheck": false,
            "serverType": "group-two", "cpu": "1", "memory": "2Gi",
            "workspace": {"mount": "/home/jovyan", "newPvc": {"metadata": {"name": "nb-workspace"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "3Gi"}}}}},
            "datavols": [
                {"name": "", "mount": "/data", "existingSource": {"persistentVolumeClaim": {"claimName": "shared", "readOnly": false}}},
                {"mount": "/scratch", "newPvc": {"metadata": {"name": "nb-scratch"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}}
            ],
            "shm": false, "configurations": ["access-ml-pipeline"], "affinityConfig": "big",
        });
        let (request, extras) = request_from_form(form(body), "team", &config()).unwrap();
        assert_eq!(request.server_type, ServerType::Rstudio);
        assert_eq!(
            (request.cpu.as_str(), request.cpu_limit.as_str()),
            ("1", "1.2")
        );
        assert_eq!(request.memory_limit, "2.4Gi");
        assert_eq!(request.shm_size, "0");
        assert_eq!(request.image_pull_policy, Some(ImagePullPolicy::Always));
        assert!(
            matches!(request.workspace, Some(WorkspaceRequest::New { ref size, .. }) if size == "3Gi")
        );
        assert_eq!(request.data_volumes[0].name, "shared");
        assert_eq!(request.data_volumes[0].size, "");
        assert_eq!(request.data_volumes[1].size, "1Gi");
        assert_eq!(extras.labels, ["access-ml-pipeline"]);
        assert!(extras.affinity.is_some());
        // The admin's default toleration group, as the form was not asked for one.
        assert_eq!(extras.tolerations[0].key.as_deref(), Some("gpu"));

        // Absent workspace: none, as in Kubeflow; a custom image wins.
        let (request, _) = request_from_form(
            form(json!({"name": "nb", "customImage": " mine:1 ", "image": "lab:1", "shm": true})),
            "team",
            &config(),
        )
        .unwrap();
        assert!(matches!(request.workspace, Some(WorkspaceRequest::None)));
        assert_eq!(request.image, "mine:1");
        assert_eq!(request.cpu_limit, "0.6");
    }

    #[test]
    fn a_workspace_the_user_named_and_an_admins_mount_path_are_taken_as_kubeflow_takes_them() {
        let body = json!({
            "name": "nb", "image": "lab:1",
            "workspace": {"mount": "/work/", "newPvc": {"metadata": {"name": "my-space"},
                "spec": {"resources": {"requests": {"storage": "2Gi"}}}}},
        });
        let (request, _) = request_from_form(form(body), "team", &config()).unwrap();
        let notebook =
            crate::validate::notebook_from_request(&request, "team", "alice", &config(), &[])
                .unwrap();
        let pod = notebook.spec.template.spec.as_ref().unwrap();
        let claim = pod.volumes.iter().flatten().find_map(|v| {
            Some((
                v.name.clone(),
                v.persistent_volume_claim.as_ref()?.claim_name.clone(),
            ))
        });
        let (volume, claim) = claim.expect("a claim volume");
        assert_eq!(claim, "my-space");
        let mounts = pod.containers[0].volume_mounts.iter().flatten();
        let mount = mounts
            .filter(|m| m.name == volume)
            .map(|m| m.mount_path.as_str())
            .next();
        assert_eq!(mount, Some("/work"));

        // The template Kubeflow's form shows, left unfilled, is the notebook's default name.
        let body = json!({"name": "nb", "workspace": {"mount": "/home/jovyan",
            "newPvc": {"metadata": {"name": "{notebook-name}-workspace"},
                "spec": {"resources": {"requests": {"storage": "1Gi"}}}}}});
        let (request, _) = request_from_form(form(body), "team", &config()).unwrap();
        assert!(matches!(
            request.workspace,
            Some(WorkspaceRequest::New {
                name: None,
                mount_path: None,
                ..
            })
        ));
        let bad = json!({"name": "nb", "workspace": {"mount": "work",
            "newPvc": {"metadata": {"name": "Not A Name"},
                "spec": {"resources": {"requests": {"storage": "1Gi"}}}}}});
        let (request, _) = request_from_form(form(bad), "team", &config()).unwrap();
        let errors =
            crate::validate::notebook_from_request(&request, "team", "alice", &config(), &[])
                .unwrap_err();
        let fields: Vec<&str> = errors.as_slice().iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["workspace.name", "workspace.mountPath"]);
    }

    #[test]
    fn every_wrong_field_of_a_form_is_named() {
        let body = json!({
            "name": "nb", "namespace": "other", "gpus": {"num": "1", "vendor": "nvidia.com/gpu"},
            "workspace": {"mount": "/work", "newPvc": {"metadata": {"name": "nb-workspace"}}},
            "datavols": [{"mount": "/d", "existingSource": {"nfs": {"server": "x", "path": "/"}}},
                         {"mount": "/e", "newPvc": {"metadata": {"name": "e"}, "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}}}}],
            "configurations": ["not a label", "app"], "affinityConfig": "nope", "tolerationGroup": "nope",
            "environment": "[1]",
        });
        let errors = request_from_form(form(body), "team", &config()).unwrap_err();
        let fields: Vec<&str> = errors.as_slice().iter().map(|e| e.field.as_str()).collect();
        for field in [
            "gpus",
            "namespace",
            "datavols[0].existingSource",
            "datavols[1].newPvc.spec.storageClassName",
            "configurations[0]",
            "configurations[1]",
            "affinityConfig",
            "tolerationGroup",
            "environment",
        ] {
            assert!(fields.contains(&field), "{field} not in {fields:?}");
        }
        let unknown = serde_json::from_value::<KubeflowForm>(json!({"name": "nb", "cpus": "1"}));
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `cpus`")
        );
        let gpus = request_from_form(
            form(json!({"name": "nb", "gpus": {"num": "two", "vendor": "nvidia.com/gpu"}})),
            "team",
            &SpawnerConfig {
                kubeflow: KubeflowChoices::default(),
                ..config()
            },
        )
        .unwrap_err();
        assert_eq!(gpus.as_slice()[0].field, "gpus.num");
    }

    #[test]
    fn labforges_own_request_gets_the_admins_defaults_and_keeps_fixed_fields() {
        let config = config();
        let mut request = NotebookRequest {
            name: "nb".into(),
            cpu: config.defaults.cpu.clone(),
            ..Default::default()
        };
        let extras = own_request_extras(&request, &config).unwrap();
        assert_eq!(extras.labels, ["access-ml-pipeline"]);
        assert_eq!(extras.tolerations[0].key.as_deref(), Some("gpu"));
        request.gpus = Some(GpuRequest {
            vendor: "nvidia.com/gpu".into(),
            count: 1,
        });
        let errors = own_request_extras(&request, &config).unwrap_err();
        assert_eq!(errors.as_slice()[0].field, "gpus");
    }

    #[test]
    fn labforges_own_request_is_not_taken_for_a_form() {
        for body in [
            json!({"name": "nb", "serverType": "vscode", "gpus": {"vendor": "nvidia.com/gpu", "count": 1}}),
            json!({"name": "nb", "workspace": {"new": {"size": "1Gi"}}, "dataVolumes": []}),
        ] {
            assert!(!is_kubeflow_form(&body), "{body}");
        }
    }

    #[test]
    fn limits_follow_kubeflows_factor_arithmetic() {
        assert_eq!(
            limit_from_factor("0.5", Some("1.2")).as_deref(),
            Some("0.6")
        );
        assert_eq!(
            limit_from_factor("1.0Gi", Some("1.2")).as_deref(),
            Some("1.2Gi")
        );
        assert_eq!(limit_from_factor("2", Some("1.0")).as_deref(), Some("2"));
        assert_eq!(limit_from_factor("500m", Some("1.2")), None);
        assert_eq!(limit_from_factor("1", Some("none")), None);
        assert_eq!(limit_from_factor("1", None), None);
    }
}
