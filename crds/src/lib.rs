//! The Kubernetes resource types labforge serves and writes.
//!
//! - [`Notebook`] is wire-compatible with Kubeflow's `kubeflow.org/v1` Notebook, so users keep their
//!   CRs when they swap Kubeflow's controller for ours; the CRD serves v1, v1beta1 and v1alpha1 with
//!   one schema and v1 as the storage version, as Kubeflow's does.
//! - [`ImageBuild`] (`labforge.dev/v1alpha1`) asks for a notebook's environment to be saved as an image.
//! - [`VirtualService`] is the subset of Istio's `networking.istio.io` VirtualService that the
//!   controller writes and the proxy reads.
//!
//! The CRD YAML under `crds/` is generated from these types ([`crd_yaml`]); a test fails when the
//! committed files are stale.

pub mod host;
pub mod imagebuild;
pub mod istio;
pub mod notebook;
pub mod quantity;

pub use imagebuild::{ImageBuild, ImageBuildPhase, ImageBuildSpec, ImageBuildStatus};
pub use istio::VirtualService;
pub use notebook::{Notebook, NotebookCondition, NotebookSpec, NotebookStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Every CRD labforge installs, in the order `kubectl apply` should see them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![notebook::crd(), imagebuild::crd()]
}

/// A CRD as the YAML document committed under `crds/` and applied by `deploy/`.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(crd).map(|yaml| format!("---\n{yaml}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn committed_path(crd: &CustomResourceDefinition) -> PathBuf {
        let name = crd.metadata.name.clone().unwrap_or_default();
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("{name}.yaml"))
    }

    /// The committed YAML is what the types generate. Regenerate with
    /// `LABFORGE_UPDATE_CRDS=1 cargo test -p labforge-crds`.
    #[test]
    fn committed_crd_yaml_is_up_to_date() {
        let update = std::env::var_os("LABFORGE_UPDATE_CRDS").is_some();
        for crd in crds() {
            let generated = crd_yaml(&crd).unwrap();
            let path = committed_path(&crd);
            if update {
                std::fs::write(&path, &generated).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == generated,
                "{} is stale: run LABFORGE_UPDATE_CRDS=1 cargo test -p labforge-crds",
                path.display()
            );
        }
    }

    mod schemas {
        use labforge_tests::fake_kube::{FakeApiServerOptions, SchemaSet};
        use serde_json::Value;
        use std::path::{Path, PathBuf};

        fn manifest_dir() -> PathBuf {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        }

        /// Kubeflow's CRD (as shipped in shared/schemas) and ours, as two schema sets.
        fn kubeflow_and_ours() -> (SchemaSet, SchemaSet, tempfile::TempDir) {
            let kubeflow = SchemaSet::load(&FakeApiServerOptions::default()).unwrap();
            let (options, dir) = FakeApiServerOptions::with_labforge_notebook_crd().unwrap();
            (kubeflow, SchemaSet::load(&options).unwrap(), dir)
        }

        fn load(path: &Path) -> Value {
            serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        }

        fn check(set: &SchemaSet, object: &Value) -> Result<(), String> {
            let api_version = object["apiVersion"].as_str().unwrap_or_default();
            set.validate(api_version, "Notebook", object)
                .map_err(|e| format!("{e:?}"))
        }

        #[test]
        fn samples_validate_against_kubeflows_crd_and_ours() {
            let (kubeflow, ours, _dir) = kubeflow_and_ours();
            let mut count = 0;
            for entry in std::fs::read_dir(manifest_dir().join("samples")).unwrap() {
                let path = entry.unwrap().path();
                let object = load(&path);
                check(&kubeflow, &object)
                    .unwrap_or_else(|e| panic!("Kubeflow rejects {}: {e}", path.display()));
                check(&ours, &object)
                    .unwrap_or_else(|e| panic!("ours rejects {}: {e}", path.display()));
                count += 1;
            }
            assert!(count >= 4);
        }

        #[test]
        fn both_crds_reject_the_same_bad_notebooks() {
            let (kubeflow, ours, _dir) = kubeflow_and_ours();
            let good = load(&manifest_dir().join("samples/jupyterlab.yaml"));
            let mut typo = good.clone();
            typo["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x".into();
            let mut no_containers = good.clone();
            no_containers["spec"]["template"]["spec"] = serde_json::json!({});
            let mut bad_port = good.clone();
            bad_port["spec"]["template"]["spec"]["containers"][0]["ports"] =
                serde_json::json!([{"containerPort": "eighty"}]);
            for (what, bad) in [
                ("typo", typo),
                ("no containers", no_containers),
                ("port", bad_port),
            ] {
                assert!(
                    check(&kubeflow, &bad).is_err(),
                    "Kubeflow's CRD accepts {what}"
                );
                assert!(check(&ours, &bad).is_err(), "our CRD accepts {what}");
            }
        }
    }

    #[test]
    fn notebook_crd_serves_three_versions_and_stores_v1() {
        let crd = notebook::crd();
        let versions: Vec<_> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [
                ("v1", true, true),
                ("v1beta1", true, false),
                ("v1alpha1", true, false)
            ]
        );
        assert!(
            crd.spec
                .versions
                .iter()
                .all(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some())),
            "every version has the status subresource"
        );
    }
}
