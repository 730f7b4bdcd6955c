//! Idle culling with Kubeflow's settings and annotations.
//!
//! Every check period each running Notebook's last activity is refreshed from its activity
//! sources (Jupyter's kernels and terminals API, the proxy's per-route activity) and, when it has
//! been idle longer than the cull time, it is stopped with Kubeflow's stop annotation. The
//! last-activity annotation is written only when it moves, so idle clusters see no writes.
//!
//! The pass is written once, over [`CullPlatform`], so that every platform judges idleness alike:
//! the controller's [`ClusterCulling`] reads and writes Notebooks through the Kubernetes API, and
//! the embedded mode implements the trait over its store and runtime.

use crate::metrics::{Metrics, NotebookLabels};
use jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use labforge_crds::Notebook;
use labforge_crds::notebook::{LAST_ACTIVITY_ANNOTATION, STOP_ANNOTATION};
use std::sync::Arc;
use std::time::Duration;

/// Kubeflow's culling settings (`ENABLE_CULLING`, `CULL_IDLE_TIME` and `IDLENESS_CHECK_PERIOD`,
/// both in minutes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CullingConfig {
    pub enabled: bool,
    pub idle_time: Duration,
    pub check_period: Duration,
}

impl Default for CullingConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            idle_time: Duration::from_secs(1440 * 60),
            check_period: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}={value:?} {expected}")]
pub struct CullingConfigError {
    pub variable: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl CullingConfig {
    /// Reads Kubeflow's variables through `lookup`; unset values keep the defaults, malformed ones
    /// are an error (never a silent fallback).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, CullingConfigError> {
        let defaults = Self::default();
        let minutes = |variable: &'static str, default: Duration| match lookup(variable) {
            None => Ok(default),
            Some(value) => value
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|m| *m > 0)
                .and_then(|m| m.checked_mul(60))
                .map(Duration::from_secs)
                .ok_or(CullingConfigError {
                    variable,
                    value,
                    expected: "is not a positive whole number of minutes",
                }),
        };
        let enabled = match lookup("ENABLE_CULLING").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(CullingConfigError {
                    variable: "ENABLE_CULLING",
                    value: other.to_owned(),
                    expected: "must be true or false",
                });
            }
        };
        Ok(Self {
            enabled,
            idle_time: minutes("CULL_IDLE_TIME", defaults.idle_time)?,
            check_period: minutes("IDLENESS_CHECK_PERIOD", defaults.check_period)?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("activity of {notebook}: {message}")]
pub struct ActivityError {
    pub notebook: String,
    pub message: String,
}

/// Somewhere a notebook's last activity can be read.
#[async_trait::async_trait]
pub trait ActivitySource: Send + Sync {
    /// The most recent activity this source saw, or `None` when it has nothing to say.
    async fn last_activity(&self, notebook: &Notebook) -> Result<Option<Timestamp>, ActivityError>;
}

/// Maps (namespace, name) to the base URL of that notebook's server, or to the `Authorization`
/// its server wants.
type BaseUrlFn = Box<dyn Fn(&str, &str) -> String + Send + Sync>;

/// Jupyter's own view: `/api/kernels` and `/api/terminals` under the notebook's prefix. A busy
/// kernel counts as active now.
pub struct JupyterActivity {
    http: reqwest::Client,
    /// Base URL of a notebook's server, e.g. `http://<name>.<ns>.svc.cluster.local`.
    base_url: BaseUrlFn,
    /// The `Authorization` a notebook's server takes (the embedded mode's per-notebook secret).
    authorization: Option<BaseUrlFn>,
}

impl JupyterActivity {
    pub fn new(base_url: impl Fn(&str, &str) -> String + Send + Sync + 'static) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            base_url: Box::new(base_url),
            authorization: None,
        }
    }

    /// Sends `authorization(namespace, name)` as the `Authorization` header to each server.
    pub fn with_authorization(
        mut self,
        authorization: impl Fn(&str, &str) -> String + Send + Sync + 'static,
    ) -> Self {
        self.authorization = Some(Box::new(authorization));
        self
    }

    /// In a cluster: through the notebook's Service.
    pub fn in_cluster(cluster_domain: String) -> Self {
        Self::new(move |namespace, name| format!("http://{name}.{namespace}.svc.{cluster_domain}"))
    }

    async fn fetch(
        &self,
        url: &str,
        (namespace, notebook): (&str, &str),
    ) -> Result<Vec<serde_json::Value>, ActivityError> {
        let error = |message: String| ActivityError {
            notebook: notebook.to_owned(),
            message,
        };
        let mut request = self.http.get(url);
        if let Some(authorization) = &self.authorization {
            request = request.header(
                reqwest::header::AUTHORIZATION,
                authorization(namespace, notebook),
            );
        }
        let response = request
            .send()
            .await
            .map_err(|e| error(format!("GET {url}: {e}")))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            // Not a Jupyter server (code-server, RStudio): the proxy's activity decides.
            return Ok(Vec::new());
        }
        if !response.status().is_success() {
            return Err(error(format!("GET {url}: HTTP {}", response.status())));
        }
        response
            .json()
            .await
            .map_err(|e| error(format!("GET {url}: {e}")))
    }
}

