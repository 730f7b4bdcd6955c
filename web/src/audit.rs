//! The audit trail: one JSON line for every request that changes something and every sign-in to a
//! notebook's host, saying when, who, from where, what, on which object and with what result, so
//! that a team's admin can answer "who stopped my notebook?" after the fact.
//!
//! The web app records through [`record_requests`], a middleware, so no handler can forget to.
//! Where the lines go is an [`AuditSink`]: files in the embedded mode's data dir ([`AuditFiles`],
//! rotated by size, read back by `labforge audit` and the admin page), or the process's log in a
//! cluster ([`AuditToLog`]), where the log pipeline keeps them.

use crate::api::ApiState;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One audited request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// When it was answered (RFC 3339, UTC).
    pub time: String,
    /// Who asked: the signed-in user, the name a sign-in was tried with, or "" for nobody.
    pub user: String,
    /// The client's address as the proxy in front saw it; "" when unknown.
    pub from: String,
    /// The method and path, e.g. `DELETE /api/namespaces/alice/notebooks/lab`, or
    /// `notebook sign-in` for a sign-in to a notebook's host.
    pub action: String,
    /// The namespace acted in, when there is one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The object acted on inside it, as `kind/name` (`notebooks/lab`), when there is one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object: String,
    /// The HTTP status of the answer.
    pub status: u16,
    /// `ok` (2xx, 3xx), `refused` (4xx) or `failed` (5xx).
    pub result: String,
}

impl AuditRecord {
    fn result_of(status: StatusCode) -> &'static str {
        if status.is_server_error() {
            "failed"
        } else if status.is_client_error() {
            "refused"
        } else {
            "ok"
        }
    }
}

/// Which records a reader wants.
#[derive(Debug, Default, Clone, Deserialize, utoipa::IntoParams)]
pub struct AuditFilter {
    /// Only this user's.
    pub user: Option<String>,
    /// Only those in this namespace.
    pub namespace: Option<String>,
    /// Only those at or after this time (RFC 3339).
    pub since: Option<String>,
}

impl AuditFilter {
    /// `since` as a timestamp; an error names what is wrong with it.
    pub fn since(&self) -> Result<Option<jiff::Timestamp>, String> {
        self.since
            .as_deref()
            .map(|since| {
                since.parse::<jiff::Timestamp>().map_err(|err| {
                    format!(
                        "since: {since:?} is not an RFC 3339 time (2026-01-31T09:00:00Z): {err}"
                    )
                })
            })
            .transpose()
    }

    fn keeps(&self, record: &AuditRecord, since: Option<jiff::Timestamp>) -> bool {
        self.user.as_ref().is_none_or(|user| &record.user == user)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| &record.namespace == ns)
            && since.is_none_or(|since| {
                record
                    .time
                    .parse::<jiff::Timestamp>()
                    .is_ok_and(|time| time >= since)
            })
    }
}

/// Where audit records go.
pub trait AuditSink: Send + Sync {
    fn record(&self, record: &AuditRecord);
    /// The records `filter` keeps, oldest first, at most the newest `limit`; `None` where they
    /// cannot be read back here (they went to the log).
    fn read(&self, filter: &AuditFilter, limit: usize) -> Option<Vec<AuditRecord>>;
}

/// Records as lines in the process's log, target `audit` (a cluster's web app: its log pipeline
/// keeps them).
pub struct AuditToLog;

impl AuditSink for AuditToLog {
    fn record(&self, record: &AuditRecord) {
        if let Ok(line) = serde_json::to_string(record) {
            tracing::info!(target: "audit", "{line}");
        }
    }

    fn read(&self, _filter: &AuditFilter, _limit: usize) -> Option<Vec<AuditRecord>> {
        None
    }
}

/// Records appended to `audit.jsonl` in a directory, which moves to `audit.jsonl.1` (and so on,
/// up to [`Self::KEEP`] files) when it reaches [`Self::ROTATE_AT`] bytes.
pub struct AuditFiles {
    dir: PathBuf,
    rotate_at: u64,
    lock: Mutex<()>,
}

