//! Quotas per namespace in `labforge up`: set from the machine (`labforge namespace quota`) or by
//! an admin (API), applied at every create and start, each refusal naming the quota, what is in
//! use and what was asked.

use crate::embedded::{Session, up_with_jupyterlab};
use crate::need;
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::json;

#[tokio::test]
async fn a_namespace_quota_refuses_creates_and_starts_beyond_it_and_says_why() {
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
    // Removed, nothing holds creates back.
    let cleared = quota_cli(&["--clear"]);
    assert_eq!(
        String::from_utf8_lossy(&cleared.stdout).trim(),
        format!("{alice}: no quota")
    );
    let (status, body) = create("three", "250m").await;
    assert_eq!(status, 201, "{body}");
}
