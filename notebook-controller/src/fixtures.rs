//! Chainable Notebook fixtures for tests: `Notebook::test("ns", "name").stopped()`.

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, PodSecurityContext, PodSpec};
use labforge_crds::notebook::{NotebookTemplateSpec, STOP_ANNOTATION};
use labforge_crds::{Notebook, NotebookSpec};

pub trait NotebookFixture: Sized {
    fn test(namespace: &str, name: &str) -> Self;
    fn labelled(self, key: &str, value: &str) -> Self;
    fn annotated(self, key: &str, value: &str) -> Self;
    fn stopped(self) -> Self {
        self.annotated(STOP_ANNOTATION, "2026-11-21T00:00:00Z")
    }
    fn with_port(self, port: i32) -> Self;
    fn with_working_dir(self, dir: &str) -> Self;
    fn with_env(self, name: &str, value: &str) -> Self;
    fn with_security_context(self) -> Self;
    fn without_containers(self) -> Self;
}

impl NotebookFixture for Notebook {
    fn test(namespace: &str, name: &str) -> Self {
        let mut nb = Notebook::new(
            name,
            NotebookSpec {
                template: NotebookTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: name.to_owned(),
                            image: Some("kubeflownotebookswg/jupyter-scipy:v1.9.0".into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
            },
        );
        nb.metadata.namespace = Some(namespace.to_owned());
        nb.metadata.uid = Some(format!("uid-{namespace}-{name}"));
        nb
    }

    fn labelled(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    fn annotated(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    fn with_port(mut self, port: i32) -> Self {
        container(&mut self).ports = Some(vec![ContainerPort {
            container_port: port,
            name: Some("http".into()),
            ..Default::default()
        }]);
        self
    }

    fn with_working_dir(mut self, dir: &str) -> Self {
        container(&mut self).working_dir = Some(dir.into());
        self
    }

    fn with_env(mut self, name: &str, value: &str) -> Self {
        container(&mut self)
            .env
            .get_or_insert_with(Vec::new)
            .push(EnvVar {
                name: name.into(),
                value: Some(value.into()),
                value_from: None,
            });
        self
    }

    fn with_security_context(mut self) -> Self {
        if let Some(spec) = self.spec.template.spec.as_mut() {
            spec.security_context = Some(PodSecurityContext {
                run_as_user: Some(1000),
                ..Default::default()
            });
        }
        self
    }

    fn without_containers(mut self) -> Self {
        if let Some(spec) = self.spec.template.spec.as_mut() {
            spec.containers.clear();
        }
        self
    }
}

fn container(nb: &mut Notebook) -> &mut Container {
    let spec = nb.spec.template.spec.get_or_insert_with(Default::default);
    if spec.containers.is_empty() {
        spec.containers.push(Container::default());
    }
    &mut spec.containers[0]
}
