//! The ImageBuild reconciler end to end: a real JupyterLab container (podman) stands in for the
//! notebook's pod, the fake API server relays `pods/exec` to it the way a kubelet would (as the
//! container's user, not root), and the reconciler saves through it to the real registry:
//! progress in the status, the final digest, a saved image that imports what was installed, and
//! clear failures for a notebook that does not exist and a registry that cannot be reached.

use crate::controller::eventually;
use crate::need;
use crate::save::{notebook_with_agent, wheel};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use labforge_builder::cache::BlobCache;
use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::registry::RegistryOptions;
use labforge_builder::save::SaveOptions;
use labforge_crds::Notebook;
use labforge_crds::imagebuild::{ImageBuild, ImageBuildPhase, ImageBuildSpec};
use labforge_tests::Registry;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn image_build(name: &str, notebook: &str, target: &str) -> ImageBuild {
    ImageBuild::new(
        name,
        ImageBuildSpec {
            notebook: notebook.into(),
            target_image: target.into(),
            compression: None,
        },
    )
}

/// Polls `name` until it is Succeeded or Failed, recording every phase and stage seen.
async fn finished(builds: &Api<ImageBuild>, name: &str, seen: &Mutex<Vec<String>>) -> ImageBuild {
    eventually(
        &format!("ImageBuild {name} to finish"),
        Duration::from_secs(180),
        || async {
            let build = builds.get(name).await.ok()?;
            let status = build.status.clone()?;
            let stage = status
                .progress
                .as_ref()
                .map(|p| p.stage.clone())
                .unwrap_or_default();
            let mut seen = seen.lock().unwrap();
            let entry = format!("{:?} {stage}", status.phase);
            if seen.last() != Some(&entry) {
                seen.push(entry);
            }
            matches!(
                status.phase,
                ImageBuildPhase::Succeeded | ImageBuildPhase::Failed
            )
            .then_some(build)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_build_saves_a_running_notebook_through_pods_exec() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let workspace = tempfile::tempdir().unwrap();
    wheel(
        workspace.path(),
        "labforge_probe",
        "1.0",
        "from-the-cluster",
    );
    let notebook = notebook_with_agent(&registry, "env", workspace.path()).await;
    let container = notebook.container();
    need(container.exec(&[
        "pip",
        "install",
        "--no-index",
        "-q",
        "/home/jovyan/labforge_probe-1.0-py3-none-any.whl",
    ]));

    let server = FakeApiServer::start(FakeApiServerOptions {
        extra_crds: vec![labforge_tests::repo_root().join("crds/imagebuilds.labforge.dev.yaml")],
        ..FakeApiServerOptions::default()
    })
    .await
    .unwrap();
    let client = server.client();
    // The Notebook, and its pod as the StatefulSet and the kubelet would have made it.
    let mut nb: Notebook = crate::controller::notebook("alice", "env");
    if let Some(spec) = nb.spec.template.spec.as_mut() {
        spec.containers[0].image = Some(notebook.image().to_owned());
    }
    Api::<Notebook>::namespaced(client.clone(), "alice")
        .create(&PostParams::default(), &nb)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "alice");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "env-0", "namespace": "alice"},
        "spec": {"containers": [{"name": "env", "image": notebook.image()}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "env-0",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "containerStatuses": [{
                "name": "env", "image": notebook.image(), "imageID": "", "ready": true,
                "restartCount": 0
            }]}}),
        ),
    )
    .await
    .unwrap();
    let podman = need(labforge_tests::Podman::locate());
    let container_name = container.name().to_owned();
    let program = podman.command().get_program().to_owned();
    let execs = Arc::new(Mutex::new(Vec::new()));
    let seen_execs = execs.clone();
    server.set_exec_runner(move |request| {
        seen_execs.lock().unwrap().push(request.clone());
        let running = request.pod == "env-0" && request.container.as_deref() == Some("env");
        running.then(|| {
            let mut command = std::process::Command::new(&program);
            command
                .args(["exec", "-i", &container_name])
                .args(&request.command);
            command
        })
    });

    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let options = SaveOptions {
        compression: Compression::default(),
        registry: RegistryOptions {
            insecure: vec![host.clone(), "127.0.0.1:9".into()],
            credentials: None,
        },
        cache: Some(BlobCache::Dir(cache.path().to_owned())),
        runtime: RuntimeConfig::default(),
        scratch_dir: scratch.path().to_owned(),
        created_by: "labforge ImageBuild".into(),
    };
    let reconciler = tokio::spawn(labforge_image_builds::run(Arc::new(
        labforge_image_builds::Context::new(client.clone(), options),
    )));

    let builds: Api<ImageBuild> = Api::namespaced(client.clone(), "alice");
    let target = format!("{host}/alice/env:from-cluster");
    builds
        .create(
            &PostParams::default(),
            &image_build("save-1", "env", &target),
        )
        .await
        .unwrap();
    let seen = Mutex::new(Vec::new());
    let build = finished(&builds, "save-1", &seen).await;
    let status = build.status.unwrap();
    assert_eq!(
        status.phase,
        ImageBuildPhase::Succeeded,
        "{:?}",
        status.message
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|s| s.starts_with("Running")),
        "the status showed the build running: {:?}",
        seen.lock().unwrap()
    );
    assert!(
        status.progress.is_none(),
        "a finished build keeps no progress"
    );
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    let digest = status.image_digest.unwrap();
    assert!(status.layer_digest.is_some() && status.layer_size.unwrap() > 0);
    let executed = execs.lock().unwrap().clone();
    assert_eq!(executed.len(), 1, "{executed:?}");
    assert_eq!(executed[0].command[0], "/.labforge/agent/labforge-agent");

    // The registry has it under the tag, by the digest the status gives, one layer more.
    let inspect = |image: &str| -> serde_json::Value {
        let out = std::process::Command::new(need(labforge_tests::tools::locate("skopeo")))
            .args([
                "inspect",
                "--tls-verify=false",
                &format!("docker://{image}"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let saved = inspect(&target);
    assert_eq!(saved["Digest"], digest);
    assert_eq!(
        saved["Layers"].as_array().unwrap().len(),
        inspect(notebook.image())["Layers"]
            .as_array()
            .unwrap()
            .len()
            + 1
    );
    need(podman.pull(&target, false));
    let out = podman
        .command()
        .args([
            "run",
            "--rm",
            "--entrypoint",
            "/opt/conda/bin/python",
            &target,
            "-c",
            "import labforge_probe; print(labforge_probe.VALUE)",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "from-the-cluster",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Kubernetes' record of it.
    let events = server.client();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(events, "alice");
    let reasons: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.contains(&"Saved".to_owned()), "{reasons:?}");

    // A notebook that does not exist: failed at once, saying so; no exec.
    builds
        .create(
            &PostParams::default(),
            &image_build("ghost", "ghost", &target),
        )
        .await
        .unwrap();
    let ghost = finished(&builds, "ghost", &Mutex::default())
        .await
        .status
        .unwrap();
    assert_eq!(ghost.phase, ImageBuildPhase::Failed);
    assert_eq!(
        ghost.message.as_deref(),
        Some("notebook ghost does not exist")
    );

    // A registry nobody answers: failed, naming it; the notebook keeps running.
    let nowhere = "127.0.0.1:9/alice/env:never";
    builds
        .create(
            &PostParams::default(),
            &image_build("nowhere", "env", nowhere),
        )
        .await
        .unwrap();
    let failed = finished(&builds, "nowhere", &Mutex::default())
        .await
        .status
        .unwrap();
    assert_eq!(failed.phase, ImageBuildPhase::Failed);
    let message = failed.message.unwrap_or_default();
    assert!(message.contains("127.0.0.1:9"), "{message}");
    assert!(failed.image_digest.is_none());
    need(container.exec(&["true"]));
    reconciler.abort();
}
