//! The ImageBuild reconciler end to end: a real JupyterLab container (podman) stands in for the
//! notebook's pod, the fake API server relays `pods/exec` to it the way a kubelet would (as the
//! container's user, not root), and `labforge image-builds` saves through it to the real
//! registry: killed mid-build and started again, it finishes the build; the status shows the
//! progress and the final digest, the saved image imports what was installed, and a notebook
//! that does not exist, a registry that cannot be reached or a target outside `--target-prefix`
//! fail clearly.

use crate::need;
use crate::support::save::{notebook_with_agent, pip_install, wheel};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use labforge_crds::Notebook;
use labforge_crds::imagebuild::{ImageBuild, ImageBuildPhase, ImageBuildSpec};
use labforge_tests::Registry;
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `labforge image-builds` against `server`, killed when dropped.
struct Reconciler {
    child: std::process::Child,
    admin: u16,
}

impl Reconciler {
    /// Runs `labforge image-builds` as its Deployment's service account, with exactly the rights
    /// `deploy/` grants it ([`crate::support::deploy::load_deploy_rbac`] must have run).
    fn start(server: &FakeApiServer, dir: &Path, registry: &str, extra: &[&str]) -> Reconciler {
        let kubeconfig = dir.join("kubeconfig");
        server
            .write_kubeconfig_as(&kubeconfig, crate::support::deploy::IMAGE_BUILDS_USER)
            .unwrap();
        let admin = need(labforge_tests::tools::free_port());
        let child = crate::labforge()
            .args([
                "image-builds",
                "--admin-addr",
                &format!("127.0.0.1:{admin}"),
            ])
            .args(extra)
            .args([
                "--insecure-registry",
                registry,
                "--insecure-registry",
                "127.0.0.1:9",
            ])
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .arg("--scratch-dir")
            .arg(dir)
            .env("KUBECONFIG", &kubeconfig)
            .env("LABFORGE_LOG", "labforge_image_builds=info")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Reconciler { child, admin }
    }

    async fn metrics(&self) -> String {
        eventually(
            "the reconciler's /metrics",
            Duration::from_secs(20),
            || async {
                let response = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.admin))
                    .await
                    .ok()?;
                response.text().await.ok()
            },
        )
        .await
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

/// Polls `name` until `done` holds for its phase, recording every phase, stage and message seen.
async fn until(
    builds: &Api<ImageBuild>,
    name: &str,
    seen: &Mutex<Vec<String>>,
    done: impl Fn(&ImageBuildPhase) -> bool,
) -> ImageBuild {
    eventually(
        &format!("ImageBuild {name}"),
        Duration::from_secs(180),
        || async {
            let build = builds.get(name).await.ok()?;
            let status = build.status.clone()?;
            let stage = status
                .progress
                .as_ref()
                .map(|p| p.stage.clone())
                .unwrap_or_default();
            let entry = format!(
                "{:?} {stage} {}",
                status.phase,
                status.message.clone().unwrap_or_default()
            );
            let mut seen = seen.lock().unwrap();
            if seen.last() != Some(&entry) {
                seen.push(entry);
            }
            done(&status.phase).then_some(build)
        },
    )
    .await
}

