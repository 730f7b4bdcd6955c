//! The image `deploy/` runs, made by `make image` (which packs with `images/build labforge`)
//! from this run's binaries, pushed to a real registry and run with podman the ways the
//! manifests run it.

use crate::need;
use labforge_tests::Registry;
use labforge_tests::podman::Podman;
use labforge_tests::tools::run;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn make_image(registry: Option<&str>) -> std::process::Output {
    let binaries = Path::new(env!("CARGO_BIN_EXE_labforge")).parent().unwrap();
    let agent = need(labforge_tests::agent::agent_binary());
    let mut make = Command::new("make");
    make.current_dir(labforge_tests::repo_root())
        .args(["-s", "image", "PUSH_FLAGS=--dest-tls-verify=false"])
        .env("LABFORGE_BINARIES", binaries)
        .env("LABFORGE_AGENT", agent)
        // A cache of its own: the debug binaries' image must not replace a release one.
        .env("LABFORGE_IMAGE_CACHE", "/var/cache/labforge/test-images");
    if let Some(registry) = registry {
        make.arg(format!("REGISTRY={registry}"));
    }
    make.output().unwrap()
}

#[tokio::test]
async fn make_image_pushes_an_image_that_runs_every_component_as_a_non_root_user() {
    let refused = make_image(None);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("set REGISTRY"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let registry = need(Registry::start().await);
    let target = format!("{}/team", registry.host());
    let made = make_image(Some(&target));
    let said = String::from_utf8_lossy(&made.stdout);
    assert!(
        made.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let reference = format!("{target}/labforge:{version}");
    assert!(said.contains(&format!("pushed {reference}")), "{said}");

    let podman = need(Podman::locate());
    let id = need(podman.pull(&reference, false));
    let in_image = |entrypoint: Option<&str>, volume: Option<&str>, args: &[&str]| {
        let mut command = podman.command();
        command.args(["run", "--rm"]);
        if let Some(entrypoint) = entrypoint {
            command.args(["--entrypoint", entrypoint]);
        }
        if let Some(volume) = volume {
            command.args(["-v", volume]);
        }
        run(command.arg(&id).args(args))
    };

    // The workloads' `args:` go to labforge, the proxy's Deployment names labforge-proxy.
    let labforge = need(in_image(None, None, &["--version"]));
    assert!(labforge.contains(version), "{labforge}");
    let proxy = need(in_image(Some("labforge-proxy"), None, &["--help"]));
    assert!(proxy.contains("--listen"), "{proxy}");
    let user = need(in_image(Some("id"), None, &["-u"]));
    assert_eq!(user.trim(), "65532");

    // The notebook pods' init container: `/labforge-agent install <dir>` into an emptyDir.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let volume = format!("{}:/opt/labforge", dir.path().display());
    need(in_image(
        Some("/labforge-agent"),
        Some(&volume),
        &["install", "/opt/labforge"],
    ));
    let installed = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert!(
        installed
            .iter()
            .any(|name| name.starts_with("labforge-agent")),
        "{installed:?}"
    );

    let inspected: serde_json::Value =
        serde_json::from_str(&need(run(podman.command().args(["image", "inspect", &id])))).unwrap();
    let config = &inspected[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert_eq!(labels["org.opencontainers.image.title"], "labforge");
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(revision.len(), 40, "{labels}");
    let _ = podman.command().args(["rmi", "-f", &id]).output();
}
