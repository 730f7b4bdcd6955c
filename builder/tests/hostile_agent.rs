//! The builder bounds and checks everything the agent sends.
//!
//! Anything root in a notebook's container can write to the agent's descriptor during a save.
//! The "engine" here is a script named `podman` that, like `podman exec --preserve-fds 1`,
//! finds the builder's pipe at descriptor 3, and writes what a hostile container would.

use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::registry::RegistryOptions;
use labforge_builder::save::{SaveError, SaveOptions, save};
use labforge_builder::source::{ChangeSource, SourceError};
use labforge_snapshot::guard::StreamViolation;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const CONTAINER: &str = "labforge-alice-nb";

/// A `podman` that reads the baseline index, then runs `script` (with the pipe at fd 3).
fn fake_engine(dir: &Path, script: &str) -> std::path::PathBuf {
    let engine = dir.join("podman");
    std::fs::write(&engine, format!("#!/bin/sh\ncat >/dev/null\n{script}\n")).expect("script");
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    engine
}

async fn save_from(engine: std::path::PathBuf, scratch: &Path) -> Result<(), SaveError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = SaveOptions {
        compression: Compression::default(),
        // Nothing listens there: the save must fail on the stream before any push.
        registry: RegistryOptions {
            insecure: vec!["127.0.0.1:9".into()],
            ..RegistryOptions::default()
        },
        cache: None,
        runtime: RuntimeConfig::default(),
        scratch_dir: scratch.to_owned(),
        created_by: "test".into(),
        push_unchanged: true,
    };
    let source = ChangeSource::Container {
        engine,
        container: CONTAINER.into(),
        ignore: vec![],
        verify_content: false,
    };
    save(&source, None, "127.0.0.1:9/alice/nb:1", &options, |_| {})
        .await
        .map(drop)
}

fn header_line(content_bytes: u64) -> String {
    format!(
        r#"{{"key":"sha256:{}","scanned":1,"changed":1,"deleted":0,"content_bytes":{content_bytes},"skipped":[]}}"#,
        "ab".repeat(32)
    )
}

/// A tar header as a hostile writer makes it, with a name `tar::Header::set_path` would refuse.
fn raw_header(kind: u8, name: &[u8], size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.as_mut_bytes()[..name.len()].copy_from_slice(name);
    header.set_entry_type(tar::EntryType::new(kind));
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    header
}

/// Writes the header line and `tar` as the payload a script sends to fd 3.
fn payload(dir: &Path, content_bytes: u64, tar: &[u8]) -> std::path::PathBuf {
    let path = dir.join("payload");
    let mut bytes = header_line(content_bytes).into_bytes();
    bytes.push(b'\n');
    bytes.extend_from_slice(tar);
    std::fs::write(&path, bytes).expect("payload");
    path
}

fn violation(result: Result<(), SaveError>) -> StreamViolation {
    match result {
        Err(SaveError::Source(SourceError::ChangeSet(violation))) => violation,
        other => panic!("expected a refused change set, got {other:?}"),
    }
}

#[tokio::test]
async fn a_change_set_entry_outside_the_root_fails_the_save() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tar = raw_header(b'0', b"../../etc/cron.d/evil", 4)
        .as_bytes()
        .to_vec();
    tar.extend_from_slice(b"boom");
    tar.resize(1024 + 1024, 0);
    let payload = payload(dir.path(), 4, &tar);
    let engine = fake_engine(dir.path(), &format!("cat '{}' >&3", payload.display()));
    let violation = violation(save_from(engine, dir.path()).await);
    assert!(
        matches!(&violation, StreamViolation::UnsafePath { path, .. } if path.contains("cron.d")),
        "{violation}"
    );
}

#[tokio::test]
async fn an_extension_claiming_gigabytes_fails_before_it_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The claim only, and then a stream of bytes that never ends: held whole by the tar reader,
    // this would take all memory.
    let tar = raw_header(b'x', b"pax", 100 << 30).as_bytes().to_vec();
    let payload = payload(dir.path(), 0, &tar);
    let engine = fake_engine(
        dir.path(),
        &format!("cat '{}' >&3; cat /dev/zero >&3", payload.display()),
    );
    let violation = violation(save_from(engine, dir.path()).await);
    assert!(
        matches!(violation, StreamViolation::ExtensionTooLarge { .. }),
        "{violation}"
    );
}

#[tokio::test]
async fn file_content_beyond_what_the_header_announced_fails_the_save() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tar = raw_header(b'0', b"home/jovyan/a", 600).as_bytes().to_vec();
    tar.resize(512 + 1024, b'i');
    tar.resize(tar.len() + 1024, 0);
    // The header announced 10 bytes: anything written into the pipe besides the agent's stream
    // shows as content it did not announce.
    let payload = payload(dir.path(), 10, &tar);
    let engine = fake_engine(dir.path(), &format!("cat '{}' >&3", payload.display()));
    let violation = violation(save_from(engine, dir.path()).await);
    assert!(
        matches!(
            violation,
            StreamViolation::ContentBeyondHeader { announced: 10, .. }
        ),
        "{violation}"
    );
}

#[tokio::test]
async fn an_endless_header_line_fails_naming_the_container() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = fake_engine(dir.path(), "tr -d '\\n' </dev/zero >&3");
    match save_from(engine, dir.path()).await {
        Err(SaveError::Source(SourceError::Agent { container, message })) => {
            assert_eq!(container, CONTAINER);
            assert!(message.contains("longer than"), "{message}");
        }
        other => panic!("expected the agent to be named, got {other:?}"),
    }
}

#[tokio::test]
async fn the_agents_stderr_is_kept_to_a_bounded_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 8 MiB of chatter, then the line that says why, and no header at all.
    let engine = fake_engine(
        dir.path(),
        "head -c 8388608 /dev/zero | tr '\\0' 'e' >&2; echo; echo 'the real reason' >&2; exit 3",
    );
    match save_from(engine, dir.path()).await {
        Err(SaveError::Source(SourceError::Agent { message, .. })) => {
            assert!(message.len() < 70 << 10, "{} bytes kept", message.len());
            assert!(message.contains("the real reason"), "the tail was lost");
            assert!(message.contains("earlier bytes"), "the cut is not said");
        }
        other => panic!("expected the agent's failure, got {other:?}"),
    }
}