#[async_trait::async_trait]
impl ActivitySource for JupyterActivity {
    async fn last_activity(&self, notebook: &Notebook) -> Result<Option<Timestamp>, ActivityError> {
        let (namespace, name) = (
            notebook.namespace().unwrap_or_default(),
            notebook.name_any(),
        );
        let base = format!(
            "{}/notebook/{namespace}/{name}",
            (self.base_url)(&namespace, &name)
        );
        let notebook = (namespace.as_str(), name.as_str());
        let kernels = self.fetch(&format!("{base}/api/kernels"), notebook).await?;
        let terminals = self
            .fetch(&format!("{base}/api/terminals"), notebook)
            .await?;
        Ok(jupyter_last_activity(
            &kernels,
            &terminals,
            Timestamp::now(),
        ))
    }
}

/// Kubeflow's rule: any busy kernel means active now; otherwise the newest `last_activity` of
/// kernels and terminals.
pub fn jupyter_last_activity(
    kernels: &[serde_json::Value],
    terminals: &[serde_json::Value],
    now: Timestamp,
) -> Option<Timestamp> {
    if kernels.iter().any(|k| k["execution_state"] == "busy") {
        return Some(now);
    }
    kernels
        .iter()
        .chain(terminals)
        .filter_map(|k| k["last_activity"].as_str()?.parse::<Timestamp>().ok())
        .max()
}

/// What one culling check decided for a notebook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CullDecision {
    /// Leave it; write `last_activity` first when it moved.
    Keep { last_activity: Option<Timestamp> },
    /// Idle too long: stop it.
    Cull { last_activity: Timestamp },
}

/// Decides from the stored annotation and what the sources report (pure, for tests).
pub fn decide(
    stored: Option<Timestamp>,
    observed: Option<Timestamp>,
    now: Timestamp,
    idle_time: Duration,
) -> CullDecision {
    let newest = match (stored, observed) {
        (Some(s), Some(o)) => Some(s.max(o)),
        (s, o) => s.or(o),
    };
    // A notebook never seen active starts its idle clock now, as in Kubeflow.
    let last = newest.unwrap_or(now);
    let idle = now.duration_since(last);
    if idle > SignedDuration::try_from(idle_time).unwrap_or(SignedDuration::MAX) {
        return CullDecision::Cull {
            last_activity: last,
        };
    }
    CullDecision::Keep {
        last_activity: (Some(last) != stored).then_some(last),
    }
}

