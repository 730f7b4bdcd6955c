//! Soak: many websockets through the proxy for minutes, each a terminal of one notebook whose
//! shell echoes a numbered line every second (lighter than a kernel per socket, the same tunnel).
//! No message may be lost; labforge's descriptors and memory at the end are where they were at
//! the start.

use crate::Row;
use crate::lab::{Lab, percentile};
use anyhow::{Context, ensure};
use futures::{SinkExt as _, StreamExt as _};
use labforge_tests::jupyter::JupyterClient;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const DRILL: &str = "websocket soak";

pub async fn run(labforge: &Path, sockets: usize, duration: Duration) -> Vec<Row> {
    let done = format!(
        "{sockets} terminal websockets through the proxy for {} s, each echoing a line every second",
        duration.as_secs()
    );
    let expected = "0 messages lost; fds and RSS at the end within 10 % of the start";
    vec![Row::of(
        DRILL,
        &done,
        expected,
        drill(labforge, sockets, duration).await,
    )]
}

/// One terminal's session: a line sent every second, its echo awaited.
async fn echo_every_second(
    client: &JupyterClient,
    base: &str,
    terminal: String,
    until: Instant,
) -> anyhow::Result<(usize, usize, Vec<Duration>)> {
    let url = format!(
        "{}/terminals/websocket/{terminal}",
        base.replacen("http", "ws", 1)
    );
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("cookie", client.cookie_header().parse()?);
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await?;
    let (mut sent, mut echoed, mut round_trips) = (0, 0, Vec::new());
    let mut output = String::new();
    while Instant::now() < until {
        // The shell prints the marker; the line as typed (which the terminal echoes) does not
        // hold it.
        let id = format!("{terminal}x{sent}");
        let asked = Instant::now();
        let line = serde_json::json!(["stdin", format!("printf 'm%s\\n' {id}\r")]).to_string();
        socket.send(Message::text(line)).await?;
        sent += 1;
        let expected = format!("m{id}\r\n");
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(message) = socket.next().await {
                if let Message::Text(text) = message? {
                    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                    if parsed[0] == "stdout" {
                        output.push_str(parsed[1].as_str().unwrap_or_default());
                        if let Some(at) = output.find(&expected) {
                            output.drain(..at + expected.len());
                            return anyhow::Ok(true);
                        }
                    }
                }
            }
            Ok(false)
        })
        .await;
        if matches!(got, Ok(Ok(true))) {
            echoed += 1;
            round_trips.push(asked.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed())).await;
    }
    let _ = socket.close(None).await;
    Ok((sent, echoed, round_trips))
}

async fn drill(labforge: &Path, sockets: usize, duration: Duration) -> anyhow::Result<String> {
    let (lab, user, base) = Lab::with_notebook_at_path(labforge, "soak", "soak").await?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("cookie", user.cookie.parse()?);
    let client = JupyterClient::connect_with_headers(&base, headers).await?;
    let mut terminals = Vec::new();
    for _ in 0..sockets {
        let terminal = client
            .post("/api/terminals", &serde_json::json!({}))
            .await?;
        terminals.push(
            terminal["name"]
                .as_str()
                .context("no terminal name")?
                .to_owned(),
        );
    }
    let until = Instant::now() + duration;
    let sessions = futures::future::join_all(
        terminals
            .into_iter()
            .map(|terminal| echo_every_second(&client, &base, terminal, until)),
    );
    // The start's figures once every socket is open and echoing.
    let start_sample = async {
        tokio::time::sleep(Duration::from_secs(15)).await;
        (lab.open_fds(), lab.resident_mib())
    };
    let end_sample = async {
        tokio::time::sleep(duration.saturating_sub(Duration::from_secs(5))).await;
        (lab.open_fds(), lab.resident_mib())
    };
    let (results, (fds_start, rss_start), (fds_end, rss_end)) =
        tokio::join!(sessions, start_sample, end_sample);
    let (mut sent, mut echoed, mut round_trips) = (0, 0, Vec::new());
    for result in results {
        let (s, e, r) = result?;
        sent += s;
        echoed += e;
        round_trips.extend(r);
    }
    let figures = format!(
        "{sent} sent, {} lost; round trip p50 {:.0} ms, p99 {:.0} ms; fds {fds_start} → {fds_end}; RSS {rss_start:.0} → {rss_end:.0} MiB",
        sent - echoed,
        percentile(&mut round_trips, 0.5) * 1000.0,
        percentile(&mut round_trips, 0.99) * 1000.0,
    );
    ensure!(sent == echoed, "{figures}");
    ensure!(fds_end as f64 <= fds_start as f64 * 1.1 + 2.0, "{figures}");
    ensure!(rss_end <= rss_start * 1.1, "{figures}");
    Ok(figures)
}
