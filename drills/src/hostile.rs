//! Hostile input: a flood of wrong sign-ins, and a flood of requests whose bodies come a byte at
//! a time. labforge's memory and descriptors stay bounded, and a signed-in user keeps working
//! meanwhile (the p95 of their requests during the flood).

use crate::Row;
use crate::lab::{Lab, Session, percentile};
use anyhow::ensure;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt as _;

const DRILL: &str = "hostile input";
/// Concurrent attackers in each flood.
const ATTACKERS: usize = 200;
const FLOOD: Duration = Duration::from_secs(20);
/// Past the proxy's body pace (60 s grace, then at least 1 KiB/s): every trickle is cut.
const TRICKLE: Duration = Duration::from_secs(75);

pub async fn run(labforge: &Path) -> Vec<Row> {
    let namespace = format!("hostile-{:x}", std::process::id());
    let lab = match Lab::start(labforge, std::slice::from_ref(&namespace), &[]).await {
        Ok(lab) => lab,
        Err(error) => return vec![Row::of(DRILL, "start labforge up", "it starts", Err(error))],
    };
    let user = match lab.user(&namespace).await {
        Ok(user) => user,
        Err(error) => return vec![Row::of(DRILL, "add a user", "it signs in", Err(error))],
    };
    let bounded =
        "only 401/429/503; fds back to their baseline, RSS bounded; the user's p95 under 1 s";
    vec![
        Row::of(
            DRILL,
            &format!(
                "{ATTACKERS} clients send wrong passwords for {} s",
                FLOOD.as_secs()
            ),
            bounded,
            login_flood(&lab, &user).await,
        ),
        Row::of(
            DRILL,
            &format!(
                "{ATTACKERS} connections send a 64 KiB body a byte a second for {} s",
                TRICKLE.as_secs()
            ),
            "every one cut off by the server; fds back to their baseline, RSS bounded; the user's p95 under 1 s",
            slow_bodies(&lab, &user).await,
        ),
    ]
}

/// The signed-in user's list requests every 100 ms until `stop`; their round trips.
async fn user_keeps_working(
    user: &Session,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<Duration>> {
    let path = format!("/api/namespaces/{}/notebooks", user.user);
    let mut took = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let (status, body) = user.get(&path).await?;
        ensure!(
            status == 200,
            "the user's list answered {status} during the flood: {body}"
        );
        took.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(took)
}

/// Waits up to 30 s for labforge's descriptors to come back to `baseline` (a few of slack for
/// pooled connections); returns the count it settled at.
async fn settled_fds(lab: &Lab, baseline: usize) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = lab.open_fds();
        if now <= baseline + 8 {
            return Ok(now);
        }
        ensure!(
            Instant::now() < deadline,
            "{now} descriptors open 30 s after the flood (baseline {baseline})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn login_flood(lab: &Lab, user: &Session) -> anyhow::Result<String> {
    let (fds_before, rss_before) = (lab.open_fds(), lab.resident_mib());
    let stop = Arc::new(AtomicBool::new(false));
    let working = user_keeps_working(user, stop.clone());
    let url = format!("{}/api/login", lab.up.url);
    let attackers = (0..ATTACKERS).map(|i| {
        let (url, stop) = (url.clone(), stop.clone());
        async move {
            let http = reqwest::Client::new();
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let status = http
                    .post(&url)
                    .json(&serde_json::json!({"username": format!("nobody-{i}"), "password": "wrong"}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                answers.push(status);
            }
            answers
        }
    });
    let flood = futures::future::join_all(attackers);
    let timer = {
        let stop = stop.clone();
        async move {
            tokio::time::sleep(FLOOD).await;
            stop.store(true, Ordering::Relaxed);
        }
    };
    let mut peak_rss = rss_before;
    let sample = async {
        while !stop.load(Ordering::Relaxed) {
            peak_rss = peak_rss.max(lab.resident_mib());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (mut took, answers, (), ()) = tokio::join!(working, flood, timer, sample);
    let took = took.as_mut().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let answers: Vec<u16> = answers.into_iter().flatten().collect();
    let unexpected: Vec<u16> = answers
        .iter()
        .copied()
        .filter(|s| !matches!(s, 401 | 429 | 503))
        .collect();
    ensure!(
        unexpected.is_empty(),
        "flood answers outside 401/429/503: {:?}",
        &unexpected[..unexpected.len().min(10)]
    );
    let p95 = percentile(took, 0.95);
    ensure!(p95 < 1.0, "the user's p95 was {p95:.2} s during the flood");
    let fds_after = settled_fds(lab, fds_before).await?;
    let count = |code: u16| answers.iter().filter(|s| **s == code).count();
    Ok(format!(
        "{} attempts: {} × 401, {} × 429, {} × 503; user p50 {:.0} ms, p95 {:.0} ms; RSS {rss_before:.0} → peak {peak_rss:.0} MiB; fds {fds_before} → {fds_after}",
        answers.len(),
        count(401),
        count(429),
        count(503),
        percentile(took, 0.5) * 1000.0,
        p95 * 1000.0,
    ))
}

async fn slow_bodies(lab: &Lab, user: &Session) -> anyhow::Result<String> {
    let (fds_before, rss_before) = (lab.open_fds(), lab.resident_mib());
    let stop = Arc::new(AtomicBool::new(false));
    let working = user_keeps_working(user, stop.clone());
    let address = lab
        .up
        .url
        .rsplit_once("://")
        .map(|(_, rest)| rest.to_owned())
        .unwrap_or_default();
    let host = address.split(':').next().unwrap_or("localhost").to_owned();
    let port: u16 = address.rsplit(':').next().unwrap_or_default().parse()?;
    let attackers = (0..ATTACKERS).map(|_| {
        let (stop, host) = (stop.clone(), host.clone());
        async move {
            let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                return false;
            };
            let head = format!(
                "POST /api/login HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n\r\n"
            );
            if stream.write_all(head.as_bytes()).await.is_err() {
                return false;
            }
            while !stop.load(Ordering::Relaxed) {
                if stream.write_all(b" ").await.is_err() {
                    // Cut off by the server: what a timeout does.
                    return true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            false
        }
    });
    let flood = futures::future::join_all(attackers);
    let timer = {
        let stop = stop.clone();
        async move {
            tokio::time::sleep(TRICKLE).await;
            stop.store(true, Ordering::Relaxed);
        }
    };
    let mut peak = (rss_before, fds_before);
    let sample = async {
        while !stop.load(Ordering::Relaxed) {
            peak = (peak.0.max(lab.resident_mib()), peak.1.max(lab.open_fds()));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (mut took, cut, (), ()) = tokio::join!(working, flood, timer, sample);
    let took = took.as_mut().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let p95 = percentile(took, 0.95);
    ensure!(p95 < 1.0, "the user's p95 was {p95:.2} s during the flood");
    let cut = cut.iter().filter(|c| **c).count();
    ensure!(
        cut == ATTACKERS,
        "only {cut} of {ATTACKERS} trickles were cut off"
    );
    let fds_after = settled_fds(lab, fds_before).await?;
    Ok(format!(
        "{cut} of {ATTACKERS} cut off by the server; user p50 {:.0} ms, p95 {:.0} ms; RSS {rss_before:.0} → peak {:.0} MiB; fds {fds_before} → peak {} → {fds_after}",
        percentile(took, 0.5) * 1000.0,
        p95 * 1000.0,
        peak.0,
        peak.1,
    ))
}
