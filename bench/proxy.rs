//! Proxy benchmark (not a test): `labforge proxy` against nginx and configurable-http-proxy.
//!
//! In one run, on the same cores, with the same wrk settings for every contender:
//! - a tiny static upstream (hyper, in this process, one thread) and a websocket echo upstream;
//! - `labforge proxy` (release build, routes from a VirtualService file), nginx (temporary config,
//!   foreground, loopback, keep-alive upstream pool) and configurable-http-proxy (npm, routes via
//!   its REST API);
//! - wrk at full load (req/s, p50, p99, each contender's CPU time per request, and that of the
//!   whole exchange: wrk, the upstream and the contender, which the two cores share), in rounds
//!   that take the contenders in turn (the machine's speed drifts by a fifth within minutes, so
//!   one run each would compare moments, not proxies; medians are reported); then at half of
//!   labforge's full-load rate (each connection waits a random time between its requests, so
//!   arrivals spread out), in rounds too, to compare p99 added latency against the upstream
//!   alone's in the same round;
//! - each contender's RSS after the full-load rounds and after the half-load phase;
//! - the same with 10,000 routes (the measured route is the last one created);
//! - the floor of any hyper-based proxy ([`hyper_floor`]): hyper's server and client with nothing
//!   between them, which tells labforge's own cost apart from its building blocks';
//! - websocket echo round trips through each proxy;
//! - with one route, HTTP/2 (in clear and under TLS) and HTTP/1.1 under TLS through labforge and
//!   nginx, with h2load as the client ([`protocols`]);
//! - labforge's open descriptors before and after 10,000 requests to a refused upstream.
//!
//! labforge is the release build of `labforge-proxy`, as the image ships it. `LABFORGE_PROXY_BIN`
//! names another build to measure beside it in the same rounds (another Cargo profile, another
//! commit).
//!
//!   bench/setup     # nginx, wrk, h2load, configurable-http-proxy (make bench runs it)
//!   cargo bench --bench proxy [-- SECONDS [ROUNDS]]

mod hyper_floor;
mod protocols;

use futures::{SinkExt, StreamExt};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

const CONNECTIONS: u32 = 64;
const THREADS: u32 = 2;
const USER: &str = "bench@example.com";
/// Websocket echoes before [`ws_round_trips`] times any.
const WS_WARM_UP: usize = 100;
const CHP: &str = "/opt/labforge/chp/node_modules/.bin/configurable-http-proxy";

fn free_port() -> u16 {
    labforge_tests::tools::free_port().expect("free port")
}

/// Serves every connection `listener` accepts with `serve`, each in its own task, on a
/// current-thread runtime that blocks the calling thread.
fn serve_each_connection<Served>(
    listener: std::net::TcpListener,
    serve: impl Fn(tokio::net::TcpStream) -> Served,
) where
    Served: Future<Output = ()> + Send + 'static,
{
    listener.set_nonblocking(true).expect("nonblocking");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a serving runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream));
        }
    });
}

/// The upstream's thread (its id under `/proc/self/task`), whose CPU time is part of each
/// request's.
static UPSTREAM_THREAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A small fixed response, keep-alive, from a one-thread hyper server, after reading the request's
/// body (the bench sends none).
fn start_upstream() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = listener.local_addr().expect("upstream addr");
    std::thread::spawn(move || {
        if let Some(thread) = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|link| Some(link.file_name()?.to_str()?.to_owned()))
        {
            let _ = UPSTREAM_THREAD.set(thread);
        }
        serve_each_connection(listener, |stream| async move {
            let service = hyper::service::service_fn(|request: hyper::Request<_>| async {
                let _ = http_body_util::BodyExt::collect(request.into_body()).await;
                Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"ok\n"),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        })
    });
    addr
}

/// A websocket echo server on its own thread.
fn start_echo() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    std::thread::spawn(move || {
        serve_each_connection(listener, |stream| async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            while let Some(Ok(message)) = ws.next().await {
                if message.is_text() && ws.send(message).await.is_err() {
                    return;
                }
            }
        })
    });
    addr
}

