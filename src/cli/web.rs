//! `labforge web`: the web app in a cluster.

use clap::Args;

#[derive(Debug, Args)]
pub struct WebArgs {
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Header carrying the authenticated user, set by the auth proxy in front.
    #[arg(long, env = "USERID_HEADER", default_value = "kubeflow-userid")]
    pub user_header: String,
    /// Prefix to strip from the header's value (e.g. `accounts.google.com:`).
    #[arg(long, env = "USERID_PREFIX", default_value = "")]
    pub user_prefix: String,
    /// Spawner configuration (image catalog, GPU vendors, defaults): labforge's (JSON or YAML),
    /// or Kubeflow's `spawner_ui_config.yaml`.
    #[arg(long)]
    pub spawner_config: Option<std::path::PathBuf>,
    /// Registry (`host[:port][/path]`) saved environments are pushed to, as
    /// `<registry>/<namespace>/<notebook>:<tag>`, by the ImageBuild reconciler; without it the
    /// web app offers no saving.
    #[arg(long, env = "LABFORGE_SAVE_REGISTRY")]
    pub save_registry: Option<String>,
    /// Notebooks are served on their own hosts below this domain (the proxy's and the
    /// controller's `LABFORGE_NOTEBOOK_DOMAIN`): the UI links there.
    #[arg(long, env = "LABFORGE_NOTEBOOK_DOMAIN")]
    pub notebook_domain: Option<String>,
    /// Serve the app under this path (`/jupyter/` under Kubeflow's central dashboard): pages,
    /// API, assets and redirects.
    #[arg(long, env = "LABFORGE_BASE_PATH", default_value = "/", value_parser = base_path)]
    pub base_path: labforge_web::base_path::BasePath,
}

/// `--app-path`: an absolute path ending in `/`, nothing a link could be broken out of.
pub(crate) fn app_path(value: &str) -> Result<String, String> {
    base_path(value).map(|path| path.as_str().to_owned())
}

pub(crate) fn base_path(value: &str) -> Result<labforge_web::base_path::BasePath, String> {
    labforge_web::base_path::BasePath::parse(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_app_path_is_a_plain_absolute_directory_path() {
        for good in ["/", "/jupyter/", "/a/b-c_d.e~/"] {
            assert_eq!(app_path(good).as_deref(), Ok(good));
        }
        for bad in [
            "jupyter/",
            "/jupyter",
            "//evil.example/",
            "/a\"b/",
            "/a b/",
            "",
        ] {
            let error = app_path(bad).unwrap_err();
            assert!(
                error.contains("not a path like /jupyter/"),
                "{bad}: {error}"
            );
        }
    }
}
