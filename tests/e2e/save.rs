//! Saving environments with `labforge build commit --base`: tricky trees unpack to exactly what was
//! saved (skopeo + umoci), a `pip install` inside a running podman notebook is saved through the
//! agent and imports from the saved image, incremental saves add one layer each, and the registry
//! and S3 faults leave no broken tag behind.

use crate::support::save::{
    inspect, notebook_with_agent, pip_install, save, save_command, skopeo, succeeded, unpack, wheel,
};
use crate::{labforge, need};
use labforge_tests::faulty::FaultyRelay;
use labforge_tests::noise;
use labforge_tests::tools::locate;
use labforge_tests::{Registry, S3Server};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Output;

fn write(root: &Path, rel: &str, body: impl AsRef<[u8]>) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, body).unwrap();
}

/// Debian's umoci reads gzip layers only, so images it unpacks are saved with gzip (the podman
/// test covers zstd).
const GZIP: [&str; 2] = ["--compression", "gzip"];

/// Everything an unpacked tree must preserve, per path.
fn describe(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_owned();
            let kind = meta.file_type();
            let detail = if kind.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else if kind.is_symlink() {
                format!("link -> {}", fs::read_link(&path).unwrap().display())
            } else if kind.is_file() {
                format!(
                    "file {} mtime {} links {}",
                    labforge_builder::Digest::of(&fs::read(&path).unwrap()),
                    meta.mtime(),
                    meta.nlink()
                )
            } else {
                format!("special {:o}", meta.mode() & 0o170000)
            };
            let xattrs: Vec<String> = xattr::list(&path)
                .map(|names| {
                    names
                        .filter_map(|n| n.to_str().map(str::to_owned))
                        .filter(|n| n.starts_with("user."))
                        .map(|n| {
                            let value = xattr::get(&path, &n).ok().flatten().unwrap_or_default();
                            format!("{n}={}", String::from_utf8_lossy(&value))
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.insert(
                rel,
                format!(
                    "{detail} mode {:o} owner {}:{} xattrs {xattrs:?}",
                    meta.mode() & 0o7777,
                    meta.uid(),
                    meta.gid()
                ),
            );
        }
    }
    out
}

#[track_caller]
fn assert_same_tree(saved: &Path, unpacked: &Path) {
    let want = describe(saved);
    let got = describe(unpacked);
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, unexpected {extra:?}"
    );
    for (path, description) in &want {
        assert_eq!(&got[path], description, "{}", path.display());
    }
}

const LONG: &str =
    "directory-name-long-enough-that-three-of-them-overflow-every-ustar-field-by-far";

fn base_tree(root: &Path) {
    write(root, "etc/motd", "hello");
    write(root, "opt/pkg/a.py", "a");
    write(root, "opt/pkg/b.py", "b");
    write(root, "opt/pkg/sub/c.py", "c");
    write(root, "var/cache/x/1", "1");
    write(root, "var/lib/swap", "f");
    write(root, "srv/old/tree/deep.txt", "deep");
    write(root, "usr/bin/tool", "#!/bin/sh\n");
    symlink("tool", root.join("usr/bin/alias")).unwrap();
    write(root, "usr/share/big.bin", noise(300_000, 7));
}

fn tricky_changes(root: &Path) {
    fs::remove_file(root.join("etc/motd")).unwrap();
    fs::remove_dir_all(root.join("srv/old")).unwrap();
    fs::remove_dir_all(root.join("opt/pkg")).unwrap();
    write(root, "opt/pkg/new.py", "new");
    fs::remove_dir_all(root.join("var/cache/x")).unwrap();
    write(root, "var/cache/x", "dir became a file");
    fs::remove_file(root.join("var/lib/swap")).unwrap();
    write(root, "var/lib/swap/inside", "file became a dir");
    fs::remove_file(root.join("usr/bin/alias")).unwrap();
    symlink("../../etc/elsewhere", root.join("usr/bin/alias")).unwrap();
    write(root, "usr/bin/twin-a", "twins");
    fs::hard_link(root.join("usr/bin/twin-a"), root.join("usr/bin/twin-b")).unwrap();
    fs::set_permissions(
        root.join("usr/bin/tool"),
        fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    fs::create_dir_all(root.join("usr/share/empty")).unwrap();
    write(root, &format!("{LONG}/{LONG}/{LONG}/file.txt"), "long");
    write(root, "données/naïve-文件.txt", "unicode");
    write(root, "usr/share/caps.bin", "x");
    xattr::set(root.join("usr/share/caps.bin"), "user.labforge", b"kept").unwrap();
    std::os::unix::fs::chown(root.join("opt/pkg/new.py"), Some(1000), Some(100)).unwrap();
}

#[tokio::test]
async fn tricky_changes_saved_on_a_base_unpack_to_exactly_the_saved_tree() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("root");
    base_tree(&root);
    let base = format!("{host}/e2e/tricky:base");
    let root_arg = root.to_str().unwrap();
    succeeded(&save(
        &["--root", root_arg, "--target", &base, GZIP[0], GZIP[1]],
        &host,
    ));

    tricky_changes(&root);
    let saved = format!("{host}/e2e/tricky:saved");
    let stdout = succeeded(&save(
        &[
            "--root", root_arg, "--base", &base, "--target", &saved, GZIP[0], GZIP[1],
        ],
        &host,
    ));
    assert!(
        stdout.starts_with(&format!("pushed {saved}@sha256:")),
        "{stdout}"
    );

    let manifest = inspect(&saved, &["--raw"]);
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "one new layer on the base");
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.base.name"],
        base.as_str()
    );
    assert!(
        layers[1]["size"].as_u64().unwrap() < 10_000,
        "only the changes, not the 300 kB base file: {}",
        layers[1]
    );
    let (_work, rootfs) = unpack(&saved);
    assert_same_tree(&root, &rootfs);

    // An incremental save on the saved image adds exactly one more, small layer.
    write(&root, "usr/share/added-later.txt", "later");
    fs::remove_file(root.join("usr/bin/twin-b")).unwrap();
    let again = format!("{host}/e2e/tricky:again");
    succeeded(&save(
        &[
            "--root", root_arg, "--base", &saved, "--target", &again, GZIP[0], GZIP[1],
        ],
        &host,
    ));
    let manifest = inspect(&again, &["--raw"]);
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    assert!(layers[2]["size"].as_u64().unwrap() < 2_000, "{}", layers[2]);
    let (_work, rootfs) = unpack(&again);
    assert_same_tree(&root, &rootfs);
}

