//! OCI image configs and manifests.
//!
//! A config is kept as JSON rather than a typed struct: when labforge appends a layer to somebody
//! else's image, every field of their config (healthchecks, labels, fields newer than this code)
//! must survive unchanged.

use crate::digest::Digest;
use serde_json::{Value, json};

pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image config is not valid JSON")]
    ConfigJson(#[source] serde_json::Error),
    #[error("image config has no {0}")]
    ConfigShape(&'static str),
}

/// Runtime defaults of an image built from scratch (`config` section of the OCI config).
#[derive(Clone, Debug, Default)]
pub struct RuntimeConfig {
    pub user: Option<String>,
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: Option<String>,
    pub exposed_ports: Vec<String>,
}

/// An OCI image config document.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageConfig(Value);

impl ImageConfig {
    /// A config with no layers, for the host's architecture.
    pub fn scratch(runtime: &RuntimeConfig) -> Self {
        let mut config = serde_json::Map::new();
        if let Some(user) = &runtime.user {
            config.insert("User".into(), json!(user));
        }
        if !runtime.env.is_empty() {
            config.insert("Env".into(), json!(runtime.env));
        }
        if !runtime.entrypoint.is_empty() {
            config.insert("Entrypoint".into(), json!(runtime.entrypoint));
        }
        if !runtime.cmd.is_empty() {
            config.insert("Cmd".into(), json!(runtime.cmd));
        }
        if let Some(dir) = &runtime.working_dir {
            config.insert("WorkingDir".into(), json!(dir));
        }
        if !runtime.exposed_ports.is_empty() {
            let ports: serde_json::Map<_, _> = runtime
                .exposed_ports
                .iter()
                .map(|p| (p.clone(), json!({})))
                .collect();
            config.insert("ExposedPorts".into(), Value::Object(ports));
        }
        ImageConfig(json!({
            "architecture": oci_architecture(),
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": [] },
            "history": [],
        }))
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, ImageError> {
        let value: Value = serde_json::from_slice(bytes).map_err(ImageError::ConfigJson)?;
        if !value["rootfs"]["diff_ids"].is_array() {
            return Err(ImageError::ConfigShape("rootfs.diff_ids array"));
        }
        Ok(ImageConfig(value))
    }

    /// Records a new top layer: its `diff_id` and a history entry saying what made it.
    pub fn append_layer(&mut self, diff_id: &Digest, created_by: &str, created: &str) {
        let root = &mut self.0;
        if let Some(ids) = root["rootfs"]["diff_ids"].as_array_mut() {
            ids.push(json!(diff_id.as_str()));
        }
        let entry = json!({ "created": created, "created_by": created_by });
        match root["history"].as_array_mut() {
            Some(history) => history.push(entry),
            None => root["history"] = json!([entry]),
        }
        root["created"] = json!(created);
    }

    pub fn diff_ids(&self) -> Vec<String> {
        self.0["rootfs"]["diff_ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing a `Value` cannot fail: its keys are strings.
        serde_json::to_vec(&self.0).unwrap_or_default()
    }

    pub fn as_json(&self) -> &Value {
        &self.0
    }
}

pub(crate) fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appending_a_layer_keeps_unknown_fields_and_adds_history() {
        let parent = br#"{"architecture":"amd64","os":"linux","config":{"Healthcheck":{"Test":["CMD","true"]}},
            "rootfs":{"type":"layers","diff_ids":["sha256:aa"]},"history":[{"created_by":"base"}]}"#;
        let mut config = ImageConfig::from_json(parent).unwrap();
        let diff_id = Digest::of(b"layer");
        config.append_layer(&diff_id, "labforge save", "2026-11-21T00:00:00Z");
        let json = config.as_json();
        assert_eq!(json["config"]["Healthcheck"]["Test"][1], "true");
        assert_eq!(
            config.diff_ids(),
            vec!["sha256:aa".to_string(), diff_id.to_string()]
        );
        assert_eq!(json["history"][1]["created_by"], "labforge save");
    }

    #[test]
    fn config_without_diff_ids_is_refused() {
        let err = ImageConfig::from_json(br#"{"rootfs":{}}"#).unwrap_err();
        assert!(err.to_string().contains("rootfs.diff_ids"), "{err}");
        assert!(ImageConfig::from_json(b"not json").is_err());
    }

    #[test]
    fn scratch_config_carries_runtime_defaults() {
        let config = ImageConfig::scratch(&RuntimeConfig {
            user: Some("1000:100".into()),
            cmd: vec!["start-notebook".into()],
            exposed_ports: vec!["8888/tcp".into()],
            ..Default::default()
        });
        let json = config.as_json();
        assert_eq!(json["config"]["User"], "1000:100");
        assert_eq!(json["config"]["Cmd"][0], "start-notebook");
        assert!(json["config"]["ExposedPorts"]["8888/tcp"].is_object());
        assert!(config.diff_ids().is_empty());
    }
}
