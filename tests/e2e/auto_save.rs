//! Stops that never lose installed packages: a notebook with auto-save is saved before it stops
//! and starts on that image; a failed save (registry down) never blocks the stop; retention keeps
//! the newest saved images of a notebook, never one that a notebook runs.

use crate::need;
use crate::support::embedded::{CHECK, PIP_INSTALL, Session};
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn wait_image(user: &Session, path: &str, not: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, body) = user.get(path).await;
        let image = body["notebook"]["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if image != not {
            return image;
        }
        assert!(Instant::now() < deadline, "{path} still runs {not}: {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn reasons(user: &Session, path: &str) -> Vec<(String, String)> {
    let (_, events) = user.get(&format!("{path}/events")).await;
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap().to_owned(),
                e["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn save(user: &Session, ns: &str, name: &str, tag: &str) -> Value {
    let (code, started) = user
        .post(
            &format!("/api/namespaces/{ns}/notebooks/{name}/saves"),
            json!({"tag": tag}),
        )
        .await;
    assert_eq!(code, 202, "{started}");
    let (events, mut progress) = user
        .save_progress(ns, started["id"].as_str().unwrap())
        .await;
    let last = progress.pop().unwrap();
    assert_eq!(last["phase"], "done", "{events}");
    last
}

fn manifest_status(registry: &str, image: &Value) -> u16 {
    let name = image["image"].as_str().unwrap();
    let repository = name.split_once('/').unwrap().1.split(':').next().unwrap();
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
        ])
        .arg(format!(
            "http://{registry}/v2/{repository}/manifests/{}",
            image["digest"].as_str().unwrap()
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).parse().unwrap()
}