#[tokio::test]
async fn pip_install_in_a_running_notebook_is_saved_through_the_agent() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let workspace = tempfile::tempdir().unwrap();
    let first_wheel = wheel(workspace.path(), "labforge_probe", "1.0", "first");
    let second_wheel = wheel(workspace.path(), "labforge_second", "2.0", "second");
    let notebook = notebook_with_agent(&registry, "env", workspace.path()).await;
    let container = notebook.container();
    pip_install(container, &first_wheel);
    // A file of the image removed in the notebook must stay removed in the saved image.
    need(container.exec(&["rm", "/opt/conda/bin/jupyter-trust"]));
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap();

    let first = format!("{host}/alice/env:saved-1");
    let stdout = succeeded(&save(
        &[
            "--container",
            container.name(),
            "--base",
            notebook.image(),
            "--target",
            &first,
            "--cache-dir",
            cache_arg,
        ],
        &host,
    ));
    assert!(stdout.contains("; cached"), "{stdout}");
    let base_layers = inspect(notebook.image(), &["--raw"])["layers"]
        .as_array()
        .unwrap()
        .len();
    let saved_layers = inspect(&first, &["--raw"])["layers"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(saved_layers.len(), base_layers + 1);

    let podman = need(labforge_tests::Podman::locate());
    let run_saved = |image: &str, code: &str| {
        let id = need(podman.pull(image, false));
        let out = podman
            .command()
            .args([
                "run",
                "--rm",
                "--entrypoint",
                "/opt/conda/bin/python",
                &id,
                "-c",
                code,
            ])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, printed, stderr) = run_saved(
        &first,
        "import os, labforge_probe; print(labforge_probe.VALUE, \
         os.path.exists('/opt/conda/bin/jupyter-trust'), os.path.exists('/.labforge/agent/labforge-agent'), \
         os.path.exists('/home/jovyan/labforge_probe-1.0-py3-none-any.whl'))",
    );
    assert!(ok, "{stderr}");
    // Installed package saved; deletion kept; neither the agent nor the workspace is in the image.
    assert_eq!(printed, "first False False False");

    // An engine that is not podman (docker, say) cannot pass the agent a pipe: the change set
    // then crosses the exec's stdout. The same changes make the same layer either way.
    let engine_dir = tempfile::tempdir().unwrap();
    let relay_engine = engine_dir.path().join("engine-without-fd-passing");
    symlink(need(locate("podman")), &relay_engine).unwrap();
    let relayed = format!("{host}/alice/env:saved-1-relayed");
    succeeded(&save(
        &[
            "--engine",
            relay_engine.to_str().unwrap(),
            "--container",
            container.name(),
            "--base",
            notebook.image(),
            "--target",
            &relayed,
        ],
        &host,
    ));
    assert_eq!(
        inspect(&relayed, &["--config"])["rootfs"],
        inspect(&first, &["--config"])["rootfs"],
        "the layer through the stdout relay differs from the layer through the pipe"
    );

    // Second save from the same notebook, on the first saved image: one more layer, new package only.
    pip_install(container, &second_wheel);
    let second = format!("{host}/alice/env:saved-2");
    succeeded(&save(
        &[
            "--container",
            container.name(),
            "--base",
            &first,
            "--target",
            &second,
            "--cache-dir",
            cache_arg,
        ],
        &host,
    ));
    let layers = inspect(&second, &["--raw"])["layers"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(layers.len(), base_layers + 2);
    assert_eq!(layers[..base_layers + 1], saved_layers[..]);
    let (ok, printed, stderr) = run_saved(
        &second,
        "import labforge_probe, labforge_second; print(labforge_probe.VALUE, labforge_second.VALUE)",
    );
    assert!(ok, "{stderr}");
    assert_eq!(printed, "first second");
    let newest = layers.last().unwrap()["size"].as_u64().unwrap();
    let previous = saved_layers.last().unwrap()["size"].as_u64().unwrap();
    assert!(
        newest < 64 * 1024,
        "second layer holds only the second install: {newest} bytes (first: {previous})"
    );

    // Saving the same changes again: the cache knows the change set, nothing is compressed.
    let third = format!("{host}/alice/env:saved-2-again");
    let stdout = succeeded(&save(
        &[
            "--container",
            container.name(),
            "--base",
            &first,
            "--target",
            &third,
            "--cache-dir",
            cache_arg,
        ],
        &host,
    ));
    assert!(stdout.contains("cache hit"), "{stdout}");
    assert_eq!(
        inspect(&third, &["--raw"])["layers"],
        inspect(&second, &["--raw"])["layers"]
    );
}

/// A gzip save of `root` to `target` with the builder's log on stderr. A save that takes long has
/// its output printed: once in a dozen CI runs the registry-cut test's save waited out the 300 s
/// stall timeout, and which one, and on what, is not known yet.
fn logged_save(root: &str, target: &str, registry: &str) -> Output {
    let started = std::time::Instant::now();
    let args = [
        "--log",
        "labforge_builder=info",
        "--root",
        root,
        "--target",
        target,
    ];
    let out = save(&[&args[..], &GZIP[..]].concat(), registry);
    let took = started.elapsed();
    if took > std::time::Duration::from_secs(30) {
        eprintln!(
            "a save took {took:?}; its output:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// A registry reached through a relay that can cut connections, and a base tree to save.
async fn registry_behind_relay() -> (Registry, FaultyRelay, tempfile::TempDir, PathBuf) {
    let registry = need(Registry::start().await);
    let relay = need(FaultyRelay::start(registry.host().parse().unwrap()).await);
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("root");
    base_tree(&root);
    (registry, relay, tree, root)
}

// The relay runs on the runtime while the test thread blocks on the labforge process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_cut_mid_push_fails_cleanly_and_a_retry_succeeds() {
    let (registry, relay, _tree, root) = registry_behind_relay().await;
    let host = relay.host();
    write(&root, "payload.bin", noise(3 << 20, 11));
    let root_arg = root.to_str().unwrap();
    let target = format!("{host}/e2e/faulty:v1");

    relay.fail_after(512 * 1024);
    let out = logged_save(root_arg, &target, &host);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the push cannot succeed through a cut connection"
    );
    assert!(stderr.contains(&format!("registry {host}")), "{stderr}");
    relay.heal();
    // No tag was written: the manifest goes last.
    assert!(!registry.has_tag("e2e/faulty", "v1").await);

    succeeded(&logged_save(root_arg, &target, &host));
    // A full copy reads every blob the tag points at.
    let (_work, rootfs) = unpack(&target);
    assert_eq!(
        fs::read(rootfs.join("payload.bin")).unwrap(),
        noise(3 << 20, 11)
    );
}

// A registry that hangs (a stuck proxy in front of it, a full disk behind it) fails the save once
// it has been silent for the stall timeout, naming it, instead of holding the save forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_stops_answering_mid_upload_fails_the_save_after_the_stall_timeout() {
    let (registry, relay, _tree, root) = registry_behind_relay().await;
    let host = relay.host();
    // More than the sockets between labforge and the relay hold: the upload itself stalls.
    write(&root, "payload.bin", noise(16 << 20, 31));
    let root_arg = root.to_str().unwrap();
    let target = format!("{host}/e2e/silent:v1");

    relay.stall_after(512 * 1024);
    let mut running = save_command(
        &[
            "--registry-stall-timeout",
            "2",
            "--log",
            "labforge_builder=info",
            "--root",
            root_arg,
            "--target",
            &target,
            GZIP[0],
            GZIP[1],
        ],
        &host,
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Without the stall timeout the save never ends; with it, it ends in seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while running.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = running.kill();
            panic!("the save still waited on the silent registry after 90 s");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let out = running.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a silent registry cannot take a push"
    );
    assert!(
        stderr.contains("the registry took no data for 2 s"),
        "the layer's upload gave up waiting: {stderr}"
    );
    assert!(
        stderr.contains(&format!("registry {host} stopped answering")),
        "{stderr}"
    );
    relay.heal();
    assert!(
        !registry.has_tag("e2e/silent", "v1").await,
        "no tag without every blob"
    );

    // The registry answering again, the same save succeeds.
    succeeded(&save(
        &["--root", root_arg, "--target", &target, GZIP[0], GZIP[1]],
        &host,
    ));
    assert!(registry.has_tag("e2e/silent", "v1").await);
}

// The layer goes up while it is compressed; a cut of that upload costs a second upload from the
// staged copy, not the save.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_upload_cut_while_streaming_goes_up_again_from_disk() {
    let (_registry, relay, _tree, root) = registry_behind_relay().await;
    let host = relay.host();
    let root_arg = root.to_str().unwrap();
    let save_to = |target: &str| logged_save(root_arg, target, &host);

    write(&root, "payload.bin", noise(3 << 20, 21));
    let streamed = save_to(&format!("{host}/e2e/streamed:v1"));
    succeeded(&streamed);
    let log = String::from_utf8_lossy(&streamed.stderr);
    assert!(log.contains("layer uploaded while it was written"), "{log}");
    assert!(!log.contains("again from disk"), "{log}");

    write(&root, "payload.bin", noise(3 << 20, 22));
    relay.cut_once_after(1 << 20);
    let target = format!("{host}/e2e/streamed:v2");
    let recovered = save_to(&target);
    succeeded(&recovered);
    let log = String::from_utf8_lossy(&recovered.stderr);
    assert!(log.contains("uploading it again from disk"), "{log}");
    assert_eq!(relay.cuts(), 1, "only the streamed upload was cut");
    let (_work, rootfs) = unpack(&target);
    assert_eq!(
        fs::read(rootfs.join("payload.bin")).unwrap(),
        noise(3 << 20, 22)
    );
    assert_same_tree(&root, &rootfs);
}