fn vs_yaml(i: usize, prefix: &str, port: u16) -> String {
    format!(
        "---\napiVersion: networking.istio.io/v1beta1\nkind: VirtualService\n\
         metadata: {{name: notebook-bench-nb{i}, namespace: bench, creationTimestamp: '2026-01-01T00:00:00Z'}}\n\
         spec:\n  hosts: ['*']\n  gateways: [kubeflow/kubeflow-gateway]\n  http:\n\
         \x20 - match: [{{uri: {{prefix: '{prefix}'}}}}]\n    rewrite: {{uri: '{prefix}'}}\n\
         \x20   route: [{{destination: {{host: 127.0.0.1, port: {{number: {port}}}}}}}]\n"
    )
}

fn route_prefix(i: usize) -> String {
    format!("/notebook/bench/nb{i}/")
}

/// The routes every contender gets: `routes` notebooks on the upstream, a websocket route on the
/// echo server and a route to a port nobody listens on.
struct Routes {
    count: usize,
    upstream: u16,
    echo: u16,
    refused: u16,
}

impl Routes {
    /// The two tables each run measures: one notebook's route, and 10,000 notebooks' routes.
    fn both(upstream: SocketAddr, echo: SocketAddr, refused: u16) -> [Routes; 2] {
        [1, 10_000].map(|count| Routes {
            count,
            upstream: upstream.port(),
            echo: echo.port(),
            refused,
        })
    }
    fn measured(&self) -> String {
        format!("{}x", route_prefix(self.count - 1))
    }
    fn list(&self) -> Vec<(String, u16)> {
        let mut list: Vec<_> = (0..self.count)
            .map(|i| (route_prefix(i), self.upstream))
            .collect();
        list.push(("/ws/".into(), self.echo));
        list.push(("/refused/".into(), self.refused));
        list
    }
}

