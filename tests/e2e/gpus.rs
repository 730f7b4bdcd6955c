//! GPUs: in the embedded mode, CDI devices handed to notebooks exclusively through podman (fake
//! devices described by a CDI spec that injects an env var), refused with a clear error when none
//! is free, given back on stop, and asked for through the spawner form in Chromium; in cluster
//! mode, only vendors some node has are offered.

use crate::need;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use labforge_proxy::authz::TrustedHeader;
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use labforge_tests::eventually;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

const KIND: &str = "e2e.labforge.dev/gpu";

/// A CDI spec in /etc/cdi (where podman looks), removed on drop.
struct CdiSpec(std::path::PathBuf);

impl Drop for CdiSpec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The device's variable as the notebook's process sees it (CDI edits the container's process,
/// which `podman exec` sessions do not inherit).
fn env_in(container: &str) -> String {
    let out = Command::new("podman")
        .args(["exec", container, "cat", "/proc/1/environ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .find_map(|v| v.strip_prefix("LABFORGE_E2E_GPU="))
        .unwrap_or_default()
        .to_owned()
}

async fn notebook(
    http: &reqwest::Client,
    up: &LabforgeUp,
    cookie: &str,
    ns: &str,
    name: &str,
) -> Value {
    http.get(format!("{}/api/namespaces/{ns}/notebooks/{name}", up.url))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["notebook"]
        .clone()
}

#[tokio::test]
async fn cdi_devices_are_given_exclusively_and_freed_on_stop() {
    crate::init_crypto();
    let user = format!("gpu-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    std::fs::create_dir_all("/etc/cdi").unwrap();
    let spec = CdiSpec(format!("/etc/cdi/labforge-e2e-{}.yaml", std::process::id()).into());
    std::fs::write(
        &spec.0,
        format!(
            "cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n\
             - name: \"0\"\n  containerEdits:\n    env: [LABFORGE_E2E_GPU=0]\n\
             - name: \"1\"\n  containerEdits:\n    env: [LABFORGE_E2E_GPU=1]\n\
             containerEdits: {{}}\n"
        ),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The devices' use as nvidia-smi reports it: device 0 busy, device 1 nearly idle.
    let smi = dir.path().join("fake-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\n[ \"$1 $2\" = \"--query-gpu=index,uuid,utilization.gpu,memory.used --format=csv,noheader,nounits\" ] || exit 2\n\
         printf '0, GPU-e2e-0, 87, 2048\\n1, GPU-e2e-1, 3, 256\\n'\n",
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = need(labforge_tests::agent::agent_binary());
    // The registry address is only known once labforge runs: the catalog allows custom images.
    let config = dir.path().join("spawner.json");
    std::fs::write(
        &config,
        json!({
            "images": [],
            "allowCustomImages": true,
            "gpuVendors": [{"limitsKey": KIND, "name": "Fake GPU", "smi": smi}, {"limitsKey": "nvidia.com/gpu", "name": "NVIDIA"}],
        })
        .to_string(),
    )
    .unwrap();
    let up = need(
        LabforgeUp::start_with(
            std::path::Path::new(env!("CARGO_BIN_EXE_labforge")),
            &dir.path().join("data"),
            &agent,
            &["--spawner-config", &config.to_string_lossy()],
        )
        .await,
    );
    let image = need(labforge_tests::push_layout(
        "jupyterlab",
        &up.registry,
        "labforge/jupyterlab:latest",
    ));
    let password = need(up.add_user(&user));
    let http = reqwest::Client::new();
    let cookie = need(up.sign_in(&user, &password).await);

    // Only the vendor with devices on this machine is offered.
    let config: Value = http
        .get(format!("{}/api/config", up.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        config["gpuVendors"],
        json!([{"limitsKey": KIND, "name": "Fake GPU", "cdiKind": null}])
    );

    let create = |name: &'static str| {
        let http = http.clone();
        let (url, cookie, image, user) =
            (up.url.clone(), cookie.clone(), image.clone(), user.clone());
        async move {
            let response = http
                .post(format!("{url}/api/namespaces/{user}/notebooks"))
                .header("cookie", cookie)
                .json(&json!({"name": name, "image": image, "cpuLimit": "1", "gpus": {"vendor": KIND, "count": 1}}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 201, "{}", response.text().await.unwrap());
        }
    };
    create("g1").await;
    create("g2").await;
    for name in ["g1", "g2"] {
        eventually(
            &format!("{name} ready"),
            Duration::from_secs(120),
            || async {
                (notebook(&http, &up, &cookie, &user, name).await["state"] == "ready").then_some(())
            },
        )
        .await;
    }
    let (g1, g2) = (
        env_in(&labforge_embedded::runtime::container_name(&user, "g1")),
        env_in(&labforge_embedded::runtime::container_name(&user, "g2")),
    );
    let mut seen = [g1.clone(), g2.clone()];
    seen.sort();
    assert_eq!(
        seen,
        ["0".to_owned(), "1".to_owned()],
        "each got its own device"
    );
    // Each notebook's GPU use is its own device's, as the vendor's program reports it.
    for (name, device) in [("g1", &g1), ("g2", &g2)] {
        let want = if device == "0" {
            json!({"utilizationPercent": 87.0, "memoryBytes": 2048u64 << 20})
        } else {
            json!({"utilizationPercent": 3.0, "memoryBytes": 256u64 << 20})
        };
        eventually(
            &format!("{name}'s GPU use"),
            Duration::from_secs(30),
            || async {
                let nb = notebook(&http, &up, &cookie, &user, name).await;
                (nb["usage"]["gpu"] == want).then_some(())
            },
        )
        .await;
    }

    // A third waits with a clear error, and gets g1's device once g1 stops.
    create("g3").await;
    let waiting = eventually("g3 refused", Duration::from_secs(30), || async {
        let nb = notebook(&http, &up, &cookie, &user, "g3").await;
        (nb["state"] == "error").then_some(nb)
    })
    .await;
    assert_eq!(
        waiting["reason"],
        format!("1 {KIND} requested, but 0 of 2 are free")
    );
    let stop = |name: &'static str| {
        let http = http.clone();
        let (url, cookie, user) = (up.url.clone(), cookie.clone(), user.clone());
        async move {
            let stop = http
                .patch(format!("{url}/api/namespaces/{user}/notebooks/{name}"))
                .header("cookie", cookie)
                .json(&json!({"stopped": true}))
                .send()
                .await
                .unwrap();
            assert_eq!(stop.status(), 200, "stopping {name}");
        }
    };
    stop("g1").await;
    eventually("g3 ready", Duration::from_secs(120), || async {
        (notebook(&http, &up, &cookie, &user, "g3").await["state"] == "ready").then_some(())
    })
    .await;
    assert_eq!(
        env_in(&labforge_embedded::runtime::container_name(&user, "g3")),
        g1,
        "g1's device, freed by its stop"
    );

    // The same through the form in Chromium, with every device free again.
    stop("g2").await;
    stop("g3").await;
    let seen = labforge_tests::browser::run_with_config(
        "gpu.mjs",
        dir.path(),
        &json!({
            "url": up.url,
            "user": [user, password],
            "image": image,
            "screenshots": need(labforge_tests::artifacts_dir()),
        }),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen["vendors"],
        json!([{"value": "", "label": "None"}, {"value": KIND, "label": "Fake GPU"}]),
        "only the vendor with devices here: {seen}"
    );
    assert_eq!(
        seen["countMax"], "2",
        "the form's limit is what exists: {seen}"
    );
    assert_eq!(seen["tooMany"]["message"], "at most 2 GPUs", "{seen}");
    assert_eq!(seen["tooMany"]["visible"], true, "{seen}");
    let listed = seen["listed"].as_str().unwrap();
    assert!(
        listed == format!("1 × {KIND} · 87 % · 2.0 GiB")
            || listed == format!("1 × {KIND} · 3 % · 256.0 MiB"),
        "the list shows the GPU's use: {seen}"
    );
    let given = env_in(&labforge_embedded::runtime::container_name(&user, "gform"));
    assert!(
        given == "0" || given == "1",
        "the notebook made in the form got a device: {given:?}"
    );
}

#[tokio::test]
async fn in_a_cluster_only_vendors_some_node_has_are_offered() {
    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node"}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    // Capacity is status, which the kubelet reports through the status subresource.
    let status =
        json!({"status": {"capacity": {"cpu": "8", "memory": "32Gi", "amd.com/gpu": "2"}}});
    nodes
        .patch_status("gpu-node", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let mut spawner = labforge_web::config::default_spawner("registry.example.com");
    spawner.gpu_vendors = serde_json::from_value(json!([
        {"limitsKey": "nvidia.com/gpu", "name": "NVIDIA"},
        {"limitsKey": "amd.com/gpu", "name": "AMD"}
    ]))
    .unwrap();
    let app = labforge_web::cluster::router(
        server.client(),
        labforge_web::cluster::WebOptions {
            header: TrustedHeader::default(),
            spawner,
            save_registry: None,
            notebook_domain: None,
            base_path: Default::default(),
        },
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let serving = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = reqwest::Client::new();
    let config: Value = http
        .get(format!("{base}/api/config"))
        .header("kubeflow-userid", "alice@example.com")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let offered: Vec<&str> = config["gpuVendors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["limitsKey"].as_str())
        .collect();
    assert_eq!(offered, ["amd.com/gpu"]);
    // And the API refuses the vendor no node has, naming the field.
    let refused = http
        .post(format!("{base}/api/namespaces/alice/notebooks"))
        .header("kubeflow-userid", "alice@example.com")
        .json(&json!({"name": "lab", "gpus": {"vendor": "nvidia.com/gpu", "count": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    assert_eq!(
        refused.json::<Value>().await.unwrap()["field"],
        "gpus.vendor"
    );
    serving.abort();
}
