//! The change summary of a save: `labforge build commit` prints which Python, conda and Debian
//! packages the new layer added, upgraded and removed, and its file totals, under the digest line,
//! and writes them into the manifest's `dev.labforge.summary.*` annotations (read back with
//! skopeo). The same summary comes out whether the base's package lists are read from its layers
//! or from the cache, and when the whole change set is a cache hit. A `pip install` inside a
//! running JupyterLab notebook, saved through the agent, is named in its save's summary.

use crate::need;
use crate::support::save::{inspect, notebook_with_agent, pip_install, save, succeeded, wheel};
use labforge_tests::Registry;
use serde_json::Value;
use std::fs;
use std::path::Path;

const SITE: &str = "opt/conda/lib/python3.11/site-packages";
const CONDA_META: &str = "opt/conda/conda-meta";
const DPKG_STATUS: &str = "var/lib/dpkg/status";

fn write(root: &Path, rel: &str, body: impl AsRef<[u8]>) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, body).unwrap();
}

/// What `pip install` leaves: the distribution's metadata directory and its module.
fn install_dist(root: &Path, name: &str, version: &str, module: &str) {
    let info = format!("{SITE}/{name}-{version}.dist-info");
    write(
        root,
        &format!("{info}/METADATA"),
        format!(
            "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test package\n\n\
             # {name}\n\nA long description that is not a header.\nVersion: 0\n"
        ),
    );
    write(
        root,
        &format!("{info}/RECORD"),
        format!("{name}/__init__.py,,\n{info}/METADATA,,\n"),
    );
    write(root, &format!("{SITE}/{name}/__init__.py"), module);
}

fn conda_record(root: &Path, name: &str, version: &str) {
    // A record lists its package's files (thousands, for large packages) before `name`.
    let record = serde_json::json!({
        "build": "h5eee18b_0",
        "channel": "https://repo.anaconda.com/pkgs/main/linux-64",
        "depends": ["libgcc-ng >=11.2.0"],
        "files": (0..200).map(|i| format!("lib/lib{name}.so.{i}")).collect::<Vec<_>>(),
        "name": name,
        "version": version,
    });
    write(
        root,
        &format!("{CONDA_META}/{name}-{version}-h5eee18b_0.json"),
        serde_json::to_vec_pretty(&record).unwrap(),
    );
}

fn dpkg_status(packages: &[(&str, &str)]) -> String {
    let mut status = String::new();
    for (name, version) in packages {
        status.push_str(&format!(
            "Package: {name}\nStatus: install ok installed\nPriority: optional\n\
             Architecture: amd64\nVersion: {version}\nDescription: {name}\n the {name} package\n\n"
        ));
    }
    // Removed with its configuration kept: not installed.
    status.push_str("Package: old-lib\nStatus: deinstall ok config-files\nVersion: 0.9-1\n");
    status
}

fn base_tree(root: &Path) {
    for name in ["a", "b", "c"] {
        install_dist(root, name, "1.0", "VERSION = '1.0'\n");
    }
    write(
        root,
        DPKG_STATUS,
        dpkg_status(&[
            ("base-files", "12.4+deb12u5"),
            ("curl", "7.88.1-10"),
            ("vim", "2:9.0.1378-2"),
        ]),
    );
    conda_record(root, "python", "3.11.8");
    conda_record(root, "zlib", "1.2.13");
    write(
        root,
        &format!("{CONDA_META}/history"),
        "==> 2024-01-01 <==\n+defaults/linux-64::zlib-1.2.13\n",
    );
    write(root, "etc/motd", "not a package\n");
}

/// Files the changes add, change and delete (for the totals).
const ADDED: &[&str] = &[
    "d-1.0.dist-info/METADATA",
    "d-1.0.dist-info/RECORD",
    "d/__init__.py",
    "e-2.0.dist-info/METADATA",
    "e-2.0.dist-info/RECORD",
    "e/__init__.py",
    "c-2.0.dist-info/METADATA",
    "c-2.0.dist-info/RECORD",
    "conda:zlib-1.3-h5eee18b_0.json",
    "conda:xz-5.4.6-h5eee18b_0.json",
];
const CHANGED: &[&str] = &["c/__init__.py", "conda:history", "dpkg"];
const DELETED: &[&str] = &[
    "b-1.0.dist-info/METADATA",
    "b-1.0.dist-info/RECORD",
    "b/__init__.py",
    "c-1.0.dist-info/METADATA",
    "c-1.0.dist-info/RECORD",
    "conda:zlib-1.2.13-h5eee18b_0.json",
];

