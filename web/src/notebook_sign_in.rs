//! Signing in to a notebook's own host (embedded mode): the web app's half of
//! [`labforge_proxy::notebook_host`].
//!
//! The web app's session cookie never leaves its host. A visitor the web app lets into a
//! notebook gets a one-time code bound to that notebook, to the browser that was sent for it
//! (the proxy's state cookie) and to the visitor's session; the proxy trades it once for a grant,
//! the notebook host's own cookie. A grant lasts as long as its session: sign-out, removing or
//! resetting the user ends it, and the proxy closes the websockets opened with it. Access is
//! checked again on every request by the proxy, so taking a namespace away ends it too.

use crate::users::LocalAuth;
use labforge_crds::host::{is_label_of, port_host_label};
use labforge_proxy::authz::Revocation;
use labforge_proxy::notebook_host::{CodeRefused, HostSignIn, Redeemed, port_of, random_hex};
use labforge_proxy::ports::PortTarget;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a code may take from the web app to the notebook's host: one redirect.
pub const CODE_LIFETIME: Duration = Duration::from_secs(60);
/// Codes outstanding at once; more are refused until some are used or expire.
const MAX_CODES: usize = 10_000;
/// Codes one user may have outstanding: a new one past that takes the place of the user's
/// oldest, so that no one (a page that gets codes made for its visitor, a user with many tabs)
/// can use up a user's sign-ins, and one user's codes cannot fill [`MAX_CODES`].
const MAX_CODES_PER_USER: usize = 16;

/// Where the web app sends people to a notebook: its own host under `domain`.
#[derive(Clone)]
pub struct NotebookLinks {
    pub domain: String,
    /// Embedded mode's codes; `None` where an auth proxy in front signs visitors in on every
    /// host.
    pub sign_in: Option<Arc<NotebookSignIn>>,
}

impl NotebookLinks {
    /// `//<notebook's host>[:port]`, the port being the one the web app was reached on
    /// (`host_header`): embedded mode serves every host on one port.
    pub fn origin(&self, namespace: &str, name: &str, host_header: Option<&str>) -> String {
        let host = labforge_crds::host::notebook_host(namespace, name, &self.domain);
        format!("//{host}{}", port_of(host_header.unwrap_or_default()))
    }
}

impl NotebookLinks {
    /// `//<port's host>[:port]` of port `port` of notebook `namespace/name`.
    pub fn port_origin(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
        host_header: Option<&str>,
    ) -> String {
        let label = labforge_crds::host::port_host_label(namespace, name, port);
        format!(
            "//{label}.{}{}",
            self.domain,
            port_of(host_header.unwrap_or_default())
        )
    }
}

/// Codes issued and grants given, in memory: a restart signs visitors in again.
pub struct NotebookSignIn {
    auth: Arc<LocalAuth>,
    code_lifetime: Duration,
    codes: Mutex<HashMap<String, Code>>,
    grants: RwLock<HashMap<String, HeldGrant>>,
}

/// A grant given: dropping it (its `ended` sender) closes the websockets opened with it.
struct HeldGrant {
    grant: Grant,
    ended: tokio::sync::watch::Sender<()>,
}

struct Code {
    grant: Grant,
    state: String,
    return_to: String,
    issued: Instant,
}

#[derive(Clone)]
struct Grant {
    user: String,
    namespace: String,
    name: String,
    /// For one of the notebook's ports' hosts rather than the notebook's own.
    port: Option<u16>,
    /// The web app session it came from; never leaves this process.
    session: String,
}

