//! `labforge render`: Notebook YAML in, the controller's objects out, with no cluster involved.

use crate::builders::{BuildError, BuilderConfig, build_children};
use labforge_crds::Notebook;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("document {index}: not valid YAML")]
    Yaml {
        index: usize,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("document {index}: kind {kind:?} is not a kubeflow.org Notebook")]
    NotANotebook { index: usize, kind: String },
    #[error("document {index}: not a valid Notebook")]
    Invalid {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("notebook {name}")]
    Build {
        name: String,
        #[source]
        source: BuildError,
    },
    #[error("writing YAML")]
    Output(#[source] serde_yaml_ng::Error),
}

/// Parses every non-empty YAML document as a Notebook; those without a namespace get `namespace`.
pub fn parse_notebooks(text: &str, namespace: &str) -> Result<Vec<Notebook>, RenderError> {
    let mut notebooks = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let index = index + 1;
        let value = serde_json::Value::deserialize(document)
            .map_err(|source| RenderError::Yaml { index, source })?;
        if value.is_null() {
            continue;
        }
        // `kubectl get notebooks -o yaml` writes a List (or a NotebookList) of them.
        let items = match value["kind"].as_str() {
            Some("List" | "NotebookList") => value["items"].as_array().cloned().unwrap_or_default(),
            _ => vec![value],
        };
        for value in items {
            let api_version = value["apiVersion"].as_str().unwrap_or_default();
            let kind = value["kind"].as_str().unwrap_or_default();
            if kind != "Notebook" || !api_version.starts_with("kubeflow.org/") {
                return Err(RenderError::NotANotebook {
                    index,
                    kind: format!("{api_version} {kind}").trim().to_owned(),
                });
            }
            let mut notebook: Notebook = serde_json::from_value(value)
                .map_err(|source| RenderError::Invalid { index, source })?;
            notebook
                .metadata
                .namespace
                .get_or_insert_with(|| namespace.to_owned());
            notebooks.push(notebook);
        }
    }
    Ok(notebooks)
}

/// The objects each Notebook yields, as a multi-document YAML stream.
pub fn render_yaml(notebooks: &[Notebook], config: &BuilderConfig) -> Result<String, RenderError> {
    let mut out = String::new();
    for notebook in notebooks {
        let children = build_children(notebook, config).map_err(|source| RenderError::Build {
            name: notebook.metadata.name.clone().unwrap_or_default(),
            source,
        })?;
        let mut push = |object: serde_json::Value| -> Result<(), RenderError> {
            out.push_str("---\n");
            out.push_str(&serde_yaml_ng::to_string(&object).map_err(RenderError::Output)?);
            Ok(())
        };
        push(serde_json::to_value(&children.stateful_set).unwrap_or_default())?;
        push(serde_json::to_value(&children.service).unwrap_or_default())?;
        if let Some(vs) = &children.virtual_service {
            push(serde_json::to_value(vs).unwrap_or_default())?;
        }
        if let Some(policy) = &children.network_policy {
            push(serde_json::to_value(policy).unwrap_or_default())?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_document_is_rendered_with_the_default_namespace_filled_in() {
        let text = "apiVersion: kubeflow.org/v1\nkind: Notebook\nmetadata: {name: a}\n\
                    spec: {template: {spec: {containers: [{name: a, image: x}]}}}\n---\n\
                    apiVersion: kubeflow.org/v1beta1\nkind: Notebook\nmetadata: {name: b, namespace: team}\n\
                    spec: {template: {spec: {containers: [{name: b, image: y}]}}}\n";
        let notebooks = parse_notebooks(text, "default").unwrap();
        assert_eq!(notebooks.len(), 2);
        assert_eq!(notebooks[0].metadata.namespace.as_deref(), Some("default"));
        assert_eq!(notebooks[1].metadata.namespace.as_deref(), Some("team"));
        let yaml = render_yaml(&notebooks, &BuilderConfig::default()).unwrap();
        assert_eq!(yaml.matches("kind: StatefulSet").count(), 2);
        assert_eq!(yaml.matches("kind: VirtualService").count(), 2);
        assert!(yaml.contains("notebook-team-b"));
    }

    #[test]
    fn a_list_from_kubectl_get_is_read_item_by_item() {
        let text = "apiVersion: v1\nkind: List\nitems:\n\
                    - apiVersion: kubeflow.org/v1\n  kind: Notebook\n  metadata: {name: a, namespace: alice}\n  \
                    spec: {template: {spec: {containers: [{name: a, image: x}]}}}\n\
                    - apiVersion: kubeflow.org/v1\n  kind: Notebook\n  metadata: {name: b, namespace: bob}\n  \
                    spec: {template: {spec: {containers: [{name: b, image: x}]}}}\n";
        let notebooks = parse_notebooks(text, "default").unwrap();
        let names: Vec<_> = notebooks
            .iter()
            .map(|n| {
                (
                    n.metadata.namespace.as_deref().unwrap(),
                    n.metadata.name.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(names, [("alice", "a"), ("bob", "b")]);
        let mixed = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod}\n";
        assert!(parse_notebooks(mixed, "default").is_err());
    }

    #[test]
    fn other_kinds_and_bad_yaml_are_named() {
        let err = parse_notebooks("apiVersion: v1\nkind: Pod\n", "default").unwrap_err();
        assert!(
            err.to_string().contains("document 1") && err.to_string().contains("Pod"),
            "{err}"
        );
        let err = parse_notebooks("a: [", "default").unwrap_err();
        assert!(err.to_string().contains("not valid YAML"), "{err}");
    }
}