fn rel(short: &str) -> String {
    match short.split_once(':') {
        Some(("conda", file)) => format!("{CONDA_META}/{file}"),
        _ if short == "dpkg" => DPKG_STATUS.to_owned(),
        _ => format!("{SITE}/{short}"),
    }
}

fn size_of(root: &Path, files: &[&str]) -> u64 {
    files
        .iter()
        .map(|f| fs::metadata(root.join(rel(f))).unwrap().len())
        .sum()
}

/// `pip install d e`, `pip install -U c`, `pip uninstall b`, `apt install git` with a curl
/// upgrade, `conda install xz` with a zlib upgrade.
fn change_tree(root: &Path) {
    install_dist(root, "d", "1.0", "VERSION = '1.0'\n");
    install_dist(root, "e", "2.0", "VERSION = '2.0'\n");
    fs::remove_dir_all(root.join(format!("{SITE}/c-1.0.dist-info"))).unwrap();
    // A longer module: the scan compares size and whole-second mtimes.
    install_dist(root, "c", "2.0", "VERSION = '2.0'  # upgraded\n");
    fs::remove_dir_all(root.join(format!("{SITE}/b-1.0.dist-info"))).unwrap();
    fs::remove_dir_all(root.join(format!("{SITE}/b"))).unwrap();
    write(
        root,
        DPKG_STATUS,
        dpkg_status(&[
            ("base-files", "12.4+deb12u5"),
            ("curl", "7.88.1-10+deb12u5"),
            ("git", "1:2.39.2-1.1"),
            ("vim", "2:9.0.1378-2"),
        ]),
    );
    fs::remove_file(root.join(format!("{CONDA_META}/zlib-1.2.13-h5eee18b_0.json"))).unwrap();
    conda_record(root, "zlib", "1.3");
    conda_record(root, "xz", "5.4.6");
    write(
        root,
        &format!("{CONDA_META}/history"),
        "==> 2024-01-01 <==\n+defaults/linux-64::zlib-1.2.13\n\
         ==> 2024-02-01 <==\n-defaults/linux-64::zlib-1.2.13\n+defaults/linux-64::zlib-1.3\n\
         +defaults/linux-64::xz-5.4.6\n",
    );
}

/// The lines under the `pushed …` line.
fn printed_summary(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("pushed "))
        .skip(1)
        .map(|l| l.trim().to_owned())
        .collect()
}

fn annotations(reference: &str) -> Value {
    inspect(reference, &["--raw"])["annotations"].clone()
}

