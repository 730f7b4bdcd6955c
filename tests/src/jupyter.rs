//! Talking to a real Jupyter server the way its web UI does.

use crate::tools::SupportError;

/// A Jupyter server reached at `base` (e.g. `http://127.0.0.1:PORT/notebook/ns/name`), with the
/// XSRF token its API wants on every non-GET request (Jupyter sets it as a cookie on page loads).
pub struct JupyterClient {
    http: reqwest::Client,
    base: String,
    xsrf: String,
    /// Cookies given by the caller (a proxy's session), sent along with `_xsrf`.
    cookies: Option<String>,
    headers: reqwest::header::HeaderMap,
    /// For an `https` base: the one certificate trusted (PEM).
    certificate: Option<Vec<u8>>,
}

/// A websocket to a notebook server, over TLS or not.
pub type KernelSocket = tokio_tungstenite::WebSocketStream<
    tokio_util::either::Either<
        tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        tokio::net::TcpStream,
    >,
>;

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
        Self::connect_with(base, headers, None).await
    }

    /// Like [`Self::connect_with_headers`]; an `https` base is trusted with `certificate` (PEM),
    /// websockets included.
    pub async fn connect_with(
        base: &str,
        headers: reqwest::header::HeaderMap,
        certificate: Option<&[u8]>,
    ) -> Result<Self, SupportError> {
        crate::init_crypto();
        let mut headers = headers;
        let cookies = headers
            .remove(reqwest::header::COOKIE)
            .and_then(|v| v.to_str().ok().map(str::to_owned));
        let client_error = |detail: String| SupportError::Command {
            command: format!("building a client for {base}"),
            detail,
        };
        let mut http = reqwest::Client::builder().default_headers(headers.clone());
        if let Some(pem) = certificate {
            http = http.add_root_certificate(
                reqwest::Certificate::from_pem(pem).map_err(|e| client_error(e.to_string()))?,
            );
        }
        let http = http.build().map_err(|e| client_error(e.to_string()))?;
        let failed = |detail: String| SupportError::Command {
            command: format!("GET {base}/lab"),
            detail,
        };
        let mut request = http.get(format!("{base}/lab"));
        if let Some(cookies) = &cookies {
            request = request.header(reqwest::header::COOKIE, cookies);
        }
        let response = request.send().await.map_err(|e| failed(e.to_string()))?;
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
            cookies,
            headers,
            certificate: certificate.map(<[u8]>::to_vec),
        })
    }

    /// The XSRF token (Jupyter wants it as `_xsrf` cookie and header, websockets included).
    pub fn xsrf(&self) -> &str {
        &self.xsrf
    }

    /// The Cookie header for this server: the caller's cookies and `_xsrf`.
    pub fn cookie_header(&self) -> String {
        match &self.cookies {
            Some(cookies) => format!("{cookies}; _xsrf={}", self.xsrf),
            None => format!("_xsrf={}", self.xsrf),
        }
    }

    /// A new kernel's channels websocket, opened as JupyterLab opens it.
    pub async fn kernel_channels(&self) -> Result<KernelSocket, SupportError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let kernel = self
            .post("/api/kernels", &serde_json::json!({"name": "python3"}))
            .await?;
        let id = kernel["id"].as_str().unwrap_or_default().to_owned();
        let url = format!(
            "{}/api/kernels/{id}/channels",
            self.base.replacen("http", "ws", 1)
        );
        let failed = |detail: String| SupportError::Command {
            command: format!("kernel websocket {url}"),
            detail,
        };
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| failed(e.to_string()))?;
        for (name, value) in &self.headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let cookie = self
            .cookie_header()
            .parse()
            .map_err(|_| failed("cookie".into()))?;
        request.headers_mut().insert("cookie", cookie);
        let xsrf = self.xsrf.parse().map_err(|_| failed("xsrf".into()))?;
        request.headers_mut().insert("x-xsrftoken", xsrf);
        self.websocket(request)
            .await
            .map_err(|e| failed(e.to_string()))
    }

    /// Runs `code` in a new kernel over its websocket (as JupyterLab does) and returns what it
    /// printed; an error names the exception the code raised.
    pub async fn run_code(&self, code: &str) -> Result<String, SupportError> {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let mut socket = self.kernel_channels().await?;
        let failed = |detail: String| SupportError::Command {
            command: format!("running code in a kernel at {}", self.base),
            detail,
        };
        let msg_id = format!("labforge-{}", jiff::Timestamp::now().as_nanosecond());
        let execute = serde_json::json!({
            "header": {"msg_id": msg_id, "username": "labforge", "session": "labforge-tests",
                       "msg_type": "execute_request", "version": "5.3",
                       "date": jiff::Timestamp::now().to_string()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": false, "store_history": false,
                        "user_expressions": {}, "allow_stdin": false, "stop_on_error": true}
        });
        socket
            .send(Message::text(execute.to_string()))
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut printed = String::new();
        while let Some(message) = socket.next().await {
            let Ok(Message::Text(text)) = message else {
                continue;
            };
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
            if value["parent_header"]["msg_id"] != msg_id.as_str() {
                continue;
            }
            match value["msg_type"].as_str() {
                Some("stream") => {
                    printed.push_str(value["content"]["text"].as_str().unwrap_or_default())
                }
                Some("error") => {
                    return Err(failed(format!(
                        "{}: {} (printed before: {printed})",
                        value["content"]["ename"], value["content"]["evalue"]
                    )));
                }
                Some("status") if value["content"]["execution_state"] == "idle" => {
                    return Ok(printed);
                }
                _ => {}
            }
        }
        Err(failed(format!(
            "closed before the code finished; printed: {printed}"
        )))
    }

    /// Opens a websocket: over TLS trusting only [`Self::certificate`] for a `wss` URL.
    async fn websocket(
        &self,
        request: tokio_tungstenite::tungstenite::handshake::client::Request,
    ) -> Result<KernelSocket, Box<dyn std::error::Error + Send + Sync>> {
        use rustls::pki_types::pem::PemObject;
        use tokio_util::either::Either;
        let uri = request.uri().clone();
        let host = uri.host().ok_or("no host in the URL")?.to_owned();
        let secure = uri.scheme_str() == Some("wss");
        let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        let stream = if secure {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in rustls::pki_types::CertificateDer::pem_slice_iter(
                self.certificate
                    .as_deref()
                    .ok_or("wss without a certificate to trust")?,
            ) {
                roots.add(certificate?)?;
            }
            let config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from(host)?;
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            Either::Left(connector.connect(name, tcp).await?)
        } else {
            Either::Right(tcp)
        };
        let (socket, _) = tokio_tungstenite::client_async(request, stream).await?;
        Ok(socket)
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
            .header(reqwest::header::COOKIE, self.cookie_header())
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
