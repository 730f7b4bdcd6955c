//! Local users and sessions for the embedded mode, where no auth proxy stands in front.
//!
//! Users live in `users.json` in the data dir with argon2 password hashes; `labforge user add`
//! edits the same file, and a running server picks the change up. Each user owns the namespace of
//! their name; admins see every namespace. Sessions are random tokens in an HttpOnly cookie, kept
//! in memory: a restart signs everyone out, and nothing secret is on disk besides the hashes.
//! The same sessions identify requests in the proxy ([`IdentitySource`]), so the web app and
//! notebooks share one login.

use crate::json_file::{FileError, JsonFile};
use crate::namespaces::{Action, Namespaces, Role, allows};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine as _;
use http::HeaderMap;
use labforge_proxy::authz::{Answer, Identity, IdentitySource, NamespaceAccess, Revocation};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

/// The session cookie's name where the browser would not keep a `__Host-` cookie: plain HTTP
/// on a host other than `localhost`'s own family.
pub const SESSION_COOKIE: &str = "labforge_session";
/// The session cookie's name wherever the browser keeps `__Host-` cookies (TLS, and plain HTTP on
/// `localhost` and its subdomains): a page of another host, a notebook's among them, cannot set a
/// cookie of this name, not even for a parent domain, so it cannot plant a session beside the
/// visitor's own.
pub const HOST_SESSION_COOKIE: &str = "__Host-labforge_session";
/// No user may have this name: the local registry keeps the platform's images (the catalog's)
/// under `labforge/`, where a user of that name would save.
pub const RESERVED_NAMESPACE: &str = "labforge";
/// A session ends this long after sign-in (not extended by use: the proxy checks sessions on
/// every request, and a read lock keeps that cheap).
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("{0}")]
    InvalidName(String),
    #[error("user {0} exists already")]
    Exists(String),
    #[error("no user {0}")]
    NotFound(String),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("starting the password-check threads: {0}")]
    Threads(#[source] std::io::Error),
    #[error("hashing the password: {0}")]
    Hash(String),
    #[error("no randomness: {0}")]
    Random(String),
    #[error(transparent)]
    Tokens(#[from] crate::tokens::TokenError),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub name: String,
    pub namespace: String,
    pub admin: bool,
    /// PHC string (argon2id).
    pub password_hash: String,
}

/// `len` random bytes as URL-safe base64.
pub fn random_token(len: usize) -> Result<String, UserError> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| UserError::Random(e.to_string()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

pub(crate) fn hash_password(password: &str) -> Result<String, UserError> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| UserError::Random(e.to_string()))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| UserError::Hash(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| UserError::Hash(e.to_string()))
}

/// Whether `password` hashes to the PHC string `hash` (argon2, its parameters from `hash`).
pub(crate) fn password_matches(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|hash| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok()
    })
}

/// The users file, re-read when it changes on disk.
pub struct Users {
    file: JsonFile<Vec<User>>,
}

impl Users {
    pub fn open(data_dir: &Path) -> Result<Self, UserError> {
        Ok(Self {
            file: JsonFile::open(data_dir.join("users.json"))?,
        })
    }

    /// The data dir the users file is in.
    pub fn data_dir(&self) -> &Path {
        self.file.path().parent().unwrap_or(Path::new("."))
    }

    /// Re-reads the file if it changed since the last read.
    pub fn refresh(&self) -> Result<(), UserError> {
        Ok(self.file.refresh()?)
    }

    pub fn list(&self) -> Vec<User> {
        self.file.get()
    }

    /// One user (the proxy asks on every request: only the match is copied).
    pub fn get(&self, name: &str) -> Option<User> {
        self.file
            .read(|users| users.iter().find(|u| u.name == name).cloned())
            .flatten()
    }

    fn write(&self, users: &[User]) -> Result<(), UserError> {
        Ok(self.file.write(&users.to_vec())?)
    }

