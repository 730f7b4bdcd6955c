//! The plan never gives podman a limit it reads as none.

use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use labforge_web::config::{CatalogImage, Defaults, SpawnerConfig};
use labforge_web::model::{NotebookRequest, ServerType};

/// A notebook as the store could hold it, with these limits (no validation in between: stored
/// before the minimums existed, or written to the store directly).
fn stored_with_limits(cpu: &str, memory: &str) -> Notebook {
    let config = SpawnerConfig {
        images: vec![CatalogImage {
            image: "registry.local/labforge/jupyterlab:latest".into(),
            server_type: ServerType::Jupyter,
            description: String::new(),
            default: true,
        }],
        allow_custom_images: false,
        gpu_vendors: vec![],
        defaults: Defaults::default(),
        kubeflow: Default::default(),
    };
    let request = NotebookRequest {
        name: "nb".into(),
        ..Default::default()
    };
    let mut notebook =
        labforge_web::validate::notebook_from_request(&request, "alice", "alice", &config, &[])
            .expect("a valid request");
    let container = &mut notebook
        .spec
        .template
        .spec
        .as_mut()
        .expect("a pod spec")
        .containers[0];
    let limits = container
        .resources
        .as_mut()
        .and_then(|r| r.limits.as_mut())
        .expect("limits");
    limits.insert("cpu".into(), Quantity(cpu.into()));
    limits.insert("memory".into(), Quantity(memory.into()));
    notebook
}

fn option<'a>(plan: &'a ContainerPlan, name: &str) -> Option<&'a str> {
    let at = plan.options.iter().position(|o| o == name)?;
    plan.options.get(at + 1).map(String::as_str)
}

fn planned(cpu: &str, memory: &str) -> Result<ContainerPlan, PlanError> {
    plan(
        &stored_with_limits(cpu, memory),
        &BuilderConfig::default(),
        None,
        &[],
        None,
    )
}

#[test]
fn tiny_limits_are_raised_to_the_minimum_not_dropped() {
    let plan = planned("0.0004", "0.4").expect("planned");
    assert_eq!(option(&plan, "--cpus"), Some("0.010"));
    assert_eq!(option(&plan, "--memory"), Some("6291456"));
    let plan = planned("0", "0").expect("planned");
    assert_eq!(option(&plan, "--cpus"), Some("0.010"));
    assert_eq!(option(&plan, "--memory"), Some("6291456"));
}

#[test]
fn ordinary_limits_are_passed_as_they_were() {
    // Unchanged text means an unchanged plan digest: no running notebook is replaced.
    let plan = planned("1.5", "1.1G").expect("planned");
    assert_eq!(option(&plan, "--cpus"), Some("1.500"));
    assert_eq!(option(&plan, "--memory"), Some("1100000000"));
}

#[test]
fn an_unreadable_limit_fails_the_plan_instead_of_vanishing() {
    for (cpu, memory, says) in [("lots", "1Gi", "CPU"), ("1", "-1Gi", "memory")] {
        let err = planned(cpu, memory).expect_err("no plan without its limits");
        assert!(
            matches!(&err, PlanError::Unsupported(m) if m.contains(says)),
            "{cpu} {memory}: {err}"
        );
    }
}
