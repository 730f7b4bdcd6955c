//! The notebook images built by `images/build` and how suites put them into a test registry.

use crate::tools::{SupportError, locate, run};
use std::path::PathBuf;
use std::process::Command;

const DEFAULT_CACHE: &str = "/var/cache/labforge/images";

/// The OCI layout of a cached image (`jupyterlab`, ...), or an error saying how to build it.
pub fn cached_layout(image: &str) -> Result<PathBuf, SupportError> {
    let cache = std::env::var_os("LABFORGE_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE));
    let layout = cache.join(image);
    if !layout.join(".complete").exists() {
        return Err(SupportError::MissingFile {
            what: "the cached image layout",
            path: layout,
            hint: "run `make images` (images/build)",
        });
    }
    Ok(layout)
}

/// Copies `image` from the cache into `registry_host` as `repository:tag`; returns the reference.
pub fn push_layout(
    image: &str,
    registry_host: &str,
    repository_and_tag: &str,
) -> Result<String, SupportError> {
    let layout = cached_layout(image)?;
    let skopeo = locate("skopeo")?;
    let reference = format!("{registry_host}/{repository_and_tag}");
    run(Command::new(skopeo).args([
        "copy",
        "-q",
        "--dest-tls-verify=false",
        &format!("oci:{}:latest", layout.display()),
        &format!("docker://{reference}"),
    ]))?;
    Ok(reference)
}
