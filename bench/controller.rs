//! Controller benchmark (not a test): 1,000 Notebooks against the fake API server.
//!
//! Runs the real `labforge controller` binary against the fake Kubernetes API server (which
//! validates every object against the official schemas), and reports:
//! - time until every Notebook has its StatefulSet, Service, VirtualService and status;
//! - the controller's peak RSS;
//! - requests sent by a periodic resync with nothing changed (0: reads come from watch caches);
//! - writes made by a full resync with nothing changed (a fresh controller re-reconciling all).
//!
//!   cargo bench --bench controller [-- COUNT]

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use labforge_crds::{Notebook, VirtualService};
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use labforge_tests::tools::reconciles_done;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Notebook as Kubeflow's web app writes it by default: `0.5` CPU and `1.0Gi` memory, limits
/// 1.2 times that, which the API server stores as `500m`, `1Gi`, `600m` and `1288490188800m`.
fn notebook(i: usize) -> Notebook {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
        "metadata": { "name": format!("nb-{i:04}"), "namespace": format!("user-{}", i % 50) },
        "spec": { "template": { "spec": { "containers": [{
            "name": format!("nb-{i:04}"), "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0",
            "resources": { "requests": { "cpu": "0.5", "memory": "1.0Gi" }, "limits": { "cpu": "0.6", "memory": "1.2Gi" } }
        }] } } }
    }))
    .expect("notebook fixture")
}

/// Seconds between periodic resyncs in this bench (the default is minutes).
const RESYNC_SECONDS: u64 = 10;

fn start_controller(kubeconfig: &std::path::Path, admin_port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_labforge"))
        .args([
            "controller",
            "--admin-addr",
            &format!("127.0.0.1:{admin_port}"),
            "--resync-seconds",
            &RESYNC_SECONDS.to_string(),
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("LABFORGE_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("start labforge controller")
}

/// Peak resident set size of a process, from /proc (kB).
fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    labforge_tests::init_crypto();
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let server = FakeApiServer::start(FakeApiServerOptions {
        watch_history: 20_000,
        ..Default::default()
    })
    .await
    .expect("fake API server");
    let client = server.client();
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = write_kubeconfig(dir.path(), &server);

    let create_time = create_notebooks(&client, count).await;
    let writes_after_create = server.write_count();

    let admin_port = labforge_tests::tools::free_port().expect("port");
    let mut controller = start_controller(&kubeconfig, admin_port);
    let converge_time = converge(&client, count).await;
    let converge_writes = server.write_count() - writes_after_create;
    let rss_first = peak_rss_kb(controller.id());
    let idle_requests = periodic_resync_requests(&server, admin_port, count).await;
    let _ = controller.kill();
    let _ = controller.wait();

    let resync = full_resync(&server, &kubeconfig, count).await;

    Report {
        count,
        create_time,
        converge_time,
        converge_writes,
        rss_first,
        idle_requests,
        resync,
    }
    .print(&server);
}

/// A kubeconfig in `dir` for the controller to reach `server`.
fn write_kubeconfig(dir: &Path, server: &FakeApiServer) -> PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            server.url()
        ),
    )
    .expect("kubeconfig");
    kubeconfig
}

/// Creates `count` Notebooks one after another; the time it took.
async fn create_notebooks(client: &Client, count: usize) -> Duration {
    let started = Instant::now();
    for i in 0..count {
        let nb = notebook(i);
        let ns = nb.metadata.namespace.clone().unwrap_or_default();
        Api::<Notebook>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &nb)
            .await
            .expect("create notebook");
    }
    started.elapsed()
}

