//! The web UI in a real browser (Playwright + Debian Chromium) against `labforge up` with real
//! podman: sign-in, the spawner form and its errors, live status, JupyterLab through the proxy,
//! saving an environment with its progress (and a failing one), starting from a saved image,
//! another user's view, and the admin page. Screenshots land in tests/artifacts/.

use crate::need;
use crate::support::embedded::Session;
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use serde_json::{Value, json};
use std::path::Path;

#[tokio::test]
async fn users_work_through_the_web_ui_in_a_browser() {
    crate::init_crypto();
    let agent = need(labforge_tests::agent::agent_binary());
    let suffix = format!("{:x}", std::process::id());
    let (alice, bob) = (format!("ui-alice-{suffix}"), format!("ui-bob-{suffix}"));
    // Before `up`: dropped after it, once labforge has stopped.
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone(), bob.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up =
        need(LabforgeUp::start(Path::new(env!("CARGO_BIN_EXE_labforge")), &data, &agent).await);
    need(labforge_tests::push_layout(
        "jupyterlab",
        &up.registry,
        "labforge/jupyterlab:latest",
    ));
    let alice_password = need(up.add_user(&alice));
    let bob_password = need(up.add_user(&bob));

    let screenshots = need(labforge_tests::artifacts_dir());
    let config = dir.path().join("ui.json");
    std::fs::write(
        &config,
        json!({
            "url": up.url,
            "alice": [alice, alice_password],
            "bob": [bob, bob_password],
            "admin": ["admin", up.admin_password.clone().unwrap()],
            "agent": data.join("agent/labforge-agent"),
            "screenshots": screenshots,
        })
        .to_string(),
    )
    .unwrap();
    let output = match labforge_tests::browser::run_script("ui.mjs", &[&config.to_string_lossy()]) {
        Ok(output) => output,
        Err(e) => {
            // First, in case gathering the rest fails too.
            eprintln!("{e}");
            panic!("{e}\n{}", diagnostics(&up, &alice, &alice_password).await)
        }
    };
    let seen: Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    eprintln!("{seen:#}");
    if let Some(stall) = seen["labStall"].as_str() {
        eprintln!(
            "JupyterLab stalled on its first load and showed its launcher after a reload:\n{stall}\n{}",
            diagnostics(&up, &alice, &alice_password).await
        );
    }
    assert!(
        seen["loginError"]
            .as_str()
            .unwrap()
            .contains("wrong user name or password")
    );
    let login_page = seen["loginPage"].as_str().unwrap();
    assert!(
        !login_page.contains("printed") && !login_page.contains("labforge user add"),
        "the sign-in page is for every visitor, not the operator: {login_page}"
    );
    assert!(
        seen["emptyState"]
            .as_str()
            .unwrap()
            .contains("No notebooks yet")
    );
    assert!(
        seen["nameError"].as_str().unwrap().contains("lowercase"),
        "checked as typed"
    );
    assert!(
        seen["cpuError"]
            .as_str()
            .unwrap()
            .contains("\"lots\" is not an amount of cores"),
        "{seen}"
    );
    assert!(
        seen["jupyterTitle"]
            .as_str()
            .unwrap()
            .contains("JupyterLab")
    );
    // The progress bar reached the digest the registry holds.
    let cookie = need(up.sign_in(&alice, &alice_password).await);
    let images: Value = reqwest::Client::new()
        .get(format!("{}/api/namespaces/{alice}/images", up.url))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let saved = &images["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"].as_str().unwrap().ends_with(":ui-save"))
        .unwrap();
    let digest = saved["digest"].as_str().unwrap();
    assert!(
        seen["saveText"].as_str().unwrap().contains(digest),
        "{seen}"
    );
    assert_eq!(seen["saveBar"], 100);
    assert!(
        seen["tagReuseQuestion"]
            .as_str()
            .unwrap()
            .contains(":ui-save is already saved"),
        "{seen}"
    );
    assert_eq!(
        seen["savedAfterDeclined"], 1,
        "a declined reuse saves nothing"
    );
    let offered = |select: &str| {
        seen["savedOffered"][select]
            .as_array()
            .unwrap()
            .iter()
            .any(|image| image.as_str().unwrap().ends_with(":ui-save"))
    };
    assert!(
        offered("jupyter") && !offered("vscode"),
        "a JupyterLab save is offered for JupyterLab only: {seen}"
    );
    assert!(
        seen["saveError"].as_str().unwrap().contains("agent"),
        "a failed save says why: {seen}"
    );
    assert_eq!(
        images["images"].as_array().unwrap().len(),
        1,
        "the failed save and the unchanged one recorded nothing"
    );
    let unchanged = &seen["unchangedSave"];
    assert!(
        unchanged["text"]
            .as_str()
            .unwrap()
            .contains("no image was made"),
        "{seen}"
    );
    assert_eq!(unchanged["bar"], 100, "{seen}");
    assert_eq!(unchanged["buttonEnabled"], true, "{seen}");
    let tags = reqwest::get(format!(
        "http://{}/v2/{alice}/from-saved/tags/list",
        up.registry
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(!tags.contains("nothing-new"), "no image pushed: {tags}");

    let deletion = &seen["imageDeletion"];
    let dialogs: Vec<&str> = deletion["dialogs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(
        dialogs.len() == 3
            && dialogs[0].contains(":ui-save? It is deleted from the registry")
            && dialogs[1].contains("a notebook (from-saved) runs on")
            && dialogs[2].contains(":spare? It is deleted from the registry"),
        "{seen}"
    );
    assert_eq!(deletion["rowsLeft"], 1, "{seen}");
    // The one left, shared with bob from its row, is offered on bob's form.
    assert!(
        seen["shareQuestion"]
            .as_str()
            .unwrap()
            .contains(saved["image"].as_str().unwrap()),
        "{seen}"
    );
    assert_eq!(
        seen["sharedRow"],
        format!("Shared with {bob} Share…"),
        "{seen}"
    );
    assert_eq!(seen["sharedOffered"], json!([saved["image"]]), "{seen}");
    assert!(
        seen["volumeRow"]
            .as_str()
            .unwrap()
            .starts_with("lab-workspace lab"),
        "the new notebook's volume is listed as mounted by it, without a reload: {seen}"
    );
    assert_eq!(
        seen["signingInTo"],
        format!("Sign in to open notebook lab of {alice}."),
        "{seen}"
    );
    for width in [1400, 1024] {
        assert_eq!(
            seen[format!("overflowingAt{width}")],
            json!([]),
            "at {width} px every card fits, the saved images' actions too"
        );
    }
    let ages = seen["savedAges"].as_array().unwrap();
    assert!(
        ages[0].as_str().unwrap().ends_with("s ago") && ages[0] != ages[1],
        "the saved image's age moves on: {seen}"
    );
    let tags = reqwest::get(format!("http://{}/v2/{alice}/lab/tags/list", up.registry))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        tags.contains("ui-save") && !tags.contains("spare"),
        "the registry keeps the one in use: {tags}"
    );
    assert_eq!(seen["prefilledImage"], saved["image"]);
    assert_eq!(seen["existingNameShown"], true, "{seen}");
    assert_eq!(seen["dataVolumeShown"], true, "{seen}");
    assert_eq!(seen["existingVolumes"], json!(["lab-workspace"]), "{seen}");
    assert_eq!(seen["fromSavedImage"], saved["image"]);
    assert_eq!(
        seen["missing"],
        json!([]),
        "labforge's pages asked for something it does not serve"
    );
    // labforge's log goes to a file here: plain text, no terminal colours.
    let log = up.log();
    assert!(log.contains("proxy serving"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in the log file: {log}"
    );
    assert_eq!(seen["bobRows"], 0);
    assert_eq!(seen["bobNotebookPage"], 403);
    assert_eq!(seen["bobProxy"], 403);
    assert_eq!(seen["adminOwners"], json!([alice, bob]));
    // Who stopped bob's notebook, in the admin's audit trail: the admin, from loopback, done.
    let audit_stop = seen["auditStop"].as_str().unwrap_or_default();
    assert!(
        audit_stop.contains(&format!(
            "admin 127.0.0.1 PATCH /api/namespaces/{bob}/notebooks/"
        )) && audit_stop.ends_with("200 ok"),
        "{audit_stop}"
    );

    // Each notebook on its own host: JupyterLab ran a cell there.
    let port = up.url.rsplit(':').next().unwrap();
    assert!(
        seen["labUrl"].as_str().unwrap().starts_with(&format!(
            "http://lab--{alice}.localhost:{port}/notebook/{alice}/lab/"
        )),
        "{seen}"
    );
    assert!(
        seen["cellOutput"].as_str().unwrap().contains("42"),
        "{seen}"
    );
    // A page of bob's notebook, opened by the admin, could not act as the admin: not on the web
    // app (no session cookie goes there from another site, CORS hides the answer) and not on
    // alice's notebook (its host refuses other origins), and the admin is still signed in.
    assert_eq!(seen["adminOnAlice"]["status"], 200, "{seen}");
    assert_eq!(seen["adminOnBob"]["status"], 200, "{seen}");
    assert!(
        seen["adminOnBob"]["url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("http://bobs--{bob}.localhost:{port}/")),
        "{seen}"
    );
    let attack = &seen["attack"];
    for what in ["apiRead", "apiWrite", "aliceRead"] {
        assert!(
            attack[what].as_str().unwrap().starts_with("refused"),
            "{what}: {attack}"
        );
    }
    assert_eq!(attack["aliceSocket"], "refused", "{attack}");
    // The blind writes went out (their answers hidden) and did nothing.
    assert_eq!(attack["apiBlindWrite"], "opaque", "{attack}");
    assert_eq!(attack["aliceBlindWrite"], "opaque", "{attack}");
    let alice_session = Session::sign_in(&up, &alice, &alice_password).await;
    let visit = alice_session.open_notebook(&alice, "lab").await.unwrap();
    let files: Value = alice_session
        .http
        .get(format!("{}/api/contents", visit.base))
        .headers(visit.headers())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !files.to_string().contains("untitled"),
        "a file made by bob's page: {files}"
    );
    assert_eq!(seen["adminAfterAttack"], 200, "{seen}");
    let (_, bobs) = Session::sign_in(&up, &bob, &bob_password)
        .await
        .get(&format!("/api/namespaces/{bob}/notebooks"))
        .await;
    let names: Vec<&str> = bobs["notebooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["bobs"], "nothing created by the attack: {attack}");
    assert_eq!(seen["bulkStopped"], true);
    assert_eq!(seen["ticksAfterBulkStop"], 0, "a done selection is cleared");
    for page in [
        "login",
        "notebooks-empty",
        "new-notebook-error",
        "notebooks",
        "jupyterlab",
        "jupyterlab-cell",
        "notebook-saved",
        "notebook-save-failed",
        "notebooks-narrow",
        "forbidden",
        "admin",
        "admin-filtered",
    ] {
        let file = screenshots.join(format!("ui-{page}.png"));
        assert!(
            file.metadata().map(|m| m.len() > 5_000).unwrap_or(false),
            "screenshot {}",
            file.display()
        );
    }
}

/// For whoever reads a failure or a stall: `user`'s notebooks with their status and events as
/// the API reports them, every container with the last log lines of `user`'s, and the end of
/// labforge's log.
async fn diagnostics(up: &LabforgeUp, user: &str, password: &str) -> String {
    let session = Session::sign_in(up, user, password).await;
    let (_, list) = session
        .get(&format!("/api/namespaces/{user}/notebooks"))
        .await;
    let mut report = format!("{user}'s notebooks:\n{list:#}\n");
    for name in list["notebooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["name"].as_str())
    {
        let (_, events) = session
            .get(&format!("/api/namespaces/{user}/notebooks/{name}/events"))
            .await;
        report.push_str(&format!("events of {name}: {events}\n"));
    }
    let podman = |args: &[&str]| {
        std::process::Command::new("podman")
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr)
            })
            .unwrap_or_default()
    };
    let containers = podman(&["ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Ports}}"]);
    report.push_str(&format!("containers:\n{containers}"));
    let prefix = labforge_embedded::runtime::container_name(user, "");
    for name in containers
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&prefix))
    {
        let log = podman(&["logs", "--tail", "60", name]);
        report.push_str(&format!("log of {name}:\n{log}"));
    }
    report + "labforge up log (its end):\n" + &up.log_tail(300)
}