    /// Adds a user with a new random password, which is returned (and stored only hashed).
    pub fn add(&self, name: &str, admin: bool) -> Result<String, UserError> {
        crate::validate::dns_label("user", name)
            .map_err(|e| UserError::InvalidName(e.to_string()))?;
        if name == RESERVED_NAMESPACE {
            return Err(UserError::InvalidName(format!(
                "{name} is reserved: the local registry keeps the catalog's images under {name}/"
            )));
        }
        self.refresh()?;
        let mut users = self.list();
        if users.iter().any(|u| u.name == name) {
            return Err(UserError::Exists(name.to_owned()));
        }
        if Namespaces::open(self.data_dir())?.is_team_namespace(name) {
            return Err(UserError::InvalidName(format!(
                "{name} is a team namespace: a user's namespace is named after them"
            )));
        }
        let password = random_token(15)?;
        users.push(User {
            name: name.to_owned(),
            namespace: name.to_owned(),
            admin,
            password_hash: hash_password(&password)?,
        });
        self.write(&users)?;
        Ok(password)
    }

    /// Gives `name` a new random password, which is returned.
    pub fn reset_password(&self, name: &str) -> Result<String, UserError> {
        self.refresh()?;
        let mut users = self.list();
        let user = users
            .iter_mut()
            .find(|u| u.name == name)
            .ok_or_else(|| UserError::NotFound(name.to_owned()))?;
        let password = random_token(15)?;
        user.password_hash = hash_password(&password)?;
        self.write(&users)?;
        Ok(password)
    }

    pub fn remove(&self, name: &str) -> Result<(), UserError> {
        self.refresh()?;
        let mut users = self.list();
        let before = users.len();
        users.retain(|u| u.name != name);
        if users.len() == before {
            return Err(UserError::NotFound(name.to_owned()));
        }
        self.write(&users)
    }

    /// On first start: an admin with a random password, returned to be printed once.
    pub fn ensure_admin(&self) -> Result<Option<(String, String)>, UserError> {
        self.refresh()?;
        if !self.list().is_empty() {
            return Ok(None);
        }
        let password = self.add("admin", true)?;
        Ok(Some(("admin".to_owned(), password)))
    }

    /// The user, if `password` is theirs. Signing in goes through [`crate::sign_in::SignIn`],
    /// which runs this check on its own threads.
    pub fn verify(&self, name: &str, password: &str) -> Option<User> {
        let _ = self.refresh();
        let user = self.get(name)?;
        password_matches(password, &user.password_hash).then_some(user)
    }
}

/// Signed-in sessions: token → user name and sign-in time.
#[derive(Default)]
pub struct Sessions {
    map: RwLock<HashMap<String, Session>>,
}

struct Session {
    user: String,
    started: Instant,
    /// The user's password hash at sign-in ([`Sessions::sign_in`]), or when the session was
    /// first checked: `labforge user reset` changes it, and that ends the session.
    hash: OnceLock<String>,
    /// Dropped with the session: what [`Sessions::ended`] waits for (open websocket tunnels).
    ended: tokio::sync::watch::Sender<()>,
}

/// How often [`LocalAuth::watch_sessions`] looks for sessions whose user was removed or reset
/// by another process (the CLI).
pub const SESSION_CHECK_PERIOD: Duration = Duration::from_secs(2);

impl Sessions {
    pub fn start(&self, user: &str) -> Result<String, UserError> {
        let token = random_token(32)?;
        if let Ok(mut map) = self.map.write() {
            let now = Instant::now();
            map.retain(|_, session| now.duration_since(session.started) < SESSION_LIFETIME);
            map.insert(
                token.clone(),
                Session {
                    user: user.to_owned(),
                    started: now,
                    hash: OnceLock::new(),
                    ended: tokio::sync::watch::Sender::new(()),
                },
            );
        }
        Ok(token)
    }

    /// Starts a session for `user`, who just signed in with their current password: a reset
    /// from then on ends it.
    pub fn sign_in(&self, user: &User) -> Result<String, UserError> {
        let token = self.start(&user.name)?;
        self.holds(&token, &user.password_hash);
        Ok(token)
    }