struct Running {
    name: &'static str,
    child: Child,
    port: u16,
    /// Worker processes to sum RSS over (nginx); the main pid otherwise.
    pids: Vec<u32>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Running {
    /// Asks the process to stop and waits for it, killing it after 5 s: true when it stopped by
    /// itself and exited with success.
    fn stop(&mut self) -> bool {
        if let Ok(Some(status)) = self.child.try_wait() {
            // Stopped before (its pid may be another process's by now).
            return status.success();
        }
        // SIGTERM, not SIGKILL: nginx's master stops and reaps its workers only when asked.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Running {
    /// Starts `command`, a single process serving on `port`, and waits until it listens.
    fn serving(name: &'static str, command: &mut Command, port: u16) -> Running {
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        wait_port(port);
        let pid = child.id();
        Running {
            name,
            child,
            port,
            pids: vec![pid],
        }
    }
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Another build of the proxy to measure beside the release one.
const OTHER_PROXY: &str = "LABFORGE_PROXY_BIN";

/// The proxy-only binary cargo builds for this bench: the release profile, as the image ships it.
const RELEASE_PROXY: &str = env!("CARGO_BIN_EXE_labforge-proxy");

/// A self-signed certificate for `localhost` and its key, for the proxies' TLS listeners.
struct Certificate {
    cert: PathBuf,
    key: PathBuf,
}

impl Certificate {
    fn make(dir: &Path) -> Certificate {
        let (cert, key) =
            labforge_tests::tools::self_signed_certificate(dir).expect("a certificate (openssl)");
        Certificate { cert, key }
    }
}

/// How a contender listens.
#[derive(Clone, Copy)]
enum Listen<'a> {
    /// HTTP/1.1 in clear; labforge also takes HTTP/2 with prior knowledge there.
    Clear,
    /// HTTP/2 with prior knowledge: nginx takes it only on a listener of its own.
    H2c,
    /// TLS, with HTTP/2 and HTTP/1.1 by ALPN.
    Tls(&'a Certificate),
}

fn start_labforge(
    name: &'static str,
    binary: &Path,
    dir: &Path,
    routes: &Routes,
    listen: Listen,
) -> Running {
    let file = dir.join(format!("routes-{}.yaml", routes.count));
    let mut yaml = String::new();
    for (i, (prefix, port)) in routes.list().into_iter().enumerate() {
        yaml.push_str(&vs_yaml(i, &prefix, port));
    }
    std::fs::write(&file, yaml).expect("routes file");
    let port = free_port();
    // The proxy-only binary, as the proxy's Deployment runs it.
    let mut command = Command::new(binary);
    command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--access", "static", "--member", &format!("bench={USER}")])
        // The bench's routes go to loopback ports, as only a trusted namespace's may.
        .args(["--trusted-namespace", "bench"])
        .arg("--routes-file")
        .arg(&file)
        .env("LABFORGE_LOG", "error");
    if let Listen::Tls(certificate) = listen {
        command
            .arg("--tls-cert")
            .arg(&certificate.cert)
            .arg("--tls-key")
            .arg(&certificate.key);
    }
    Running::serving(name, &mut command, port)
}

/// nginx sends the upstream the request labforge sends (Host as the client sent it,
/// `X-Forwarded-For`, `-Proto` and `-Host`), so that both upstreams parse the same headers: with
/// `X-Forwarded-For` alone its upstream would do about 0.2 µs a request less.
/// Nor does it close a client's connection after its 1,000th request (`keepalive_requests`'s
/// default), as labforge does not: the client connects again, under TLS with a new handshake.
fn start_nginx(dir: &Path, routes: &Routes, listen: Listen) -> Option<Running> {
    let nginx = labforge_tests::locate("nginx").ok()?;
    let port = free_port();
    let prefix = dir.join(format!("nginx-{}-{port}", routes.count));
    std::fs::create_dir_all(prefix.join("logs")).expect("nginx dir");
    let listener = match listen {
        Listen::Clear => String::new(),
        Listen::H2c => " http2".into(),
        Listen::Tls(certificate) => format!(
            " ssl http2;\n  ssl_certificate {};\n  ssl_certificate_key {}",
            certificate.cert.display(),
            certificate.key.display()
        ),
    };
    let mut locations = String::new();
    for (path, upstream) in routes.list() {
        locations.push_str(&format!(
            "location {path} {{ proxy_pass http://u{upstream}; }}\n"
        ));
    }
    let upstreams: String = [routes.upstream, routes.echo, routes.refused]
        .iter()
        .map(|p| format!("upstream u{p} {{ server 127.0.0.1:{p}; keepalive 128; }}\n"))
        .collect();
    let config = format!(
        "daemon off;\nmaster_process on;\nuser root;\nworker_processes 2;\npid {pid};\n\
         error_log {prefix}/logs/error.log crit;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n access_log off;\n keepalive_requests 1000000;\n client_body_temp_path {prefix}/body;\n proxy_temp_path {prefix}/proxy;\n\
         fastcgi_temp_path {prefix}/fastcgi;\n uwsgi_temp_path {prefix}/uwsgi;\n scgi_temp_path {prefix}/scgi;\n\
         map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}\n\
         proxy_http_version 1.1;\n proxy_set_header Host $http_host;\n\
         proxy_set_header X-Forwarded-Proto $scheme;\n proxy_set_header X-Forwarded-Host $http_host;\n\
         proxy_set_header Upgrade $http_upgrade;\n proxy_set_header Connection $connection_upgrade;\n\
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n proxy_read_timeout 3600s;\n\
         {upstreams}\n server {{\n  listen 127.0.0.1:{port} backlog=4096{listener};\n{locations} }}\n}}\n",
        pid = prefix.join("nginx.pid").display(),
        prefix = prefix.display(),
    );
    let conf = prefix.join("nginx.conf");
    std::fs::write(&conf, config).expect("nginx.conf");
    let child = Command::new(nginx)
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    wait_port(port);
    std::thread::sleep(Duration::from_millis(300));
    let master = child.id();
    let mut pids = vec![master];
    pids.extend(children_of(master));
    Some(Running {
        name: "nginx",
        child,
        port,
        pids,
    })
}

fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

async fn start_chp(routes: &Routes) -> Option<Running> {
    if !Path::new(CHP).exists() {
        return None;
    }
    let (port, api) = (free_port(), free_port());
    let token = "bench-token";
    let child = Command::new(CHP)
        .args(["--ip", "127.0.0.1", "--port", &port.to_string()])
        .args(["--api-ip", "127.0.0.1", "--api-port", &api.to_string()])
        .args(["--log-level", "error"])
        .env("CONFIGPROXY_AUTH_TOKEN", token)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start configurable-http-proxy");
    wait_port(api);
    let http = reqwest::Client::new();
    for (path, upstream) in routes.list() {
        let response = http
            .post(format!(
                "http://127.0.0.1:{api}/api/routes{}",
                path.trim_end_matches('/')
            ))
            .header("Authorization", format!("token {token}"))
            .json(&serde_json::json!({ "target": format!("http://127.0.0.1:{upstream}") }))
            .send()
            .await
            .expect("CHP route");
        assert!(response.status().is_success(), "CHP route {path}");
    }
    let pid = child.id();
    Some(Running {
        name: "CHP",
        child,
        port,
        pids: vec![pid],
    })
}

/// What one run of a load generator (wrk, h2load) measured.
#[derive(Clone, Copy, Debug, Default)]
struct LoadRun {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    requests: u64,
    /// CPU time the contender's processes used per request during the run, when measured.
    cpu_us_per_request: Option<f64>,
    /// CPU time per request of everything the run made work: the contender, the upstream's
    /// thread and the load generator. On two shared cores the rate follows it.
    exchange_cpu_us_per_request: Option<f64>,
}

/// User + system CPU time in a `/proc/.../stat` file so far, in clock ticks, and that of the
/// children it waited for.
fn stat_ticks(path: &str) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |at: usize| fields.get(at)?.parse::<u64>().ok();
    Some((field(11)? + field(12)?, field(13)? + field(14)?))
}

/// User + system CPU time of `pids` so far, in clock ticks (`/proc/<pid>/stat`, all threads).
fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| Some(stat_ticks(&format!("/proc/{pid}/stat"))?.0))
        .sum()
}