/// What the culling loop needs from where notebooks run: the notebooks, whether each is running,
/// what its activity sources saw, and how to record activity or stop one. The loop and its rule
/// ([`decide`]) are the same in a cluster ([`ClusterCulling`]) and in the embedded mode; what each
/// platform writes, logs and counts is its own.
#[async_trait::async_trait]
pub trait CullPlatform: Send + Sync {
    /// What ends a pass early; the loop logs it and tries again the next period.
    type Error: std::error::Error + Send;

    /// Every notebook, as this pass sees them.
    async fn notebooks(&self) -> Result<Vec<Notebook>, Self::Error>;

    /// Whether `notebook` (not stopped) has a server up to be judged; asked just before it is.
    fn is_running(&self, notebook: &Notebook) -> bool;

    /// The newest activity the platform's sources report, as they report it.
    async fn observed_activity(&self, notebook: &Notebook) -> Option<Timestamp>;

    /// Records `last` as the notebook's last activity.
    async fn record_activity(
        &self,
        notebook: &Notebook,
        last: Timestamp,
    ) -> Result<(), Self::Error>;

    /// Stops `notebook`, idle since `idle_since`, as culled at `now`.
    async fn stop_culled(
        &self,
        notebook: &Notebook,
        idle_since: Timestamp,
        now: Timestamp,
    ) -> Result<(), Self::Error>;
}

/// Culls forever, every check period; a pass that fails is logged and the next one runs as usual.
pub async fn cull_forever<P: CullPlatform>(platform: P, config: CullingConfig) {
    let mut ticker = tokio::time::interval(config.check_period);
    loop {
        ticker.tick().await;
        if let Err(err) = cull_once(&platform, config.idle_time).await {
            tracing::warn!(error = %err, "culling pass failed");
        }
    }
}

/// Runs one culling pass over every running notebook. The platform's first error ends it.
pub async fn cull_once<P: CullPlatform>(platform: &P, idle_time: Duration) -> Result<(), P::Error> {
    cull_pass(platform, idle_time, Timestamp::now).await
}

/// [`cull_once`] with its clock given, for tests.
async fn cull_pass<P: CullPlatform>(
    platform: &P,
    idle_time: Duration,
    clock: impl Fn() -> Timestamp,
) -> Result<(), P::Error> {
    for notebook in platform.notebooks().await? {
        if notebook.is_stopped() || !platform.is_running(&notebook) {
            continue;
        }
        let now = clock();
        // A server's clock ahead of ours must not postpone culling forever.
        let observed = platform
            .observed_activity(&notebook)
            .await
            .map(|t| t.min(now));
        let stored = notebook
            .annotation(LAST_ACTIVITY_ANNOTATION)
            .and_then(|v| v.parse::<Timestamp>().ok());
        match decide(stored, observed, now, idle_time) {
            CullDecision::Keep {
                last_activity: None,
            } => {}
            CullDecision::Keep {
                last_activity: Some(last),
            } => platform.record_activity(&notebook, last).await?,
            CullDecision::Cull { last_activity } => {
                platform.stop_culled(&notebook, last_activity, now).await?
            }
        }
    }
    Ok(())
}

/// The culler in a cluster: Notebooks through the Kubernetes API, activity from every source
/// (one that fails is skipped), Kubeflow's annotations written with merge patches, culls counted
/// in the controller's metrics. A failed list or patch ends the pass.
pub struct ClusterCulling {
    pub client: Client,
    pub sources: Vec<Arc<dyn ActivitySource>>,
    pub metrics: Arc<Metrics>,
}

