//! Live resource use with real podman: a kernel that fills most of its notebook's memory limit
//! and spins a core shows as such within seconds, in the API, in Prometheus metrics and on the
//! pages in Chromium (the list, the notebook's page with its warning, the admin's sort and
//! totals), while an idle notebook shows near zero. In a cluster, use comes from the metrics API
//! (metrics-server's PodMetrics, served by the fake API server), read with `deploy/`'s RBAC.

use crate::need;
use crate::support::embedded::{Session, up_with_jupyterlab};
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Allocates until the container's cgroup counts a working set (use less the page cache it could
/// drop, as labforge counts it) of 95 % of the 1 GiB limit, then spins a core on a thread of its
/// own for longer than the test runs, so that the kernel still answers.
const FILL_AND_SPIN: &str = r#"
import threading, time
def working_set():
    for usage, stat, key in (
        ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"),
        ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"),
    ):
        try:
            used = int(open(usage).read())
            inactive = next(int(line.split()[1]) for line in open(stat) if line.split()[0] == key)
            return used - inactive
        except OSError:
            pass
    raise RuntimeError("no cgroup memory file")
hog = []
while working_set() < 0.95 * 1024**3:
    hog.append(b"\x01" * (8 * 1024 * 1024))
def spin(until):
    while time.time() < until:
        pass
threading.Thread(target=spin, args=(time.time() + 600,), daemon=True).start()
print(len(hog))
"#;