#[tokio::test]
async fn a_commit_on_a_base_names_the_packages_and_files_it_changed() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("root");
    base_tree(&root);
    let root_arg = root.to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap();

    // From scratch, everything is added.
    let base = format!("{host}/e2e/summary:base");
    let stdout = succeeded(&save(
        &[
            "--root",
            root_arg,
            "--target",
            &base,
            "--cache-dir",
            cache_arg,
        ],
        &host,
    ));
    let printed = printed_summary(&stdout);
    assert_eq!(
        printed[..3],
        [
            "python: added: a==1.0, b==1.0, c==1.0",
            "conda: added: python=3.11.8, zlib=1.2.13",
            "debian: added: base-files=12.4+deb12u5, curl=7.88.1-10, vim=2:9.0.1378-2",
        ],
        "{stdout}"
    );
    assert!(
        printed[3].starts_with("files: 14 added, 0 changed, 0 deleted;"),
        "{stdout}"
    );
    assert_eq!(
        annotations(&base)["dev.labforge.summary.python"],
        "added: a==1.0, b==1.0, c==1.0"
    );

    let deleted_bytes = size_of(&root, DELETED);
    change_tree(&root);
    let written_bytes = size_of(&root, ADDED) + size_of(&root, CHANGED);
    let python = "added: d==1.0, e==2.0; upgraded: c 1.0->2.0; removed: b==1.0";
    let conda = "added: xz=5.4.6; upgraded: zlib 1.2.13->1.3";
    let debian = "added: git=1:2.39.2-1.1; upgraded: curl 7.88.1-10->7.88.1-10+deb12u5";
    let files = format!(
        "added: {}, changed: {}, deleted: {}; bytes written: {written_bytes}, bytes deleted: {deleted_bytes}",
        ADDED.len(),
        CHANGED.len(),
        DELETED.len()
    );

    // The base's index and package lists come from the cache (the first save stored them), then
    // the same change set is a cache hit, then without the cache they come from its layers: the
    // same summary every time.
    let saves = [("cache", true), ("cache-hit", true), ("layers", false)];
    for (tag, cached) in saves {
        let target = format!("{host}/e2e/summary:{tag}");
        let mut args = vec!["--root", root_arg, "--base", &base, "--target", &target];
        if cached {
            args.extend(["--cache-dir", cache_arg]);
        }
        let stdout = succeeded(&save(&args, &host));
        if tag == "cache-hit" {
            assert!(stdout.contains("cache hit"), "{stdout}");
        }
        let printed = printed_summary(&stdout);
        assert_eq!(
            printed[..3],
            [
                format!("python: {python}"),
                format!("conda: {conda}"),
                format!("debian: {debian}"),
            ],
            "{tag}: {stdout}"
        );
        assert!(
            printed[3].starts_with("files: 10 added, 3 changed, 6 deleted;"),
            "{tag}: {stdout}"
        );
        assert_eq!(printed.len(), 4, "{tag}: {stdout}");

        let annotations = annotations(&target);
        assert_eq!(annotations["dev.labforge.summary.python"], python, "{tag}");
        assert_eq!(annotations["dev.labforge.summary.conda"], conda, "{tag}");
        assert_eq!(annotations["dev.labforge.summary.debian"], debian, "{tag}");
        assert_eq!(
            annotations["dev.labforge.summary.files"],
            files.as_str(),
            "{tag}"
        );
        assert_eq!(
            annotations["org.opencontainers.image.base.name"],
            base.as_str()
        );
    }

    // Nothing changed since the last save: no summary, no summary annotations.
    let again = format!("{host}/e2e/summary:again");
    let stdout = succeeded(&save(
        &[
            "--root",
            root_arg,
            "--base",
            &format!("{host}/e2e/summary:layers"),
            "--target",
            &again,
            "--cache-dir",
            cache_arg,
        ],
        &host,
    ));
    assert!(
        stdout.contains("no changes since the base image"),
        "{stdout}"
    );
    assert!(printed_summary(&stdout).is_empty(), "{stdout}");
    let annotations = annotations(&again);
    let summary_keys: Vec<&String> = annotations
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("dev.labforge.summary."))
        .collect();
    assert!(summary_keys.is_empty(), "{summary_keys:?}");
}

#[tokio::test]
async fn a_pip_install_in_a_running_notebook_is_named_in_its_save_summary() {
    let registry = need(Registry::start().await);
    let host = registry.host();
    let workspace = tempfile::tempdir().unwrap();
    let probe = wheel(workspace.path(), "labforge_summary_probe", "1.0", "probe");
    let notebook = notebook_with_agent(&registry, "summary", workspace.path()).await;
    let container = notebook.container();
    // A package of the image the notebook's server does not use.
    let removed_version = need(container.exec(&[
        "python",
        "-c",
        "import importlib.metadata as m; print(m.version('pandocfilters'))",
    ]))
    .trim()
    .to_owned();
    pip_install(container, &probe);
    need(container.exec(&["pip", "uninstall", "-y", "-q", "pandocfilters"]));

    let target = format!("{host}/alice/summary:saved");
    let stdout = succeeded(&save(
        &[
            "--container",
            container.name(),
            "--base",
            notebook.image(),
            "--target",
            &target,
        ],
        &host,
    ));
    let python =
        format!("added: labforge_summary_probe==1.0; removed: pandocfilters=={removed_version}");
    let printed = printed_summary(&stdout);
    assert_eq!(printed[0], format!("python: {python}"), "{stdout}");
    // The image's own hundred packages and its dpkg database are the base's: not in the summary.
    assert!(
        !printed.iter().any(|l| l.starts_with("debian:")),
        "{stdout}"
    );
    let annotations = annotations(&target);
    assert_eq!(annotations["dev.labforge.summary.python"], python.as_str());
    assert!(annotations.get("dev.labforge.summary.debian").is_none());
    let files = annotations["dev.labforge.summary.files"].as_str().unwrap();
    assert!(files.starts_with("added: "), "{files}");
}
