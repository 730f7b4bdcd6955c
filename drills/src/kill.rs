//! kill -9 mid-work: labforge killed with SIGKILL during a create, a save, a stop with auto-save
//! and a delete, then started again on the same data. Afterwards every notebook is in a true
//! state, no container is duplicated or orphaned, a save is either complete (its tag names a
//! whole image) or absent, and the store reads.

use crate::Row;
use crate::lab::{Lab, Session, containers_of, podman};
use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const DRILL: &str = "kill -9 mid-work";
const READY: Duration = Duration::from_secs(180);

pub async fn run(labforge: &Path) -> Vec<Row> {
    let namespace = format!("kill-{:x}", std::process::id());
    let mut rows = Vec::new();
    let mut lab = match Lab::start(labforge, std::slice::from_ref(&namespace), &[]).await {
        Ok(lab) => lab,
        Err(error) => return vec![Row::of(DRILL, "start labforge up", "it starts", Err(error))],
    };
    let mut user = match lab.user(&namespace).await {
        Ok(user) => user,
        Err(error) => return vec![Row::of(DRILL, "add a user", "it signs in", Err(error))],
    };
    for (step, done) in [
        ("create", "killed 50 ms after a create was answered"),
        ("save", "killed while a save runs"),
        ("stop", "killed while a stop with auto-save saves"),
        ("delete", "killed right after a delete was answered"),
    ] {
        let (restarted, signed_in, outcome) = match kill_during(step, lab, &user).await {
            Ok(killed) => killed,
            Err(error) => {
                rows.push(Row::of(DRILL, done, "restart", Err(error)));
                return rows;
            }
        };
        (lab, user) = (restarted, signed_in);
        let expected = match step {
            "create" => "the notebook ready, one container",
            "save" => "the save complete or absent; the notebook ready again",
            "stop" => "stopped, no container; any save recorded complete",
            _ => "the notebook and its container gone",
        };
        rows.push(Row::of(DRILL, done, expected, outcome));
    }
    let store = async {
        let (status, body) = user
            .get(&format!("/api/namespaces/{namespace}/notebooks"))
            .await?;
        ensure!(status == 200, "listing answered {status}: {body}");
        let listed: Vec<&str> = body["notebooks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["name"].as_str())
            .collect();
        // No container of this namespace is left that no notebook names.
        for container in containers_of(&namespace)? {
            let name = container.rsplit('_').next().unwrap_or_default();
            ensure!(listed.contains(&name), "orphan container {container}");
        }
        Ok(format!(
            "{} notebooks listed, no orphan container",
            listed.len()
        ))
    };
    rows.push(Row::of(
        DRILL,
        "after the four kills",
        "the store reads; no orphan container",
        store.await,
    ));
    rows
}

/// Runs `step` on a fresh notebook, kills labforge in the middle, restarts it and checks; gives
/// back the restarted lab, the user signed in again, and what the check found.
async fn kill_during(
    step: &str,
    lab: Lab,
    user: &Session,
) -> anyhow::Result<(Lab, Session, anyhow::Result<String>)> {
    let name = format!("k-{step}");
    let path = user.notebook_path(&name);
    let mut save_id = None;
    if step != "create" {
        created(user, &name).await?;
        user.wait_for(&name, "ready", READY).await?;
        // Something to save.
        podman(&[
            "exec",
            &container(user, &name),
            "sh",
            "-c",
            // Enough that the save is still running when labforge is killed.
            "head -c 200000000 /dev/urandom > /home/jovyan/drill.bin",
        ])?;
    }
    match step {
        "create" => {
            created(user, &name).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        "save" => {
            let (status, save) = user
                .call(
                    reqwest::Method::POST,
                    &format!("{path}/saves"),
                    Some(json!({})),
                )
                .await?;
            ensure!(status == 202, "save answered {status}: {save}");
            save_id = save["id"].as_str().map(str::to_owned);
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        "stop" => {
            let (status, body) = user
                .call(
                    reqwest::Method::PATCH,
                    &path,
                    Some(json!({"autoSave": true, "stopped": true})),
                )
                .await?;
            ensure!(status == 200, "stop answered {status}: {body}");
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        _ => {
            let (status, body) = user.call(reqwest::Method::DELETE, &path, None).await?;
            ensure!(status == 200, "delete answered {status}: {body}");
        }
    }
    let lab = lab.kill_and_restart().await?;
    let restarted = Instant::now();
    // Sessions live in memory: a restart signs users out.
    let user =
        Session::sign_in(&lab.up.url, &user.user, &password_reset(&lab, &user.user)?).await?;
    let check = async {
        let figures = match step {
            "create" | "save" => {
                let took = user.wait_for(&name, "ready", READY).await?;
                one_container(&user, &name, 1)?;
                if step == "save" {
                    let saves = complete_saves(&lab, &user, &name).await?;
                    format!(
                        "ready {:.1} s after the restart; {saves} (save {})",
                        took.as_secs_f64(),
                        save_id.as_deref().unwrap_or("?")
                    )
                } else {
                    format!(
                        "ready {:.1} s after the restart, one container",
                        took.as_secs_f64()
                    )
                }
            }
            "stop" => {
                user.wait_for(&name, "stopped", READY).await?;
                wait_containers(&user, &name, 0).await?;
                let saves = complete_saves(&lab, &user, &name).await?;
                format!(
                    "stopped {:.1} s after the restart, no container; {saves}",
                    restarted.elapsed().as_secs_f64()
                )
            }
            _ => {
                user.wait_for(&name, "gone", READY).await?;
                wait_containers(&user, &name, 0).await?;
                format!(
                    "gone {:.1} s after the restart",
                    restarted.elapsed().as_secs_f64()
                )
            }
        };
        Ok(figures)
    }
    .await;
    Ok((lab, user, check))
}

async fn created(user: &Session, name: &str) -> anyhow::Result<()> {
    let (status, body) = user.create(name).await?;
    ensure!(status == 201, "create answered {status}: {body}");
    Ok(())
}

fn container(user: &Session, name: &str) -> String {
    format!("labforge-{}_{name}", user.user)
}

/// `labforge user reset`: the user's new password (the old one was only printed once).
fn password_reset(lab: &Lab, name: &str) -> anyhow::Result<String> {
    let printed = lab.up.user_command(&["reset", name])?;
    printed
        .split_whitespace()
        .last()
        .map(str::to_owned)
        .context("no password printed")
}

fn one_container(user: &Session, name: &str, want: usize) -> anyhow::Result<()> {
    let have: Vec<String> = containers_of(&user.user)?
        .into_iter()
        .filter(|c| *c == container(user, name))
        .collect();
    ensure!(
        have.len() == want,
        "{} containers of {name}: {have:?}",
        have.len()
    );
    Ok(())
}

async fn wait_containers(user: &Session, name: &str, want: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match one_container(user, name, want) {
            Ok(()) => return Ok(()),
            Err(error) if Instant::now() > deadline => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Every image recorded as saved from `name`, and every tag in its repository, is a whole image
/// in the registry: its manifest, config and layers all there. Says how many there are.
async fn complete_saves(lab: &Lab, user: &Session, name: &str) -> anyhow::Result<String> {
    let (status, body) = user
        .get(&format!("/api/namespaces/{}/images", user.user))
        .await?;
    ensure!(status == 200, "saved images answered {status}: {body}");
    let registry = &lab.up.registry;
    let http = reqwest::Client::new();
    let repository = format!("{}/{name}", user.user);
    let mut tags: Vec<String> = body["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["notebook"] == name)
        .filter_map(|i| i["image"].as_str())
        .filter_map(|image| image.rsplit_once(':').map(|(_, tag)| tag.to_owned()))
        .collect();
    let recorded = tags.len();
    let listed: Value = http
        .get(format!("http://{registry}/v2/{repository}/tags/list"))
        .send()
        .await?
        .json()
        .await
        .unwrap_or_default();
    tags.extend(
        listed["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned),
    );
    tags.sort();
    tags.dedup();
    for tag in &tags {
        let manifest: Value = http
            .get(format!("http://{registry}/v2/{repository}/manifests/{tag}"))
            .header(
                "accept",
                "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
            )
            .send()
            .await?
            .json()
            .await
            .with_context(|| format!("{repository}:{tag} has no manifest"))?;
        let blobs = manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(std::iter::once(&manifest["config"]))
            .filter_map(|b| b["digest"].as_str());
        for digest in blobs {
            let status = http
                .head(format!("http://{registry}/v2/{repository}/blobs/{digest}"))
                .send()
                .await?
                .status();
            if status != 200 {
                bail!(
                    "{repository}:{tag} names blob {digest}, which the registry answers {status}"
                );
            }
        }
    }
    Ok(format!(
        "{recorded} saves recorded, {} tags, all whole",
        tags.len()
    ))
}
