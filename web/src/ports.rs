//! Web servers users run in their notebooks, each at a host of its own
//! ([`labforge_proxy::ports`]): whom a notebook's owner shares each port with, and who may open
//! one. The API that lists the ports and changes their sharing is [`crate::api::ports`].

use crate::namespaces::Action;
use crate::users::LocalAuth;
use labforge_crds::notebook::Notebook;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The annotation holding each shared port's sharing, as JSON (`{"8050": "namespace"}`); a
/// port it does not name is private.
pub const PORT_SHARING_ANNOTATION: &str = "labforge.dev/port-sharing";

/// Whom a port is open to, besides its notebook's owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PortSharing {
    /// Those who may open the notebook.
    #[default]
    Private,
    /// Every member of the notebook's namespace, viewers too.
    Namespace,
    /// Every signed-in user.
    All,
}

/// Each shared port's sharing, as the notebook's annotation says.
pub fn port_sharings(notebook: &Notebook) -> BTreeMap<u16, PortSharing> {
    notebook
        .annotation(PORT_SHARING_ANNOTATION)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default()
}

/// Port `port`'s sharing.
pub fn port_sharing(notebook: &Notebook, port: u16) -> PortSharing {
    port_sharings(notebook)
        .get(&port)
        .copied()
        .unwrap_or_default()
}

impl LocalAuth {
    /// Whether `user` may open port `port` of `notebook`: as its owner shared it.
    pub fn may_open_port(&self, user: &str, notebook: &Notebook, port: u16) -> bool {
        let namespace = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let Some(account) = self.users.get(user) else {
            return false;
        };
        match port_sharing(notebook, port) {
            PortSharing::All => true,
            PortSharing::Namespace => crate::namespaces::allows(
                account.admin,
                self.role_of(&account, namespace),
                false,
                Action::View,
            ),
            PortSharing::Private => {
                self.may_open_notebook(user, namespace, &notebook.shared_with())
            }
        }
    }
}