    pub fn end(&self, token: &str) {
        if let Ok(mut map) = self.map.write() {
            map.remove(token);
        }
    }

    pub fn user(&self, token: &str) -> Option<String> {
        let map = self.map.read().ok()?;
        let session = map.get(token)?;
        (session.started.elapsed() < SESSION_LIFETIME).then(|| session.user.clone())
    }

    /// Ends every session of `user` (removed users).
    pub fn end_user(&self, user: &str) {
        if let Ok(mut map) = self.map.write() {
            map.retain(|_, session| session.user != user);
        }
    }

    /// Resolves once the session of `token` has ended (signed out, its user removed or reset,
    /// expired), at once if it has already.
    pub fn ended(&self, token: &str) -> impl Future<Output = ()> + Send + 'static {
        let watching = self
            .map
            .read()
            .ok()
            .and_then(|map| map.get(token).map(|session| session.ended.subscribe()));
        async move {
            if let Some(mut watching) = watching {
                // Nothing is ever sent: an error means the session, and its sender, is gone.
                while watching.changed().await.is_ok() {}
            }
        }
    }

    /// Whether the session of `token` was started with `hash` as its user's password hash; the
    /// first check records it.
    fn holds(&self, token: &str, hash: &str) -> bool {
        let Ok(map) = self.map.read() else {
            return false;
        };
        map.get(token)
            .is_some_and(|session| session.hash.get_or_init(|| hash.to_owned()) == hash)
    }

    /// Ends the sessions that expired, whose user is not among `users`, or whose user's
    /// password changed.
    fn end_invalid(&self, users: &[User]) {
        if let Ok(mut map) = self.map.write() {
            map.retain(|_, session| {
                let user = users.iter().find(|u| u.name == session.user);
                session.started.elapsed() < SESSION_LIFETIME
                    && user.is_some_and(|user| {
                        session.hash.get_or_init(|| user.password_hash.clone())
                            == &user.password_hash
                    })
            });
        }
    }
}

/// The session cookie's name for a web app served at `host` (`None`: whatever host the browser
/// uses), over TLS or not: [`HOST_SESSION_COOKIE`] wherever browsers keep `__Host-` cookies,
/// which is over TLS and, on plain HTTP, on `localhost` and its subdomains (secure contexts).
pub fn session_cookie_name(tls: bool, host: Option<&str>) -> &'static str {
    if tls || host.is_some_and(is_localhost) {
        HOST_SESSION_COOKIE
    } else {
        SESSION_COOKIE
    }
}

/// `localhost` or a name below it, which browsers resolve to this machine by themselves.
pub fn is_localhost(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost")
}

/// The session a request's cookies carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionCookie<'h> {
    None,
    One(&'h str),
    /// More than one value: one was planted (by a page of a host that shares the web app's
    /// site), or is left from another path. Which one the browser meant cannot be told, so the
    /// request is signed in as nobody.
    Several,
}

/// Local users and sessions, as the proxy and the API see them.
pub struct LocalAuth {
    pub users: Users,
    /// Team namespaces and members ([`crate::namespaces`]).
    pub namespaces: Namespaces,
    pub sessions: Sessions,
    /// API tokens ([`crate::tokens`]).
    pub tokens: crate::tokens::Tokens,
    /// The session cookie's name ([`SESSION_COOKIE`] or [`HOST_SESSION_COOKIE`]).
    pub cookie: &'static str,
}

impl LocalAuth {
    /// The users and namespaces of `data_dir`, with sessions whose cookie is named `cookie`.
    pub fn open(data_dir: &Path, cookie: &'static str) -> Result<Self, UserError> {
        Ok(Self {
            users: Users::open(data_dir)?,
            namespaces: Namespaces::open(data_dir)?,
            sessions: Sessions::default(),
            tokens: crate::tokens::Tokens::open(data_dir)?,
            cookie,
        })
    }

    /// What `user` is to `namespace`, and so what they may do there ([`crate::namespaces::allows`]).
    pub fn role_of(&self, user: &User, namespace: &str) -> Option<Role> {
        self.namespaces.role_of(user, namespace)
    }