#[tokio::test]
async fn s3_down_still_saves_uncached_and_says_so() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let mut s3 = need(S3Server::start().await);
    let endpoint = s3.endpoint();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("root");
    base_tree(&root);
    let root_arg = root.to_str().unwrap();
    let with_s3 = |target: &str| {
        labforge()
            .args(["build", "commit", "--quiet", "--insecure-registry", &host])
            .args(["--root", root_arg, "--target", target, GZIP[0], GZIP[1]])
            .args([
                "--cache-s3",
                "s3://labforge-cache/saves",
                "--s3-endpoint",
                &endpoint,
            ])
            .env("AWS_ACCESS_KEY_ID", "labforge-test")
            .env("AWS_SECRET_ACCESS_KEY", "labforge-test-secret-value")
            .output()
            .unwrap()
    };
    let up = succeeded(&with_s3(&format!("{host}/e2e/s3:up")));
    assert!(up.contains("; cached"), "{up}");
    let hit = succeeded(&with_s3(&format!("{host}/e2e/s3:again")));
    assert!(hit.contains("cache hit"), "{hit}");

    s3.stop();
    let out = with_s3(&format!("{host}/e2e/s3:down"));
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("saved uncached, the cache was unavailable"),
        "{stdout}"
    );
    let everything = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !everything.contains("labforge-test-secret-value"),
        "secret leaked: {everything}"
    );
    let (_work, rootfs) = unpack(&format!("{host}/e2e/s3:down"));
    assert_same_tree(&root, &rootfs);
}