async fn finished(builds: &Api<ImageBuild>, name: &str, seen: &Mutex<Vec<String>>) -> ImageBuild {
    until(builds, name, seen, |phase| {
        matches!(phase, ImageBuildPhase::Succeeded | ImageBuildPhase::Failed)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_build_saves_a_running_notebook_through_pods_exec() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let workspace = tempfile::tempdir().unwrap();
    let probe = wheel(
        workspace.path(),
        "labforge_probe",
        "1.0",
        "from-the-cluster",
    );
    let notebook = notebook_with_agent(&registry, "env", workspace.path()).await;
    let container = notebook.container();
    pip_install(container, &probe);

    let server = FakeApiServer::start(FakeApiServerOptions {
        extra_crds: vec![labforge_tests::repo_root().join("crds/imagebuilds.labforge.dev.yaml")],
        ..FakeApiServerOptions::default()
    })
    .await
    .unwrap();
    let client = server.client();
    crate::support::deploy::load_deploy_rbac(&server).await;
    // The Notebook, and its pod as the StatefulSet and the kubelet would have made it.
    let mut nb: Notebook = crate::support::cluster::notebook("alice", "env");
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
        // As the controller builds it with LABFORGE_AGENT_IMAGE: the agent's emptyDir mounted.
        "spec": {
            "containers": [{"name": "env", "image": notebook.image(), "volumeMounts": [
                {"name": "labforge-agent", "mountPath": "/.labforge/agent", "readOnly": true}]}],
            "volumes": [{"name": "labforge-agent", "emptyDir": {}}]
        },
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
    // The first exec lingers, so the reconciler can be killed while it saves.
    let first = Arc::new(AtomicBool::new(true));
    server.set_exec_runner(move |request| {
        seen_execs.lock().unwrap().push(request.clone());
        let running = request.pod == "env-0" && request.container.as_deref() == Some("env");
        running.then(|| {
            let delay = if first.swap(false, Ordering::SeqCst) {
                "5"
            } else {
                "0"
            };
            let mut command = std::process::Command::new("sh");
            command
                .args(["-c", &format!("sleep {delay}; exec \"$0\" \"$@\"")])
                .arg(&program)
                .args(["exec", "-i", &container_name])
                .args(&request.command);
            command
        })
    });

    let dir = tempfile::tempdir().unwrap();
    let reconciler = Reconciler::start(&server, dir.path(), &host, &[]);
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
    until(&builds, "save-1", &seen, |phase| {
        *phase == ImageBuildPhase::Running
    })
    .await;
    eventually("the agent's exec", Duration::from_secs(20), || async {
        (!execs.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    drop(reconciler);
    let reconciler = Reconciler::start(&server, dir.path(), &host, &[]);
    let build = finished(&builds, "save-1", &seen).await;
    let seen = seen.into_inner().unwrap();
    let status = build.status.unwrap();
    assert_eq!(status.phase, ImageBuildPhase::Succeeded, "{seen:?}");
    assert!(
        seen.iter()
            .any(|s| s.contains("the builder restarted while saving")),
        "the restart shows in the status: {seen:?}"
    );
    assert!(
        status.progress.is_none(),
        "a finished build keeps no progress"
    );
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    let digest = status.image_digest.unwrap();
    assert!(status.layer_digest.is_some() && status.layer_size.unwrap() > 0);
    let executed = execs.lock().unwrap().clone();
    assert_eq!(executed.len(), 2, "one cut off, one finished: {executed:?}");
    assert_eq!(executed[1].command[0], "/.labforge/agent/labforge-agent");

    // The registry has it under the tag, by the digest the status gives, one layer more.
    let inspect = |image: &str| crate::support::save::inspect(image, &[]);
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
    let saved_id = need(podman.pull(&target, false));
    let out = podman
        .command()
        .args([
            "run",
            "--rm",
            "--entrypoint",
            "/opt/conda/bin/python",
            &saved_id,
            "-c",
            "import labforge_probe; print(labforge_probe.VALUE)",
        ])
        .output()
        .unwrap();
    // The agent ran as jovyan: what it could not list (root's home) is kept, not whited out.
    let root_listing = |image: &str| {
        let out = podman
            .command()
            .args([
                "run",
                "--rm",
                "--user",
                "0",
                "--entrypoint",
                "/bin/sh",
                image,
            ])
            .args(["-c", "ls -A /root"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{image}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let base_id = need(podman.pull(notebook.image(), false));
    let (kept, base_root) = (root_listing(&saved_id), root_listing(&base_id));
    assert!(!base_root.trim().is_empty(), "the base has files in /root");
    assert_eq!(kept, base_root, "/root as the image had it");
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
    let metrics = reconciler.metrics().await;
    for line in [
        "labforge_image_builds_total{result=\"succeeded\"} 1",
        "labforge_image_builds_total{result=\"failed\"} 2",
        "labforge_image_builds_running 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }

    // Confined to `<prefix>/<namespace>/`: a build of alice's aiming at bob's repository fails
    // before anything runs in the notebook.
    drop(reconciler);
    let _confined = Reconciler::start(&server, dir.path(), &host, &["--target-prefix", &host]);
    let execs_before = execs.lock().unwrap().len();
    let elsewhere = format!("{host}/bob/env:taken");
    builds
        .create(
            &PostParams::default(),
            &image_build("elsewhere", "env", &elsewhere),
        )
        .await
        .unwrap();
    let refused = finished(&builds, "elsewhere", &Mutex::default())
        .await
        .status
        .unwrap();
    assert_eq!(refused.phase, ImageBuildPhase::Failed);
    let message = refused.message.unwrap_or_default();
    assert!(message.contains(&format!("{host}/alice/")), "{message}");
    assert_eq!(execs.lock().unwrap().len(), execs_before, "no exec");
}