impl ClusterCulling {
    async fn patch_annotations(
        &self,
        notebook: &Notebook,
        annotations: serde_json::Value,
    ) -> Result<(), kube::Error> {
        let namespace = notebook.namespace().unwrap_or_default();
        let api: Api<Notebook> = Api::namespaced(self.client.clone(), &namespace);
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
        api.patch(
            &notebook.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }
}

/// Whether a cluster's culler judges `notebook`. Only a notebook with a ready pod is: the
/// controller clears the culling annotations of one that is stopped or has no pod, and one still
/// starting (or that the cluster cannot run) has had no chance to be used. One being deleted is
/// left to go.
fn has_ready_pod(notebook: &Notebook) -> bool {
    let ready = notebook
        .status
        .as_ref()
        .is_some_and(|status| status.ready_replicas > 0);
    notebook.metadata.deletion_timestamp.is_none() && ready
}

#[async_trait::async_trait]
impl CullPlatform for ClusterCulling {
    type Error = kube::Error;

    async fn notebooks(&self) -> Result<Vec<Notebook>, kube::Error> {
        let notebooks: Api<Notebook> = Api::all(self.client.clone());
        Ok(notebooks.list(&Default::default()).await?.items)
    }

    fn is_running(&self, notebook: &Notebook) -> bool {
        has_ready_pod(notebook)
    }

    async fn observed_activity(&self, notebook: &Notebook) -> Option<Timestamp> {
        let mut observed = None;
        for source in &self.sources {
            match source.last_activity(notebook).await {
                Ok(seen) => observed = observed.max(seen),
                Err(err) => tracing::debug!(error = %err, "activity source"),
            }
        }
        observed
    }

    async fn record_activity(
        &self,
        notebook: &Notebook,
        last: Timestamp,
    ) -> Result<(), kube::Error> {
        self.patch_annotations(
            notebook,
            serde_json::json!({ LAST_ACTIVITY_ANNOTATION: last.to_string() }),
        )
        .await
    }

