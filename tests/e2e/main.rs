//! End-to-end suites: the real `labforge` binary and libraries against real services (OCI registry,
//! S3 server, podman), one module per area. Support code lives in the `labforge-tests` crate.

// Test helpers panic on purpose: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod audit;
mod auto_save;
mod backups;
mod change_summary;
mod cli_commit;
mod cli_render;
mod cluster_flow;
mod controller;
mod culling;
mod deploy;
mod deploy_image;
mod embedded;
mod engine_faults;
mod fake_kube;
mod gpus;
mod image_builds;
mod isolation;
mod kubeflow_api;
mod memory_soak;
mod messages;
mod notebook_image;
mod proxy;
mod quota;
mod remote_access;
mod s3_cache;
mod save;
mod support;
mod team_server;
mod teams;
mod ui;
mod usage;
mod vscode;
mod web_cluster;

/// The labforge binary built for this test run.
pub fn labforge() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_labforge"))
}

/// The proxy-only binary built for this test run (what the proxy's Deployment runs).
pub fn labforge_proxy() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_labforge-proxy"))
}

pub use labforge_tests::init_crypto;

/// Unwraps a support result, failing the test with the support error's own message
/// (which names the missing tool and the setup command).
#[track_caller]
pub fn need<T>(result: Result<T, labforge_tests::SupportError>) -> T {
    result.unwrap_or_else(|err| panic!("{err}"))
}
