//! The JupyterLab base image from `images/build`, pushed to a real registry and run with podman.

use crate::{init_crypto, need};
use labforge_tests::Registry;
use labforge_tests::notebook::JupyterLab;

#[tokio::test]
async fn jupyterlab_image_answers_under_its_notebook_prefix() {
    init_crypto();
    let registry = need(Registry::start().await);
    let notebook = need(JupyterLab::start(&registry, "e2e-ns", "lab").await);
    let client = reqwest::Client::new();
    let status: serde_json::Value = client
        .get(format!("{}/api/status", notebook.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(status["started"].is_string(), "{status}");

    // Served only under the prefix the controller passes in NB_PREFIX.
    let unprefixed = client
        .get(format!("{}/api/status", notebook.origin()))
        .send()
        .await
        .unwrap();
    assert_eq!(unprefixed.status().as_u16(), 404);

    // JupyterLab's UI really loads in a browser at that prefix.
    let screenshot = need(labforge_tests::artifacts_dir()).join("jupyterlab-image.png");
    let loaded = need(labforge_tests::browser::run_script(
        "open-jupyterlab.mjs",
        &[
            &format!("{}/lab", notebook.base_url()),
            &screenshot.to_string_lossy(),
        ],
    ));
    assert!(loaded.contains("loaded"), "{loaded}");
    assert!(
        screenshot.metadata().unwrap().len() > 10_000,
        "empty screenshot"
    );

    // Runs as jovyan, who owns the Python environment (so users can pip install).
    assert_eq!(
        need(notebook.container().exec(&["id", "-u"])).trim(),
        "1000"
    );
    let owner = need(
        notebook
            .container()
            .exec(&["stat", "-c", "%u", "/opt/conda/bin/python3"]),
    );
    assert_eq!(owner.trim(), "1000");
}
