//! Talking to a real Jupyter server the way its web UI does.

use crate::tools::SupportError;

/// A Jupyter server reached at `base` (e.g. `http://127.0.0.1:PORT/notebook/ns/name`), with the
/// XSRF token its API wants on every non-GET request (Jupyter sets it as a cookie on page loads).
pub struct JupyterClient {
    http: reqwest::Client,
    base: String,
    xsrf: String,
}

impl JupyterClient {
    pub async fn connect(base: &str) -> Result<Self, SupportError> {
        Self::connect_with_headers(base, reqwest::header::HeaderMap::new()).await
    }

    /// Like [`Self::connect`], sending `headers` on every request (e.g. the user header a proxy
    /// in front of the server wants).
    pub async fn connect_with_headers(
        base: &str,
        headers: reqwest::header::HeaderMap,
    ) -> Result<Self, SupportError> {
        crate::init_crypto();
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|e| SupportError::Command {
                command: format!("building a client for {base}"),
                detail: e.to_string(),
            })?;
        let failed = |detail: String| SupportError::Command {
            command: format!("GET {base}/lab"),
            detail,
        };
        let response = http
            .get(format!("{base}/lab"))
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let xsrf = response
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| c.strip_prefix("_xsrf="))
            .and_then(|c| c.split(';').next())
            .ok_or_else(|| failed(format!("no _xsrf cookie (HTTP {})", response.status())))?
            .to_owned();
        Ok(Self {
            http,
            base: base.to_owned(),
            xsrf,
        })
    }

    /// The XSRF token (Jupyter wants it as `_xsrf` cookie and header, websockets included).
    pub fn xsrf(&self) -> &str {
        &self.xsrf
    }

    /// POSTs JSON to an API path (`/api/kernels`, ...) and returns the JSON answer.
    pub async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, SupportError> {
        let url = format!("{}{path}", self.base);
        let failed = |detail: String| SupportError::Command {
            command: format!("POST {url}"),
            detail,
        };
        let response = self
            .http
            .post(&url)
            .header("X-XSRFToken", &self.xsrf)
            .header(reqwest::header::COOKIE, format!("_xsrf={}", self.xsrf))
            .json(body)
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| failed(e.to_string()))?;
        if !status.is_success() {
            return Err(failed(format!("HTTP {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| failed(format!("{e}: {text}")))
    }
}