    /// Whether user `user` may open a notebook of `namespace` shared with `shared_with`: the
    /// rule's answer, asked by the proxy and of every notebook sign-in still held.
    pub fn may_open_notebook(&self, user: &str, namespace: &str, shared_with: &[&str]) -> bool {
        let shared = shared_with.contains(&user);
        self.users
            .get(user)
            .is_some_and(|u| allows(u.admin, self.role_of(&u, namespace), shared, Action::Open))
    }

    /// Ends the notebook sign-ins of `sign_in` whose user may no longer open that notebook (a
    /// member taken out or made `view`, a share revoked, a user removed), closing their
    /// websockets; `shares(namespace, name)` reads whom a notebook is shared with now.
    pub fn end_grants_no_longer_allowed(
        &self,
        sign_in: &crate::notebook_sign_in::NotebookSignIn,
        shares: impl Fn(&str, &str) -> Vec<String>,
    ) -> usize {
        let ended = sign_in.end_grants(|user, namespace, name| {
            let shares = shares(namespace, name);
            let shared: Vec<&str> = shares.iter().map(String::as_str).collect();
            !self.may_open_notebook(user, namespace, &shared)
        });
        if ended > 0 {
            tracing::info!(ended, "notebook sign-ins ended: access taken away");
        }
        ended
    }

    /// The session value the request carries under this instance's cookie name.
    pub fn session_cookie<'h>(&self, headers: &'h HeaderMap) -> SessionCookie<'h> {
        let mut values = labforge_proxy::notebook_host::cookies(headers, self.cookie);
        match (values.next(), values.next()) {
            (None, _) => SessionCookie::None,
            (Some(token), None) => SessionCookie::One(token),
            (Some(_), Some(_)) => SessionCookie::Several,
        }
    }

    /// The signed-in user a request carries, if the user still exists: a user removed with
    /// `labforge user remove` loses their sessions at once (one `stat` of the file per request).
    /// A request with more than one session value is nobody's.
    pub fn user_of(&self, headers: &HeaderMap) -> Option<User> {
        self.user_of_session(self.session_of(headers)?)
    }

    /// The user of API token `token`, if it is live and its user still exists.
    pub fn user_of_token(&self, token: &str) -> Option<User> {
        let name = self.tokens.user_of(token)?;
        if let Err(err) = self.users.refresh() {
            tracing::warn!(error = %err, "re-reading the users file");
        }
        self.users.get(&name)
    }

    /// The token of the request's one session cookie, valid or not.
    pub fn session_of<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        match self.session_cookie(headers) {
            SessionCookie::One(token) => Some(token),
            SessionCookie::None => None,
            SessionCookie::Several => {
                tracing::warn!(
                    cookie = self.cookie,
                    "a request carried more than one session cookie: refused as signed out"
                );
                None
            }
        }
    }

    /// The user of session `token`, if it lasts and its user still exists unchanged.
    pub fn user_of_session(&self, token: &str) -> Option<User> {
        let name = self.sessions.user(token)?;
        if let Err(err) = self.users.refresh() {
            tracing::warn!(error = %err, "re-reading the users file");
        }
        let user = self.users.get(&name)?;
        // A reset password ends the sessions signed in with the old one.
        if !self.sessions.holds(token, &user.password_hash) {
            self.sessions.end(token);
            return None;
        }
        Some(user)
    }

    /// Ends the sessions of users removed or reset on disk (by the CLI, another process), and
    /// expired ones: their tunnels close too.
    pub fn check_sessions(&self) {
        if let Err(err) = self.users.refresh() {
            tracing::warn!(error = %err, "re-reading the users file");
            return;
        }
        self.sessions.end_invalid(&self.users.list());
    }

    /// [`Self::check_sessions`] every [`SESSION_CHECK_PERIOD`], forever.
    pub async fn watch_sessions(self: std::sync::Arc<Self>) {
        let mut every = tokio::time::interval(SESSION_CHECK_PERIOD);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let auth = self.clone();
            // A stat and, when the file changed, a read: off the async threads.
            let _ = tokio::task::spawn_blocking(move || auth.check_sessions()).await;
        }
    }
}

