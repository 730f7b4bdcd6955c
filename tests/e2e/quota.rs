//! Quotas per namespace in `labforge up`: set from the machine (`labforge namespace quota`) or by
//! an admin (API), applied at every create, start and resize, and to the storage new volumes
//! ask for, each refusal naming the quota, what is in use and what was asked.

use crate::need;
use crate::support::embedded::{Session, container_id, up_with_jupyterlab};
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn a_namespace_quota_refuses_creates_starts_resizes_and_storage_beyond_it_and_says_why() {
    crate::init_crypto();
    let alice = format!("quota-alice-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up_with_jupyterlab(&data, &[]).await;
    let admin_password = up
        .admin_password
        .clone()
        .expect("the first start made an admin");
    let alice_password = need(up.add_user(&alice));
    let admin = Session::sign_in(&up, "admin", &admin_password).await;
    let session = Session::sign_in(&up, &alice, &alice_password).await;
    let quota_cli = |args: &[&str]| {
        crate::labforge()
            .args([
                "namespace",
                "quota",
                &alice,
                "--data-dir",
                &data.to_string_lossy(),
            ])
            .args(args)
            .output()
            .unwrap()
    };

    // One running notebook, from the machine, while labforge runs.
    let set = quota_cli(&["--notebooks", "1", "--cpu", "1"]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&set.stdout).trim(),
        format!("{alice}: cpu 1, 1 running notebooks")
    );
    let bad = quota_cli(&["--memory", "plenty"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--memory"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    let create = |name: &str, cpu: &str| {
        let session = &session;
        let path = format!("/api/namespaces/{alice}/notebooks");
        let body = json!({"name": name, "workspace": "none", "cpu": cpu});
        async move { session.post(&path, body).await }
    };
    let (status, body) = create("one", "0.5").await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = create("two", "0.5").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "namespace {alice}'s quota for running notebooks is 1: 1 in use, 1 asked; stop a notebook or ask an admin for more"
        )
    );
    let (status, _) = session
        .get(&format!("/api/namespaces/{alice}/notebooks/two"))
        .await;
    assert_eq!(status, 404, "nothing half-made");

    // A stopped notebook holds nothing; starting it again is checked like a create.
    let (status, body) = session
        .patch(
            &format!("/api/namespaces/{alice}/notebooks/one"),
            json!({"stopped": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = create("two", "0.5").await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = session
        .patch(
            &format!("/api/namespaces/{alice}/notebooks/one"),
            json!({"stopped": false}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("running notebooks is 1"),
        "{body}"
    );

    // An admin raises the notebooks and keeps the CPU: now the CPU is what runs out.
    let (status, body) = admin
        .put(
            &format!("/api/namespaces/{alice}/quota"),
            json!({"cpu": "1", "notebooks": 3}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = session
        .patch(
            &format!("/api/namespaces/{alice}/notebooks/one"),
            json!({"stopped": false}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = create("three", "250m").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "namespace {alice}'s quota for cpu is 1: 1 in use, 0.25 asked; stop a notebook or ask an admin for more"
        )
    );
    // Members see the quota and what is held; only admins set it; a bad quantity names its field.
    let (status, body) = session.get(&format!("/api/namespaces/{alice}/quota")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["quota"], json!({"cpu": "1", "notebooks": 3}));
    assert_eq!(body["inUse"]["notebooks"], 2);
    assert_eq!(body["inUse"]["cpu"], 1.0);
    let (status, _) = session
        .put(
            &format!("/api/namespaces/{alice}/quota"),
            json!({"notebooks": 9}),
        )
        .await;
    assert_eq!(status, 403);
    let (status, body) = admin
        .put(
            &format!("/api/namespaces/{alice}/quota"),
            json!({"cpu": "lots"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("cpu"), "{body}");

    // Resizing a running notebook is checked like a start, against what the others hold.
    let two = format!("/api/namespaces/{alice}/notebooks/two");
    let (status, body) = session.patch(&two, json!({"cpu": "0.75"})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "namespace {alice}'s quota for cpu is 1: 0.5 in use, 0.75 asked; stop a notebook or ask an admin for more"
        )
    );
    let (status, body) = session.patch(&two, json!({"cpu": "4000"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "cpu", "{body}");
    session
        .wait_state(&alice, "two", "ready", Duration::from_secs(120))
        .await;
    let before = container_id(&format!("labforge-{alice}_two"));
    let (status, body) = session
        .patch(&two, json!({"cpu": "250m", "memory": "256Mi"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["cpuLimit"], "250m", "{body}");
    // The container is replaced with the new limits; nothing else changed.
    let container = format!("labforge-{alice}_two");
    labforge_tests::eventually("the resized container", Duration::from_secs(60), || {
        let container = &container;
        let before = &before;
        async move {
            let inspect = std::process::Command::new("podman")
                .args([
                    "inspect",
                    "--format",
                    "{{.Id}} {{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}",
                    container,
                ])
                .output()
                .ok()?;
            let out = String::from_utf8_lossy(&inspect.stdout).trim().to_owned();
            let replaced = !out.starts_with(before.as_str());
            (replaced && out.ends_with(&format!(" 250000000 {}", 256 << 20))).then_some(())
        }
    })
    .await;
    let (_, events) = session.get(&format!("{two}/events")).await;
    assert!(
        events
            .to_string()
            .contains("resized to 250m CPU, 256Mi memory"),
        "{events}"
    );
    // A stopped notebook resizes freely: it holds nothing until it starts.
    let one = format!("/api/namespaces/{alice}/notebooks/one");
    let (status, body) = session.patch(&one, json!({"stopped": true})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = session.patch(&one, json!({"cpu": "1"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = session.patch(&one, json!({"stopped": false})).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("0.25 in use, 1 asked"),
        "{body}"
    );

    // Removed, nothing holds creates back.
    let cleared = quota_cli(&["--clear"]);
    assert_eq!(
        String::from_utf8_lossy(&cleared.stdout).trim(),
        format!("{alice}: no quota")
    );
    let (status, body) = create("three", "250m").await;
    assert_eq!(status, 201, "{body}");

    // Storage: every volume asked for counts, made yet or not, running or stopped.
    let set = quota_cli(&["--storage", "3Gi"]);
    assert_eq!(
        String::from_utf8_lossy(&set.stdout).trim(),
        format!("{alice}: storage 3Gi"),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let with_workspace = |name: &str, size: &str| {
        let session = &session;
        let path = format!("/api/namespaces/{alice}/notebooks");
        let body = json!({"name": name, "cpu": "0.1", "workspace": {"new": {"size": size}}});
        async move { session.post(&path, body).await }
    };
    let (status, body) = with_workspace("four", "2Gi").await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = with_workspace("five", "1536Mi").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "namespace {alice}'s quota for storage is 3Gi: 2.00Gi in use, 1.50Gi asked; delete a volume or ask an admin for more"
        )
    );
    // The volume, once made, keeps the size it was asked with: the volume list shows it, and
    // it still counts after its notebook is deleted.
    labforge_tests::eventually("the sized volume", Duration::from_secs(60), || {
        let session = &session;
        let path = format!("/api/namespaces/{alice}/pvcs");
        async move {
            let (_, body) = session.get(&path).await;
            body["pvcs"]
                .as_array()?
                .iter()
                .any(|pvc| pvc["name"] == "four-workspace" && pvc["size"] == "2Gi")
                .then_some(())
        }
    })
    .await;
    let (status, _) = session
        .delete(&format!("/api/namespaces/{alice}/notebooks/four"))
        .await;
    assert_eq!(status, 200);
    let (status, body) = session.get(&format!("/api/namespaces/{alice}/quota")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["inUse"]["storageBytes"],
        2.0 * f64::from(1u32 << 30),
        "{body}"
    );
    let (status, body) = with_workspace("five", "1536Mi").await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = with_workspace("five", "1Gi").await;
    assert_eq!(status, 201, "{body}");
}