/// CPU time so far of the upstream's thread and of this process's waited-for children (the load
/// generator, once a run ends), in clock ticks.
fn upstream_and_load_ticks() -> Option<u64> {
    let thread = UPSTREAM_THREAD.get()?;
    let (upstream, _) = stat_ticks(&format!("/proc/self/task/{thread}/stat"))?;
    let (_, children) = stat_ticks("/proc/self/stat")?;
    Some(upstream + children)
}

/// Linux's USER_HZ, the unit of `/proc/<pid>/stat` times, on every architecture it runs on here.
const TICKS_PER_SECOND: f64 = 100.0;

/// [`wrk`] at full load, with the CPU time `pids` spent per request, and that of the whole
/// exchange (with wrk and the upstream).
fn wrk_measuring_cpu(url: &str, seconds: u32, dir: &Path, pids: &[u32]) -> LoadRun {
    measuring_cpu(pids, || wrk(url, seconds, None, dir))
}

/// `load`'s run (a load generator this process waits for), with the CPU time `pids` spent per
/// request, and that of the whole exchange (with the load generator and the upstream).
fn measuring_cpu(pids: &[u32], load: impl FnOnce() -> LoadRun) -> LoadRun {
    let before = cpu_ticks(pids);
    let others_before = upstream_and_load_ticks();
    let mut result = load();
    let used = cpu_ticks(pids).saturating_sub(before);
    let others_used = upstream_and_load_ticks()
        .zip(others_before)
        .map(|(after, before)| after.saturating_sub(before));
    if !pids.is_empty() && result.requests > 0 {
        let per_request =
            |ticks: u64| ticks as f64 / TICKS_PER_SECOND * 1e6 / result.requests as f64;
        result.cpu_us_per_request = Some(per_request(used));
        result.exchange_cpu_us_per_request = others_used.map(|others| per_request(used + others));
    }
    result
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The run with the median req/s among `runs`, carrying the median CPU time per request.
fn median_run(runs: &[LoadRun]) -> LoadRun {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    let mut middle = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let cpu: Vec<f64> = runs.iter().filter_map(|r| r.cpu_us_per_request).collect();
    middle.cpu_us_per_request = (!cpu.is_empty()).then(|| median(cpu));
    let exchange: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.exchange_cpu_us_per_request)
        .collect();
    middle.exchange_cpu_us_per_request = (!exchange.is_empty()).then(|| median(exchange));
    middle.errors = runs.iter().map(|r| r.errors).sum();
    middle
}