/// The spawner form in Chromium: what each server type and workspace kind shows, every wrong
/// field told at once under its input, no workspace, and an existing volume.
#[tokio::test]
async fn the_spawner_form_shows_every_error_at_once_and_takes_every_workspace_kind() {
    crate::init_crypto();
    let user = format!("ui-form-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = crate::support::embedded::up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let password = need(up.add_user(&user));
    let other = format!("{user}-other");
    let other_password = need(up.add_user(&other));
    let session = Session::sign_in(&up, &user, &password).await;

    // A workspace volume a deleted notebook left behind.
    let (status, body) = session
        .post(
            &format!("/api/namespaces/{user}/notebooks"),
            json!({"name": "kept"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    session
        .wait_state(&user, "kept", "ready", std::time::Duration::from_secs(120))
        .await;
    let (status, body) = session
        .call(
            reqwest::Method::DELETE,
            &format!("/api/namespaces/{user}/notebooks/kept"),
            None,
        )
        .await;
    assert!(status < 300, "{body}");

    let config = dir.path().join("spawner.json");
    std::fs::write(
        &config,
        json!({
            "url": up.url,
            "user": [user, password],
            "other": [other, other_password],
            "keptVolume": "kept-workspace",
            "missingImage": format!("{}/{user}/no-such-image:1", up.registry),
            "screenshots": need(labforge_tests::artifacts_dir()),
        })
        .to_string(),
    )
    .unwrap();
    let output = labforge_tests::browser::run_script("spawner.mjs", &[&config.to_string_lossy()])
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    eprintln!("{seen:#}");

    let shown = |state: &str, keys: &[&str]| {
        let all = [
            "size",
            "sizeLabel",
            "volume",
            "volumeLabel",
            "jupyterImages",
            "vscodeImages",
            "vscodeLabel",
        ];
        for key in all {
            assert_eq!(
                seen[state][key].as_bool(),
                Some(keys.contains(&key)),
                "{state}: {key} shown? {}",
                seen[state]
            );
        }
    };
    shown("initially", &["size", "sizeLabel", "jupyterImages"]);
    shown("existing", &["volume", "volumeLabel", "jupyterImages"]);
    shown("none", &["jupyterImages"]);
    shown("vscode", &["vscodeImages", "vscodeLabel"]);

    let errors = seen["errors"].as_array().unwrap();
    let fields: Vec<&str> = errors
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "cpu",
            "memory",
            "workspace.size",
            "dataVolumes[0].name",
            "dataVolumes[0].mountPath",
            "environment.1BAD"
        ],
        "{seen}"
    );
    for error in errors {
        let (field, message) = (
            error["field"].as_str().unwrap(),
            error["message"].as_str().unwrap(),
        );
        assert!(
            !message.contains(field),
            "the message repeats its field: {error}"
        );
        assert!(error["input"].is_string(), "not tied to an input: {error}");
        assert_eq!(error["invalid"], "true", "{error}");
        assert_eq!(error["visible"], true, "{error}");
    }
    let cpu = errors[0]["message"].as_str().unwrap();
    assert!(
        cpu.contains("500m") && !cpu.contains("Mi"),
        "CPU in cores: {cpu}"
    );
    assert_eq!(
        seen["focused"], "cpu",
        "the first wrong input has the focus"
    );
    assert_eq!(seen["formError"], "", "every error is under its field");
    assert_eq!(seen["kept"], "lots", "what was typed stays");

    let missing_image = &seen["missingImage"];
    assert_eq!(missing_image["visible"], true, "{seen}");
    assert_eq!(missing_image["focused"], "customImage", "{seen}");
    assert!(
        missing_image["message"]
            .as_str()
            .unwrap()
            .contains("has no such image"),
        "{seen}"
    );
    assert!(
        missing_image["url"].as_str().unwrap().ends_with("/new"),
        "still on the form: {seen}"
    );
    assert!(
        !dir.path()
            .join("data/store/notebooks")
            .join(&user)
            .join("ghost.json")
            .exists(),
        "nothing made for it"
    );
    // "again" took the kept volume as its workspace: the volumes table said so.
    assert_eq!(seen["volumeMountedBy"], "again", "{seen}");
    assert_eq!(seen["volumeDeletableWhileMounted"], 0, "{seen}");
    let questions = seen["volumeQuestions"].as_array().unwrap();
    assert!(
        questions[0]
            .as_str()
            .unwrap()
            .contains("Delete notebook again")
            && questions[1]
                .as_str()
                .unwrap()
                .contains("Delete volume kept-workspace? Its files are lost"),
        "{seen}"
    );
    let volume = labforge_embedded::runtime::volume_name(&user, "kept-workspace");
    let exists = std::process::Command::new("podman")
        .args(["volume", "exists", &volume])
        .status()
        .unwrap();
    assert!(!exists.success(), "{volume} is gone");
    assert_eq!(seen["missingVolume"]["visible"], true, "{seen}");
    assert!(
        seen["missingVolume"]["message"]
            .as_str()
            .unwrap()
            .contains("kept-workspace"),
        "names the volumes there are: {seen}"
    );
    assert!(
        seen["offeredVolumes"]
            .as_array()
            .unwrap()
            .contains(&json!("kept-workspace")),
        "{seen}"
    );

    let volumes_of = |notebook: &Value| -> Vec<String> {
        notebook["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
            .map(str::to_owned)
            .collect()
    };
    let raw = |name: &str| {
        // The Notebook as stored: embedded mode's counterpart of the cluster's object.
        let path = dir
            .path()
            .join("data/store/notebooks")
            .join(&user)
            .join(format!("{name}.json"));
        serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    assert!(volumes_of(&raw("bare")).is_empty(), "no workspace");

    let narrow = &seen["narrow"];
    assert!(
        narrow["pageWidth"].as_f64().unwrap() <= 420.0
            && narrow["actionsRight"].as_f64().unwrap() <= 420.0,
        "at 420 px the list fits, actions included: {narrow}"
    );
    assert!(seen["imageBreaks"].as_u64().unwrap() > 0, "{seen}");
    // A stopped notebook's URL leads to its page, which offers Start, not Connect.
    assert_eq!(seen["stoppedPage"]["start"], true, "{seen}");
    assert_eq!(seen["stoppedPage"]["connect"], false, "{seen}");
    assert_eq!(seen["forbidden"]["status"], 403, "{seen}");
    assert_eq!(
        seen["forbidden"]["styled"], "rgb(29, 35, 48)",
        "the app's header: {seen}"
    );
    // A start counts as activity, and a stop keeps it.
    for when in ["activityAfterStart", "activityAfterStop"] {
        let text = seen["details"][when].as_str().unwrap();
        assert!(text.ends_with(" ago"), "{when}: {text}");
    }
    let started: jiff::Timestamp = seen["startedAt"].as_str().unwrap().parse().unwrap();
    let (_, bare) = session
        .get(&format!("/api/namespaces/{user}/notebooks/bare"))
        .await;
    let last: jiff::Timestamp = bare["notebook"]["lastActivity"]
        .as_str()
        .unwrap_or_else(|| panic!("no last activity after a stop: {bare}"))
        .parse()
        .unwrap();
    assert!(
        last >= started - jiff::SignedDuration::from_secs(2),
        "the start renewed the last activity ({last}, started {started})"
    );
    let created = seen["details"]["created"].as_str().unwrap();
    assert!(
        !created.is_empty() && !created.contains('T') && !created.ends_with('Z'),
        "a date people read: {created}"
    );
}
