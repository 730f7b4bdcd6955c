//! `labforge backup` and `labforge restore` as an admin uses them: a running lab backed up to a
//! directory and to S3, the machine wiped (data dir, volumes, images), and everything brought
//! back; and the faults a backup meets (a destination that fills up or goes away, a corrupt
//! object, a restore onto data that is already there).

use crate::need;
use crate::support::embedded::{CHECK, PIP_INSTALL, Session, up_with_jupyterlab};
use labforge_tests::S3Server;
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use labforge_tests::faulty::FaultyRelay;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const S3_KEYS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "labforge-test"),
    ("AWS_SECRET_ACCESS_KEY", "labforge-test-secret"),
];

/// `labforge <args>` with the S3 test server's credentials and endpoint.
fn labforge(args: &[&str], s3_endpoint: Option<&str>) -> Output {
    let mut command = crate::labforge();
    command
        .args(args)
        .envs(S3_KEYS)
        .env_remove("AWS_ENDPOINT_URL");
    if let Some(endpoint) = s3_endpoint {
        command.env("AWS_ENDPOINT_URL", endpoint);
    }
    command.output().unwrap()
}

#[track_caller]
fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[track_caller]
fn failed(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn snapshots(dest: &str, s3_endpoint: Option<&str>) -> Vec<Value> {
    let listed = succeeded(&labforge(&["backup", "list", dest, "--json"], s3_endpoint));
    serde_json::from_str(&listed).unwrap()
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman").args(args).output().unwrap()
}

/// What a machine loses with its disk: labforge's containers, volumes and images of `ns`, and
/// the data dir.
fn wipe(data: &Path, ns: &str, images: &[&str]) {
    drop(RemoveNotebooksOnDrop(vec![ns.to_owned()]));
    for image in images {
        let _ = podman(&["rmi", "--force", image]);
        assert!(
            !podman(&["image", "exists", image]).status.success(),
            "{image} still in podman's storage"
        );
    }
    std::fs::remove_dir_all(data).unwrap();
}

/// A lab in use (a notebook running with files in its workspace, a package installed and saved
/// as an image) is backed up while it runs, to a directory and to S3; the second backup to
/// the directory adds next to nothing, and `--keep 1` leaves one snapshot. Then the machine
/// loses everything labforge had, and each backup in turn brings it all back: the notebook
/// runs with its files (owned by its user, who can write there), and relaunches from the saved
/// image, which has the same digest.
#[tokio::test]
async fn a_running_lab_backed_up_comes_back_whole_on_a_wiped_machine_from_a_directory_and_from_s3()
{
    crate::init_crypto();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let alice = format!("bk-alice-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let up = up_with_jupyterlab(&data, &[]).await;
    let base_image = format!("{}/labforge/jupyterlab:latest", up.registry);
    let password = need(up.add_user(&alice));
    let a = Session::sign_in(&up, &alice, &password).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");
    assert_eq!(a.post(&notebooks, json!({"name": "lab"})).await.0, 201);
    // An API token (the CLI's, an editor's SSH) outlives a restore like the user it signs in.
    let (status, made) = a.post("/api/tokens", json!({"name": "laptop"})).await;
    assert_eq!(status, 201, "{made}");
    let token = made["token"].as_str().unwrap().to_owned();
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    let printed = need(a.jupyter(&alice, "lab").await.run_code(PIP_INSTALL).await);
    assert!(printed.starts_with("pip exit 0"), "{printed}");
    // Data of some size, unlike any other, so that it is stored as an object of its own.
    let wrote = need(
        a.jupyter(&alice, "lab")
            .await
            .run_code(
                "import hashlib, os\n\
                 os.makedirs('/home/jovyan/data', exist_ok=True)\n\
                 blob = os.urandom(3 * 1024 * 1024)\n\
                 open('/home/jovyan/data/blob.bin', 'wb').write(blob)\n\
                 os.symlink('data/blob.bin', '/home/jovyan/latest')\n\
                 print(hashlib.sha256(blob).hexdigest())",
            )
            .await,
    );
    let blob_digest = wrote.trim().to_owned();
    let (code, save) = a
        .post(&format!("{notebooks}/lab/saves"), json!({"tag": "kept"}))
        .await;
    assert_eq!(code, 202, "{save}");
    let (events, progress) = a.save_progress(&alice, save["id"].as_str().unwrap()).await;
    let last = progress.last().unwrap();
    assert_eq!(last["phase"], "done", "{events}");
    let saved_digest = last["digest"].as_str().unwrap().to_owned();
    let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
    let saved_image = images["images"][0]["image"].as_str().unwrap().to_owned();

    // Backups while the notebook runs.
    let s3 = need(S3Server::start().await);
    let endpoint = s3.endpoint();
    let to_dir = dir.path().join("backups").display().to_string();
    let to_s3 = "s3://lab-backups/team-a";
    let data_arg = data.display().to_string();
    let started = std::time::Instant::now();
    let printed = succeeded(&labforge(
        &["backup", &to_dir, "--data-dir", &data_arg],
        None,
    ));
    let first_took = started.elapsed();
    assert!(printed.contains("Snapshot "), "{printed}");
    succeeded(&labforge(
        &["backup", to_s3, "--data-dir", &data_arg],
        Some(&endpoint),
    ));
    let first = snapshots(&to_dir, None);
    assert_eq!(first.len(), 1, "{first:?}");
    let held = first[0]["bytes"].as_u64().unwrap();
    assert!(
        held > 3 * 1024 * 1024,
        "the workspace and the registry: {first:?}"
    );
    assert!(first[0]["volumes"].as_u64() == Some(1), "{first:?}");
    let started = std::time::Instant::now();
    succeeded(&labforge(
        &["backup", &to_dir, "--data-dir", &data_arg],
        None,
    ));
    let second_took = started.elapsed();
    let both = snapshots(&to_dir, None);
    assert_eq!(both.len(), 2, "{both:?}");
    let added = both[1]["addedBytes"].as_u64().unwrap();
    eprintln!(
        "backup: {held} bytes held, {} added by the first ({first_took:?}), {added} by the second, nothing changed ({second_took:?})",
        both[0]["addedBytes"]
    );
    assert!(
        added < 64 * 1024,
        "an unchanged lab adds almost nothing: {both:?}"
    );
    let status = succeeded(
        &crate::labforge()
            .args(["status", "--json", "--data-dir", &data_arg])
            .output()
            .unwrap(),
    );
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["lastBackup"]["snapshot"], both[1]["id"], "{status}");
    let kept = succeeded(&labforge(
        &["backup", &to_dir, "--keep", "1", "--data-dir", &data_arg],
        None,
    ));
    assert!(kept.contains("Removed 2 older snapshot"), "{kept}");
    assert_eq!(snapshots(&to_dir, None).len(), 1);

    let mut up = up;
    assert!(up.stop());
    for (from, endpoint) in [(to_dir.as_str(), None), (to_s3, Some(endpoint.as_str()))] {
        wipe(&data, &alice, &[&base_image, &saved_image]);
        let restored = succeeded(&labforge(
            &["restore", from, "--data-dir", &data_arg],
            endpoint,
        ));
        assert!(restored.contains("Restored snapshot"), "{restored}");
        up = need(up.restart().await);
        let a = Session::sign_in(&up, &alice, &password).await;
        let whoami = reqwest::Client::new()
            .get(format!("{}/api/whoami", up.url.trim_end_matches('/')))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(whoami.status(), 200, "the token is restored with its user");
        // The restored store still says what the notebook was: ready once its container runs.
        let container = labforge_embedded::runtime::container_name(&alice, "lab");
        labforge_tests::eventually("container started", Duration::from_secs(180), || async {
            (!crate::support::embedded::container_id(&container).is_empty()).then_some(())
        })
        .await;
        a.wait_state(&alice, "lab", "ready", Duration::from_secs(180))
            .await;
        let read = need(
            a.jupyter(&alice, "lab")
                .await
                .run_code(
                    "import hashlib, os\n\
                     print(open('/home/jovyan/notes.txt').read())\n\
                     print(hashlib.sha256(open('/home/jovyan/latest', 'rb').read()).hexdigest())\n\
                     open('/home/jovyan/after-restore.txt', 'w').write('writable')\n\
                     print(os.stat('/home/jovyan/data/blob.bin').st_uid == os.getuid())",
                )
                .await,
        );
        assert_eq!(
            read,
            format!("kept in the workspace\n{blob_digest}\nTrue\n"),
            "restored from {from}"
        );
        // The saved environment: the same digest, and a relaunch on it has the package.
        let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
        assert_eq!(images["images"][0]["digest"], saved_digest.as_str());
        let lab = format!("{notebooks}/lab");
        assert_eq!(a.patch(&lab, json!({"stopped": true})).await.0, 200);
        a.wait_state(&alice, "lab", "stopped", Duration::from_secs(60))
            .await;
        labforge_tests::eventually("container removed", Duration::from_secs(30), || async {
            crate::support::embedded::container_id(&container)
                .is_empty()
                .then_some(())
        })
        .await;
        let (code, moved) = a
            .patch(&lab, json!({"stopped": false, "image": saved_image}))
            .await;
        assert_eq!(code, 200, "{moved}");
        a.wait_state(&alice, "lab", "ready", Duration::from_secs(180))
            .await;
        let checked = need(a.jupyter(&alice, "lab").await.run_code(CHECK).await);
        assert!(checked.contains("answer 42 from /opt/conda/"), "{checked}");
        let pulled = podman(&["image", "inspect", "--format", "{{.Digest}}", &saved_image]);
        assert_eq!(
            String::from_utf8_lossy(&pulled.stdout).trim(),
            saved_digest,
            "pulled from the restored registry by its digest"
        );
        assert!(up.stop());
    }
}

/// Adds `files` (path, content) to `volume`, owned by uid 1000, as `podman volume import` does.
fn import_into(volume: &str, files: &[(&str, &[u8])]) {
    let archive = volume_tar(files);
    let imported = podman(&[
        "volume",
        "import",
        volume,
        &archive.path().display().to_string(),
    ]);
    assert!(imported.status.success(), "{imported:?}");
}

fn volume_tar(files: &[(&str, &[u8])]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut tar = tar::Builder::new(file.reopen().unwrap());
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o640);
        header.set_uid(1000);
        header.set_gid(100);
        tar.append_data(&mut header, path, *content).unwrap();
    }
    tar.finish().unwrap();
    file
}