impl IdentitySource for LocalAuth {
    fn identify(&self, headers: &HeaderMap) -> Option<Identity> {
        self.user_of(headers).map(|u| Identity { user: u.name })
    }

    /// The end of the request's session: tunnels close on sign-out, and when the user is
    /// removed or reset.
    fn revocation(&self, headers: &HeaderMap) -> Option<Revocation> {
        // An ended or unknown session's end is at once.
        let token = self.session_of(headers)?;
        Some(Box::pin(self.sessions.ended(token)))
    }
}

impl NamespaceAccess for LocalAuth {
    /// Whether the user may open notebooks of `namespace`: its owner, `edit` members, admins.
    fn may_use(&self, user: &str, namespace: &str) -> Answer {
        self.may_open(user, namespace, &[])
    }

    fn may_open(&self, user: &str, namespace: &str, shared_with: &[Arc<str>]) -> Answer {
        let shared: Vec<&str> = shared_with.iter().map(|u| &**u).collect();
        Answer::Now(self.may_open_notebook(user, namespace, &shared))
    }
    fn is_shared(&self, _namespace: &str) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_stored_hashed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        let (name, password) = users.ensure_admin().unwrap().unwrap();
        assert!(users.ensure_admin().unwrap().is_none());
        let file = std::fs::read_to_string(dir.path().join("users.json")).unwrap();
        assert!(!file.contains(&password));
        assert!(users.verify(&name, &password).unwrap().admin);
        assert!(users.verify(&name, "wrong").is_none());
        assert!(matches!(
            users.add("Bad Name", false),
            Err(UserError::InvalidName(_))
        ));
        assert!(matches!(
            users.add(RESERVED_NAMESPACE, false),
            Err(UserError::InvalidName(why)) if why.contains("reserved")
        ));
        let bob = users.add("bob", false).unwrap();
        // Another process (the `labforge user` CLI) sees the same file.
        let other = Users::open(dir.path()).unwrap();
        assert_eq!(other.verify("bob", &bob).unwrap().namespace, "bob");
        other.remove("bob").unwrap();
        assert!(users.verify("bob", &bob).is_none());
    }

    #[test]
    fn the_session_cookie_identifies_the_user() {
        let dir = tempfile::tempdir().unwrap();
        let auth = LocalAuth::open(dir.path(), SESSION_COOKIE).unwrap();
        auth.users.add("alice", false).unwrap();
        let token = auth.sessions.start("alice").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::COOKIE,
            format!("other=1; {SESSION_COOKIE}={token}")
                .parse()
                .unwrap(),
        );
        assert_eq!(auth.identify(&headers).unwrap().user, "alice");
        // A second value beside it (planted by a page of a host of the same site, another
        // user's valid session included, in any order, bytes and all) makes the request
        // nobody's: which one the browser meant cannot be told.
        let bob = {
            auth.users.add("bob", false).unwrap();
            auth.sessions.start("bob").unwrap()
        };
        for (first, second) in [(&bob, &token), (&token, &bob), (&token, &token)] {
            let mut planted = HeaderMap::new();
            planted.insert(
                http::header::COOKIE,
                http::HeaderValue::from_bytes(
                    &[
                        format!("{SESSION_COOKIE}={first}; x=").as_bytes(),
                        &[0xff],
                        format!("; {SESSION_COOKIE}={second}").as_bytes(),
                    ]
                    .concat(),
                )
                .unwrap(),
            );
            assert_eq!(auth.session_cookie(&planted), SessionCookie::Several);
            assert!(auth.identify(&planted).is_none());
            assert!(auth.revocation(&planted).is_none(), "no session to follow");
        }
        // Only this instance's cookie name counts: an unprefixed value beside the `__Host-` one
        // is someone else's cookie.
        let host_auth = LocalAuth::open(dir.path(), HOST_SESSION_COOKIE).unwrap();
        let host_token = host_auth.sessions.start("alice").unwrap();
        let mut both = HeaderMap::new();
        both.insert(
            http::header::COOKIE,
            format!("{SESSION_COOKIE}={bob}; {HOST_SESSION_COOKIE}={host_token}")
                .parse()
                .unwrap(),
        );
        assert_eq!(host_auth.identify(&both).unwrap().user, "alice");
        let may_use = |ns| matches!(auth.may_use("alice", ns), Answer::Now(true));
        assert!(may_use("alice"));
        assert!(!may_use("bob"));
        auth.users.add("root", true).unwrap();
        assert!(matches!(auth.may_use("root", "bob"), Answer::Now(true)));
        auth.sessions.end(&token);
        assert!(auth.identify(&headers).is_none());

        // Removed by another process (the CLI): the session no longer identifies anyone.
        let token = auth.sessions.start("alice").unwrap();
        headers.insert(
            http::header::COOKIE,
            format!("{SESSION_COOKIE}={token}").parse().unwrap(),
        );
        assert_eq!(auth.identify(&headers).unwrap().user, "alice");
        Users::open(dir.path()).unwrap().remove("alice").unwrap();
        assert!(auth.identify(&headers).is_none());
    }

    #[tokio::test]
    async fn a_sessions_end_is_signalled_on_sign_out_removal_and_reset() {
        use futures::FutureExt as _;
        let dir = tempfile::tempdir().unwrap();
        let auth = LocalAuth::open(dir.path(), SESSION_COOKIE).unwrap();
        auth.users.add("alice", false).unwrap();
        auth.users.add("bob", false).unwrap();
        let headers = |token: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                http::header::COOKIE,
                format!("{SESSION_COOKIE}={token}").parse().unwrap(),
            );
            headers
        };
        let ended = |token: &str| auth.revocation(&headers(token)).unwrap();

        // Signed out.
        let token = auth.sessions.start("alice").unwrap();
        let mut signal = ended(&token);
        assert!((&mut signal).now_or_never().is_none());
        auth.sessions.end(&token);
        assert!(signal.now_or_never().is_some());

        // Every session of a user ended (removed through the web app).
        let token = auth.sessions.start("bob").unwrap();
        let signal = ended(&token);
        auth.sessions.end_user("bob");
        assert!(signal.now_or_never().is_some());

        // Reset by another process: the next check ends it, and the session is gone.
        let token = auth.sessions.start("alice").unwrap();
        assert!(
            auth.identify(&headers(&token)).is_some(),
            "records the hash"
        );
        let mut signal = ended(&token);
        auth.check_sessions();
        assert!((&mut signal).now_or_never().is_none(), "nothing changed");
        Users::open(dir.path())
            .unwrap()
            .reset_password("alice")
            .unwrap();
        auth.check_sessions();
        assert!(signal.now_or_never().is_some());
        assert!(auth.identify(&headers(&token)).is_none());

        // Reset, noticed by the next request before any check.
        let token = auth.sessions.start("alice").unwrap();
        assert!(auth.identify(&headers(&token)).is_some());
        let signal = ended(&token);
        Users::open(dir.path())
            .unwrap()
            .reset_password("alice")
            .unwrap();
        assert!(auth.identify(&headers(&token)).is_none());
        assert!(signal.now_or_never().is_some());

        // Reset right after sign-in, before the session's first request: the hash recorded at
        // sign-in is the old one.
        let alice = auth.users.get("alice").unwrap();
        let token = auth.sessions.sign_in(&alice).unwrap();
        Users::open(dir.path())
            .unwrap()
            .reset_password("alice")
            .unwrap();
        assert!(auth.identify(&headers(&token)).is_none());

        // Removed by another process.
        let token = auth.sessions.start("bob").unwrap();
        let signal = ended(&token);
        auth.users.add("carol", false).unwrap();
        Users::open(dir.path()).unwrap().remove("bob").unwrap();
        auth.check_sessions();
        assert!(signal.now_or_never().is_some());

        // An unknown session has ended already.
        assert!(ended("nonsense").now_or_never().is_some());
    }
}
