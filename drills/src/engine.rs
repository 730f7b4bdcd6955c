//! The engine behind labforge's back: a notebook's container removed or stopped with podman
//! directly, its image removed, and the engine itself failing. labforge's state shows each within
//! its resync, with the reason, and recovers when the engine does.

use crate::Row;
use crate::lab::{Lab, Session, podman};
use anyhow::ensure;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const DRILL: &str = "engine behind our back";
const NOTICE: Duration = Duration::from_secs(15);
const RECOVER: Duration = Duration::from_secs(180);

pub async fn run(labforge: &Path) -> Vec<Row> {
    let namespace = format!("engine-{:x}", std::process::id());
    let scratch = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => return vec![Row::of(DRILL, "scratch dir", "made", Err(error.into()))],
    };
    // podman, unless the flag file exists: then every call fails as a broken engine would.
    let flag = scratch.path().join("engine-down");
    let wrapper = scratch.path().join("podman");
    let script = format!(
        "#!/bin/sh\nif [ -e '{}' ]; then echo 'drill: the engine is down' >&2; exit 125; fi\nexec podman \"$@\"\n",
        flag.display()
    );
    if let Err(error) = write_executable(&wrapper, &script) {
        return vec![Row::of(DRILL, "engine wrapper", "written", Err(error))];
    }
    let engine = wrapper.display().to_string();
    let lab = match Lab::start(
        labforge,
        std::slice::from_ref(&namespace),
        &["--engine", &engine],
    )
    .await
    {
        Ok(lab) => lab,
        Err(error) => return vec![Row::of(DRILL, "start labforge up", "it starts", Err(error))],
    };
    let user = match lab.user(&namespace).await {
        Ok(user) => user,
        Err(error) => return vec![Row::of(DRILL, "add a user", "it signs in", Err(error))],
    };
    let noticed = "not ready within 15 s, with a reason; ready again";
    vec![
        Row::of(
            DRILL,
            "the container removed (podman rm -f)",
            noticed,
            behind_back(&user, "gone", &["rm", "-f", "-t", "0"]).await,
        ),
        Row::of(
            DRILL,
            "the container stopped (podman stop)",
            noticed,
            behind_back(&user, "halted", &["stop", "-t", "0"]).await,
        ),
        Row::of(
            DRILL,
            "the image removed (podman rmi) while stopped, then started",
            "pulled again from the registry, ready",
            image_removed(&user).await,
        ),
        Row::of(
            DRILL,
            "every engine call failing, the container removed meanwhile",
            "labforge answers; not ready with a reason; ready once the engine works",
            engine_down(&user, &flag).await,
        ),
    ]
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A ready notebook's container.
async fn ready_notebook(user: &Session, name: &str) -> anyhow::Result<String> {
    user.ready_notebook(name).await?;
    Ok(format!("labforge-{}_{name}", user.user))
}

/// How long until the notebook is no longer ready, and the reason it gives then.
async fn not_ready_within(
    user: &Session,
    name: &str,
    limit: Duration,
) -> anyhow::Result<(Duration, String)> {
    let start = Instant::now();
    loop {
        if let Some((state, reason)) = user.state(name).await?
            && state != "ready"
        {
            return Ok((start.elapsed(), format!("{state}: {reason}")));
        }
        ensure!(
            start.elapsed() < limit,
            "{name} still ready after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn behind_back(user: &Session, name: &str, action: &[&str]) -> anyhow::Result<String> {
    let container = ready_notebook(user, name).await?;
    let mut args = action.to_vec();
    args.push(&container);
    podman(&args)?;
    let (noticed, said) = not_ready_within(user, name, NOTICE).await?;
    ensure!(!said.trim_end().ends_with(':'), "no reason given: {said:?}");
    let back = user.wait_for(name, "ready", RECOVER).await?;
    Ok(format!(
        "noticed in {:.1} s ({said}); ready again {:.1} s later",
        noticed.as_secs_f64(),
        back.as_secs_f64()
    ))
}

async fn image_removed(user: &Session) -> anyhow::Result<String> {
    let name = "no-image";
    ready_notebook(user, name).await?;
    let path = user.notebook_path(name);
    let (_, body) = user.get(&path).await?;
    let image = body["notebook"]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (status, body) = user
        .call(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"stopped": true})),
        )
        .await?;
    ensure!(status == 200, "stop answered {status}: {body}");
    user.wait_for(name, "stopped", RECOVER).await?;
    podman(&["rmi", "-f", &image])?;
    let (status, body) = user
        .call(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"stopped": false})),
        )
        .await?;
    ensure!(status == 200, "start answered {status}: {body}");
    let back = user.wait_for(name, "ready", RECOVER).await?;
    Ok(format!(
        "{image} removed; ready {:.1} s after the start",
        back.as_secs_f64()
    ))
}

async fn engine_down(user: &Session, flag: &Path) -> anyhow::Result<String> {
    let name = "engine-down";
    let container = ready_notebook(user, name).await?;
    std::fs::write(flag, "")?;
    let outcome = async {
        podman(&["rm", "-f", "-t", "0", &container])?;
        let (noticed, said) = not_ready_within(user, name, NOTICE).await?;
        // It keeps answering while the engine is down.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (status, _) = user
            .get(&format!("/api/namespaces/{}/notebooks", user.user))
            .await?;
        ensure!(
            status == 200,
            "the list answered {status} while the engine was down"
        );
        ensure!(!said.trim_end().ends_with(':'), "no reason given: {said:?}");
        anyhow::Ok((noticed, said))
    }
    .await;
    std::fs::remove_file(flag)?;
    let (noticed, said) = outcome?;
    let back = user.wait_for(name, "ready", RECOVER).await?;
    Ok(format!(
        "noticed in {:.1} s ({said}); ready {:.1} s after the engine came back",
        noticed.as_secs_f64(),
        back.as_secs_f64()
    ))
}
