//! Class at 9:00: a class of users signs in and creates a notebook each at once. Admission
//! control may turn some away, but only with a clear 429 or 503 and a Retry-After, never a 500
//! or a hang; every notebook accepted must reach ready.

use crate::Row;
use crate::lab::{Lab, Session, machine_busy_seconds, percentile};
use std::path::Path;
use std::time::{Duration, Instant};

const DRILL: &str = "class at 9:00";

pub async fn run(labforge: &Path, size: usize) -> Vec<Row> {
    let done = format!("{size} users sign in and create a notebook each, all at once");
    let expected = "every answer 201, or 429/503 with Retry-After; every accepted notebook ready";
    vec![Row::of(DRILL, &done, expected, drill(labforge, size).await)]
}

async fn drill(labforge: &Path, size: usize) -> anyhow::Result<String> {
    let names: Vec<String> = (0..size)
        .map(|i| format!("class-{:x}-{i}", std::process::id()))
        .collect();
    let lab = Lab::start(labforge, &names, &[]).await?;
    let mut users = Vec::new();
    for name in &names {
        users.push(lab.user(name).await?);
    }
    let fds_before = lab.open_fds();
    let (labforge_cpu, machine_cpu) = (lab.cpu_seconds(), machine_busy_seconds());
    let start = Instant::now();
    let creates = users.iter().map(|user| async move {
        let asked = Instant::now();
        let answer = user
            .http
            .post(format!(
                "{}/api/namespaces/{}/notebooks",
                user.base, user.user
            ))
            .header("cookie", &user.cookie)
            .json(&serde_json::json!({"name": "lab", "workspace": "none"}))
            .send()
            .await;
        (user, asked, answer)
    });
    let answers = futures::future::join_all(creates).await;
    let answered_in = start.elapsed();
    let mut accepted: Vec<(&Session, Instant)> = Vec::new();
    let mut turned_away = 0;
    for (user, asked, answer) in answers {
        let answer = answer?;
        let status = answer.status().as_u16();
        match status {
            201 => accepted.push((user, asked)),
            429 | 503 if answer.headers().contains_key("retry-after") => turned_away += 1,
            other => anyhow::bail!(
                "{} was answered {other}: {}",
                user.user,
                answer.text().await?
            ),
        }
    }
    anyhow::ensure!(
        answered_in < Duration::from_secs(10),
        "the creates took {answered_in:.1?} to answer"
    );
    // Every accepted notebook is watched at once, each through its user's live list (the event
    // stream the notebooks page follows); labforge's memory and descriptors are sampled meanwhile.
    let waits = futures::future::join_all(accepted.iter().map(|(user, asked)| async move {
        tokio::time::timeout(Duration::from_secs(900), watch_until_ready(user, "lab"))
            .await
            .map_err(|_| anyhow::anyhow!("{}/lab not ready after 900 s", user.user))?
            .map(|()| asked.elapsed())
    }));
    let (mut peak_rss, mut peak_fds) = (lab.resident_mib(), lab.open_fds());
    let mut waits = std::pin::pin!(waits);
    let ready = loop {
        tokio::select! {
            ready = &mut waits => break ready,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                peak_rss = peak_rss.max(lab.resident_mib());
                peak_fds = peak_fds.max(lab.open_fds());
            }
        }
    };
    let (labforge_cpu, machine_cpu) = (
        lab.cpu_seconds() - labforge_cpu,
        machine_busy_seconds() - machine_cpu,
    );
    let mut to_ready = ready.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(format!(
        "answered in {:.1} s; {} accepted, {turned_away} turned away; create → ready p50 {:.1} s, p95 {:.1} s, last {:.1} s; CPU until the last was ready: the machine {machine_cpu:.0} s, labforge {labforge_cpu:.1} s; labforge RSS peak {peak_rss:.0} MiB, fds {fds_before} → peak {peak_fds}",
        answered_in.as_secs_f64(),
        accepted.len(),
        percentile(&mut to_ready, 0.5),
        percentile(&mut to_ready, 0.95),
        percentile(&mut to_ready, 1.0),
    ))
}

/// Follows `user`'s namespace's event stream until notebook `name` is ready.
async fn watch_until_ready(user: &Session, name: &str) -> anyhow::Result<()> {
    use futures::StreamExt;
    let response = user
        .http
        .get(format!("{}/api/namespaces/{}/watch", user.base, user.user))
        .header("cookie", &user.cookie)
        // The stream lasts as long as the start: the client's per-request limit is not for it.
        .timeout(Duration::from_secs(900))
        .send()
        .await?
        .error_for_status()?;
    let mut stream = response.bytes_stream();
    let mut pending = String::new();
    while let Some(chunk) = stream.next().await {
        pending.push_str(&String::from_utf8_lossy(&chunk?));
        // Events end with a blank line; only whole ones are read.
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            for data in event.lines().filter_map(|line| line.strip_prefix("data:")) {
                let list: serde_json::Value = serde_json::from_str(data.trim())?;
                let ready = list["notebooks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|nb| nb["name"] == name && nb["state"] == "ready");
                if ready {
                    return Ok(());
                }
            }
        }
    }
    anyhow::bail!("{}'s event stream ended before {name} was ready", user.user)
}