/// Waits until notebook `name`'s usage passes `check`; returns it.
async fn usage_until(
    session: &Session,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = session
            .get(&format!("/api/namespaces/{ns}/notebooks/{name}"))
            .await;
        assert_eq!(code, 200, "{body}");
        let usage = body["notebook"]["usage"].clone();
        if check(&usage) {
            return usage;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {what} not seen within 30 s; last usage {usage}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_busy_kernel_shows_its_cpu_and_memory_and_an_idle_notebook_near_zero() {
    crate::init_crypto();
    let user = format!("use-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(
        &dir.path().join("data"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let password = need(up.add_user(&user));
    let session = Session::sign_in(&up, &user, &password).await;
    let notebooks = format!("/api/namespaces/{user}/notebooks");
    for name in ["busy", "idle"] {
        let (code, body) = session
            .post(
                &notebooks,
                json!({"name": name, "cpuLimit": "2", "memoryLimit": "1Gi", "workspace": "none"}),
            )
            .await;
        assert_eq!(code, 201, "{body}");
    }
    for name in ["busy", "idle"] {
        session
            .wait_state(&user, name, "ready", Duration::from_secs(120))
            .await;
    }
    let before = usage_until(&session, &user, "busy", "a first sample", |u| {
        u["memoryBytes"].is_u64()
    })
    .await;
    assert_eq!(before["memoryLimitBytes"], 1u64 << 30, "{before}");

    let printed = need(
        session
            .jupyter(&user, "busy")
            .await
            .run_code(FILL_AND_SPIN)
            .await,
    );
    assert!(printed.trim().parse::<u64>().is_ok(), "{printed}");
    let busy = usage_until(
        &session,
        &user,
        "busy",
        "a core spun and memory near the limit",
        // A good share of a core at some sample: other tests share this machine's two.
        |u| u["cpuCores"].as_f64().is_some_and(|c| c > 0.3) && u["memoryNearLimit"] == true,
    )
    .await;
    assert!(
        busy["cpuCores"].as_f64().unwrap() < 1.5,
        "one spinning thread is about one core: {busy}"
    );
    let grown = busy["memoryBytes"].as_u64().unwrap() - before["memoryBytes"].as_u64().unwrap();
    assert!(
        grown > 600 << 20,
        "the kernel's allocation shows: {before} → {busy}"
    );
    // Ready is said as the server first answers, while JupyterLab still finishes its start in
    // the background: an idle notebook comes down near zero within the 30 s.
    let idle = usage_until(&session, &user, "idle", "a CPU rate near zero", |u| {
        u["cpuCores"].as_f64().is_some_and(|c| c < 0.2)
    })
    .await;
    assert_eq!(idle["memoryNearLimit"], false, "{idle}");

    // Prometheus: per notebook, with Prometheus' names and units.
    let stdout = up.stdout();
    let metrics_url = stdout
        .split("Metrics:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no metrics URL printed: {stdout}"));
    let text = reqwest::get(metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in ["busy", "idle"] {
        let labels = format!(r#"{{namespace="{user}",notebook="{name}"}}"#);
        for metric in [
            "labforge_notebook_cpu_usage_seconds_total",
            "labforge_notebook_memory_working_set_bytes",
            "labforge_notebook_memory_limit_bytes",
        ] {
            assert!(
                text.contains(&format!("{metric}{labels} ")),
                "{metric}{labels} missing: {text}"
            );
        }
    }

    // The pages, in Chromium, while the kernel still spins.
    let admin = stdout
        .split("Sign in as")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    let seen = labforge_tests::browser::run_with_config(
        "usage.mjs",
        dir.path(),
        &json!({
            "url": up.url,
            "user": [user, password],
            "admin": [admin, up.admin_password.clone().unwrap()],
            "screenshots": need(labforge_tests::artifacts_dir()),
        }),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{seen:#}");
    // How much of a core the spinning thread gets now depends on what else runs (Chromium, other
    // tests): busy is told from idle, not measured against a figure.
    let busy_by = |cores: f64| cores > 0.1 && cores > 5.0 * seen["listIdleCores"].as_f64().unwrap();
    assert!(busy_by(seen["listBusyCores"].as_f64().unwrap()), "{seen}");
    assert!(seen["listIdleCores"].as_f64().unwrap() < 0.2, "{seen}");
    assert_eq!(seen["listBusyNearLimit"], true, "{seen}");
    assert_eq!(seen["listIdleNearLimit"], false, "{seen}");
    assert_eq!(seen["pageWarning"], true, "{seen}");
    assert!(busy_by(seen["pageCores"].as_f64().unwrap()), "{seen}");
    assert!(
        seen["pageUpdates"].as_u64().unwrap() >= 2,
        "the page follows new samples: {seen}"
    );
    assert_eq!(
        seen["adminFirstByCpu"],
        format!("{user}/busy"),
        "admins sort by CPU in use: {seen}"
    );
    // Two notebooks of 0.5 CPU requested and 2 CPUs limit each, one spinning a core.
    let totals = seen["adminTotals"].as_str().unwrap();
    let used: f64 = totals
        .split(" · ")
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no CPU use in {totals:?}"));
    assert!(busy_by(used), "{seen}");
    assert!(
        totals.ends_with(" · 1.0 · 4.0CPUs used now · requested · limits"),
        "{seen}"
    );
}

#[tokio::test]
async fn in_a_cluster_use_comes_from_the_metrics_api_read_with_deploys_rbac() {
    use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
    const ALICE: &str = "alice@example.com";
    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    server.set_access_rule(|spec| {
        spec["user"] == ALICE && spec["resourceAttributes"]["namespace"] == "alice"
    });
    // What metrics-server would report: the notebook's pod (Kubeflow's label on it) with its
    // container and an Istio sidecar, and a pod that is no notebook's. Without deploy/'s rule for
    // metrics.k8s.io the web app could not list them, and no use would show.
    server.set_pod_metrics(
        "alice",
        "lab-0",
        &[("notebook-name", "lab"), ("statefulset", "lab")],
        &[
            ("lab", "1200000000n", "950Mi"),
            ("istio-proxy", "3m", "50Mi"),
        ],
    );
    server.set_pod_metrics("alice", "other-0", &[], &[("other", "2", "1Gi")]);
    // A pod its owner labels as the notebook's is not taken for it (listed after the real one).
    server.set_pod_metrics(
        "alice",
        "x-decoy",
        &[("notebook-name", "lab")],
        &[("lab", "0", "1Mi")],
    );
    let web = crate::support::cluster::WebApp::start(&server, None, None).await;
    let api = web.client();
    let (code, body) = api
        .post(
            Some(ALICE),
            "/api/namespaces/alice/notebooks",
            json!({"name": "lab", "memoryLimit": "1Gi", "workspace": "none"}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    // Ready, as the controller reports it once the pod runs: only a ready notebook shows use.
    let notebooks: kube::Api<labforge_crds::notebook::Notebook> =
        kube::Api::namespaced(server.client(), "alice");
    notebooks
        .patch_status(
            "lab",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"readyReplicas": 1, "conditions": [], "containerState": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}})),
        )
        .await
        .unwrap();
    let usage = labforge_tests::eventually(
        "lab's use read from metrics.k8s.io",
        Duration::from_secs(30),
        || async {
            let (_, body) = api
                .get(Some(ALICE), "/api/namespaces/alice/notebooks/lab")
                .await;
            let usage = body["notebook"]["usage"].clone();
            (!usage.is_null()).then_some(usage)
        },
    )
    .await;
    assert_eq!(
        usage["cpuCores"].as_f64(),
        Some(1.2),
        "the notebook's container: {usage}"
    );
    assert_eq!(
        usage["memoryBytes"],
        950u64 << 20,
        "its sidecar left out: {usage}"
    );
    assert_eq!(
        usage["memoryLimitBytes"],
        1u64 << 30,
        "the notebook's own limit: {usage}"
    );
    assert_eq!(usage["memoryNearLimit"], true, "{usage}");
    assert!(
        usage["cpuSeconds"].is_null(),
        "the metrics API gives only a rate: {usage}"
    );
    let requests = server.requests_by();
    assert!(
        requests.contains_key("list pods.metrics.k8s.io"),
        "read through the metrics API: {requests:?}"
    );
}