#[tokio::test]
async fn a_docker_schema_2_base_gets_a_gzip_layer_with_docker_media_types() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("root");
    base_tree(&root);
    let root_arg = root.to_str().unwrap();
    let oci = format!("{host}/e2e/docker:oci");
    succeeded(&save(
        &["--root", root_arg, "--target", &oci, GZIP[0], GZIP[1]],
        &host,
    ));
    // The same image as Docker schema 2, as docker push would have written it.
    let docker = format!("{host}/e2e/docker:v2s2");
    need(skopeo(&[
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        "--format",
        "v2s2",
        &format!("docker://{oci}"),
        &format!("docker://{docker}"),
    ]));
    write(&root, "opt/added.txt", "on a docker base");
    let saved = format!("{host}/e2e/docker:saved");
    // zstd is asked for, but a Docker manifest cannot carry it.
    succeeded(&save(
        &["--root", root_arg, "--base", &docker, "--target", &saved],
        &host,
    ));
    let manifest = inspect(&saved, &["--raw"]);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.docker.container.image.v1+json"
    );
    for layer in manifest["layers"].as_array().unwrap() {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.docker.image.rootfs.diff.tar.gzip"
        );
    }
    let (_work, rootfs) = unpack(&saved);
    assert_same_tree(&root, &rootfs);
}

