//! What handlers take from a request: the signed-in user and what they may do, and a query
//! string refused in the API's error shape.

use crate::backend::Verb;
use crate::namespaces::Action;
use crate::users::{SessionCookie, User};
use axum::extract::{FromRequestParts, Query, RawPathParams};
use axum::http::{StatusCode, request::Parts};
use labforge_crds::notebook::Notebook;
use serde::Deserialize;
use std::marker::PhantomData;
use utoipa::IntoParams;

use super::notebooks::find;
use super::{ApiResult, ApiState, Failure};

/// A query string read into `T`; one that cannot be is refused in the API's error shape.
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Failure> {
        let Query(query) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(query))
    }
}

/// The signed-in user of a request.
pub struct SignedIn(pub User);

impl FromRequestParts<ApiState> for SignedIn {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Failure> {
        if crate::tokens::bearer(&parts.headers).is_some() {
            return state
                .access
                .identify(&parts.headers)
                .await
                .map(SignedIn)
                .ok_or_else(|| {
                    Failure::new(
                        StatusCode::UNAUTHORIZED,
                        "this API token is revoked, expired or unknown: make a new one on the \
                         Tokens page or with `labforge login`",
                    )
                });
        }
        let several = state
            .local_users
            .as_ref()
            .is_some_and(|auth| auth.session_cookie(&parts.headers) == SessionCookie::Several);
        if several {
            return Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                "this request carried more than one session cookie, and which one is yours \
                 cannot be told (a page of another host may have set one): sign in again",
            ));
        }
        state
            .access
            .identify(&parts.headers)
            .await
            .map(SignedIn)
            .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "sign in first"))
    }
}

impl SignedIn {
    pub(crate) async fn may(&self, state: &ApiState, verb: Verb, namespace: &str) -> ApiResult<()> {
        if state.access.may(&self.0, verb, Some(namespace)).await {
            Ok(())
        } else {
            Err(self.refused(verb, namespace))
        }
    }

    fn refused(&self, verb: Verb, namespace: &str) -> Failure {
        Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not {} notebooks in namespace {namespace}",
                self.0.name,
                verb.as_str()
            ),
        )
    }

    /// Notebook `namespace/name`, if the user may do `action` to it: by their role in its
    /// namespace, or because it is shared with them. Who may not learns nothing of whether it
    /// exists.
    pub(crate) async fn notebook(
        &self,
        state: &ApiState,
        action: Action,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Notebook> {
        let verb = match action {
            Action::View => Verb::Get,
            // Opening runs code as the owner: asked as a change (a viewer does not open).
            Action::Open | Action::Change | Action::Manage => Verb::Update,
        };
        if state.access.may(&self.0, verb, Some(namespace)).await {
            return find(state, namespace, name).await;
        }
        match state.backend.get(namespace, name).await? {
            Some(notebook) if state.access.may_on(&self.0, action, &notebook).await => Ok(notebook),
            _ => Err(self.refused(verb, namespace)),
        }
    }

    /// Admins only: whoever may list notebooks in every namespace.
    pub(crate) async fn must_be_admin(&self, state: &ApiState) -> ApiResult<()> {
        if state.access.may(&self.0, Verb::List, None).await {
            Ok(())
        } else {
            Err(Failure::new(StatusCode::FORBIDDEN, "admins only"))
        }
    }
}

/// A namespace named by the path (`/api/namespaces/{ns}/…`).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct NamespacePath {
    /// The namespace.
    pub ns: String,
}

/// A notebook named by the path (`/api/namespaces/{ns}/notebooks/{name}/…`).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct NotebookPath {
    /// Its namespace.
    pub ns: String,
    /// The notebook's name.
    pub name: String,
}

/// What a handler asks to do to a namespace's notebooks, as a type: [`Allowed`] checks it.
pub(crate) trait AskedVerb {
    const VERB: Verb;
}

/// The verbs, one type each.
pub(crate) mod verb {
    use super::{AskedVerb, Verb};

    pub(crate) struct List;
    pub(crate) struct Get;
    pub(crate) struct Create;
    pub(crate) struct Update;
    pub(crate) struct Delete;

    impl AskedVerb for List {
        const VERB: Verb = Verb::List;
    }
    impl AskedVerb for Get {
        const VERB: Verb = Verb::Get;
    }
    impl AskedVerb for Create {
        const VERB: Verb = Verb::Create;
    }
    impl AskedVerb for Update {
        const VERB: Verb = Verb::Update;
    }
    impl AskedVerb for Delete {
        const VERB: Verb = Verb::Delete;
    }
}

/// The signed-in user, allowed `V` on the notebooks of the path's namespace (`{ns}`): one
/// extractor for the check every namespaced route makes first, refused 401 or 403 before the
/// handler runs.
pub(crate) struct Allowed<V> {
    pub user: SignedIn,
    pub ns: String,
    verb: PhantomData<V>,
}

impl<V: AskedVerb + Send> FromRequestParts<ApiState> for Allowed<V> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Failure> {
        let user = SignedIn::from_request_parts(parts, state).await?;
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| Failure::new(rejection.status(), rejection.body_text()))?;
        let ns = params
            .iter()
            .find_map(|(key, value)| (key == "ns").then(|| value.to_owned()))
            .ok_or_else(|| {
                Failure::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "this route names no namespace",
                )
            })?;
        user.may(state, V::VERB, &ns).await?;
        Ok(Self {
            user,
            ns,
            verb: PhantomData,
        })
    }
}
