//! `labforge up` end to end, through its one port as users and the UI use it: sign-in, the
//! notebooks API, JupyterLab and its kernels through the proxy, saving an environment and
//! starting on it, access control, bad input, and a restart that adopts running notebooks.

use crate::need;
use crate::support::embedded::{
    CHECK, NotebookVisit, PIP_INSTALL, Session, container_id, up_with_jupyterlab,
};
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use labforge_tests::eventually;
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_user_creates_uses_saves_and_restarts_a_notebook_through_labforge_up() {
    crate::init_crypto();
    let agent = need(labforge_tests::agent::agent_binary());
    let suffix = format!("{:x}", std::process::id());
    let (alice, bob) = (format!("alice-{suffix}"), format!("bob-{suffix}"));
    // Before `up`: dropped after it, once labforge has stopped.
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone(), bob.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut up = need(
        LabforgeUp::start(
            std::path::Path::new(env!("CARGO_BIN_EXE_labforge")),
            &data,
            &agent,
        )
        .await,
    );
    need(labforge_tests::push_layout(
        "jupyterlab",
        &up.registry,
        "labforge/jupyterlab:latest",
    ));

    // The first start created an admin and printed the password once; users come from the CLI.
    let admin_password = up
        .admin_password
        .clone()
        .expect("admin password printed on first start");
    let alice_password = need(up.add_user(&alice));
    let bob_password = need(up.add_user(&bob));
    let listed = need(up.user_command(&["list"]));
    assert!(
        listed.contains(&alice) && listed.contains("admin\tadmin"),
        "{listed}"
    );
    assert!(
        !std::fs::read_to_string(data.join("users.json"))
            .unwrap()
            .contains(&alice_password)
    );

    // Without a session: the API says 401, notebook paths too, health answers.
    let anonymous = reqwest::Client::new();
    let status = |url: String| {
        let anonymous = anonymous.clone();
        async move { anonymous.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(format!("{}/api/healthz", up.url)).await, 200);
    assert_eq!(
        status(format!("{}/api/namespaces/{alice}/notebooks", up.url)).await,
        401
    );
    // A notebook path on the main host: sent to the notebook's own host, where nobody anonymous
    // gets in (a browser's visit is sent to sign in, a script's request is refused).
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let old_url = no_redirects
        .get(format!("{}/notebook/{alice}/lab/lab?x=1", up.url))
        .send()
        .await
        .unwrap();
    assert_eq!(old_url.status(), 302);
    let port = up.url.rsplit(':').next().unwrap();
    let alice_host = format!("lab--{alice}.localhost:{port}");
    assert_eq!(
        old_url.headers()["location"],
        format!("//{alice_host}/notebook/{alice}/lab/lab?x=1").as_str()
    );
    let on_host = |mode: &'static str| {
        no_redirects
            .get(format!("http://127.0.0.1:{port}/notebook/{alice}/lab/lab"))
            .header("host", &alice_host)
            .header("sec-fetch-mode", mode)
            .send()
    };
    let navigation = on_host("navigate").await.unwrap();
    assert_eq!(navigation.status(), 302);
    assert!(
        navigation.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with(&format!("//localhost:{port}/notebook-sign-in?")),
        "{:?}",
        navigation.headers()
    );
    assert_eq!(on_host("cors").await.unwrap().status(), 401);
    let openapi: Value = anonymous
        .get(format!("{}/api/openapi.json", up.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(openapi["paths"]["/api/namespaces/{ns}/notebooks"]["post"].is_object());
    let bad_login = anonymous
        .post(format!("{}/api/login", up.url))
        .json(&json!({"username": alice, "password": "wrong"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_login.status(), 401);

    let a = Session::sign_in(&up, &alice, &alice_password).await;
    let b = Session::sign_in(&up, &bob, &bob_password).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");

    // Bad input: each refused with the field named, and nothing created.
    for (body, field) in [
        (json!({"name": "Lab_1"}), "name"),
        (json!({"name": "lab", "cpu": "lots"}), "cpu"),
        (
            json!({"name": "lab", "memory": "2Gi", "memoryLimit": "1Gi"}),
            "memoryLimit",
        ),
        (
            json!({"name": "lab", "gpus": {"vendor": "nvidia.com/gpu", "count": 1}}),
            "gpus.vendor",
        ),
        (
            json!({"name": "lab", "image": "no spaces allowed"}),
            "image",
        ),
        (
            json!({"name": "lab", "workspace": {"new": {"size": "lots"}}}),
            "workspace.size",
        ),
        (
            json!({"name": "lab", "environment": {"NB_PREFIX": "/x"}}),
            "environment.NB_PREFIX",
        ),
    ] {
        let (code, answer) = a.post(&notebooks, body.clone()).await;
        assert_eq!(
            (code, answer["field"].as_str()),
            (422, Some(field)),
            "{body}: {answer}"
        );
    }
    let (code, answer) = a
        .post(&notebooks, json!({"name": "lab", "cpus": "1"}))
        .await;
    assert_eq!(code, 422, "unknown field: {answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("cpus"),
        "{answer}"
    );
    let huge = json!({"name": "lab", "environment": {"BIG": "x".repeat(100_000)}});
    assert_eq!(a.post(&notebooks, huge).await.0, 413);
    let not_json = a
        .http
        .post(format!("{}{notebooks}", up.url))
        .header("cookie", &a.cookie)
        .body(r#"{"name":"lab"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        not_json.status(),
        415,
        "a form post cannot create notebooks"
    );
    assert_eq!(a.get(&notebooks).await.1["notebooks"], json!([]));

    // Create; it becomes ready and JupyterLab answers through the proxy.
    let created_at = Instant::now();
    let (code, created) = a
        .post(
            &notebooks,
            json!({"name": "lab", "cpuLimit": "2", "memoryLimit": "2Gi"}),
        )
        .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["owner"], alice.as_str());
    assert_eq!(a.post(&notebooks, json!({"name": "lab"})).await.0, 409);
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    let visit = a.open_notebook(&alice, "lab").await.unwrap();
    let lab = a
        .http
        .get(format!("{}/lab", visit.base))
        .headers(visit.headers())
        .send()
        .await
        .unwrap();
    assert_eq!(lab.status(), 200);
    assert!(lab.text().await.unwrap().contains("JupyterLab"));
    notebook_sign_in_holds(&up, &a, &alice, &alice_password, &visit).await;
    eprintln!(
        "create -> JupyterLab answering through the proxy: {:?}",
        created_at.elapsed()
    );

    // A kernel over its websocket, through the proxy: pip install, and a file in the workspace.
    let jupyter = a.jupyter(&alice, "lab").await;
    let printed = need(jupyter.run_code(PIP_INSTALL).await);
    assert!(printed.starts_with("pip exit 0"), "{printed}");
    assert!(need(jupyter.run_code(CHECK).await).contains("answer 42"));

    // bob: no access to alice's notebook or namespace; the admin sees both users' notebooks.
    let refused = b.open_notebook(&alice, "lab").await.err();
    assert_eq!(
        refused.as_deref(),
        Some("the web app's notebook sign-in: HTTP 403"),
        "bob is not let into alice's notebook"
    );
    // Nor with alice's cookie replayed by bob's browser on another notebook's host.
    let elsewhere = b
        .http
        .get(format!(
            "http://127.0.0.1:{port}/notebook/{bob}/scratch/lab"
        ))
        .header("host", b.notebook_host(&bob, "scratch"))
        .header("cookie", &visit.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 302, "sent to sign in, not let in");
    assert_eq!(b.get(&notebooks).await.0, 403);
    // An existing workspace is one of the namespace's own volumes: listed to its users, refused
    // by name elsewhere.
    let (code, volumes) = a.get(&format!("/api/namespaces/{alice}/volumes")).await;
    assert_eq!(code, 200, "{volumes}");
    assert_eq!(
        volumes["volumes"],
        json!([{"name": "lab-workspace", "usedBy": ["lab"]}])
    );
    assert_eq!(
        b.get(&format!("/api/namespaces/{alice}/volumes")).await.0,
        403
    );
    // Volumes and saved images are deleted by their namespace's users only, a mounted volume and
    // a name that is none of the namespace's never.
    let workspace = format!("/api/namespaces/{alice}/volumes/lab-workspace");
    assert_eq!(b.delete(&workspace).await.0, 403);
    let (code, mounted) = a.delete(&workspace).await;
    assert_eq!(code, 409, "{mounted}");
    assert!(
        mounted["error"]
            .as_str()
            .unwrap()
            .contains("mounted by notebook lab"),
        "{mounted}"
    );
    assert_eq!(
        a.delete(&format!("/api/namespaces/{alice}/volumes/nope"))
            .await
            .0,
        404
    );
    let image = format!("/api/namespaces/{alice}/images?image=example.com/x:1");
    assert_eq!(b.delete(&image).await.0, 403);
    assert_eq!(a.delete(&image).await.0, 404);
    // A query or path that cannot be read is refused in the API's error shape, naming what is
    // wrong, whether the app or the proxy in front of it refuses it.
    let refusals = [
        (
            a.delete(&format!("/api/namespaces/{alice}/images")).await,
            "image",
        ),
        (
            a.get(&format!("{notebooks}/lab/logs?tail=many")).await,
            "tail",
        ),
        (
            a.get(&format!("{notebooks}/%16/pod")).await,
            "control character",
        ),
    ];
    for ((code, refused), named) in refusals {
        assert_eq!(code, 400, "{refused}");
        assert_eq!(refused["success"], false, "{refused}");
        assert!(
            refused["error"]
                .as_str()
                .unwrap_or_default()
                .contains(named),
            "{refused}"
        );
    }
    for (session, ns) in [(&b, &bob), (&a, &alice)] {
        let name = if ns == &alice {
            "nope"
        } else {
            "lab-workspace"
        };
        let (code, refused) = session
            .post(
                &format!("/api/namespaces/{ns}/notebooks"),
                json!({"name": "borrowed", "workspace": {"existing": {"name": name}}}),
            )
            .await;
        assert_eq!(code, 422, "{refused}");
        assert_eq!(refused["field"], "workspace.name", "{refused}");
    }
    assert_eq!(
        b.post(&format!("{notebooks}/lab/saves"), json!({})).await.0,
        403
    );
    assert_eq!(b.get("/api/admin/notebooks").await.0, 403);
    let (code, _) = b
        .post(
            &format!("/api/namespaces/{bob}/notebooks"),
            json!({"name": "scratch", "cpuLimit": "0.5"}),
        )
        .await;
    assert_eq!(code, 201);
    assert_eq!(
        b.patch(
            &format!("/api/namespaces/{bob}/notebooks/scratch"),
            json!({"stopped": true})
        )
        .await
        .0,
        200
    );
    let admin = Session::sign_in(&up, "admin", &admin_password).await;
    let (code, listing) = admin.get("/api/admin/notebooks").await;
    assert_eq!(code, 200);
    let owners: Vec<&str> = listing["notebooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["owner"].as_str())
        .collect();
    assert!(
        owners.contains(&alice.as_str()) && owners.contains(&bob.as_str()),
        "{listing}"
    );
    let (_, only_bob) = admin.get(&format!("/api/admin/notebooks?user={bob}")).await;
    assert_eq!(
        only_bob["notebooks"].as_array().unwrap().len(),
        1,
        "{only_bob}"
    );
    assert_eq!(only_bob["notebooks"][0]["state"], "stopped");
    assert!(
        listing["totals"]["running"].as_u64().unwrap() >= 1,
        "{listing}"
    );

    // Another labforge on the same machine (its own data dir) leaves these notebooks alone.
    let running = container_id(&labforge_embedded::runtime::container_name(&alice, "lab"));
    let other = need(
        LabforgeUp::start(
            std::path::Path::new(env!("CARGO_BIN_EXE_labforge")),
            &dir.path().join("other"),
            &agent,
        )
        .await,
    );
    // Longer than the runtime's resync, so the other instance has looked at every container.
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(other);
    assert_eq!(
        container_id(&labforge_embedded::runtime::container_name(&alice, "lab")),
        running
    );

    // Save the environment; follow the progress to the pushed digest.
    let (code, save) = a
        .post(
            &format!("{notebooks}/lab/saves"),
            json!({"tag": "with-probe"}),
        )
        .await;
    assert_eq!(code, 202, "{save}");
    assert_eq!(
        a.post(&format!("{notebooks}/lab/saves"), json!({})).await.0,
        409,
        "one save at a time"
    );
    let (events, progress) = a.save_progress(&alice, save["id"].as_str().unwrap()).await;
    let last = progress.last().unwrap();
    assert_eq!(last["phase"], "done", "{events}");
    let digest = last["digest"].as_str().unwrap().to_owned();
    assert!(digest.starts_with("sha256:"));
    assert!(last["layerBytes"].as_u64().unwrap() > 0);
    assert!(progress.len() >= 2, "progress before the end: {events}");
    let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
    let saved = images["images"][0].clone();
    assert_eq!(saved["digest"], digest.as_str());
    // One count everywhere: the record's and the progress's last are the summary's files.
    let files = &saved["summary"]["files"];
    let summarized = files["added"].as_u64().unwrap() + files["changed"].as_u64().unwrap();
    assert!(summarized > 0, "{saved}");
    assert_eq!(saved["filesChanged"].as_u64(), Some(summarized), "{saved}");
    assert_eq!(last["filesChanged"].as_u64(), Some(summarized), "{events}");
    let saved_image = saved["image"].as_str().unwrap().to_owned();
    assert!(
        saved_image.ends_with(&format!("/{alice}/lab:with-probe")),
        "{saved}"
    );
    saved_images_stay_in_their_namespace(&a, &b, &admin, &saved_image, (&alice, &bob)).await;

    // Restart labforge up while the notebook runs: its container is adopted, not replaced, and
    // its route works again.
    let before = container_id(&labforge_embedded::runtime::container_name(&alice, "lab"));
    up = need(up.restart().await);
    assert!(
        up.admin_password.is_none(),
        "the admin password is printed on the first start only"
    );
    let a = Session::sign_in(&up, &alice, &alice_password).await;
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(60))
        .await;
    assert_eq!(
        container_id(&labforge_embedded::runtime::container_name(&alice, "lab")),
        before,
        "adopted, not restarted"
    );
    let after_restart = need(
        a.jupyter(&alice, "lab")
            .await
            .run_code("print(6 * 7)")
            .await,
    );
    assert_eq!(after_restart, "42\n");

    // Stop, then start on the saved image: the package is in the image, the notes in the workspace.
    assert_eq!(
        a.patch(&format!("{notebooks}/lab"), json!({"stopped": true}))
            .await
            .0,
        200
    );
    a.wait_state(&alice, "lab", "stopped", Duration::from_secs(30))
        .await;
    eventually("container removed", Duration::from_secs(30), || async {
        container_id(&labforge_embedded::runtime::container_name(&alice, "lab"))
            .is_empty()
            .then_some(())
    })
    .await;
    let (code, moved) = a
        .patch(
            &format!("{notebooks}/lab"),
            json!({"stopped": false, "image": saved_image}),
        )
        .await;
    assert_eq!(code, 200, "{moved}");
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    let checked = need(a.jupyter(&alice, "lab").await.run_code(CHECK).await);
    assert!(
        checked.contains("answer 42 from /opt/conda/"),
        "installed into the image, not the workspace: {checked}"
    );
    assert!(checked.contains("notes kept in the workspace"), "{checked}");
    let (_, events) = a.get(&format!("{notebooks}/lab/events")).await;
    let reasons: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    for reason in ["Created", "Started", "Ready", "Saved", "Stopped"] {
        assert!(
            reasons.contains(&reason),
            "{reason} missing from {reasons:?}"
        );
    }
    let said_on = |events: &Value, words: &str| {
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["message"].as_str().unwrap_or_default().contains(words))
    };
    assert!(
        said_on(&events, &format!("started on {saved_image} by {alice}")),
        "the start says which image: {events}"
    );

    let base_image = saved["base"].as_str().unwrap().to_owned();
    // Moved onto an image while running, it restarts: the event says on which, and a log
    // followed meanwhile ends without the engine's complaint that the old container is gone.
    let following = a
        .http
        .get(format!("{}{notebooks}/lab/logs?follow=true&tail=5", a.base))
        .header("cookie", &a.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(following.status(), 200);
    let (code, moved) = a
        .patch(&format!("{notebooks}/lab"), json!({"image": base_image}))
        .await;
    assert_eq!(code, 200, "{moved}");
    let followed = tokio::time::timeout(Duration::from_secs(60), following.text())
        .await
        .expect("the followed log ends with its container")
        .unwrap();
    assert!(
        !followed.contains("no container with name"),
        "the engine's words in the notebook's log: {followed}"
    );
    let (_, events) = a.get(&format!("{notebooks}/lab/events")).await;
    assert!(
        said_on(&events, &format!("restarting on {base_image} by {alice}")),
        "{events}"
    );
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    assert!(up.stop(), "a clean exit on SIGTERM");
}

/// What alice saved is hers: bob can neither run it (by any name of the registry) nor tell
/// which of her tags exist, until she shares it with his namespace; the admin may run it
/// anywhere. Bob's stopped notebook `scratch` is moved onto images, which starts nothing.
async fn saved_images_stay_in_their_namespace(
    a: &Session,
    b: &Session,
    admin: &Session,
    saved_image: &str,
    (alice, bob): (&str, &str),
) {
    let scratch = format!("/api/namespaces/{bob}/notebooks/scratch");
    let sharing = format!("/api/namespaces/{alice}/images/sharing");
    let missing = saved_image.replace(":with-probe", ":no-such-tag");
    let aliased = saved_image.replacen("127.0.0.1", "localhost", 1);
    let mut refusals = Vec::new();
    for image in [saved_image, missing.as_str(), aliased.as_str()] {
        let (code, created) = b
            .post(
                &format!("/api/namespaces/{bob}/notebooks"),
                json!({"name": "borrowed", "image": image}),
            )
            .await;
        assert_eq!(code, 422, "{image}: {created}");
        assert_eq!(created["field"], "image", "{created}");
        let (code, moved) = b.patch(&scratch, json!({"image": image})).await;
        assert_eq!(code, 422, "{image}: {moved}");
        for answer in [&created, &moved] {
            refusals.push(answer["error"].as_str().unwrap().replace(image, "<image>"));
        }
    }
    refusals.dedup();
    assert_eq!(
        refusals.len(),
        1,
        "one answer, whether or not the tag exists: {refusals:?}"
    );
    assert!(refusals[0].contains(&format!("namespace {alice}'s saved images")));
    // Any name pinned to the digest of alice's save: podman would run it from her local image.
    let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
    let digest = images["images"][0]["digest"].as_str().unwrap().to_owned();
    let pinned = format!("docker.io/library/anything@{digest}");
    let (code, refused) = b.patch(&scratch, json!({ "image": pinned })).await;
    assert_eq!(
        (code, refused["field"].as_str()),
        (422, Some("image")),
        "{refused}"
    );
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains(&format!("namespace {alice}'s"))
    );
    // A short name or an image ID prefix, which podman would look up among its local images
    // (alice's saves among them), is kept fully qualified: a registry's name, not a local one.
    let short = format!("{alice}/lab:with-probe");
    for (named, kept) in [
        (short.as_str(), format!("docker.io/{short}")),
        ("3f2a", "docker.io/library/3f2a:latest".to_owned()),
    ] {
        let (code, moved) = b.patch(&scratch, json!({ "image": named })).await;
        assert_eq!(
            (code, moved["image"].as_str()),
            (200, Some(kept.as_str())),
            "{moved}"
        );
    }

    // Only alice shares her images, with namespaces named right, images she has.
    let (code, refused) = b
        .put(&sharing, json!({"image": saved_image, "sharedWith": [bob]}))
        .await;
    assert_eq!(code, 403, "{refused}");
    let (code, refused) = a
        .put(
            &sharing,
            json!({"image": saved_image, "sharedWith": [bob, "Not A Name"]}),
        )
        .await;
    assert_eq!(code, 422, "{refused}");
    assert_eq!(refused["field"], "sharedWith[1]", "{refused}");
    let (code, refused) = a
        .put(
            &sharing,
            json!({"image": saved_image, "sharedWith": [alice]}),
        )
        .await;
    assert_eq!(
        (code, refused["field"].as_str()),
        (422, Some("sharedWith[0]"))
    );
    let (code, refused) = a
        .put(&sharing, json!({"image": missing, "sharedWith": [bob]}))
        .await;
    assert_eq!(
        (code, refused["field"].as_str()),
        (404, Some("image")),
        "{refused}"
    );
    let (_, config) = b.get("/api/config").await;
    assert_eq!(config["sharedImages"], json!([]), "nothing shared yet");

    // Shared: bob sees it offered and may run it; the admin may anyway.
    let (code, shared) = a
        .put(
            &sharing,
            json!({"image": saved_image, "sharedWith": [bob, bob]}),
        )
        .await;
    assert_eq!(code, 200, "{shared}");
    assert_eq!(shared["sharedWith"], json!([bob]), "{shared}");
    let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
    assert_eq!(images["images"][0]["sharedWith"], json!([bob]), "{images}");
    let (_, config) = b.get("/api/config").await;
    assert_eq!(config["sharedImages"][0]["image"], saved_image, "{config}");
    let (code, moved) = b.patch(&scratch, json!({"image": saved_image})).await;
    assert_eq!(code, 200, "{moved}");
    assert_eq!(moved["image"], saved_image, "{moved}");

    // Unshared: refused again; an admin moves bob's notebook onto it all the same.
    let (code, _) = a
        .put(&sharing, json!({"image": saved_image, "sharedWith": []}))
        .await;
    assert_eq!(code, 200);
    let (code, refused) = b.patch(&scratch, json!({"image": aliased})).await;
    assert_eq!(code, 422, "{refused}");
    let (code, moved) = admin.patch(&scratch, json!({"image": aliased})).await;
    assert_eq!(code, 200, "{moved}");
}

/// Amounts podman would read as "no limit" are refused, and the smallest
/// accepted ones reach the container as real limits (its HostConfig, as podman reports it).
#[tokio::test]
async fn limits_podman_would_not_enforce_are_refused_and_the_minimum_is_enforced() {
    crate::init_crypto();
    let alice = format!("alice-limits-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let password = need(up.add_user(&alice));
    let a = Session::sign_in(&up, &alice, &password).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");

    for (body, field) in [
        (json!({"name": "tiny", "cpu": "0.0004"}), "cpu"),
        (json!({"name": "tiny", "cpuLimit": "1m"}), "cpuLimit"),
        (json!({"name": "tiny", "memory": "0.4"}), "memory"),
        (json!({"name": "tiny", "memoryLimit": "5Mi"}), "memoryLimit"),
    ] {
        let (status, answer) = a.post(&notebooks, body.clone()).await;
        // 422, as every field error of this API (the issue asks for a 4xx).
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["field"], field, "{body}: {answer}");
    }
    let (_, listed) = a.get(&notebooks).await;
    assert_eq!(
        listed["notebooks"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );

    // The smallest CPU limit, and memory enough for JupyterLab to start.
    let (status, answer) = a
        .post(
            &notebooks,
            json!({"name": "small", "cpu": "10m", "memory": "512Mi"}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let label = format!("label=dev.labforge.notebook={alice}/small");
    let host_config = eventually("the notebook's container", Duration::from_secs(120), || {
        let label = label.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let out = Command::new("podman")
                .args(["ps", "-a", "--filter", &label, "--format", "{{.ID}}"])
                .output()
                .ok()?;
            let id = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()?
                .to_owned();
            let out = Command::new("podman")
                .args(["inspect", "--format", "{{json .HostConfig}}", &id])
                .output()
                .ok()?;
            serde_json::from_slice::<Value>(&out.stdout).ok()
        }
    })
    .await;
    assert_eq!(host_config["NanoCpus"], 10_000_000, "{host_config}");
    assert_eq!(host_config["Memory"], 512 << 20, "{host_config}");
}

/// The notebook host's sign-in refuses what it must: a used code, a code on another notebook's
/// host or from another browser, a page of another origin, and a grant whose session ended.
async fn notebook_sign_in_holds(
    up: &LabforgeUp,
    a: &Session,
    ns: &str,
    password: &str,
    visit: &NotebookVisit,
) {
    let port = a.port();
    let present = |host: String, code_path: String, state: String| {
        let http = a.http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{port}{code_path}"))
                .header("host", host)
                .header("cookie", state)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let lab_host = a.notebook_host(ns, "lab");
    assert_eq!(
        present(
            lab_host.clone(),
            visit.code_path.clone(),
            visit.state.clone()
        )
        .await,
        403,
        "a used code"
    );
    let path = format!("/notebook/{ns}/lab/");
    let (state, code) = a.code_for(ns, "lab", &path).await.unwrap();
    assert_eq!(
        present(a.notebook_host(ns, "other"), code.clone(), state.clone()).await,
        403,
        "a code on another notebook's host"
    );
    assert_eq!(
        present(lab_host.clone(), code, state).await,
        403,
        "used up by the refused try"
    );
    let (_, code) = a.code_for(ns, "lab", &path).await.unwrap();
    let (other_browser, _) = a.code_for(ns, "lab", &path).await.unwrap();
    assert_eq!(
        present(lab_host.clone(), code, other_browser).await,
        403,
        "a code presented by a browser it was not issued to"
    );

    // A page of another origin (another notebook's) gets nothing, cookie or not.
    let from = |origin: Option<String>| {
        let mut request = a
            .http
            .get(format!("{}/api/contents", visit.base))
            .headers(visit.headers());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    assert_eq!(from(None).await.unwrap().status(), 200);
    assert_eq!(
        from(Some(format!("http://{lab_host}")))
            .await
            .unwrap()
            .status(),
        200,
        "its own pages"
    );
    for origin in [
        format!("http://other--{ns}.localhost:{port}"),
        format!("http://localhost:{port}"),
        "null".to_owned(),
    ] {
        assert_eq!(
            from(Some(origin.clone())).await.unwrap().status(),
            403,
            "{origin}"
        );
    }

    // A second session's grant ends when that session signs out; the first's lives on.
    let second = Session::sign_in(up, ns, password).await;
    let second_visit = second.open_notebook(ns, "lab").await.unwrap();
    let status_with = |visit: &NotebookVisit| {
        a.http
            .get(format!("{}/api/contents", visit.base))
            .headers(visit.headers())
            .send()
    };
    assert_eq!(status_with(&second_visit).await.unwrap().status(), 200);
    assert_eq!(second.post("/api/logout", json!({})).await.0, 204);
    assert_eq!(
        status_with(&second_visit).await.unwrap().status(),
        302,
        "sent to sign in again"
    );
    assert_eq!(status_with(visit).await.unwrap().status(), 200);
}

/// A message a person reads: one line, short, no Debug dump.
#[track_caller]
fn assert_one_readable_line(message: &str) {
    assert!(
        message.chars().count() <= 300 && !message.contains('\n') && !message.contains("{ "),
        "not one readable line: {message}"
    );
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_and_a_missing_engine_are_told_in_one_line() {
    crate::init_crypto();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_labforge"));
    let agent = need(labforge_tests::agent::agent_binary());

    // Without its engine, `labforge up` stops at once and says what to do.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(binary)
        .args([
            "up",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
        ])
        .args(["--engine", "/nonexistent/podman", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("labforge: error:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        error.contains("/nonexistent/podman is not installed") && error.contains("--engine"),
        "{error}"
    );
    assert_one_readable_line(error);

    let alice = format!("alice-pull-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let up = need(LabforgeUp::start(binary, &dir.path().join("data"), &agent).await);
    let password = need(up.add_user(&alice));
    let a = Session::sign_in(&up, &alice, &password).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");

    // An image its registry does not have: refused before anything is made, under its field.
    let missing = format!("{}/{alice}/no-such-image:1", up.registry);
    let (status, answer) = a
        .post(&notebooks, json!({"name": "ghost", "image": missing}))
        .await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (422, Some("image")),
        "{answer}"
    );
    let refusal = answer["error"].as_str().unwrap_or_default();
    assert!(refusal.contains("has no such image"), "{answer}");
    assert_one_readable_line(refusal);
    assert_eq!(a.get(&notebooks).await.1["notebooks"], json!([]));

    // An image on a registry nobody answers for is left to the pull, which fails: the notebook
    // says which image, and what to check.
    let image = format!(
        "127.0.0.1:{}/e2e/unreachable:1",
        need(labforge_tests::tools::free_port())
    );
    let (status, answer) = a
        .post(&notebooks, json!({"name": "ghost", "image": image}))
        .await;
    assert_eq!(status, 201, "{answer}");
    let body = a
        .wait_state(&alice, "ghost", "error", Duration::from_secs(60))
        .await;
    let reason = body["notebook"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "cannot pull image {image}; check its name and tag"
        )) && reason.contains("caused by: "),
        "{body}"
    );
    assert_one_readable_line(reason);
    let (_, events) = a
        .get(&format!("/api/namespaces/{alice}/notebooks/ghost/events"))
        .await;
    let warning = events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["reason"] == "ErrImagePull")
        .unwrap_or_else(|| panic!("{events}"));
    assert_one_readable_line(warning["message"].as_str().unwrap_or_default());

    // The UI shows the same line: in the list's badge and on the notebook's page.
    let shown: Value = serde_json::from_str(&need(labforge_tests::browser::run_script(
        "failure.mjs",
        &[
            &up.url,
            &alice,
            &password,
            &alice,
            "ghost",
            "cannot pull image",
        ],
    )))
    .unwrap();
    assert_eq!(shown["listTitle"], reason, "{shown}");
    assert_eq!(shown["pageReason"], reason, "{shown}");

    // And so does its log, at every level a person reads.
    let log = up.log();
    let read: Vec<&str> = log
        .lines()
        .filter(|line| {
            [" INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|level| line.contains(level))
        })
        .collect();
    assert!(!read.is_empty(), "no log lines to read: {log}");
    for line in read {
        let message = line.split_once(": ").map_or(line, |(_, message)| message);
        assert_one_readable_line(message);
    }
}

/// Runs `labforge up` with `args` until it exits; the error line it printed.
fn failed_up(binary: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(binary).arg("up").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "labforge up {args:?} started: {stderr}"
    );
    let error = stderr
        .lines()
        .find(|l| l.starts_with("labforge: error:"))
        .unwrap_or_else(|| panic!("{stderr}"))
        .to_owned();
    assert_one_readable_line(&error);
    error
}

#[tokio::test]
async fn one_instance_per_data_dir_and_an_address_held_by_another_program_is_an_error() {
    crate::init_crypto();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_labforge"));
    let agent = need(labforge_tests::agent::agent_binary());
    let registry = need(labforge_tests::tools::locate("docker-registry"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = need(LabforgeUp::start(binary, &data, &agent).await);
    let users_before = std::fs::read(data.join("users.json")).unwrap();

    // A second start on the same data dir, on ports of its own: refused before it touches
    // anything, naming the running one.
    let port = || labforge_tests::tools::free_port().unwrap();
    let error = failed_up(
        binary,
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{}", port()),
            "--registry-listen",
            &format!("127.0.0.1:{}", port()),
            "--registry-program",
            registry.to_str().unwrap(),
        ],
    );
    let canonical = data.canonicalize().unwrap();
    let expected = format!(
        "labforge is already running with {} (pid {}, {}/)",
        canonical.display(),
        first.pid(),
        first.url
    );
    assert!(error.contains(&expected), "{error}\nexpected: {expected}");
    assert_eq!(
        std::fs::read(data.join("users.json")).unwrap(),
        users_before
    );
    let health = reqwest::get(format!("{}/login", first.url)).await.unwrap();
    assert_eq!(health.status(), 200, "the first instance serves on");

    // An address another program listens on: an error naming it, not a port shared with it,
    // and no admin made whose password nobody saw.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = held.local_addr().unwrap().to_string();
    let fresh = dir.path().join("fresh");
    let error = failed_up(
        binary,
        &[
            "--data-dir",
            fresh.to_str().unwrap(),
            "--listen",
            &address,
            "--registry-listen",
            &format!("127.0.0.1:{}", port()),
            "--registry-program",
            registry.to_str().unwrap(),
            "--agent",
            agent.to_str().unwrap(),
        ],
    );
    assert!(
        error.contains(&format!("{address} is in use by another program")),
        "{error}"
    );
    assert!(!fresh.join("users.json").exists(), "an admin was made");

    // Once the first instance stops, the data dir is free again.
    let mut first = first;
    assert!(first.stop());
    let again = need(LabforgeUp::start(binary, &data, &agent).await);
    assert!(
        again.admin_password.is_none(),
        "the same data dir, the same users"
    );
}

/// "Ready" means the server the user chose answers: a VSCode notebook on a JupyterLab image
/// stays starting and says what answered instead.
#[tokio::test]
async fn a_notebook_whose_image_serves_another_ide_is_not_ready_and_says_why() {
    crate::init_crypto();
    let user = format!("wrong-ide-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let password = need(up.add_user(&user));
    let session = Session::sign_in(&up, &user, &password).await;
    let image = format!("{}/labforge/jupyterlab:latest", up.registry);
    let (status, body) = session
        .post(
            &format!("/api/namespaces/{user}/notebooks"),
            json!({"name": "wrong", "serverType": "vscode", "image": image, "workspace": "none"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let reason = eventually(
        "the wrong server's answer",
        Duration::from_secs(120),
        || {
            let session = &session;
            let user = &user;
            async move {
                let (_, body) = session
                    .get(&format!("/api/namespaces/{user}/notebooks/wrong"))
                    .await;
                let notebook = &body["notebook"];
                assert_ne!(notebook["state"], "ready", "{body}");
                notebook["reason"]
                    .as_str()
                    .filter(|r| r.contains("answered"))
                    .map(str::to_owned)
            }
        },
    )
    .await;
    assert!(
        reason.contains("/healthz answered HTTP 404") && reason.contains("code-server"),
        "{reason}"
    );
}

/// The catalog's images are pulled into podman in the background once their registry has them:
/// here code-server's, pushed after `labforge up` started (as `scripts/up` seeds it). Until then
/// the spawner form says it is being prepared, and a notebook made on it meanwhile waits for it,
/// saying so, instead of failing its pull; it starts once the image is there.
#[tokio::test]
async fn a_notebook_of_an_image_being_prepared_waits_for_it_and_starts_once_it_is_there() {
    crate::init_crypto();
    let user = format!("prepared-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let password = need(up.add_user(&user));
    let session = Session::sign_in(&up, &user, &password).await;
    let image = format!("{}/labforge/codeserver:latest", up.registry);
    // Until then the form and the spawner's configuration say it is being prepared.
    let (_, config) = session.get("/api/config").await;
    assert!(
        config["imagesBeingPrepared"]
            .as_array()
            .is_some_and(|images| images.contains(&json!(image))),
        "{config}"
    );
    let (_, form) = session.get("/new").await;
    let form = form.as_str().unwrap_or_default().to_owned();
    assert!(
        form.contains("VSCode <span class=\"hint\">(being prepared)</span>"),
        "{form}"
    );
    let (status, body) = session
        .post(
            &format!("/api/namespaces/{user}/notebooks"),
            json!({"name": "early", "serverType": "vscode", "image": image, "workspace": "none"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let waiting = eventually("the notebook waiting", Duration::from_secs(30), || {
        let session = &session;
        let user = &user;
        async move {
            let (_, body) = session
                .get(&format!("/api/namespaces/{user}/notebooks/early"))
                .await;
            let notebook = body["notebook"].clone();
            assert_ne!(notebook["state"], "error", "{notebook}");
            notebook["reason"]
                .as_str()
                .is_some_and(|r| r.contains("being prepared"))
                .then_some(notebook)
        }
    })
    .await;
    assert_eq!(waiting["state"], "starting", "{waiting}");
    // A few resyncs later it still waits, with one event saying why and no failed pull.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (_, events) = session
        .get(&format!("/api/namespaces/{user}/notebooks/early/events"))
        .await;
    let reasons: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == "ImageBeingPrepared")
            .count(),
        1,
        "{events}"
    );
    assert!(!reasons.contains(&"ErrImagePull"), "{events}");
    need(labforge_tests::push_layout(
        "codeserver",
        &up.registry,
        "labforge/codeserver:latest",
    ));
    eventually(
        "code-server's image in podman",
        Duration::from_secs(120),
        || {
            let image = image.clone();
            async move {
                Command::new("podman")
                    .args(["image", "exists", &image])
                    .status()
                    .unwrap()
                    .success()
                    .then_some(())
            }
        },
    )
    .await;
    // Said once the pull ends, a moment after podman holds the image.
    eventually("the pull logged", Duration::from_secs(30), || async {
        up.log()
            .contains("catalog image pulled ahead")
            .then_some(())
    })
    .await;
    eventually("every image prepared", Duration::from_secs(60), || async {
        let (_, config) = session.get("/api/config").await;
        (config["imagesBeingPrepared"] == json!([])).then_some(())
    })
    .await;
    let (_, form) = session.get("/new").await;
    assert!(!form.as_str().unwrap_or_default().contains("being prepared"));
    session
        .wait_state(&user, "early", "ready", Duration::from_secs(120))
        .await;
    let (status, body) = session
        .delete(&format!("/api/namespaces/{user}/notebooks/early"))
        .await;
    assert!(status < 300, "{body}");
    // The image goes once its notebook's container has gone.
    eventually("the image removed", Duration::from_secs(60), || {
        let image = image.clone();
        async move {
            Command::new("podman")
                .args(["rmi", &image])
                .output()
                .unwrap()
                .status
                .success()
                .then_some(())
        }
    })
    .await;
}

/// With one start at a time (`--concurrent-starts 1`), notebooks made while another starts wait
/// in line in the order they were made: the API, the list and the notebook's page say each one's
/// place, and each starts only once the one before it is ready or stopped. The first holds its
/// place by starting slowly (a hundredth of a CPU) until it is stopped.
#[tokio::test]
async fn starts_beyond_the_limit_wait_in_line_in_order_and_say_their_place() {
    crate::init_crypto();
    let user = format!("line-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &["--concurrent-starts", "1"]).await;
    let password = need(up.add_user(&user));
    let session = Session::sign_in(&up, &user, &password).await;
    // Pulled ahead first, so that no start waits for a pull of its own (pulls are not in line).
    eventually(
        "the image pulled ahead",
        Duration::from_secs(120),
        || async {
            up.log()
                .contains("catalog image pulled ahead")
                .then_some(())
        },
    )
    .await;
    let path = |name: &str| format!("/api/namespaces/{user}/notebooks/{name}");
    let events = |name: &str| {
        let (session, path) = (&session, path(name));
        async move {
            let (status, body) = session.get(&format!("{path}/events")).await;
            assert_eq!(status, 200, "{body}");
            body["events"].as_array().cloned().unwrap_or_default()
        }
    };
    let event_time = |events: &[Value], reason: &str| -> Option<String> {
        events
            .iter()
            .find(|e| e["reason"] == reason)
            .and_then(|e| e["time"].as_str())
            .map(str::to_owned)
    };
    let create = |name: &'static str, body: Value| {
        let session = &session;
        let user = &user;
        async move {
            let (status, answer) = session
                .post(&format!("/api/namespaces/{user}/notebooks"), body)
                .await;
            assert_eq!(status, 201, "{name}: {answer}");
        }
    };
    let reason_of = |name: &'static str| {
        let (session, path) = (&session, path(name));
        async move {
            let (_, body) = session.get(&path).await;
            let notebook = &body["notebook"];
            (
                notebook["state"].as_str().unwrap_or_default().to_owned(),
                notebook["reason"].as_str().unwrap_or_default().to_owned(),
            )
        }
    };

    create(
        "slow",
        json!({"name": "slow", "workspace": "none", "cpu": "10m"}),
    )
    .await;
    eventually("the slow one started", Duration::from_secs(60), || async {
        event_time(&events("slow").await, "Started")
    })
    .await;
    for (name, place) in [("second", "1st in line"), ("third", "2nd in line")] {
        create(name, json!({"name": name, "workspace": "none"})).await;
        let seen = eventually(
            &format!("{name} in line"),
            Duration::from_secs(30),
            || async {
                let (state, reason) = reason_of(name).await;
                reason.contains("in line").then_some((state, reason))
            },
        )
        .await;
        assert_eq!(seen, ("starting".to_owned(), place.to_owned()));
        let queued = events(name).await;
        assert!(
            queued.iter().any(|e| e["reason"] == "Queued"
                && e["message"] == format!("{place} to start (notebooks start 1 at a time here)")),
            "{queued:?}"
        );
    }
    // The list says so too, for every notebook in it.
    let (_, list) = session
        .get(&format!("/api/namespaces/{user}/notebooks"))
        .await;
    let listed: Vec<(String, String)> = list["notebooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|nb| {
            (
                nb["name"].as_str().unwrap().to_owned(),
                nb["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .filter(|(_, reason)| reason.contains("in line"))
        .collect();
    assert_eq!(
        listed,
        [
            ("second".to_owned(), "1st in line".to_owned()),
            ("third".to_owned(), "2nd in line".to_owned())
        ]
    );
    assert!(event_time(&events("second").await, "Started").is_none());

    // As the owner sees it in a browser.
    let config = dir.path().join("line.json");
    std::fs::write(
        &config,
        json!({
            "url": up.url,
            "user": [user, password],
            "waiting": {"second": "1st in line", "third": "2nd in line"},
            "screenshots": need(labforge_tests::artifacts_dir()),
        })
        .to_string(),
    )
    .unwrap();
    let output = labforge_tests::browser::run_script("line.mjs", &[&config.to_string_lossy()])
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    assert_eq!(seen["list"]["third"], "starting 2nd in line", "{seen}");
    assert_eq!(seen["page"]["third"], "2nd in line", "{seen}");

    // Stopping the slow one gives its place to the next in line; each then starts once the one
    // before it is ready.
    let (status, body) = session.patch(&path("slow"), json!({"stopped": true})).await;
    assert_eq!(status, 200, "{body}");
    for name in ["second", "third"] {
        session
            .wait_state(&user, name, "ready", Duration::from_secs(120))
            .await;
    }
    let stopped = event_time(&events("slow").await, "Stopped").expect("slow stopped");
    let (second, third) = (events("second").await, events("third").await);
    let second_started = event_time(&second, "Started").expect("second started");
    let second_ready = event_time(&second, "Ready").expect("second ready");
    let third_started = event_time(&third, "Started").expect("third started");
    let at = |time: &str| time.parse::<jiff::Timestamp>().unwrap();
    assert!(at(&second_started) >= at(&stopped), "{second:?}");
    assert!(at(&third_started) >= at(&second_ready), "{third:?}");
}
