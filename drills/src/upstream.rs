//! Upstream death: a notebook's server killed while a kernel websocket and a terminal websocket
//! are open through the proxy. Each client gets a close frame, labforge's descriptors come back
//! to their baseline, and the next request gets the app's 503 page rather than a hang.

use crate::Row;
use crate::lab::{Lab, podman};
use anyhow::{Context, ensure};
use futures::StreamExt as _;
use labforge_tests::jupyter::JupyterClient;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const DRILL: &str = "upstream death";

pub async fn run(labforge: &Path) -> Vec<Row> {
    let done = "the notebook's container killed with a kernel and a terminal websocket open";
    let expected = "a close frame on each; fds back to their baseline; the app's 503 page next";
    vec![Row::of(DRILL, done, expected, drill(labforge).await)]
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn open(client: &JupyterClient, base: &str, path: &str) -> anyhow::Result<Socket> {
    let mut request = format!("{}{path}", base.replacen("http", "ws", 1)).into_client_request()?;
    request
        .headers_mut()
        .insert("cookie", client.cookie_header().parse()?);
    request
        .headers_mut()
        .insert("x-xsrftoken", client.xsrf().parse()?);
    let (socket, _) = tokio_tungstenite::connect_async(request).await?;
    Ok(socket)
}

/// What the socket got after its server died: its close frame's code, or how it ended without.
async fn ending(socket: &mut Socket) -> String {
    let deadline = tokio::time::sleep(Duration::from_secs(15));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return "nothing within 15 s".into(),
            message = socket.next() => match message {
                Some(Ok(Message::Close(Some(frame)))) => return format!("close {}", u16::from(frame.code)),
                Some(Ok(Message::Close(None))) => return "close (no code)".into(),
                Some(Ok(_)) => continue,
                Some(Err(error)) => return format!("ended without a close frame: {error}"),
                None => return "ended without a close frame".into(),
            },
        }
    }
}

async fn drill(labforge: &Path) -> anyhow::Result<String> {
    let (lab, user, base) = Lab::with_notebook_at_path(labforge, "upstream", "dies").await?;
    let fds_before = lab.open_fds();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("cookie", user.cookie.parse()?);
    let client = JupyterClient::connect_with_headers(&base, headers).await?;
    let kernel = client
        .post("/api/kernels", &serde_json::json!({"name": "python3"}))
        .await?;
    let kernel = kernel["id"].as_str().context("no kernel id")?.to_owned();
    let terminal = client
        .post("/api/terminals", &serde_json::json!({}))
        .await?;
    let terminal = terminal["name"]
        .as_str()
        .context("no terminal name")?
        .to_owned();
    let mut sockets = vec![
        (
            "kernel",
            open(&client, &base, &format!("/api/kernels/{kernel}/channels")).await?,
        ),
        (
            "terminal",
            open(&client, &base, &format!("/terminals/websocket/{terminal}")).await?,
        ),
    ];
    let fds_open = lab.open_fds();
    let killed = Instant::now();
    podman(&["kill", &format!("labforge-{}_dies", user.user)])?;
    let mut endings = Vec::new();
    for (what, socket) in &mut sockets {
        endings.push(format!("{what}: {}", ending(socket).await));
    }
    let closed_in = killed.elapsed();
    // The next request, before the runtime has the server back.
    let next = user
        .http
        .get(format!("{base}/lab"))
        .header("cookie", &user.cookie)
        .send()
        .await?;
    let next_status = next.status().as_u16();
    let next_page = next.text().await.unwrap_or_default();
    drop(sockets);
    let deadline = Instant::now() + Duration::from_secs(30);
    let fds_after = loop {
        let now = lab.open_fds();
        if now <= fds_before + 8 || Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let figures = format!(
        "{} within {:.1} s; next request {next_status}; fds {fds_before} → {fds_open} with the sockets → {fds_after}",
        endings.join(", "),
        closed_in.as_secs_f64()
    );
    ensure!(endings.iter().all(|e| e.contains(": close")), "{figures}");
    ensure!(fds_after <= fds_before + 8, "{figures}");
    ensure!(
        next_status == 503 && next_page.contains("labforge"),
        "{figures}; the page: {}",
        next_page.chars().take(200).collect::<String>()
    );
    Ok(figures)
}