impl AuditFiles {
    pub const FILE: &str = "audit.jsonl";
    pub const ROTATE_AT: u64 = 16 * 1024 * 1024;
    /// Rotated files kept besides the current one.
    pub const KEEP: usize = 4;

    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::rotating_at(dir, Self::ROTATE_AT)
    }

    /// Rotating at `bytes` (small in tests).
    pub fn rotating_at(dir: impl Into<PathBuf>, bytes: u64) -> Self {
        Self {
            dir: dir.into(),
            rotate_at: bytes,
            lock: Mutex::default(),
        }
    }

    fn path(&self, generation: usize) -> PathBuf {
        path_of(&self.dir, generation)
    }

    fn append(&self, line: &str) -> std::io::Result<()> {
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        std::fs::create_dir_all(&self.dir)?;
        let current = self.path(0);
        if std::fs::metadata(&current).is_ok_and(|m| m.len() >= self.rotate_at) {
            for generation in (1..=Self::KEEP).rev() {
                let from = self.path(generation - 1);
                if from.exists() {
                    std::fs::rename(&from, self.path(generation))?;
                }
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&current)?;
        // One write per line: concurrent readers never see half a record.
        file.write_all(format!("{line}\n").as_bytes())
    }
}

fn path_of(dir: &Path, generation: usize) -> PathBuf {
    match generation {
        0 => dir.join(AuditFiles::FILE),
        n => dir.join(format!("{}.{n}", AuditFiles::FILE)),
    }
}

impl AuditSink for AuditFiles {
    fn record(&self, record: &AuditRecord) {
        let Ok(line) = serde_json::to_string(record) else {
            return;
        };
        if let Err(err) = self.append(&line) {
            // Never lost without a trace: the log keeps what the file could not.
            tracing::error!(target: "audit", error = %err, dir = %self.dir.display(), "{line}");
        }
    }

    fn read(&self, filter: &AuditFilter, limit: usize) -> Option<Vec<AuditRecord>> {
        read_dir(&self.dir, filter, limit).ok()
    }
}

/// The records in `dir` that `filter` keeps, oldest first, at most the newest `limit`. Lines
/// that do not read as records (a file cut short by a crash) are skipped. Files are read newest
/// first and older ones only while fewer than `limit` were found: the usual read is the current
/// file alone.
pub fn read_dir(
    dir: &Path,
    filter: &AuditFilter,
    limit: usize,
) -> Result<Vec<AuditRecord>, std::io::Error> {
    let since = filter
        .since()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut records: Vec<AuditRecord> = Vec::new();
    for generation in 0..=AuditFiles::KEEP {
        if records.len() >= limit {
            break;
        }
        let file = match std::fs::File::open(path_of(dir, generation)) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        let mut older = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            if let Ok(record) = serde_json::from_str::<AuditRecord>(&line?)
                && filter.keeps(&record, since)
            {
                older.push(record);
            }
        }
        older.append(&mut records);
        records = older;
    }
    let surplus = records.len().saturating_sub(limit);
    records.drain(..surplus);
    Ok(records)
}

/// Records every request that can change something (any method but GET, HEAD and OPTIONS) and
/// every sign-in to a notebook's host, once answered.
pub async fn record_requests(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let notebook_sign_in = path == labforge_proxy::notebook_host::WEB_SIGN_IN_PATH;
    // An SSH connection runs code as the notebook's owner, like a sign-in to its host.
    let ssh = path.starts_with("/api/namespaces/") && path.ends_with("/ssh");
    if matches!(method, Method::GET | Method::HEAD | Method::OPTIONS) && !notebook_sign_in && !ssh {
        return next.run(request).await;
    }
    let headers = request.headers().clone();
    let uri = request.uri().clone();
    let signed_in = state.access.identify(&headers).await.map(|u| u.name);
    let response = next.run(request).await;
    let (action, namespace, object) = if notebook_sign_in {
        let query =
            axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(&uri)
                .map(|q| q.0)
                .unwrap_or_default();
        let get = |key: &str| query.get(key).cloned().unwrap_or_default();
        let name = get("name");
        (
            "notebook sign-in".to_owned(),
            get("namespace"),
            if name.is_empty() {
                String::new()
            } else {
                format!("notebooks/{name}")
            },
        )
    } else if ssh {
        let (namespace, object) = object_of(&path);
        ("notebook ssh".to_owned(), namespace, object)
    } else {
        let (namespace, object) = object_of(&path);
        (format!("{method} {path}"), namespace, object)
    };
    let user = signed_in
        .or_else(|| {
            response
                .extensions()
                .get::<SignInAttempt>()
                .map(|a| a.0.clone())
        })
        .unwrap_or_default();
    let status = response.status();
    state.audit.record(&AuditRecord {
        time: jiff::Timestamp::now().to_string(),
        user,
        from: crate::api::client_address(&headers)
            .unwrap_or_default()
            .to_owned(),
        action,
        namespace,
        object,
        status: status.as_u16(),
        result: AuditRecord::result_of(status).to_owned(),
    });
    response
}