#[tokio::test]
async fn auto_save_keeps_packages_across_stops_and_retention_prunes_what_no_notebook_runs() {
    crate::init_crypto();
    let user_name = format!("keep-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user_name.clone()]);
    let mut registry = need(labforge_tests::Registry::start().await);
    let base = need(labforge_tests::push_layout(
        "jupyterlab",
        &registry.host(),
        "labforge/jupyterlab:latest",
    ));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spawner.json");
    std::fs::write(
        &config,
        json!({
            "images": [{"image": base, "serverType": "jupyter", "default": true}],
            "defaults": {"cpu": "0.5", "memory": "1Gi", "workspaceSize": "5Gi", "shmSize": "64Mi",
                         "maxCpu": "4", "maxMemory": "8Gi", "maxGpus": 0, "maxVolumeSize": "100Gi",
                         "autoSave": true, "keepSavedImages": 1},
        })
        .to_string(),
    )
    .unwrap();
    let agent = need(labforge_tests::agent::agent_binary());
    let up = need(
        LabforgeUp::start_with(
            std::path::Path::new(env!("CARGO_BIN_EXE_labforge")),
            &dir.path().join("data"),
            &agent,
            &[
                "--registry",
                &registry.host(),
                "--spawner-config",
                &config.to_string_lossy(),
            ],
        )
        .await,
    );
    let password = need(up.add_user(&user_name));
    let user = Session::sign_in(&up, &user_name, &password).await;
    let ns = user_name.as_str();
    let notebooks = format!("/api/namespaces/{ns}/notebooks");
    let lab = format!("{notebooks}/lab");

    // Auto-save is the admin's default here.
    let (code, created) = user
        .post(
            &notebooks,
            json!({"name": "lab", "cpuLimit": "2", "memoryLimit": "2Gi"}),
        )
        .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["autoSave"], true);
    user.wait_state(ns, "lab", "ready", Duration::from_secs(120))
        .await;
    let printed = need(user.jupyter(ns, "lab").await.run_code(PIP_INSTALL).await);
    assert!(printed.starts_with("pip exit 0"), "{printed}");

    // Stop: saved first, then stopped; the next start runs on the saved image.
    assert_eq!(user.patch(&lab, json!({"stopped": true})).await.0, 200);
    let saved_image = wait_image(&user, &lab, &base).await;
    assert!(
        saved_image.contains(&format!("/{ns}/lab:auto-")),
        "{saved_image}"
    );
    user.wait_state(ns, "lab", "stopped", Duration::from_secs(60))
        .await;
    let (_, images) = user.get(&format!("/api/namespaces/{ns}/images")).await;
    let added = &images["images"][0]["summary"]["python"]["added"];
    assert_eq!(
        added[0]["name"], "labforge_probe",
        "the summary names the package: {images}"
    );
    assert!(
        reasons(&user, &lab)
            .await
            .iter()
            .any(|(r, _)| r == "AutoSaved")
    );
    assert_eq!(user.patch(&lab, json!({"stopped": false})).await.0, 200);
    user.wait_state(ns, "lab", "ready", Duration::from_secs(120))
        .await;
    let visit = user.open_notebook(ns, "lab").await.unwrap();
    let client =
        labforge_tests::jupyter::JupyterClient::connect_with_headers(&visit.base, visit.headers())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{e}\ncontainers: {}\nlabforge log: {}",
                    podman_ps(),
                    up.log()
                )
            });
    let checked = client.run_code(CHECK).await;
    let checked = checked.unwrap_or_else(|e| {
        panic!(
            "{e}\ncontainers: {}\nlabforge log: {}",
            podman_ps(),
            up.log()
        )
    });
    assert!(checked.contains("answer 42 from /opt/conda/"), "{checked}");

    // Retention (keep 1): a saved image another notebook runs stays; one nobody runs goes.
    // Each save has a file to keep (one with none makes no image).
    need(client.run_code("open('/tmp/v1', 'w').write('1')").await);
    let v1 = save(&user, ns, "lab", "v1").await;
    let (code, _) = user
        .post(
            &notebooks,
            json!({"name": "other", "image": v1["target"], "autoSave": false, "cpuLimit": "1"}),
        )
        .await;
    assert_eq!(code, 201);
    need(
        user.jupyter(ns, "lab")
            .await
            .run_code("open('/tmp/x', 'w').write('1')")
            .await,
    );
    let v2 = save(&user, ns, "lab", "v2").await;
    need(
        user.jupyter(ns, "lab")
            .await
            .run_code("open('/tmp/y', 'w').write('2')")
            .await,
    );
    let v3 = save(&user, ns, "lab", "v3").await;
    let (_, images) = user.get(&format!("/api/namespaces/{ns}/images")).await;
    let kept: Vec<&str> = images["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["image"].as_str().unwrap())
        .collect();
    assert!(kept.contains(&v3["target"].as_str().unwrap()), "{kept:?}");
    assert!(
        kept.contains(&v1["target"].as_str().unwrap()),
        "in use by `other`: {kept:?}"
    );
    assert!(
        !kept.contains(&v2["target"].as_str().unwrap()),
        "pruned: {kept:?}"
    );
    let pruned = json!({"image": v2["target"], "digest": v2["digest"]});
    assert_eq!(
        manifest_status(&registry.host(), &pruned),
        404,
        "deleted from the registry"
    );
    let in_use = json!({"image": v1["target"], "digest": v1["digest"]});
    assert_eq!(manifest_status(&registry.host(), &in_use), 200);

    // Registry down: the stop still completes, and the event says why nothing was saved.
    registry.stop();
    let running_on = user.get(&lab).await.1["notebook"]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(user.patch(&lab, json!({"stopped": true})).await.0, 200);
    user.wait_state(ns, "lab", "stopped", Duration::from_secs(120))
        .await;
    labforge_tests::eventually(
        "the container removed",
        Duration::from_secs(120),
        || async {
            let out = std::process::Command::new("podman")
                .args([
                    "container",
                    "exists",
                    &labforge_embedded::runtime::container_name(ns, "lab"),
                ])
                .status()
                .unwrap();
            (!out.success()).then_some(())
        },
    )
    .await;
    let failed = reasons(&user, &lab).await;
    let (_, message) = failed
        .iter()
        .find(|(r, _)| r == "AutoSaveFailed")
        .unwrap_or_else(|| panic!("{failed:?}"));
    assert!(message.starts_with("stopped without saving:"), "{message}");
    assert!(message.contains("is unreachable"), "{message}");
    assert_eq!(
        user.get(&lab).await.1["notebook"]["image"],
        running_on.as_str(),
        "still on its last image"
    );
}

/// What podman runs, for failure messages.
fn podman_ps() -> String {
    String::from_utf8_lossy(
        &std::process::Command::new("podman")
            .args(["ps", "-a"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned()
}
