//! HTTP/2 and TLS through the proxies, which wrk (HTTP/1.1 in clear) cannot send: h2load
//! (nghttp2) is the client, for the benchmark's protocol table.
//!
//! labforge takes HTTP/2 with prior knowledge on its clear listener and, given a certificate,
//! TLS with HTTP/2 or HTTP/1.1 by ALPN; nginx gets the same listeners (HTTP/2 in clear on one of
//! its own). Both talk HTTP/1.1 to the upstream either way, so the table shows what each protocol
//! costs a proxy in front of a notebook. configurable-http-proxy is left out: it takes no HTTP/2.

use crate::{
    CONNECTIONS, Certificate, Listen, LoadRun, Routes, Running, THREADS, USER, in_turn,
    measuring_cpu, median_ratio, median_run, start_labforge, start_nginx,
};
use std::path::Path;
use std::process::Command;

/// What a load sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 in clear, with prior knowledge (what a TLS-terminating gateway in front may send).
    H2c,
    TlsHttp1,
    TlsHttp2,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::H2c, Protocol::TlsHttp1, Protocol::TlsHttp2];

    fn label(self) -> &'static str {
        match self {
            Protocol::H2c => "HTTP/2 in clear",
            Protocol::TlsHttp1 => "TLS, HTTP/1.1",
            Protocol::TlsHttp2 => "TLS, HTTP/2",
        }
    }

    pub fn tls(self) -> bool {
        self != Protocol::H2c
    }

    /// What h2load must report having spoken (under TLS, what ALPN chose).
    fn application_protocol(self) -> &'static str {
        match self {
            Protocol::H2c => "h2c",
            Protocol::TlsHttp1 => "http/1.1",
            Protocol::TlsHttp2 => "h2",
        }
    }
}

/// Streams in flight at once: as many as wrk's connections, over 16 HTTP/2 connections of 4
/// streams each (a browser multiplexes a page's requests) or 64 HTTP/1.1 connections.
const HTTP2_CONNECTIONS: u32 = 16;
const STREAMS_PER_CONNECTION: u32 = 4;

/// h2load's run of `protocol` against `path` on `port` for `seconds`, as [`USER`], its per-request
/// log in `dir`. Panics when h2load spoke another protocol than `protocol`'s.
pub fn h2load(protocol: Protocol, port: u16, path: &str, seconds: u32, dir: &Path) -> LoadRun {
    let log = dir.join("h2load.log");
    let scheme = if protocol.tls() { "https" } else { "http" };
    let mut command = Command::new("h2load");
    command
        .args(["-t", &THREADS.to_string(), "-D", &seconds.to_string()])
        .args(["-H", &format!("kubeflow-userid: {USER}")])
        .arg("--log-file")
        .arg(&log);
    if protocol == Protocol::TlsHttp1 {
        command.args(["--h1", "-c", &CONNECTIONS.to_string()]);
    } else {
        command
            .args(["-c", &HTTP2_CONNECTIONS.to_string()])
            .args(["-m", &STREAMS_PER_CONNECTION.to_string()]);
    }
    let output = command
        .arg(format!("{scheme}://127.0.0.1:{port}{path}"))
        .output()
        .expect("h2load (bench/setup installs nghttp2-client)");
    let summary = String::from_utf8_lossy(&output.stdout);
    let spoken = summary
        .lines()
        .find_map(|line| line.strip_prefix("Application protocol:"))
        .map(str::trim);
    assert_eq!(
        spoken,
        Some(protocol.application_protocol()),
        "h2load, {}: {summary}",
        protocol.label()
    );
    let mut run = parse_summary(&summary);
    let timings = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    add_timings(&mut run, &timings);
    run
}