/// A container the agent is not mounted in: the save fails at once, naming the container and what
/// the engine said, and writes no tag. The change set's pipe closes when the exec fails, so the
/// builder does not wait for a header that will never come.
#[tokio::test]
async fn a_container_without_the_agent_fails_naming_it_and_writes_no_tag() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let base = need(labforge_tests::images::push_layout(
        "jupyterlab",
        &host,
        "labforge/jupyterlab:no-agent",
    ));
    let podman = need(labforge_tests::Podman::locate());
    let image_id = need(podman.pull(&base, false));
    let container =
        need(podman.run_detached(&["--entrypoint", r#"["/bin/sleep","infinity"]"#], &image_id));
    let target = format!("{host}/alice/env:never");
    let out = save(
        &[
            "--container",
            container.name(),
            "--base",
            &base,
            "--target",
            &target,
        ],
        &host,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the save succeeded: {stderr}");
    assert!(
        stderr.contains(&format!("the agent in container {}", container.name()))
            && stderr.contains("labforge-agent"),
        "{stderr}"
    );
    // The repository is unknown to the registry (an error) or lists no such tag.
    let repository = format!("docker://{host}/alice/env");
    if let Ok(tags) = skopeo(&["list-tags", "--tls-verify=false", &repository]) {
        assert!(!tags.contains("never"), "a tag was written: {tags}");
    }
}

/// Where no file changed (only a directory's own time, as a container's start touches `/etc`),
/// a save with `push_unchanged` off, as the web app's saves run, pushes nothing; with it on, as
/// `labforge build commit` runs, the target exists afterwards.
#[tokio::test]
async fn a_save_where_no_file_changed_pushes_nothing_unless_asked_to() {
    use labforge_builder::layer::Compression;
    use labforge_builder::registry::RegistryOptions;
    use labforge_builder::save::{SaveOptions, save as save_layer};
    use labforge_builder::source::ChangeSource;
    crate::init_crypto();
    let registry = need(Registry::start().await);
    let host = registry.host();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("root");
    base_tree(&root);
    let base = format!("{host}/e2e/untouched:base");
    succeeded(&save(
        &["--root", root.to_str().unwrap(), "--target", &base],
        &host,
    ));
    // A directory's own entry changed (its mode), no file did.
    fs::set_permissions(root.join("usr/share"), fs::Permissions::from_mode(0o750)).unwrap();

    let source = ChangeSource::Directory {
        root: root.clone(),
        scan: labforge_snapshot::ScanOptions::default(),
    };
    let options = |push_unchanged| SaveOptions {
        compression: Compression::default(),
        registry: RegistryOptions {
            insecure: vec![host.clone()],
            ..RegistryOptions::default()
        },
        cache: None,
        runtime: Default::default(),
        scratch_dir: tree.path().to_owned(),
        created_by: "e2e".into(),
        push_unchanged,
    };
    let skipped = format!("{host}/e2e/untouched:skipped");
    let saved = save_layer(&source, Some(&base), &skipped, &options(false), |_| {})
        .await
        .unwrap();
    assert!(saved.header.changed > 0, "the directory's entry changed");
    assert!(saved.image.is_none() && saved.layer.is_none(), "{saved:?}");
    let tags = reqwest::get(format!("http://{host}/v2/e2e/untouched/tags/list"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!tags.contains("skipped"), "{tags}");

    let kept = format!("{host}/e2e/untouched:kept");
    let pushed = save_layer(&source, Some(&base), &kept, &options(true), |_| {})
        .await
        .unwrap();
    assert!(pushed.image.is_some(), "{pushed:?}");
    inspect(&kept, &["--raw"]);
}