    async fn stop_culled(
        &self,
        notebook: &Notebook,
        idle_since: Timestamp,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let namespace = notebook.namespace().unwrap_or_default();
        tracing::info!(notebook = %notebook.name_any(), %namespace, %idle_since, "culling idle notebook");
        let labels = NotebookLabels {
            namespace,
            name: notebook.name_any(),
        };
        self.metrics.culled.get_or_create(&labels).inc();
        self.metrics
            .last_culled
            .get_or_create(&labels)
            .set(now.as_millisecond() as f64 / 1000.0);
        // The activity record goes with the stop, as in Kubeflow: a restarted notebook starts a
        // fresh idle clock instead of being culled again at once.
        self.patch_annotations(
            notebook,
            serde_json::json!({
                LAST_ACTIVITY_ANNOTATION: null,
                STOP_ANNOTATION: now.to_string(),
            }),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::NotebookFixture;
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn busy_kernel_is_activity_now_and_idle_ones_give_their_newest_time() {
        let now = at("2026-11-21T12:00:00Z");
        let idle = [
            json!({"execution_state": "idle", "last_activity": "2026-11-21T10:00:00Z"}),
            json!({"execution_state": "idle", "last_activity": "2026-11-21T11:00:00Z"}),
        ];
        let terminal = [json!({"name": "1", "last_activity": "2026-11-21T11:30:00Z"})];
        assert_eq!(
            jupyter_last_activity(&idle, &[], now),
            Some(at("2026-11-21T11:00:00Z"))
        );
        assert_eq!(
            jupyter_last_activity(&idle, &terminal, now),
            Some(at("2026-11-21T11:30:00Z"))
        );
        let busy = [json!({"execution_state": "busy", "last_activity": "2026-11-20T00:00:00Z"})];
        assert_eq!(jupyter_last_activity(&busy, &[], now), Some(now));
        assert_eq!(jupyter_last_activity(&[], &[], now), None);
    }

    #[test]
    fn idle_longer_than_cull_time_is_culled_and_activity_only_moves_forward() {
        let now = at("2026-11-21T12:00:00Z");
        let hour = Duration::from_secs(3600);
        assert_eq!(
            decide(Some(at("2026-11-21T10:00:00Z")), None, now, hour),
            CullDecision::Cull {
                last_activity: at("2026-11-21T10:00:00Z")
            }
        );
        // Fresh activity from a source keeps it and is written once.
        assert_eq!(
            decide(
                Some(at("2026-11-21T10:00:00Z")),
                Some(at("2026-11-21T11:59:00Z")),
                now,
                hour
            ),
            CullDecision::Keep {
                last_activity: Some(at("2026-11-21T11:59:00Z"))
            }
        );
        // Nothing new: no write.
        assert_eq!(
            decide(
                Some(at("2026-11-21T11:30:00Z")),
                Some(at("2026-11-21T11:00:00Z")),
                now,
                hour
            ),
            CullDecision::Keep {
                last_activity: None
            }
        );
        // Never seen: the clock starts now.
        assert_eq!(
            decide(None, None, now, hour),
            CullDecision::Keep {
                last_activity: Some(now)
            }
        );
    }

    #[test]
    fn culling_config_reads_kubeflow_variables_and_refuses_garbage() {
        let config = CullingConfig::from_env(|k| match k {
            "ENABLE_CULLING" => Some("true".into()),
            "CULL_IDLE_TIME" => Some("30".into()),
            "IDLENESS_CHECK_PERIOD" => Some("2".into()),
            _ => None,
        })
        .unwrap();
        assert!(config.enabled);
        assert_eq!(config.idle_time, Duration::from_secs(1800));
        assert_eq!(config.check_period, Duration::from_secs(120));
        let err =
            CullingConfig::from_env(|k| (k == "CULL_IDLE_TIME").then(|| "1h".into())).unwrap_err();
        assert_eq!(err.variable, "CULL_IDLE_TIME");
        assert!(!CullingConfig::from_env(|_| None).unwrap().enabled);
    }

    /// What the loop asked of the platform, in order.
    #[derive(Debug, PartialEq, Eq)]
    enum Call {
        Observed(String),
        Recorded(String, Timestamp),
        Culled {
            name: String,
            idle_since: Timestamp,
            now: Timestamp,
        },
    }

    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused;

    /// A platform in memory: its notebooks, which of them run, what their sources say, and a
    /// record of every call.
    #[derive(Default)]
    struct Fake {
        notebooks: Vec<Notebook>,
        running: Vec<&'static str>,
        observed: BTreeMap<&'static str, Timestamp>,
        /// Listing or writing fails, as the Kubernetes API can.
        list_fails: bool,
        writes_fail: bool,
        calls: Mutex<Vec<Call>>,
    }

    impl Fake {
        fn call(&self, call: Call) {
            self.calls.lock().unwrap().push(call);
        }

        fn write(&self, call: Call) -> Result<(), Refused> {
            self.call(call);
            if self.writes_fail {
                Err(Refused)
            } else {
                Ok(())
            }
        }
    }

    #[async_trait::async_trait]
    impl CullPlatform for Fake {
        type Error = Refused;

        async fn notebooks(&self) -> Result<Vec<Notebook>, Refused> {
            if self.list_fails {
                return Err(Refused);
            }
            Ok(self.notebooks.clone())
        }

        fn is_running(&self, notebook: &Notebook) -> bool {
            self.running.contains(&notebook.name_any().as_str())
        }

        async fn observed_activity(&self, notebook: &Notebook) -> Option<Timestamp> {
            self.call(Call::Observed(notebook.name_any()));
            self.observed.get(notebook.name_any().as_str()).copied()
        }

        async fn record_activity(
            &self,
            notebook: &Notebook,
            last: Timestamp,
        ) -> Result<(), Refused> {
            self.write(Call::Recorded(notebook.name_any(), last))
        }

        async fn stop_culled(
            &self,
            notebook: &Notebook,
            idle_since: Timestamp,
            now: Timestamp,
        ) -> Result<(), Refused> {
            self.write(Call::Culled {
                name: notebook.name_any(),
                idle_since,
                now,
            })
        }
    }

    fn last_active(name: &str, at: &str) -> Notebook {
        Notebook::test("alice", name).annotated(LAST_ACTIVITY_ANNOTATION, at)
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_pass_records_activity_that_moved_and_stops_the_idle() {
        let now = at("2026-11-21T12:00:00Z");
        let fake = Fake {
            notebooks: vec![
                last_active("fresh", "2026-11-21T11:00:00Z"),
                last_active("quiet", "2026-11-21T11:30:00Z"),
                last_active("idle", "2026-11-21T10:00:00Z"),
                Notebook::test("alice", "new"),
                last_active("ahead", "2026-11-21T11:00:00Z"),
                last_active("garbled", "yesterday"),
            ],
            running: vec!["fresh", "quiet", "idle", "new", "ahead", "garbled"],
            observed: BTreeMap::from([
                ("fresh", at("2026-11-21T11:59:00Z")),
                ("quiet", at("2026-11-21T11:00:00Z")),
                // A server whose clock runs ahead: capped at now.
                ("ahead", at("2026-11-21T13:00:00Z")),
            ]),
            ..Fake::default()
        };
        cull_pass(&fake, HOUR, || now).await.unwrap();
        let observed = |name: &str| Call::Observed(name.into());
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [
                observed("fresh"),
                Call::Recorded("fresh".into(), at("2026-11-21T11:59:00Z")),
                // Nothing newer than what is stored: no write.
                observed("quiet"),
                observed("idle"),
                Call::Culled {
                    name: "idle".into(),
                    idle_since: at("2026-11-21T10:00:00Z"),
                    now,
                },
                // Never seen active: its idle clock starts now.
                observed("new"),
                Call::Recorded("new".into(), now),
                observed("ahead"),
                Call::Recorded("ahead".into(), now),
                // An annotation that is no time counts as none.
                observed("garbled"),
                Call::Recorded("garbled".into(), now),
            ]
        );
    }

    #[tokio::test]
    async fn stopped_and_not_running_notebooks_are_not_judged() {
        let now = at("2026-11-21T12:00:00Z");
        let fake = Fake {
            notebooks: vec![
                last_active("stopped", "2026-11-20T00:00:00Z").stopped(),
                last_active("starting", "2026-11-20T00:00:00Z"),
            ],
            // Running as far as the platform knows, but stopped by its annotation.
            running: vec!["stopped"],
            ..Fake::default()
        };
        cull_pass(&fake, HOUR, || now).await.unwrap();
        assert_eq!(*fake.calls.lock().unwrap(), []);
    }

    #[tokio::test]
    async fn the_platforms_first_error_ends_the_pass() {
        let now = at("2026-11-21T12:00:00Z");
        let fake = Fake {
            notebooks: vec![Notebook::test("alice", "a"), Notebook::test("alice", "b")],
            running: vec!["a", "b"],
            writes_fail: true,
            ..Fake::default()
        };
        assert!(cull_pass(&fake, HOUR, || now).await.is_err());
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [Call::Observed("a".into()), Call::Recorded("a".into(), now)],
            "b is left for the next pass"
        );
        let unlisted = Fake {
            list_fails: true,
            ..Fake::default()
        };
        assert!(cull_once(&unlisted, HOUR).await.is_err());
    }

    #[test]
    fn a_cluster_judges_only_notebooks_with_a_ready_pod_that_are_not_being_deleted() {
        let ready = |replicas: i32| {
            let mut nb = Notebook::test("alice", "lab");
            nb.status = Some(labforge_crds::NotebookStatus {
                ready_replicas: replicas,
                ..Default::default()
            });
            nb
        };
        assert!(has_ready_pod(&ready(1)));
        assert!(!has_ready_pod(&ready(0)));
        assert!(
            !has_ready_pod(&Notebook::test("alice", "lab")),
            "no status yet"
        );
        let mut deleting = ready(1);
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at("2026-11-21T12:00:00Z")),
        );
        assert!(!has_ready_pod(&deleting));
    }
}
