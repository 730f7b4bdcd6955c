//! The JupyterLab base image from `images/build`, pushed to a real registry and run with podman.

use crate::{init_crypto, need};
use labforge_tests::tools::free_port;
use labforge_tests::{Podman, Registry, push_layout};
use std::time::{Duration, Instant};

#[tokio::test]
async fn jupyterlab_image_answers_under_its_notebook_prefix() {
    init_crypto();
    let podman = need(Podman::locate());
    let registry = need(Registry::start().await);
    let reference = need(push_layout(
        "jupyterlab",
        &registry.host(),
        "labforge/jupyterlab:e2e",
    ));
    need(podman.pull(&reference, false));
    let port = need(free_port());
    let container = need(podman.run_detached(
        &[
            "-p",
            &format!("127.0.0.1:{port}:8888"),
            "-e",
            "NB_PREFIX=/notebook/e2e-ns/lab",
        ],
        &reference,
    ));
    // The image stays in podman's store for the next run; only this run's tag goes.
    let _untag = scopeguard(|| {
        let _ = podman.command().args(["untag", &reference]).output();
    });

    let status_url = format!("http://127.0.0.1:{port}/notebook/e2e-ns/lab/api/status");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        match client.get(&status_url).send().await {
            Ok(resp) if resp.status().is_success() => {
                break resp.json::<serde_json::Value>().await.unwrap();
            }
            _ if Instant::now() > deadline => {
                panic!(
                    "{status_url} never answered 200; container log:\n{}",
                    container.logs()
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    assert!(status["started"].is_string(), "{status}");

    // Served only under the prefix the controller passes in NB_PREFIX.
    let unprefixed = client
        .get(format!("http://127.0.0.1:{port}/api/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(unprefixed.status().as_u16(), 404);

    // JupyterLab's UI really loads in a browser at that prefix.
    let screenshot = need(labforge_tests::artifacts_dir()).join("jupyterlab-image.png");
    let loaded = need(labforge_tests::browser::run_script(
        "open-jupyterlab.mjs",
        &[
            &format!("http://127.0.0.1:{port}/notebook/e2e-ns/lab/lab"),
            &screenshot.to_string_lossy(),
        ],
    ));
    assert!(loaded.contains("loaded"), "{loaded}");
    assert!(
        screenshot.metadata().unwrap().len() > 10_000,
        "empty screenshot"
    );

    // Runs as jovyan, who owns the Python environment (so users can pip install).
    assert_eq!(need(container.exec(&["id", "-u"])).trim(), "1000");
    let owner = need(container.exec(&["stat", "-c", "%u", "/opt/conda/bin/python3"]));
    assert_eq!(owner.trim(), "1000");
}

struct Guard<F: FnMut()>(F);
impl<F: FnMut()> Drop for Guard<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}
fn scopeguard<F: FnMut()>(f: F) -> Guard<F> {
    Guard(f)
}