/// `rounds` rounds of `measure(round, contender)` over `count` contenders, `each_round(round)`
/// first in each; round r starts with contender r, so that none always runs first (or right
/// after a rest). Each contender's runs, in round order.
fn in_turn(
    count: usize,
    rounds: usize,
    mut each_round: impl FnMut(usize),
    mut measure: impl FnMut(usize, usize) -> LoadRun,
) -> Vec<Vec<LoadRun>> {
    let mut runs = vec![Vec::new(); count];
    for round in 0..rounds {
        each_round(round);
        for turn in 0..count {
            let index = (round + turn) % count;
            runs[index].push(measure(round, index));
        }
    }
    runs
}

/// labforge's req/s ÷ another contender's: the median of the rounds' ratios, each from runs of
/// the same round (the machine's speed drifts between rounds).
fn median_ratio(labforge: &[LoadRun], them: &[LoadRun]) -> f64 {
    median(
        them.iter()
            .zip(labforge)
            .map(|(them, labforge)| labforge.rps / them.rps)
            .collect(),
    )
}

fn parse_latency(value: &str) -> f64 {
    let value = value.trim();
    let (number, factor) = if let Some(v) = value.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = value.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = value.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (value, 1.0)
    };
    number.parse::<f64>().unwrap_or(f64::NAN) * factor
}

/// wrk against `url`; `rate` sets the request rate through a wait between each connection's
/// requests.
fn wrk(url: &str, seconds: u32, rate: Option<f64>, dir: &Path) -> LoadRun {
    let Some(rate) = rate else {
        return run_wrk(url, seconds, CONNECTIONS, Some(USER), None);
    };
    // Each connection waits a random 0–20 ms between requests (10 on average): rate ≈
    // connections × 1000 / 10. A fixed wait keeps the connections, all started together, in
    // step: every one of them sends at once every 10 ms, a burst at full load rather than
    // half load. Each wrk thread has its own seed, the same in every run, so every contender
    // gets the same arrivals.
    let mean_delay_ms = 10.0;
    let connections = ((rate * mean_delay_ms / 1000.0).round() as u32).clamp(THREADS, 1000);
    let script = dir.join("spread.lua");
    std::fs::write(
        &script,
        format!(
            "local threads = 0\n\
             function setup(thread) threads = threads + 1; thread:set(\"seed\", threads) end\n\
             function init(args) math.randomseed(seed) end\n\
             function delay() return math.random() * {} end\n",
            2.0 * mean_delay_ms
        ),
    )
    .expect("lua");
    run_wrk(url, seconds, connections, Some(USER), Some(&script))
}

/// wrk's run against `url` as `user` (none: no header), with `script` when given.
fn run_wrk(
    url: &str,
    seconds: u32,
    connections: u32,
    user: Option<&str>,
    script: Option<&Path>,
) -> LoadRun {
    let mut command = Command::new("wrk");
    command
        .args(["-t", &THREADS.to_string(), "-c", &connections.to_string()])
        .args(["-d", &format!("{seconds}s"), "--latency"]);
    if let Some(user) = user {
        command.args(["-H", &format!("kubeflow-userid: {user}")]);
    }
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let output = command
        .arg(url)
        .output()
        .expect("wrk (bench/setup installs it)");
    parse_wrk(&String::from_utf8_lossy(&output.stdout))
}

