//! Saving as the suites drive it: `labforge build commit` run against a registry, the image it
//! pushed read back with skopeo and umoci, and a notebook container with the agent mounted and a
//! package installed in it.

use crate::labforge;
use crate::need;
use labforge_tests::Registry;
use labforge_tests::notebook::JupyterLab;
use labforge_tests::tools::locate;
use labforge_tests::tools::run;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::process::Output;
/// `labforge build commit --quiet --insecure-registry REGISTRY ARGS...`, not yet run.
pub(crate) fn save_command(args: &[&str], registry: &str) -> Command {
    let mut command = labforge();
    command
        .args([
            "build",
            "commit",
            "--quiet",
            "--insecure-registry",
            registry,
        ])
        .args(args);
    command
}

/// [`save_command`], run to its end.
pub(crate) fn save(args: &[&str], registry: &str) -> Output {
    save_command(args, registry).output().unwrap()
}

#[track_caller]
pub(crate) fn succeeded(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "save failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub(crate) fn skopeo(args: &[&str]) -> Result<String, labforge_tests::SupportError> {
    run(Command::new(need(locate("skopeo"))).args(args))
}

/// `skopeo inspect` with view flags (`--raw`, `--config`).
pub(crate) fn inspect(reference: &str, view: &[&str]) -> Value {
    let mut args = vec!["inspect", "--tls-verify=false"];
    args.extend_from_slice(view);
    let target = format!("docker://{reference}");
    args.push(&target);
    serde_json::from_str(&need(skopeo(&args))).unwrap()
}

/// Copies `reference` into an OCI layout and unpacks it with umoci; returns (workdir, rootfs).
pub(crate) fn unpack(reference: &str) -> (tempfile::TempDir, PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    need(skopeo(&[
        "copy",
        "-q",
        "--src-tls-verify=false",
        &format!("docker://{reference}"),
        &format!("oci:{}:img", layout.display()),
    ]));
    let bundle = work.path().join("bundle");
    need(run(Command::new(need(locate("umoci")))
        .args(["unpack", "--image"])
        .arg(format!("{}:img", layout.display()))
        .arg(&bundle)));
    let rootfs = bundle.join("rootfs");
    (work, rootfs)
}

/// A wheel built by hand (a wheel is a zip with metadata), so pip installs it with no network.
pub(crate) fn wheel(dir: &Path, name: &str, version: &str, value: &str) -> PathBuf {
    let file = dir.join(format!("{name}-{version}-py3-none-any.whl"));
    let script = r#"
import zipfile, sys
name, version, value, path = sys.argv[1:]
info = f"{name}-{version}.dist-info"
files = {
    f"{name}/__init__.py": f"VALUE = {value!r}\n",
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: labforge-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
with zipfile.ZipFile(path, "w") as z:
    for n, body in files.items():
        z.writestr(n, body)
"#;
    need(run(Command::new("python3")
        .args(["-c", script, name, version, value])
        .arg(&file)));
    file
}

/// `pip install`s a wheel that [`wheel`] wrote into the workspace of a notebook from
/// [`notebook_with_agent`] (mounted as jovyan's home), offline, as the notebook's user.
pub(crate) fn pip_install(container: &labforge_tests::Container, wheel: &Path) {
    let name = wheel.file_name().unwrap().to_str().unwrap();
    let path = format!("/home/jovyan/{name}");
    need(container.exec(&["pip", "install", "--no-index", "-q", &path]));
}

/// JupyterLab as notebook `alice/<name>`, with the save agent mounted read-only where labforge
/// mounts it and `workspace` (made writable for jovyan) as its home.
pub(crate) async fn notebook_with_agent(
    registry: &Registry,
    name: &str,
    workspace: &std::path::Path,
) -> JupyterLab {
    let agent = need(labforge_tests::agent::agent_binary());
    fs::set_permissions(workspace, fs::Permissions::from_mode(0o777)).unwrap();
    let agent_mount = format!("{}:/.labforge/agent:ro", agent.parent().unwrap().display());
    let workspace_mount = format!("{}:/home/jovyan", workspace.display());
    need(
        JupyterLab::start_with(
            registry,
            "alice",
            name,
            &["-v", &agent_mount, "-v", &workspace_mount],
        )
        .await,
    )
}