/// Put on a sign-in's answer by its handler: the name the sign-in was tried with, since nobody
/// is signed in yet when it is asked.
#[derive(Debug, Clone)]
pub struct SignInAttempt(pub String);

/// The namespace and `kind/name` a path acts on:
/// `/api/namespaces/alice/notebooks/lab/saves` is (`alice`, `notebooks/lab`).
fn object_of(path: &str) -> (String, String) {
    let mut parts = path.trim_matches('/').split('/');
    while let Some(part) = parts.next() {
        if part == "namespaces" {
            let namespace = parts.next().unwrap_or_default().to_owned();
            let object = match (parts.next(), parts.next()) {
                (Some(kind), Some(name)) => format!("{kind}/{name}"),
                (Some(kind), None) => kind.to_owned(),
                _ => String::new(),
            };
            return (namespace, object);
        }
    }
    (String::new(), String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_proxys_access_decision_is_an_audit_record_of_its_own() {
        let at: jiff::Timestamp = "2026-11-29T04:00:00Z".parse().unwrap();
        let line = labforge_proxy::review::audit_line("carol@example.com", "team", false, at);
        let record: AuditRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(
            record,
            AuditRecord {
                time: "2026-11-29T04:00:00Z".into(),
                user: "carol@example.com".into(),
                from: String::new(),
                action: "notebook access".into(),
                namespace: "team".into(),
                object: String::new(),
                status: 403,
                result: "refused".into(),
            }
        );
    }

    fn record(user: &str, namespace: &str, time: &str) -> AuditRecord {
        AuditRecord {
            time: time.into(),
            user: user.into(),
            from: "192.0.2.7".into(),
            action: "POST /api/namespaces/x/notebooks".into(),
            namespace: namespace.into(),
            object: "notebooks".into(),
            status: 201,
            result: "ok".into(),
        }
    }

    #[test]
    fn paths_name_their_namespace_and_object() {
        let cases = [
            (
                "/api/namespaces/alice/notebooks/lab/saves",
                ("alice", "notebooks/lab"),
            ),
            ("/api/namespaces/alice/notebooks", ("alice", "notebooks")),
            (
                "/api/namespaces/alice/volumes/data",
                ("alice", "volumes/data"),
            ),
            ("/api/login", ("", "")),
        ];
        for (path, (namespace, object)) in cases {
            assert_eq!(
                object_of(path),
                (namespace.to_owned(), object.to_owned()),
                "{path}"
            );
        }
    }

    #[test]
    fn files_rotate_and_read_back_in_order_through_the_filter() {
        let dir = tempfile::tempdir().unwrap();
        // Small files: every few records rotate.
        let files = AuditFiles::rotating_at(dir.path(), 600);
        let times = (0..20).map(|i| format!("2026-11-29T00:00:{i:02}Z"));
        for (i, time) in times.enumerate() {
            let user = if i % 2 == 0 { "alice" } else { "bob" };
            files.record(&record(user, user, &time));
        }
        assert!(dir.path().join("audit.jsonl.1").exists(), "rotated");
        assert!(
            !dir.path().join("audit.jsonl.5").exists(),
            "only KEEP rotations kept"
        );
        let all = files.read(&AuditFilter::default(), 1000).unwrap();
        let times: Vec<&str> = all.iter().map(|r| r.time.as_str()).collect();
        let mut sorted = times.clone();
        sorted.sort();
        assert_eq!(times, sorted, "oldest first across rotated files");
        assert_eq!(all.last().unwrap().time, "2026-11-29T00:00:19Z");

        let bobs = AuditFilter {
            user: Some("bob".into()),
            since: Some("2026-11-29T00:00:15Z".into()),
            ..Default::default()
        };
        let seen: Vec<String> = files
            .read(&bobs, 1000)
            .unwrap()
            .into_iter()
            .map(|r| format!("{} {}", r.user, r.time))
            .collect();
        assert_eq!(
            seen,
            [
                "bob 2026-11-29T00:00:15Z",
                "bob 2026-11-29T00:00:17Z",
                "bob 2026-11-29T00:00:19Z"
            ]
        );
        assert_eq!(files.read(&AuditFilter::default(), 2).unwrap().len(), 2);
        let bad = AuditFilter {
            since: Some("yesterday".into()),
            ..Default::default()
        };
        assert!(bad.since().unwrap_err().contains("since"));
    }
}
