//! Where the CLI keeps the server it signed in to and its API token: `credentials.json` in
//! `$XDG_CONFIG_HOME/labforge` (else `~/.config/labforge`), readable by its user alone.
//! `LABFORGE_URL` and `LABFORGE_TOKEN` take its place when set (scripts, CI).

use crate::RemoteError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A server and a token for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Credentials {
    /// The web app's address, e.g. `http://localhost:8080`, without a trailing `/`.
    pub url: String,
    pub token: String,
}

/// The credentials file's path.
pub fn path() -> Result<PathBuf, RemoteError> {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .ok_or_else(|| {
            RemoteError::Usage(
                "neither XDG_CONFIG_HOME nor HOME is set: no place for the credentials".into(),
            )
        })?;
    Ok(config.join("labforge").join("credentials.json"))
}

/// `url` as kept: its scheme checked, no trailing slash.
pub fn normalize_url(url: &str) -> Result<String, RemoteError> {
    let url = url.trim().trim_end_matches('/');
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| RemoteError::Usage(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(RemoteError::Usage(format!(
            "{url:?} is not the address of a labforge server: give http:// or https:// and its host"
        )));
    }
    Ok(url.to_owned())
}

/// The credentials to use: `LABFORGE_URL` and `LABFORGE_TOKEN` where set, else the file's.
pub fn load() -> Result<Credentials, RemoteError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    choose(env("LABFORGE_URL"), env("LABFORGE_TOKEN"), read_file()?)
}

/// The server and token from the environment's `url` and `token` and the `saved` file. The
/// file's token goes only to the file's server: a `LABFORGE_URL` naming another server without
/// a `LABFORGE_TOKEN` of its own is not signed in there.
fn choose(
    url: Option<String>,
    token: Option<String>,
    saved: Option<Credentials>,
) -> Result<Credentials, RemoteError> {
    let url = url.map(|u| normalize_url(&u)).transpose()?;
    match (url, token, saved) {
        (Some(url), Some(token), _) => Ok(Credentials { url, token }),
        (None, Some(token), Some(saved)) => Ok(Credentials {
            url: saved.url,
            token,
        }),
        (Some(url), None, Some(saved)) if url == saved.url => Ok(saved),
        (None, None, Some(saved)) => Ok(saved),
        _ => Err(RemoteError::NotSignedIn),
    }
}

fn read_file() -> Result<Option<Credentials>, RemoteError> {
    let path = path()?;
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| RemoteError::File {
                path,
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RemoteError::File { path, source }),
    }
}

/// Writes `credentials` to the file, mode 0600 in a directory of mode 0700, replacing it whole.
pub fn save(credentials: &Credentials) -> Result<PathBuf, RemoteError> {
    let path = path()?;
    let bytes = serde_json::to_vec_pretty(credentials).unwrap_or_default();
    crate::write_private(&path, &bytes)?;
    Ok(path)
}

/// Removes the file, if there is one.
pub fn forget() -> Result<bool, RemoteError> {
    let path = path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(RemoteError::File { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_token_goes_only_to_the_saved_server() {
        let saved = || {
            Some(Credentials {
                url: "https://lab.example.com".into(),
                token: "lft_saved".into(),
            })
        };
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(choose(None, None, saved()).unwrap().token, "lft_saved");
        let elsewhere = choose(some("https://evil.example.com"), None, saved());
        assert!(matches!(elsewhere, Err(RemoteError::NotSignedIn)));
        let same = choose(some("https://lab.example.com/"), None, saved()).unwrap();
        assert_eq!(same.token, "lft_saved");
        let both = choose(some("http://localhost:8080"), some("lft_env"), saved()).unwrap();
        assert_eq!(
            (both.url.as_str(), both.token.as_str()),
            ("http://localhost:8080", "lft_env")
        );
        let token_only = choose(None, some("lft_env"), saved()).unwrap();
        assert_eq!(token_only.url, "https://lab.example.com");
        assert!(matches!(
            choose(None, None, None),
            Err(RemoteError::NotSignedIn)
        ));
    }

    #[test]
    fn urls_are_checked_and_kept_without_a_trailing_slash() {
        assert_eq!(
            normalize_url("http://localhost:8080/").unwrap(),
            "http://localhost:8080"
        );
        assert_eq!(
            normalize_url("https://lab.example.com/jupyter").unwrap(),
            "https://lab.example.com/jupyter"
        );
        for bad in ["localhost:8080", "ftp://x", "not a url", ""] {
            assert!(normalize_url(bad).is_err(), "{bad}");
        }
    }
}