/// What wrk printed, read.
fn parse_wrk(text: &str) -> LoadRun {
    let mut result = LoadRun::default();
    for line in text.lines() {
        let line = line.trim();
        if let Some((count, _)) = line.split_once(" requests in ") {
            result.requests = count.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("Requests/sec:") {
            result.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("50%") {
            result.p50_ms = parse_latency(v);
        } else if let Some(v) = line.strip_prefix("99%") {
            result.p99_ms = parse_latency(v);
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            result.errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            result.errors += v
                .split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    result
}

/// Resident set size (kB) summed over `pids`; `peak` reads VmHWM instead of VmRSS.
fn rss_kb(pids: &[u32], peak: bool) -> u64 {
    let field = if peak { "VmHWM:" } else { "VmRSS:" };
    pids.iter()
        .map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `count` sequential requests to the route whose upstream refuses connections: how many were
/// answered 503.
async fn requests_to_refused_upstream(port: u16, count: usize) -> usize {
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/refused/x");
    let mut unavailable = 0;
    for _ in 0..count {
        if let Ok(r) = http.get(&url).header("kubeflow-userid", USER).send().await
            && r.status() == 503
        {
            unavailable += 1;
        }
    }
    unavailable
}

/// Median and p99 of `count` sequential websocket echo round trips, in µs.
async fn ws_round_trips(port: u16, count: usize) -> Option<(f64, f64)> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://127.0.0.1:{port}/ws/echo")
        .into_client_request()
        .ok()?;
    request
        .headers_mut()
        .insert("kubeflow-userid", USER.parse().ok()?);
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.ok()?;
    let mut samples = Vec::with_capacity(count);
    for i in 0..count + WS_WARM_UP {
        let started = Instant::now();
        ws.send(Message::text(format!("m{i}"))).await.ok()?;
        ws.next().await?.ok()?;
        if i >= WS_WARM_UP {
            samples.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.sort_by(f64::total_cmp);
    Some((
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
    ))
}

/// p99 at half load, over the rounds: one run's p99 moves by milliseconds from run to run.
#[derive(Clone, Copy)]
struct HalfLoad {
    /// The median of the rounds' p99.
    p99_ms: f64,
    /// The median of the rounds' p99 minus the upstream alone's in the same round.
    added_ms: Option<f64>,
}

struct Row {
    label: String,
    /// The median round at full load.
    full: LoadRun,
    /// Median over rounds of labforge's req/s ÷ this contender's, both from the same round.
    ratio: Option<f64>,
    half: Option<HalfLoad>,
    /// Resident size after the full-load rounds, and after the half-load phase.
    rss_after_full_kb: u64,
    rss_after_half_kb: u64,
    ws: Option<(f64, f64)>,
}

fn print_table(title: &str, rows: &[Row], direct: &Row) {
    println!("\n### {title}\n");
    println!(
        "| contender | req/s | p50 | p99 | labforge ÷ it | CPU per request: its own / with wrk and upstream | p99 at half load, median of the rounds (added vs upstream alone) | RSS after full / half load | ws echo RTT p50 / p99 | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in std::iter::once(direct).chain(rows) {
        let ratio = row.ratio.map(|r| format!("{r:.2}×")).unwrap_or_default();
        let cpu = match (
            row.full.cpu_us_per_request,
            row.full.exchange_cpu_us_per_request,
        ) {
            (Some(own), Some(exchange)) => format!("{own:.1} / {exchange:.1} µs"),
            (Some(own), None) => format!("{own:.1} µs"),
            _ => String::new(),
        };
        let half = match row.half {
            Some(HalfLoad {
                p99_ms,
                added_ms: Some(added),
            }) => format!("{p99_ms:.3} ms ({added:+.3} ms)"),
            Some(HalfLoad { p99_ms, .. }) => format!("{p99_ms:.3} ms"),
            None => String::new(),
        };
        let ws = row
            .ws
            .map(|(p50, p99)| format!("{p50:.0} / {p99:.0} µs"))
            .unwrap_or_default();
        let rss = if row.rss_after_half_kb > 0 {
            format!(
                "{:.1} / {:.1} MiB",
                row.rss_after_full_kb as f64 / 1024.0,
                row.rss_after_half_kb as f64 / 1024.0
            )
        } else {
            String::new()
        };
        println!(
            "| {} | {:.0} | {:.3} ms | {:.3} ms | {ratio} | {cpu} | {half} | {rss} | {ws} | {} |",
            row.label, row.full.rps, row.full.p50_ms, row.full.p99_ms, row.full.errors
        );
    }
    let _ = std::io::stdout().flush();
}

/// The bench binary again, as [`hyper_floor`] in front of the upstream.
fn start_hyper_floor(routes: &Routes) -> Running {
    let port = free_port();
    let exe = std::env::current_exe().expect("the bench binary's path");
    let mut command = Command::new(exe);
    command
        .arg("--hyper-floor")
        .arg(format!("127.0.0.1:{port}"))
        .arg(format!("127.0.0.1:{}", routes.upstream));
    Running::serving("hyper alone (floor)", &mut command, port)
}

/// labforge's builds, named: the release one, and the other one beside it when given.
fn labforge_builds(other: Option<&Path>) -> Vec<(&'static str, &Path)> {
    let release = Path::new(RELEASE_PROXY);
    match other {
        Some(other) => vec![("labforge", release), ("labforge, other build", other)],
        None => vec![("labforge", release)],
    }
}

/// labforge first (the release build, then the other one when given), then the others.
async fn contenders(dir: &Path, routes: &Routes, other: Option<&Path>) -> Vec<Running> {
    let mut list: Vec<Running> = labforge_builds(other)
        .into_iter()
        .map(|(name, binary)| start_labforge(name, binary, dir, routes, Listen::Clear))
        .collect();
    list.push(start_hyper_floor(routes));
    match start_nginx(dir, routes, Listen::Clear) {
        Some(nginx) => list.push(nginx),
        None => eprintln!("nginx not installed (bench/setup): skipped"),
    }
    match start_chp(routes).await {
        Some(chp) => list.push(chp),
        None => eprintln!("configurable-http-proxy not installed (bench/setup): skipped"),
    }
    list
}

fn main() {
    // cargo adds `--bench` to what follows `--`.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    if let [_, mode, listen, upstream] = args.as_slice()
        && mode == "--hyper-floor"
    {
        let address = |text: &str| text.parse().expect("--hyper-floor <listen> <upstream>");
        return hyper_floor::run(address(listen), address(upstream));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("bench runtime");
    runtime.block_on(bench());
}

async fn bench() {
    labforge_tests::init_crypto();
    let numbers: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = numbers.first().copied().unwrap_or(6);
    let rounds = numbers.get(1).copied().unwrap_or(3).max(1) as usize;
    for tool in ["wrk", "h2load"] {
        labforge_tests::locate(tool).expect("the load generators: run bench/setup");
    }
    let other = std::env::var_os(OTHER_PROXY).map(PathBuf::from);
    match &other {
        Some(path) => eprintln!("labforge: {RELEASE_PROXY}, and {}", path.display()),
        None => eprintln!("labforge: {RELEASE_PROXY}"),
    }
    let dir: PathBuf = tempfile::tempdir().expect("tempdir").keep();
    let upstream = start_upstream();
    let echo = start_echo();
    let refused = free_port();
    println!(
        "proxy bench: {} cores, wrk -t{THREADS} -c{CONNECTIONS} -d{seconds}s, {rounds} rounds at full load, upstream {upstream}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let plan = Plan {
        dir: &dir,
        upstream,
        other: other.as_deref(),
        seconds,
        rounds,
    };
    for routes in Routes::both(upstream, echo, refused) {
        plan.table(&routes).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What every table is measured with: the run's settings, its directory and the upstream.
struct Plan<'a> {
    dir: &'a Path,
    upstream: SocketAddr,
    /// Another labforge build, measured beside the release one.
    other: Option<&'a Path>,
    /// Length of each load generator run.
    seconds: u32,
    rounds: usize,
}

impl Plan<'_> {
    /// Starts the contenders with `routes`, measures them and prints their table, then what is
    /// measured with this table size only.
    async fn table(&self, routes: &Routes) {
        let count = routes.count;
        let started = Instant::now();
        let running = contenders(self.dir, routes, self.other).await;
        eprintln!(
            "{count} routes: contenders up in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let direct_url = format!("http://{}{}", self.upstream, routes.measured());
        let (direct_runs, runs) = self.full_load(&running, routes, &direct_url);
        let mut rows = full_load_rows(&running, &runs);
        // Half of labforge's full-load rate, the same fixed rate for everyone.
        let half_rate = rows[0].full.rps / 2.0;
        let (direct_half, half_runs) = self.half_load(&running, routes, &direct_url, half_rate);
        let direct = Row {
            label: "upstream alone".into(),
            full: median_run(&direct_runs),
            ratio: None,
            half: Some(HalfLoad {
                p99_ms: median_p99(&direct_half),
                added_ms: None,
            }),
            rss_after_full_kb: 0,
            rss_after_half_kb: 0,
            ws: None,
        };
        add_half_load_and_ws(&mut rows, &running, &half_runs, &direct_half).await;
        print_table(
            &format!("{count} route(s), rate of the half-load column: {half_rate:.0} req/s"),
            &rows,
            &direct,
        );
        if count == 1 {
            // Protocols cost the same whatever the table's size: measured with one route.
            let builds = labforge_builds(self.other);
            protocols::measure(self.dir, routes, &builds, self.seconds, self.rounds);
        }
        if count == 10_000 {
            descriptors_after_refused_upstream(&running[0]).await;
        }
        drop(running);
    }

    /// The rounds at full load: the upstream alone's runs, and each contender's (with its CPU
    /// time).
    fn full_load(
        &self,
        running: &[Running],
        routes: &Routes,
        direct_url: &str,
    ) -> (Vec<LoadRun>, Vec<Vec<LoadRun>>) {
        let count = routes.count;
        let mut direct_runs = Vec::new();
        let runs = in_turn(
            running.len(),
            self.rounds,
            |_| direct_runs.push(wrk(direct_url, self.seconds, None, self.dir)),
            |round, index| {
                let contender = &running[index];
                let url = format!("http://127.0.0.1:{}{}", contender.port, routes.measured());
                let full = wrk_measuring_cpu(&url, self.seconds, self.dir, &contender.pids);
                eprintln!("{} {count} round {round}: {full:?}", contender.name);
                full
            },
        );
        (direct_runs, runs)
    }

    /// The rounds at the fixed `rate`: the upstream alone's runs, and each contender's.
    fn half_load(
        &self,
        running: &[Running],
        routes: &Routes,
        direct_url: &str,
        rate: f64,
    ) -> (Vec<LoadRun>, Vec<Vec<LoadRun>>) {
        let count = routes.count;
        let mut direct_half = Vec::new();
        let half_runs = in_turn(
            running.len(),
            self.rounds,
            |_| direct_half.push(wrk(direct_url, self.seconds, Some(rate), self.dir)),
            |round, index| {
                let contender = &running[index];
                let url = format!("http://127.0.0.1:{}{}", contender.port, routes.measured());
                let half = wrk(&url, self.seconds, Some(rate), self.dir);
                eprintln!(
                    "{} {count} half load, round {round}: p99 {:.3} ms",
                    contender.name, half.p99_ms
                );
                half
            },
        );
        (direct_half, half_runs)
    }
}

/// One row per contender from its full-load rounds, with its resident size right after them.
fn full_load_rows(running: &[Running], runs: &[Vec<LoadRun>]) -> Vec<Row> {
    // labforge is the first contender.
    let labforge_runs = &runs[0];
    running
        .iter()
        .zip(runs)
        .enumerate()
        .map(|(index, (contender, runs))| {
            let ratio = (index > 0).then(|| median_ratio(labforge_runs, runs));
            Row {
                label: contender.name.to_owned(),
                full: median_run(runs),
                ratio,
                half: None,
                rss_after_full_kb: rss_kb(&contender.pids, false),
                rss_after_half_kb: 0,
                ws: None,
            }
        })
        .collect()
}

fn median_p99(runs: &[LoadRun]) -> f64 {
    median(runs.iter().map(|run| run.p99_ms).collect())
}

/// Completes each contender's row: p99 at half load (and what it adds to the upstream alone's
/// in the same round), websocket round trips, and resident size after all that.
async fn add_half_load_and_ws(
    rows: &mut [Row],
    running: &[Running],
    half_runs: &[Vec<LoadRun>],
    direct_half: &[LoadRun],
) {
    for ((row, contender), runs) in rows.iter_mut().zip(running).zip(half_runs) {
        let added = runs
            .iter()
            .zip(direct_half)
            .map(|(run, direct)| run.p99_ms - direct.p99_ms);
        row.half = Some(HalfLoad {
            p99_ms: median_p99(runs),
            added_ms: Some(median(added.collect())),
        });
        row.ws = ws_round_trips(contender.port, 2000).await;
        row.rss_after_half_kb = rss_kb(&contender.pids, false);
    }
}

/// Descriptors of labforge before and after 10,000 requests to a refused upstream: a leak
/// would show as a growing count.
async fn descriptors_after_refused_upstream(labforge: &Running) {
    let pid = labforge.pids[0];
    let before = open_fds(pid);
    let started = Instant::now();
    let unavailable = requests_to_refused_upstream(labforge.port, 10_000).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "\nlabforge after 10,000 requests to a refused upstream ({unavailable} answered 503, {:.1} s): open descriptors {before} → {}; peak RSS {:.1} MiB",
        started.elapsed().as_secs_f64(),
        open_fds(pid),
        rss_kb(&[pid], true) as f64 / 1024.0
    );
}