impl Grant {
    /// Whether the grant is for the host labelled `label`.
    fn is_for_host(&self, label: &str) -> bool {
        match self.port {
            None => is_label_of(label, &self.namespace, &self.name),
            Some(port) => port_host_label(&self.namespace, &self.name, port) == label,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IssueError {
    #[error("too many notebook sign-ins at once; try again in a minute")]
    Busy,
}

impl NotebookSignIn {
    pub fn new(auth: Arc<LocalAuth>) -> Self {
        Self::with_code_lifetime(auth, CODE_LIFETIME)
    }

    pub fn with_code_lifetime(auth: Arc<LocalAuth>, code_lifetime: Duration) -> Self {
        Self {
            auth,
            code_lifetime,
            codes: Mutex::default(),
            grants: RwLock::default(),
        }
    }

    /// A code for `user`, signed in with `session`, to notebook `namespace/name`, for the
    /// browser holding `state`; it brings them back to `return_to`. The caller has checked the
    /// user's access and that `return_to` is below the notebook's prefix.
    pub fn issue(
        &self,
        session: &str,
        user: &str,
        namespace: &str,
        name: &str,
        state: &str,
        return_to: &str,
    ) -> Result<String, IssueError> {
        self.issue_for(session, user, (namespace, name, None), state, return_to)
    }

    /// [`Self::issue`] for the notebook's host, or (`port`) one of its ports' hosts.
    pub fn issue_for(
        &self,
        session: &str,
        user: &str,
        (namespace, name, port): (&str, &str, Option<u16>),
        state: &str,
        return_to: &str,
    ) -> Result<String, IssueError> {
        let code = random_hex(32);
        let mut codes = self.codes.lock().unwrap_or_else(|e| e.into_inner());
        codes.retain(|_, code| code.issued.elapsed() < self.code_lifetime);
        let users_codes = codes.iter().filter(|(_, c)| c.grant.user == user);
        if users_codes.clone().count() >= MAX_CODES_PER_USER
            && let Some(oldest) = users_codes
                .min_by_key(|(_, c)| c.issued)
                .map(|(code, _)| code.clone())
        {
            codes.remove(&oldest);
        }
        if codes.len() >= MAX_CODES {
            return Err(IssueError::Busy);
        }
        codes.insert(
            code.clone(),
            Code {
                grant: Grant {
                    user: user.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    port,
                    session: session.to_owned(),
                },
                state: state.to_owned(),
                return_to: return_to.to_owned(),
                issued: Instant::now(),
            },
        );
        Ok(code)
    }

    /// Ends the grants for which `ends(user, namespace, notebook)` holds (a share revoked, a
    /// member removed): their visitors must sign in to the notebook again, and the websockets
    /// they opened close now. Returns how many ended.
    pub fn end_grants(&self, ends: impl Fn(&str, &str, &str) -> bool) -> usize {
        let mut grants = self.grants.write().unwrap_or_else(|e| e.into_inner());
        let before = grants.len();
        grants.retain(|_, HeldGrant { grant, .. }| {
            // A port's access is the port's sharing, asked by the proxy on each request.
            grant.port.is_some() || !ends(&grant.user, &grant.namespace, &grant.name)
        });
        before - grants.len()
    }

    /// The user `grant` lets into notebook `namespace/name` (or its `port`), while the session
    /// it came from lasts.
    fn user_of(
        &self,
        grant: &str,
        (namespace, name, port): (&str, &str, Option<u16>),
    ) -> Option<String> {
        let grant = {
            let grants = self.grants.read().ok()?;
            let grant = &grants.get(grant)?.grant;
            if grant.namespace != namespace || grant.name != name || grant.port != port {
                return None;
            }
            grant.clone()
        };
        let user = self.auth.user_of_session(&grant.session)?;
        (user.name == grant.user).then_some(user.name)
    }

    /// Grants held now.
    #[cfg(test)]
    fn grants(&self) -> usize {
        self.grants.read().map_or(0, |grants| grants.len())
    }
}

impl HostSignIn for NotebookSignIn {
    fn redeem(&self, code: &str, label: &str, state: &str) -> Result<Redeemed, CodeRefused> {
        let issued = self
            .codes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(code)
            .ok_or(CodeRefused::Unknown)?;
        if issued.issued.elapsed() >= self.code_lifetime {
            return Err(CodeRefused::Expired);
        }
        if !issued.grant.is_for_host(label) {
            return Err(CodeRefused::OtherNotebook);
        }
        if state.is_empty() || issued.state != state {
            return Err(CodeRefused::OtherBrowser);
        }
        let token = random_hex(32);
        let mut grants = self.grants.write().unwrap_or_else(|e| e.into_inner());
        // One grant per session and notebook; those of ended sessions go.
        let sessions = &self.auth.sessions;
        grants.retain(|_, HeldGrant { grant, .. }| {
            sessions.user(&grant.session).is_some()
                && !(grant.session == issued.grant.session
                    && grant.namespace == issued.grant.namespace
                    && grant.name == issued.grant.name
                    && grant.port == issued.grant.port)
        });
        grants.insert(
            token.clone(),
            HeldGrant {
                grant: issued.grant,
                ended: tokio::sync::watch::Sender::new(()),
            },
        );
        Ok(Redeemed {
            grant: token,
            return_to: issued.return_to,
        })
    }

    fn user(&self, grant: &str, namespace: &str, name: &str) -> Option<String> {
        self.user_of(grant, (namespace, name, None))
    }

    fn port_user(&self, grant: &str, target: &PortTarget) -> Option<String> {
        self.user_of(grant, (&target.namespace, &target.name, Some(target.port)))
    }

    /// The end of the grant's session, or of the grant itself ([`NotebookSignIn::end_grants`]).
    fn revocation(&self, grant: &str) -> Option<Revocation> {
        let grants = self.grants.read().ok()?;
        let held = grants.get(grant)?;
        let session_ended = Box::pin(self.auth.sessions.ended(&held.grant.session));
        let mut watching = held.ended.subscribe();
        let grant_ended = Box::pin(async move {
            // Nothing is ever sent: an error means the grant, and its sender, is gone.
            while watching.changed().await.is_ok() {}
        });
        Some(Box::pin(async move {
            futures::future::select(session_ended, grant_ended).await;
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign_in(lifetime: Duration) -> (NotebookSignIn, Arc<LocalAuth>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let auth = Arc::new(LocalAuth::open(dir.path(), crate::users::SESSION_COOKIE).unwrap());
        auth.users.add("alice", false).unwrap();
        auth.users.add("bob", false).unwrap();
        (
            NotebookSignIn::with_code_lifetime(auth.clone(), lifetime),
            auth,
            dir,
        )
    }

    const RETURN: &str = "/notebook/alice/lab/lab?x=1";

    #[test]
    fn a_ports_grant_opens_that_port_only_and_a_notebooks_no_port() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("alice").unwrap();
        let port = |port| PortTarget {
            namespace: "alice".into(),
            name: "lab".into(),
            port,
        };
        let code = sign_in
            .issue_for(&session, "alice", ("alice", "lab", Some(8050)), "s1", "/")
            .unwrap();
        // Not on the notebook's own host, nor another port's.
        assert_eq!(
            sign_in.redeem(&code, "lab--alice", "s1"),
            Err(CodeRefused::OtherNotebook)
        );
        let code = sign_in
            .issue_for(&session, "alice", ("alice", "lab", Some(8050)), "s1", "/")
            .unwrap();
        assert_eq!(
            sign_in.redeem(&code, "8051--lab--alice", "s1"),
            Err(CodeRefused::OtherNotebook)
        );
        let code = sign_in
            .issue_for(&session, "alice", ("alice", "lab", Some(8050)), "s1", "/")
            .unwrap();
        let grant = sign_in
            .redeem(&code, "8050--lab--alice", "s1")
            .unwrap()
            .grant;
        assert_eq!(
            sign_in.port_user(&grant, &port(8050)).as_deref(),
            Some("alice")
        );
        assert_eq!(sign_in.port_user(&grant, &port(8051)), None);
        assert_eq!(sign_in.user(&grant, "alice", "lab"), None);
        // The notebook's grant opens no port.
        let code = sign_in
            .issue(&session, "alice", "alice", "lab", "s2", RETURN)
            .unwrap();
        let grant = sign_in.redeem(&code, "lab--alice", "s2").unwrap().grant;
        assert_eq!(sign_in.port_user(&grant, &port(8050)), None);
        // Signing out ends a port's grant too.
        auth.sessions.end(&session);
        let code_after =
            sign_in.issue_for(&session, "alice", ("alice", "lab", Some(8050)), "s3", "/");
        let grant = sign_in
            .redeem(&code_after.unwrap(), "8050--lab--alice", "s3")
            .map(|r| r.grant);
        assert!(grant.is_ok_and(|g| sign_in.port_user(&g, &port(8050)).is_none()));
    }

    #[test]
    fn a_code_is_traded_once_for_a_grant_to_its_notebook() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("alice").unwrap();
        let code = sign_in
            .issue(&session, "alice", "alice", "lab", "s1", RETURN)
            .unwrap();
        let redeemed = sign_in.redeem(&code, "lab--alice", "s1").unwrap();
        assert_eq!(redeemed.return_to, RETURN);
        assert_eq!(
            sign_in.user(&redeemed.grant, "alice", "lab").as_deref(),
            Some("alice")
        );
        assert_eq!(sign_in.user(&redeemed.grant, "alice", "other"), None);
        assert_eq!(
            sign_in.redeem(&code, "lab--alice", "s1"),
            Err(CodeRefused::Unknown),
            "reused"
        );
    }

    #[test]
    fn codes_for_another_notebook_or_browser_or_expired_are_refused_and_used_up() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("alice").unwrap();
        let issue = || {
            sign_in
                .issue(&session, "alice", "alice", "lab", "s1", RETURN)
                .unwrap()
        };
        let code = issue();
        assert_eq!(
            sign_in.redeem(&code, "lab--bob", "s1"),
            Err(CodeRefused::OtherNotebook)
        );
        assert_eq!(
            sign_in.redeem(&code, "lab--alice", "s1"),
            Err(CodeRefused::Unknown)
        );
        let code = issue();
        assert_eq!(
            sign_in.redeem(&code, "lab--alice", "bobs-state"),
            Err(CodeRefused::OtherBrowser),
            "presented by another browser than the one sent for it"
        );
        let code = issue();
        assert_eq!(
            sign_in.redeem(&code, "lab--alice", ""),
            Err(CodeRefused::OtherBrowser)
        );
        assert_eq!(sign_in.grants(), 0);

        let (short, auth, _dir) = sign_in_with_expiry();
        let session = auth.sessions.start("alice").unwrap();
        let code = short
            .issue(&session, "alice", "alice", "lab", "s1", RETURN)
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            short.redeem(&code, "lab--alice", "s1"),
            Err(CodeRefused::Expired)
        );
    }

    fn sign_in_with_expiry() -> (NotebookSignIn, Arc<LocalAuth>, tempfile::TempDir) {
        sign_in(Duration::from_millis(10))
    }

    #[tokio::test]
    async fn a_grant_ends_with_its_session() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("alice").unwrap();
        let grant_of = |session: &str| {
            let code = sign_in
                .issue(session, "alice", "alice", "lab", "s", RETURN)
                .unwrap();
            sign_in.redeem(&code, "lab--alice", "s").unwrap().grant
        };
        let grant = grant_of(&session);
        let ended = sign_in.revocation(&grant).unwrap();
        auth.sessions.end(&session);
        tokio::time::timeout(Duration::from_secs(1), ended)
            .await
            .expect("the tunnel's revocation fires at sign-out");
        assert_eq!(sign_in.user(&grant, "alice", "lab"), None, "signed out");

        let session = auth.sessions.start("alice").unwrap();
        let grant = grant_of(&session);
        auth.users.remove("alice").unwrap();
        assert_eq!(sign_in.user(&grant, "alice", "lab"), None, "user removed");
    }

    #[tokio::test]
    async fn ending_a_users_grants_to_one_notebook_leaves_their_session_and_other_grants() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("bob").unwrap();
        let grant_to = |name: &str| {
            let code = sign_in
                .issue(&session, "bob", "alice", name, "s", RETURN)
                .unwrap();
            sign_in
                .redeem(&code, &format!("{name}--alice"), "s")
                .unwrap()
                .grant
        };
        let (lab, other) = (grant_to("lab"), grant_to("other"));
        let ended = sign_in.revocation(&lab).unwrap();
        let ended_count =
            sign_in.end_grants(|user, ns, name| (user, ns, name) == ("bob", "alice", "lab"));
        assert_eq!(ended_count, 1);
        tokio::time::timeout(Duration::from_secs(1), ended)
            .await
            .expect("the websockets opened with the grant close");
        assert_eq!(sign_in.user(&lab, "alice", "lab"), None);
        assert_eq!(
            sign_in.user(&other, "alice", "other").as_deref(),
            Some("bob")
        );
        assert_eq!(auth.sessions.user(&session).as_deref(), Some("bob"));
    }

    #[test]
    fn codes_made_for_a_user_in_a_flood_cannot_lock_them_out() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("alice").unwrap();
        let issue = |state: &str| {
            sign_in
                .issue(&session, "alice", "alice", "lab", state, RETURN)
                .unwrap()
        };
        // A page keeps having codes made for its visitor; the visitor's own sign-in, in the
        // middle of it, goes through, until the flood has pushed it out.
        let first = issue("s0");
        let flood: Vec<String> = (0..MAX_CODES_PER_USER * 4)
            .map(|i| issue(&format!("f{i}")))
            .collect();
        let own = issue("own");
        assert!(sign_in.redeem(&own, "lab--alice", "own").is_ok());
        assert_eq!(
            sign_in.redeem(&first, "lab--alice", "s0"),
            Err(CodeRefused::Unknown),
            "the oldest made way"
        );
        let last = flood.last().unwrap();
        let state = format!("f{}", flood.len() - 1);
        assert!(sign_in.redeem(last, "lab--alice", &state).is_ok());
        let outstanding = sign_in.codes.lock().unwrap().len();
        assert_eq!(
            outstanding,
            MAX_CODES_PER_USER - 2,
            "one user's codes stay bounded"
        );
        // Other users are not touched.
        let bob = auth.sessions.start("bob").unwrap();
        let code = sign_in
            .issue(&bob, "bob", "bob", "lab", "b", "/notebook/bob/lab/")
            .unwrap();
        assert!(sign_in.redeem(&code, "lab--bob", "b").is_ok());
    }

    #[test]
    fn a_new_sign_in_replaces_the_sessions_grant_for_that_notebook() {
        let (sign_in, auth, _dir) = sign_in(CODE_LIFETIME);
        let session = auth.sessions.start("alice").unwrap();
        for _ in 0..3 {
            let code = sign_in
                .issue(&session, "alice", "alice", "lab", "s", RETURN)
                .unwrap();
            sign_in.redeem(&code, "lab--alice", "s").unwrap();
        }
        assert_eq!(sign_in.grants(), 1);
    }
}
