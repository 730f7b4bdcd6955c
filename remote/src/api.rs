//! Calls to a labforge server's API as the CLI makes them: with an API token, or, to make one,
//! with a session signed in by name and password.

use crate::RemoteError;
use crate::credentials::Credentials;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde::Deserialize;
use serde_json::{Value, json};

/// A server and how requests to it are signed in.
pub struct Api {
    pub url: String,
    http: reqwest::Client,
    auth: Auth,
}

enum Auth {
    Token(String),
    /// The session cookie a sign-in set, as `name=value`.
    Session(String),
}

/// A notebook the user may open, as `config-ssh` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotebookRef {
    pub namespace: String,
    pub name: String,
}

/// A token just made.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MadeToken {
    pub token: String,
    pub expires: String,
}

fn http() -> reqwest::Client {
    // Upgrades (the SSH websocket) are HTTP/1.1's.
    reqwest::Client::builder()
        .http1_only()
        .user_agent(concat!("labforge-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

/// The error a refused request carries: the API's `error` message, else the body.
pub(crate) async fn refusal(response: reqwest::Response) -> RemoteError {
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["error"].as_str().map(String::from))
        .unwrap_or(body);
    RemoteError::Refused { status, message }
}

impl Api {
    /// The server and token of `credentials`.
    pub fn with_token(credentials: &Credentials) -> Self {
        Self {
            url: credentials.url.clone(),
            http: http(),
            auth: Auth::Token(credentials.token.clone()),
        }
    }

    /// Signs in to the server at `url` as `user` with `password`, for making a token.
    pub async fn sign_in(url: &str, user: &str, password: &str) -> Result<Self, RemoteError> {
        let http = http();
        let response = http
            .post(format!("{url}/api/login"))
            .json(&json!({"username": user, "password": password}))
            .send()
            .await
            .map_err(|source| RemoteError::Unreachable {
                url: url.to_owned(),
                source,
            })?;
        if !response.status().is_success() {
            return Err(refusal(response).await);
        }
        let cookie = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.split(';').next())
            .find(|v| v.contains("labforge_session="))
            .ok_or_else(|| RemoteError::Refused {
                status: response.status().as_u16(),
                message: "the server signed in but set no session".into(),
            })?;
        Ok(Self {
            url: url.to_owned(),
            http,
            auth: Auth::Session(cookie.to_owned()),
        })
    }

    /// A request to `path` (`/api/...`), signed in.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.url));
        match &self.auth {
            Auth::Token(token) => request.bearer_auth(token),
            Auth::Session(cookie) => request.header(COOKIE, cookie),
        }
    }

    /// Sends `request` and reads its JSON answer, or the server's refusal.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, RemoteError> {
        let response = request
            .send()
            .await
            .map_err(|source| RemoteError::Unreachable {
                url: self.url.clone(),
                source,
            })?;
        if !response.status().is_success() {
            return Err(refusal(response).await);
        }
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        response
            .json()
            .await
            .map_err(|source| RemoteError::Unreachable {
                url: self.url.clone(),
                source,
            })
    }

    pub async fn get(&self, path: &str) -> Result<Value, RemoteError> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// The signed-in user's name.
    pub async fn whoami(&self) -> Result<String, RemoteError> {
        let answer = self.get("/api/whoami").await?;
        Ok(answer["name"].as_str().unwrap_or_default().to_owned())
    }

    /// Makes an API token named `name` lasting `expires_in`.
    pub async fn make_token(&self, name: &str, expires_in: &str) -> Result<MadeToken, RemoteError> {
        let request = self
            .request(reqwest::Method::POST, "/api/tokens")
            .json(&json!({"name": name, "expiresIn": expires_in}));
        let answer = self.send(request).await?;
        serde_json::from_value(answer).map_err(|e| RemoteError::Refused {
            status: 200,
            message: format!("the server's answer is not a token: {e}"),
        })
    }

    /// Ends the session a sign-in started (a token made with it lives on).
    pub async fn sign_out(&self) {
        let _ = self
            .request(reqwest::Method::POST, "/api/logout")
            .send()
            .await;
    }

    /// The running or stopped notebooks the user may open: those of every namespace they may
    /// change, and those shared with them.
    pub async fn notebooks(&self) -> Result<Vec<NotebookRef>, RemoteError> {
        let namespaces = self.get("/api/namespaces").await?;
        let mut found = Vec::new();
        let roles = &namespaces["roles"];
        for ns in namespaces["namespaces"].as_array().into_iter().flatten() {
            let Some(ns) = ns.as_str() else { continue };
            if roles[ns].as_str() == Some("view") {
                continue;
            }
            let list = self.get(&format!("/api/namespaces/{ns}/notebooks")).await?;
            found.extend(names(ns, &list["notebooks"]));
        }
        let shared = self.get("/api/shared").await?;
        for notebook in shared["notebooks"].as_array().into_iter().flatten() {
            if let (Some(namespace), Some(name)) =
                (notebook["namespace"].as_str(), notebook["name"].as_str())
            {
                found.push(NotebookRef {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                });
            }
        }
        found.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        found.dedup();
        Ok(found)
    }
}

fn names(namespace: &str, notebooks: &Value) -> Vec<NotebookRef> {
    notebooks
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["name"].as_str())
        .map(|name| NotebookRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .collect()
}