fn volume_file(volume: &str, path: &str) -> Option<Vec<u8>> {
    let mountpoint = podman(&["volume", "inspect", "--format", "{{.Mountpoint}}", volume]);
    let mountpoint = String::from_utf8_lossy(&mountpoint.stdout)
        .trim()
        .to_owned();
    (!mountpoint.is_empty())
        .then(|| std::fs::read(Path::new(&mountpoint).join(path)).ok())
        .flatten()
}

/// A backup to a directory that fills up, or to S3 that goes away, stops and says the
/// snapshots already there are whole, and they restore; a corrupt object stops a restore with
/// the object and its file named, and nothing made; a restore onto a data dir or a volume that
/// is there already is refused, naming it.
// Threads of its own for the relay: the test blocks on `labforge` commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_that_fail_leave_earlier_snapshots_whole_and_restores_make_all_or_nothing() {
    crate::init_crypto();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.display().to_string();
    let ns = format!("bk-faults-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![ns.clone()]);
    succeeded(&labforge(
        &["user", "add", &ns, "--data-dir", &data_arg],
        None,
    ));
    let volume = format!("labforge-{ns}_lab-workspace");
    assert!(podman(&["volume", "create", &volume]).status.success());
    let first = labforge_tests::noise(512 * 1024, 1);
    import_into(
        &volume,
        &[("notes.txt", b"first"), ("data/first.bin", &first)],
    );

    // A directory on a small filesystem, and S3 through a relay that can cut it off.
    let small = dir.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .output()
        .unwrap();
    assert!(mounted.status.success(), "mounting a tmpfs: {mounted:?}");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&small);
    let to_small = small.join("backups").display().to_string();
    let s3 = need(S3Server::start().await);
    let upstream = s3.endpoint().trim_start_matches("http://").parse().unwrap();
    let relay = need(FaultyRelay::start(upstream).await);
    let endpoint = format!("http://{}", relay.host());
    let to_s3 = "s3://faults/lab";
    for (dest, endpoint) in [(to_small.as_str(), None), (to_s3, Some(endpoint.as_str()))] {
        succeeded(&labforge(
            &["backup", dest, "--data-dir", &data_arg],
            endpoint,
        ));
    }

    // One backup at a time per directory.
    let held = std::fs::File::open(small.join("backups/lock")).unwrap();
    held.lock().unwrap();
    let error = failed(&labforge(
        &["backup", &to_small, "--data-dir", &data_arg],
        None,
    ));
    assert!(error.contains("another backup or pruning holds"), "{error}");
    drop(held);

    // More than the small filesystem holds, and more than the relay lets through.
    let second = labforge_tests::noise(3 * 1024 * 1024, 2);
    import_into(&volume, &[("data/second.bin", &second)]);
    relay.fail_after(512 * 1024);
    for (dest, endpoint) in [(to_small.as_str(), None), (to_s3, Some(endpoint.as_str()))] {
        let error = failed(&labforge(
            &["backup", dest, "--data-dir", &data_arg],
            endpoint,
        ));
        assert!(
            error.contains("stopped and made no snapshot")
                && error.contains("the 1 snapshot(s) already there are whole"),
            "{dest}: {error}"
        );
    }
    relay.heal();

    // Each destination's earlier snapshot restores: the volume as it was then.
    assert!(podman(&["volume", "rm", &volume]).status.success());
    for (dest, endpoint) in [(to_small.as_str(), None), (to_s3, Some(endpoint.as_str()))] {
        assert_eq!(snapshots(dest, endpoint).len(), 1, "{dest}");
        let into = dir.path().join("restored");
        let into_arg = into.display().to_string();
        succeeded(&labforge(
            &["restore", dest, "--data-dir", &into_arg],
            endpoint,
        ));
        assert!(into.join("users.json").exists());
        assert_eq!(
            volume_file(&volume, "notes.txt").as_deref(),
            Some(&b"first"[..])
        );
        assert_eq!(volume_file(&volume, "data/first.bin"), Some(first.clone()));
        assert_eq!(volume_file(&volume, "data/second.bin"), None);

        // Onto data that is there: refused, naming it.
        let error = failed(&labforge(
            &["restore", dest, "--data-dir", &into_arg],
            endpoint,
        ));
        assert!(error.contains("already holds labforge data ("), "{error}");
        std::fs::remove_dir_all(&into).unwrap();
        let error = failed(&labforge(
            &["restore", dest, "--data-dir", &into_arg],
            endpoint,
        ));
        assert!(
            error.contains(&format!("volume {volume} already exists")),
            "{error}"
        );
        assert!(!into.join("users.json").exists());
        assert!(podman(&["volume", "rm", &volume]).status.success());
    }

    // A corrupt object: the restore names it and its file, and makes nothing.
    let objects = small.join("backups/objects");
    let largest = std::fs::read_dir(&objects)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let digest = largest.file_name().unwrap().to_string_lossy().into_owned();
    let good = std::fs::read(&largest).unwrap();
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0xff;
    std::fs::write(&largest, &bad).unwrap();
    let into = dir.path().join("corrupt");
    let into_arg = into.display().to_string();
    let error = failed(&labforge(
        &["restore", &to_small, "--data-dir", &into_arg],
        None,
    ));
    assert!(
        error.contains(&format!(
            "object sha256:{digest} (data/first.bin in volume {volume})"
        )) && error.contains("is corrupt"),
        "{error}"
    );
    assert!(!into.join("users.json").exists(), "nothing placed");
    assert!(
        !podman(&["volume", "exists", &volume]).status.success(),
        "no volume made"
    );
    std::fs::write(&largest, &good).unwrap();
    succeeded(&labforge(
        &["restore", &to_small, "--data-dir", &into_arg],
        None,
    ));
    assert_eq!(volume_file(&volume, "data/first.bin"), Some(first));
}
