//! The engine behind labforge's back (found by `make drills`): a notebook's container removed
//! with podman directly shows as starting again with that reason, not as a bare "starting"; and
//! an engine whose every call fails shows on every running notebook, while the API keeps
//! answering, until the engine is back.

use crate::need;
use crate::support::embedded::{Session, up_with_jupyterlab};
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

/// Polls the notebook until `done` holds for it; fails with the last answer and labforge's log
/// after a minute.
async fn until(
    up: &LabforgeUp,
    session: &Session,
    path: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = session.get(path).await;
        assert_eq!(status, 200, "{body}");
        if done(&body["notebook"]) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "not {what} within 60 s: {body}\nlabforge's log:\n{}",
            up.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn state_tells_what_happened_behind_labforges_back() {
    crate::init_crypto();
    let user = format!("faults-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    // podman, unless the flag file exists: then every call fails as a broken engine's would.
    let flag = dir.path().join("engine-down");
    let engine = dir.path().join("podman");
    std::fs::write(
        &engine,
        format!(
            "#!/bin/sh\nif [ -e '{}' ]; then echo 'the engine is down' >&2; exit 125; fi\nexec podman \"$@\"\n",
            flag.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
    let up = up_with_jupyterlab(
        &dir.path().join("data"),
        &["--engine", &engine.display().to_string()],
    )
    .await;
    let password = need(up.add_user(&user));
    let session = Session::sign_in(&up, &user, &password).await;
    let (status, body) = session
        .post(
            &format!("/api/namespaces/{user}/notebooks"),
            json!({"name": "lab", "workspace": "none"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let path = format!("/api/namespaces/{user}/notebooks/lab");
    session
        .wait_state(&user, "lab", "ready", Duration::from_secs(120))
        .await;
    let container = labforge_embedded::runtime::container_name(&user, "lab");
    the_engine_finds_a_notebooks_container_by_its_label(&user, &container).await;

    let removed = std::process::Command::new("podman")
        .args(["rm", "-f", "-t", "0", &container])
        .status()
        .unwrap();
    assert!(removed.success());
    let restarting = until(
        &up,
        &session,
        &path,
        "starting again with its reason",
        |nb| {
            nb["state"] == "starting"
                && nb["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("removed outside labforge"))
        },
    )
    .await;
    let (_, events) = session.get(&format!("{path}/events")).await;
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "ContainerGone" && e["type"] == "Warning"),
        "{events}\n{restarting}"
    );
    session
        .wait_state(&user, "lab", "ready", Duration::from_secs(120))
        .await;

    std::fs::write(&flag, "").unwrap();
    let down = until(
        &up,
        &session,
        &path,
        "marked as the engine not answering",
        |nb| {
            nb["state"] != "ready"
                && nb["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("the engine is down"))
        },
    )
    .await;
    // The API answers meanwhile.
    let (status, list) = session
        .get(&format!("/api/namespaces/{user}/notebooks"))
        .await;
    assert_eq!(status, 200, "{list}\n{down}");
    std::fs::remove_file(&flag).unwrap();
    session
        .wait_state(&user, "lab", "ready", Duration::from_secs(120))
        .await;
}

/// The runtime's work queue lists one notebook's container alone, by its notebook label under
/// this instance's: the running one is found, and a notebook without one finds none.
async fn the_engine_finds_a_notebooks_container_by_its_label(user: &str, container: &str) {
    use labforge_embedded::runtime::{Engine, MANAGED_LABEL};
    let inspected = std::process::Command::new("podman")
        .args(["inspect", "--format"])
        .arg(format!("{{{{index .Config.Labels \"{MANAGED_LABEL}\"}}}}"))
        .arg(container)
        .output()
        .unwrap();
    assert!(inspected.status.success(), "{inspected:?}");
    let engine = Engine {
        program: "podman".into(),
        insecure_registries: Vec::new(),
        instance: String::from_utf8_lossy(&inspected.stdout).trim().to_owned(),
    };
    let found = engine.container_of(user, "lab").await.unwrap().unwrap();
    assert_eq!(found.name, container);
    assert_eq!(found.notebook, (user.to_owned(), "lab".to_owned()));
    assert!(found.running);
    assert!(engine.container_of(user, "other").await.unwrap().is_none());
    let other_instance = Engine {
        instance: "another-instance".into(),
        ..engine
    };
    assert!(
        other_instance
            .container_of(user, "lab")
            .await
            .unwrap()
            .is_none()
    );
}
