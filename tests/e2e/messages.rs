//! What a person reads when something outside labforge fails: known faults fed to
//! `labforge build commit` against real services, and every line it prints (its result, its
//! warnings and errors, its log at info and above) held to the house rule: one line naming
//! what failed, where, and what to do, the cause after `caused by:`, no Debug dump.

use crate::labforge;
use crate::need;
use crate::support::save::save_command;
use labforge_tests::services::{REGISTRY_PASSWORD, REGISTRY_USER};
use labforge_tests::{Registry, S3Server};
use std::process::Output;

/// The longest line a person should have to read.
const MAX_LINE: usize = 300;

/// Runs `build commit` of a one-file tree to `target`, with `extra` arguments and environment.
fn commit(registry: &str, target: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(tree.path().join("notes.txt"), "hello").unwrap();
    let mut command = save_command(
        &["--root", tree.path().to_str().unwrap(), "--target", target],
        registry,
    );
    command.args(extra).env("LABFORGE_LOG", "info");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

/// The lines of `output` that a person reads, each held to the rule; returns them joined.
#[track_caller]
fn readable(output: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for line in text.lines() {
        let message = log_message(line);
        assert!(
            message.chars().count() <= MAX_LINE,
            "a message of {} characters: {message}",
            message.chars().count()
        );
        assert!(!line.contains("{ "), "a Debug dump: {line}");
    }
    text
}

/// A log line's message, after its time, level and target (`2026-…  WARN labforge::x: message`).
fn log_message(line: &str) -> &str {
    for level in [" INFO ", " WARN ", " ERROR "] {
        if let Some((time, rest)) = line.split_once(level)
            && time.starts_with(|c: char| c.is_ascii_digit())
            && let Some((_target, message)) = rest.split_once(": ")
        {
            return message;
        }
    }
    line
}

/// The one line of `text` that contains `needle`.
#[track_caller]
fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

#[tokio::test]
async fn wrong_s3_credentials_save_uncached_and_say_which_bucket_and_what_to_check() {
    let registry = need(Registry::start().await);
    let s3 = need(S3Server::start_checking_credentials().await);
    let host = registry.host();
    let out = commit(
        &host,
        &format!("{host}/e2e/messages:s3"),
        &[
            "--cache-s3",
            "s3://team-cache/saves",
            "--s3-endpoint",
            &s3.endpoint(),
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1"),
            ("AWS_SECRET_ACCESS_KEY", "not-the-secret-value"),
        ],
    );
    assert!(out.status.success(), "{}", readable(&out));
    let text = readable(&out);
    line_with(&text, "saved uncached");
    let warning = line_with(&text, "cache unavailable, saving without it");
    for what in [
        "bucket \"team-cache\"",
        "credentials refused",
        "AWS_SECRET_ACCESS_KEY",
        "caused by: InvalidAccessKeyId",
    ] {
        assert!(warning.contains(what), "{what:?} missing from: {warning}");
    }
    assert!(
        !text.contains("not-the-secret-value"),
        "the secret leaked: {text}"
    );
}

#[tokio::test]
async fn a_person_reads_warnings_as_warning_lines_and_gets_log_lines_only_by_asking() {
    let registry = need(Registry::start().await);
    let s3 = need(S3Server::start_checking_credentials().await);
    let host = registry.host();
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(tree.path().join("notes.txt"), "hello").unwrap();
    let save = |log: Option<&str>| {
        let target = format!("{host}/e2e/messages:voice");
        let mut command = save_command(
            &[
                "--root",
                tree.path().to_str().unwrap(),
                "--target",
                &target,
                "--cache-s3",
                "s3://team-cache/saves",
                "--s3-endpoint",
                &s3.endpoint(),
            ],
            &host,
        );
        command
            .env_remove("LABFORGE_LOG")
            .env("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
            .env("AWS_SECRET_ACCESS_KEY", "not-the-secret-value");
        if let Some(filter) = log {
            command.args(["--log", filter]);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = save(None);
    let warning = line_with(&said, "cache unavailable");
    assert!(
        warning.starts_with("warning: cache unavailable, saving without it: "),
        "a person's line, no time or module: {warning}"
    );
    assert!(
        !said.contains(" WARN ") && !said.contains("labforge_builder::"),
        "{said}"
    );
    let logged = save(Some("warn"));
    let line = line_with(&logged, "cache unavailable");
    assert!(
        line.contains(" WARN ") && line.contains("labforge_builder"),
        "--log asks for log lines: {line}"
    );
}

#[tokio::test]
async fn a_registry_refusing_the_login_fails_naming_it_and_the_variables_to_set() {
    let registry = need(Registry::start_requiring_login().await);
    let host = registry.host();
    let target = format!("{host}/e2e/messages:auth");
    // No credentials, then a wrong password.
    let anonymous: &[(&str, &str)] = &[];
    let wrong: &[(&str, &str)] = &[
        ("LABFORGE_REGISTRY_USER", REGISTRY_USER),
        ("LABFORGE_REGISTRY_PASSWORD", "wrong-password"),
    ];
    for env in [anonymous, wrong] {
        let out = commit(&host, &target, &[], env);
        assert!(!out.status.success(), "{}", readable(&out));
        let text = readable(&out);
        let error = line_with(&text, "labforge: error:");
        for what in [
            format!("registry {host} refused access"),
            "LABFORGE_REGISTRY_PASSWORD".to_owned(),
            "caused by: ".to_owned(),
        ] {
            assert!(error.contains(&what), "{what:?} missing from: {error}");
        }
        assert!(!registry.has_tag("e2e/messages", "auth").await);
    }
    // The right password pushes.
    let out = commit(
        &host,
        &target,
        &[],
        &[
            ("LABFORGE_REGISTRY_USER", REGISTRY_USER),
            ("LABFORGE_REGISTRY_PASSWORD", REGISTRY_PASSWORD),
        ],
    );
    assert!(out.status.success(), "{}", readable(&out));
}

#[tokio::test]
async fn a_base_image_not_in_the_registry_fails_naming_the_image() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let base = format!("{host}/e2e/no-such-image:1");
    let out = commit(
        &host,
        &format!("{host}/e2e/messages:base"),
        &["--base", &base],
        &[],
    );
    assert!(!out.status.success(), "{}", readable(&out));
    let text = readable(&out);
    let error = line_with(&text, "labforge: error:");
    for what in [
        format!("image {base} is not in registry {host}"),
        "check its name and tag".to_owned(),
        "caused by: ".to_owned(),
    ] {
        assert!(error.contains(&what), "{what:?} missing from: {error}");
    }
}

#[tokio::test]
async fn saving_a_container_without_podman_says_podman_is_missing() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let base = format!("{host}/e2e/base:1");
    let pushed = commit(&host, &base, &[], &[]);
    assert!(pushed.status.success(), "{}", readable(&pushed));
    let empty = tempfile::tempdir().unwrap();
    let mut command = labforge();
    let out = command
        .args(["build", "commit", "--quiet", "--insecure-registry", &host])
        .args([
            "--container",
            "notebook-1",
            "--base",
            &format!("{host}/e2e/base:1"),
        ])
        .args(["--target", &format!("{host}/e2e/messages:podman")])
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = readable(&out);
    let error = line_with(&text, "labforge: error:");
    assert!(error.contains("podman"), "{error}");
    assert!(error.contains("install"), "says what to do: {error}");
}