/// Rate and failures from h2load's summary.
fn parse_summary(text: &str) -> LoadRun {
    let mut run = LoadRun::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("finished in ") {
            // "finished in 6.00s, 50402.00 req/s, 1.30MB/s"
            run.rps = rest
                .split(", ")
                .find_map(|part| part.strip_suffix(" req/s"))
                .and_then(|rate| rate.parse().ok())
                .unwrap_or(0.0);
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            // "requests: 100 total, 100 started, 100 done, 98 succeeded, 2 failed, 0 errored, 0 timeout"
            for part in rest.split(", ") {
                if let Some((count, what)) = part.split_once(' ')
                    && matches!(what, "failed" | "errored" | "timeout")
                {
                    run.errors += count.parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    run
}

/// Requests, answers other than 2xx, p50 and p99 from h2load's per-request log: a line per
/// request of its start (µs since the epoch), status and duration (µs), tab-separated.
fn add_timings(run: &mut LoadRun, log: &str) {
    let mut durations_us = Vec::new();
    for line in log.lines() {
        let mut fields = line.split('\t');
        let (Some(_start), Some(status), Some(duration)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !status.starts_with('2') {
            run.errors += 1;
        }
        if let Ok(duration) = duration.trim().parse::<u64>() {
            durations_us.push(duration);
        }
    }
    durations_us.sort_unstable();
    run.requests = durations_us.len() as u64;
    let at = |fraction: f64| {
        let index = ((durations_us.len() as f64 * fraction) as usize).min(durations_us.len() - 1);
        durations_us[index] as f64 / 1000.0
    };
    if !durations_us.is_empty() {
        run.p50_ms = at(0.50);
        run.p99_ms = at(0.99);
    }
}

/// A contender's two listeners: in clear (HTTP/2 with prior knowledge) and TLS.
struct Contender {
    name: &'static str,
    clear: Running,
    tls: Running,
}

impl Contender {
    fn serving(&self, protocol: Protocol) -> &Running {
        if protocol.tls() {
            &self.tls
        } else {
            &self.clear
        }
    }
}

/// labforge's builds (the shipped one first, when given), then nginx when installed.
fn contenders(
    dir: &Path,
    routes: &Routes,
    certificate: &Certificate,
    labforge: &[(&'static str, &Path)],
) -> Vec<Contender> {
    let mut list: Vec<Contender> = labforge
        .iter()
        .map(|&(name, binary)| Contender {
            name,
            clear: start_labforge(name, binary, dir, routes, Listen::Clear),
            tls: start_labforge(name, binary, dir, routes, Listen::Tls(certificate)),
        })
        .collect();
    if let (Some(clear), Some(tls)) = (
        start_nginx(dir, routes, Listen::H2c),
        start_nginx(dir, routes, Listen::Tls(certificate)),
    ) {
        list.push(Contender {
            name: "nginx",
            clear,
            tls,
        });
    }
    list
}

/// The protocol table: each protocol in `rounds` rounds of `seconds` that take the contenders
/// in turn, as the HTTP/1.1 table's rounds do; `labforge` names its builds, the shipped first.
pub fn measure(
    dir: &Path,
    routes: &Routes,
    labforge: &[(&'static str, &Path)],
    seconds: u32,
    rounds: usize,
) {
    let certificate = Certificate::make(dir);
    let contenders = contenders(dir, routes, &certificate, labforge);
    let path = routes.measured();
    println!(
        "\n### HTTP/2 and TLS, {} route(s): h2load -t{THREADS} -D{seconds}, {} streams at once (HTTP/2: {HTTP2_CONNECTIONS} connections × {STREAMS_PER_CONNECTION} streams)\n",
        routes.count,
        HTTP2_CONNECTIONS * STREAMS_PER_CONNECTION
    );
    println!(
        "| protocol | contender | req/s | p50 | p99 | labforge ÷ it | CPU per request: its own / with h2load and upstream | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for protocol in Protocol::ALL {
        let runs = in_turn(
            contenders.len(),
            rounds,
            |_| {},
            |round, index| {
                let serving = contenders[index].serving(protocol);
                let run = measuring_cpu(&serving.pids, || {
                    h2load(protocol, serving.port, &path, seconds, dir)
                });
                eprintln!(
                    "{} {}, round {round}: {run:?}",
                    contenders[index].name,
                    protocol.label()
                );
                run
            },
        );
        for (index, (contender, its_runs)) in contenders.iter().zip(&runs).enumerate() {
            let median = median_run(its_runs);
            // labforge (the shipped build) is the first contender.
            let ratio = if index == 0 {
                String::new()
            } else {
                format!("{:.2}×", median_ratio(&runs[0], its_runs))
            };
            let cpu = match (
                median.cpu_us_per_request,
                median.exchange_cpu_us_per_request,
            ) {
                (Some(own), Some(exchange)) => format!("{own:.1} / {exchange:.1} µs"),
                _ => String::new(),
            };
            println!(
                "| {} | {} | {:.0} | {:.3} ms | {:.3} ms | {ratio} | {cpu} | {} |",
                protocol.label(),
                contender.name,
                median.rps,
                median.p50_ms,
                median.p99_ms,
                median.errors
            );
        }
    }
}
