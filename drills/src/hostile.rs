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

/// What a flood left: the attackers' own results, the signed-in user's round trips meanwhile
/// (p50 and p95 in seconds), labforge's peak RSS and descriptors, and its descriptors once settled.
struct Flooded<T> {
    attackers: Vec<T>,
    p50: f64,
    p95: f64,
    rss: (f64, f64),
    fds: (usize, usize, usize),
}

/// Runs `attackers` (each told by the flag when to stop) for `duration` while the user keeps
/// working and labforge is sampled; fails when the user's p95 reaches 1 s or the descriptors do
/// not come back.
async fn flood<A, F>(
    lab: &Lab,
    user: &Session,
    duration: Duration,
    attacker: A,
) -> anyhow::Result<Flooded<F::Output>>
where
    A: Fn(usize, Arc<AtomicBool>) -> F,
    F: std::future::Future,
{
    let (fds_before, rss_before) = (lab.open_fds(), lab.resident_mib());
    let stop = Arc::new(AtomicBool::new(false));
    let working = user_keeps_working(user, stop.clone());
    let attackers = futures::future::join_all((0..ATTACKERS).map(|i| attacker(i, stop.clone())));
    let timer = async {
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
    };
    let mut peak = (rss_before, fds_before);
    let sample = async {
        while !stop.load(Ordering::Relaxed) {
            peak = (peak.0.max(lab.resident_mib()), peak.1.max(lab.open_fds()));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (took, attackers, (), ()) = tokio::join!(working, attackers, timer, sample);
    let mut took = took?;
    let p95 = percentile(&mut took, 0.95);
    ensure!(p95 < 1.0, "the user's p95 was {p95:.2} s during the flood");
    let fds_after = settled_fds(lab, fds_before).await?;
    Ok(Flooded {
        attackers,
        p50: percentile(&mut took, 0.5),
        p95,
        rss: (rss_before, peak.0),
        fds: (fds_before, peak.1, fds_after),
    })
}

async fn login_flood(lab: &Lab, user: &Session) -> anyhow::Result<String> {
    let url = format!("{}/api/login", lab.up.url);
    let flooded = flood(lab, user, FLOOD, |i, stop| {
        let url = url.clone();
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
    })
    .await?;
    let answers: Vec<u16> = flooded.attackers.into_iter().flatten().collect();
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
    let count = |code: u16| answers.iter().filter(|s| **s == code).count();
    Ok(format!(
        "{} attempts: {} × 401, {} × 429, {} × 503; user p50 {:.0} ms, p95 {:.0} ms; RSS {:.0} → peak {:.0} MiB; fds {} → {}",
        answers.len(),
        count(401),
        count(429),
        count(503),
        flooded.p50 * 1000.0,
        flooded.p95 * 1000.0,
        flooded.rss.0,
        flooded.rss.1,
        flooded.fds.0,
        flooded.fds.2,
    ))
}

async fn slow_bodies(lab: &Lab, user: &Session) -> anyhow::Result<String> {
    let address = lab
        .up
        .url
        .rsplit_once("://")
        .map(|(_, rest)| rest.to_owned())
        .unwrap_or_default();
    let host = address.split(':').next().unwrap_or("localhost").to_owned();
    let port: u16 = address.rsplit(':').next().unwrap_or_default().parse()?;
    let flooded = flood(lab, user, TRICKLE, |_, stop| {
        let host = host.clone();
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
    })
    .await?;
    let cut = flooded.attackers.iter().filter(|c| **c).count();
    ensure!(
        cut == ATTACKERS,
        "only {cut} of {ATTACKERS} trickles were cut off"
    );
    Ok(format!(
        "{cut} of {ATTACKERS} cut off by the server; user p50 {:.0} ms, p95 {:.0} ms; RSS {:.0} → peak {:.0} MiB; fds {} → peak {} → {}",
        flooded.p50 * 1000.0,
        flooded.p95 * 1000.0,
        flooded.rss.0,
        flooded.rss.1,
        flooded.fds.0,
        flooded.fds.1,
        flooded.fds.2,
    ))
}
