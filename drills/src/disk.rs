//! Disk full: the data dir on a small filesystem of its own, filled up. Creates and saves fail with
//! a clear error and leave nothing half-made, the store stays readable, and everything works
//! again once space is freed.

use crate::Row;
use crate::lab::{Lab, Session};
use anyhow::{Context, bail, ensure};
use futures::StreamExt as _;
use serde_json::{Value, json};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DRILL: &str = "disk full";

pub async fn run(labforge: &Path) -> Vec<Row> {
    let done =
        "the data dir's filesystem (64 MiB tmpfs) filled; a create and a save; then space freed";
    let expected =
        "both refused with a clear error, nothing half-made; the store reads; both work after";
    vec![Row::of(DRILL, done, expected, drill(labforge).await)]
}

/// A tmpfs mounted at a path, unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(at: &Path, size: &str) -> anyhow::Result<Mounted> {
        std::fs::create_dir_all(at)?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()?;
        if !output.status.success() {
            bail!(
                "mounting a tmpfs needs root: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(Mounted(at.to_owned()))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes `path` until the filesystem refuses; returns the bytes written.
fn fill(path: &Path) -> anyhow::Result<u64> {
    let mut file = std::fs::File::create(path)?;
    let chunk = vec![0x5a; 64 * 1024];
    let mut written = 0;
    loop {
        match file.write(&chunk) {
            Ok(0) => return Ok(written),
            Ok(n) => written += n as u64,
            Err(error) if error.raw_os_error() == Some(28) => return Ok(written),
            Err(error) => return Err(error.into()),
        }
    }
}

/// Starts a save of `name` and follows it to its end; its last status.
async fn save(user: &Session, name: &str) -> anyhow::Result<Value> {
    let (status, started) = user
        .call(
            reqwest::Method::POST,
            &format!("{}/saves", user.notebook_path(name)),
            Some(json!({})),
        )
        .await?;
    if status != 202 {
        return Ok(started);
    }
    let id = started["id"].as_str().context("no save id")?;
    let response = user
        .http
        .get(format!(
            "{}/api/namespaces/{}/saves/{id}",
            user.base, user.user
        ))
        .header("cookie", &user.cookie)
        .send()
        .await?;
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    let mut last = Value::Null;
    let followed = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk?));
            while let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                    last = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
                }
                if matches!(
                    last["phase"].as_str(),
                    Some("done" | "unchanged" | "failed")
                ) {
                    return anyhow::Ok(());
                }
            }
        }
        Ok(())
    })
    .await;
    followed.context("the save did not end within 300 s")??;
    Ok(last)
}

async fn drill(labforge: &Path) -> anyhow::Result<String> {
    let namespace = format!("disk-{:x}", std::process::id());
    let dir = tempfile::tempdir()?;
    let fs = dir.path().join("fs");
    let _mounted = Mounted::tmpfs(&fs, "64m")?;
    // The registry's blobs live elsewhere: the image alone would fill the filesystem.
    let registry = labforge_tests::services::Registry::start().await?;
    let lab = Lab::start_in(
        dir,
        &fs.join("data"),
        labforge,
        std::slice::from_ref(&namespace),
        &["--registry", &registry.host()],
    )
    .await?;
    let user = lab.user(&namespace).await?;
    user.ready_notebook("before").await?;
    crate::lab::podman(&[
        "exec",
        &format!("labforge-{namespace}_before"),
        "sh",
        "-c",
        "head -c 1000000 /dev/urandom > /home/jovyan/installed.bin",
    ])?;

    let filler = fs.join("filler");
    let filled = fill(&filler)?;
    let (create_status, create_answer) = user.create("full").await?;
    let saved = save(&user, "before").await?;
    let (list_status, list) = user
        .get(&format!("/api/namespaces/{namespace}/notebooks"))
        .await?;
    let half_made = user.state("full").await?;
    std::fs::remove_file(&filler)?;

    let create_error = create_answer["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let save_error = saved["error"].as_str().unwrap_or_default().to_owned();
    let figures = format!(
        "filled with {} MiB; create → {create_status} {create_error:?}; save → {} {save_error:?}; list → {list_status} ({} notebooks)",
        filled >> 20,
        saved["phase"].as_str().unwrap_or("?"),
        list["notebooks"].as_array().map_or(0, Vec::len),
    );
    ensure!(
        create_status != 201 && create_error.contains("space"),
        "{figures}"
    );
    ensure!(
        half_made.is_none(),
        "{figures}; the refused notebook exists: {half_made:?}"
    );
    ensure!(
        saved["phase"] == "failed" && save_error.contains("space"),
        "{figures}"
    );
    ensure!(list_status == 200, "{figures}");

    let (status, body) = user.create("after").await?;
    ensure!(
        status == 201,
        "{figures}; after freeing space, create answered {status}: {body}"
    );
    let saved = save(&user, "before").await?;
    ensure!(
        saved["phase"] == "done",
        "{figures}; after freeing space the save ended {saved}"
    );
    Ok(format!(
        "{figures}; after freeing space: create 201, save done"
    ))
}