/// Waits until every Notebook has its StatefulSet, Service, VirtualService and status; the time
/// it took.
async fn converge(client: &Client, count: usize) -> Duration {
    let started = Instant::now();
    let all: ListParams = ListParams::default();
    loop {
        let sts = Api::<StatefulSet>::all(client.clone())
            .list(&all)
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        let svc = Api::<Service>::all(client.clone())
            .list(&all)
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        let vs = Api::<VirtualService>::all(client.clone())
            .list(&all)
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        let with_status = Api::<Notebook>::all(client.clone())
            .list(&all)
            .await
            .map(|l| l.items.iter().filter(|n| n.status.is_some()).count())
            .unwrap_or(0);
        if sts == count && svc == count && vs == count && with_status == count {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "did not converge: {sts} {svc} {vs} {with_status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    started.elapsed()
}

/// Requests the running controller sends while its periodic resync goes over every unchanged
/// notebook once, watches aside: only watches may stay open.
async fn periodic_resync_requests(
    server: &FakeApiServer,
    admin_port: u16,
    count: usize,
) -> BTreeMap<String, u64> {
    let requests_before = server.requests_by();
    let reconciles_before = reconciles_done(admin_port).await;
    let started = Instant::now();
    while reconciles_done(admin_port).await < reconciles_before + count as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "periodic resync did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server
        .requests_by()
        .into_iter()
        .filter(|(key, _)| !key.starts_with("watch "))
        .filter_map(|(key, n)| {
            let sent = n - requests_before.get(&key).copied().unwrap_or(0);
            (sent > 0).then_some((key, sent))
        })
        .collect()
}

/// What a fresh controller did while reconciling every unchanged notebook.
struct Resync {
    time: Duration,
    /// Changes stored.
    writes: u64,
    /// Write requests, no-ops included.
    requests: u64,
    rss_kb: u64,
}

/// A fresh controller re-reconciles everything; nothing has changed, so nothing may be written.
async fn full_resync(server: &FakeApiServer, kubeconfig: &Path, count: usize) -> Resync {
    let before = server.write_count();
    let requests_before = server.write_requests();
    let admin_port = labforge_tests::tools::free_port().expect("port");
    let mut controller = start_controller(kubeconfig, admin_port);
    let started = Instant::now();
    while reconciles_done(admin_port).await < count as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "resync did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let time = started.elapsed();
    let writes = server.write_count() - before;
    let requests = server.write_requests() - requests_before;
    let rss_kb = peak_rss_kb(controller.id());
    let _ = controller.kill();
    let _ = controller.wait();
    Resync {
        time,
        writes,
        requests,
        rss_kb,
    }
}

/// The measures of one run, printed as a Markdown table.
struct Report {
    count: usize,
    create_time: Duration,
    converge_time: Duration,
    converge_writes: u64,
    rss_first: u64,
    idle_requests: BTreeMap<String, u64>,
    resync: Resync,
}

impl Report {
    fn print(&self, server: &FakeApiServer) {
        let Report {
            count,
            create_time,
            converge_time,
            converge_writes,
            rss_first,
            idle_requests,
            resync,
        } = self;
        println!("| measure | value |");
        println!("|---|---|");
        println!("| notebooks | {count} |");
        println!(
            "| create {count} Notebook CRs (client → fake API server) | {:.2} s |",
            create_time.as_secs_f64()
        );
        println!(
            "| controller: all StatefulSets, Services, VirtualServices and statuses written | {:.2} s ({:.0} notebooks/s) |",
            converge_time.as_secs_f64(),
            *count as f64 / converge_time.as_secs_f64()
        );
        println!(
            "| writes to converge | {converge_writes} ({:.1} per notebook) |",
            *converge_writes as f64 / *count as f64
        );
        println!(
            "| controller peak RSS (first run) | {:.1} MiB |",
            *rss_first as f64 / 1024.0
        );
        println!(
            "| requests sent by a periodic resync of {count} unchanged notebooks (watches aside) | {} {idle_requests:?} |",
            idle_requests.values().sum::<u64>()
        );
        println!(
            "| full resync of {count} unchanged notebooks by a fresh controller | {:.2} s |",
            resync.time.as_secs_f64()
        );
        println!(
            "| writes during that resync (changes / write requests incl. no-ops) | {} / {} |",
            resync.writes, resync.requests
        );
        println!(
            "| controller peak RSS (resync) | {:.1} MiB |",
            resync.rss_kb as f64 / 1024.0
        );
        println!("| writes by kind (whole run) | {:?} |", server.writes_by());
    }
}
