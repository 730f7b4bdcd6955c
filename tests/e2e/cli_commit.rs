//! `labforge build commit` pushing to a real registry, read back with skopeo and umoci.

use crate::support::save::{inspect, save, unpack};
use crate::{labforge, need};
use labforge_tests::Registry;
use std::fs;
use std::time::Duration;

fn sample_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("opt/env/lib")).unwrap();
    fs::write(dir.path().join("opt/env/lib/module.py"), "ANSWER = 42\n").unwrap();
    fs::write(dir.path().join("README"), "saved by labforge\n").unwrap();
    std::os::unix::fs::symlink("opt/env", dir.path().join("env")).unwrap();
    dir
}

fn commit(
    root: &std::path::Path,
    target: &str,
    registry: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec!["--target", target, "--root", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    save(&args, registry)
}

/// The digest printed on the `pushed REF@sha256:... (...)` line (the change summary follows it).
fn printed_digest(stdout: &str) -> String {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("pushed "))
        .unwrap_or_default();
    let after = line
        .split_once('@')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    after
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn committed_tree_is_pushed_and_skopeo_reads_it_back() {
    let registry = need(Registry::start().await);
    let root = sample_root();
    let target = format!("{}/e2e/committed:v1", registry.host());

    let out = commit(
        root.path(),
        &target,
        &registry.host(),
        &["--user", "1000:100"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "commit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = printed_digest(&stdout);
    assert!(
        digest.starts_with("sha256:"),
        "no digest on the pushed line: {stdout}"
    );

    let inspected = inspect(&target, &[]);
    assert_eq!(
        inspected["Digest"],
        digest.as_str(),
        "printed digest is the registry's"
    );
    let layers = inspected["Layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert!(
        stdout.contains(layers[0].as_str().unwrap()),
        "layer digest printed: {stdout}"
    );
    let manifest = inspect(&target, &["--raw"]);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+zstd"
    );

    let config = inspect(&target, &["--config"]);
    assert_eq!(config["config"]["User"], "1000:100");
    assert_eq!(config["rootfs"]["diff_ids"].as_array().unwrap().len(), 1);
    assert!(
        config["history"][0]["created_by"]
            .as_str()
            .unwrap()
            .contains("labforge build commit")
    );
}

#[tokio::test]
async fn gzip_commit_unpacks_with_umoci_to_the_same_tree() {
    let registry = need(Registry::start().await);
    let root = sample_root();
    let target = format!("{}/e2e/gzip:v1", registry.host());
    let out = commit(
        root.path(),
        &target,
        &registry.host(),
        &["--compression", "gzip"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (_work, rootfs) = unpack(&target);
    assert_eq!(
        fs::read_to_string(rootfs.join("opt/env/lib/module.py")).unwrap(),
        "ANSWER = 42\n"
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("README")).unwrap(),
        "saved by labforge\n"
    );
    assert_eq!(
        fs::read_link(rootfs.join("env")).unwrap(),
        std::path::Path::new("opt/env")
    );
}

#[tokio::test]
async fn registry_down_fails_cleanly_naming_the_registry() {
    let mut registry = need(Registry::start().await);
    let host = registry.host();
    registry.stop();
    let root = sample_root();
    let out = commit(root.path(), &format!("{host}/e2e/down:v1"), &host, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("registry {host} is unreachable (signing in)")),
        "registry not named as unreachable: {stderr}"
    );
    assert!(stderr.contains("Connection refused"), "{stderr}");
}

#[tokio::test]
async fn a_registry_that_never_accepts_fails_the_save_instead_of_hanging() {
    // A listener whose backlog of one is taken: the kernel drops every further SYN, as a firewall
    // or the address of a dead load balancer does.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let _taken = std::net::TcpStream::connect(&host).unwrap();
    let root = sample_root();
    let mut command = tokio::process::Command::from(labforge());
    command
        .args(["build", "commit", "--quiet", "--insecure-registry", &host])
        .args(["--target", &format!("{host}/e2e/stalled:v1"), "--root"])
        .arg(root.path())
        .kill_on_drop(true);
    // Four connects of at most 10 s (the streamed upload's sign-in, then three attempts) and the
    // backoff between them: 42 s here. Without the timeout, each waits some two minutes.
    let out = tokio::time::timeout(Duration::from_secs(90), command.output())
        .await
        .expect("the save still waits for the registry after 90 s")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("registry {host} is unreachable (signing in)")),
        "{stderr}"
    );
    drop(listener);
}

#[test]
fn bad_options_exit_64_before_any_work() {
    let root = sample_root();
    let out = labforge()
        .args([
            "build",
            "commit",
            "--target",
            "127.0.0.1:1/x:y",
            "--level",
            "99",
            "--root",
        ])
        .arg(root.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--level 99"));
}

#[test]
fn missing_root_is_named() {
    let out = labforge()
        .args([
            "build",
            "commit",
            "--target",
            "127.0.0.1:1/x:y",
            "--root",
            "/nonexistent/labforge-root",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("/nonexistent/labforge-root is not a directory")
    );
}
