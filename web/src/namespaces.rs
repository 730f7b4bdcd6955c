//! Namespaces and their members in the embedded mode, as Kubeflow's Profiles with contributors,
//! and the one rule that says what a user may do to a namespace's notebooks.
//!
//! Every user owns the namespace named after them. An admin adds team namespaces with an owner
//! (`labforge namespace add`); an owner lets others in as `edit` (create, start, stop, delete,
//! save and open the notebooks) or `view` (list them, their status, events and logs; open
//! nothing). A notebook shared with a user (its `labforge.dev/shared-with` annotation) lets that
//! user see and open that one notebook. [`allows`] is the rule: the web app's checks and the
//! proxy's all go through it. The members live in `namespaces.json` in the data dir, which the CLI
//! and a running server both edit.

use crate::json_file::{FileError, JsonFile};
use crate::users::{RESERVED_NAMESPACE, User, Users};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What a user is to a namespace.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees its notebooks; opens and changes none.
    View,
    /// Creates, starts, stops, deletes, saves and opens its notebooks.
    Edit,
    /// Everything `edit` does, and manages the members.
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::View => "view",
            Role::Edit => "edit",
            Role::Owner => "owner",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = NamespaceError;

    /// A member's role as given (`edit` or `view`; the owner is named by `namespace add`).
    fn from_str(role: &str) -> Result<Self, Self::Err> {
        match role {
            "edit" => Ok(Role::Edit),
            "view" => Ok(Role::View),
            other => Err(NamespaceError::BadRole(other.to_owned())),
        }
    }
}

/// What is done to a namespace's notebooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// List them; read one's status, events and logs.
    View,
    /// Create, start, stop, delete, save; change saved images and volumes.
    Change,
    /// Open a notebook's server (through the proxy): whoever does works as its owner.
    Open,
    /// Add and remove members.
    Manage,
}

/// The rule: whether a user who is `role` to a namespace (an admin: `admin`), with the notebook
/// in question shared with them or not, may do `action`.
pub fn allows(admin: bool, role: Option<Role>, shared_with_them: bool, action: Action) -> bool {
    if admin {
        return true;
    }
    match action {
        Action::View => role.is_some() || shared_with_them,
        Action::Open => role >= Some(Role::Edit) || shared_with_them,
        Action::Change => role >= Some(Role::Edit),
        Action::Manage => role == Some(Role::Owner),
    }
}

/// A namespace with an owner other than the one named after its user, or a user's own with
/// members: what `namespaces.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub name: String,
    pub owner: String,
    /// User → `edit` or `view`.
    #[serde(default)]
    pub members: BTreeMap<String, Role>,
}

/// A namespace as a user or admin is shown it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceView {
    pub name: String,
    pub owner: String,
    /// The asking user's role there (an admin's where they are no member: `owner`).
    pub role: Role,
    /// User → `edit` or `view`, besides the owner.
    pub members: BTreeMap<String, Role>,
}

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("{0}")]
    InvalidName(String),
    #[error("namespace {0} exists already")]
    Exists(String),
    #[error("no namespace {0}")]
    NotFound(String),
    #[error("no user {0}")]
    NoSuchUser(String),
    #[error("{user} is not a member of namespace {namespace}")]
    NotAMember { namespace: String, user: String },
    #[error("{user} owns namespace {namespace}: an owner's role is not changed or removed")]
    Owner { namespace: String, user: String },
    #[error("role {0:?}: give edit or view")]
    BadRole(String),
    #[error(transparent)]
    File(#[from] FileError),
}

impl NamespaceError {
    /// The request field the error is about, where it is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            NamespaceError::InvalidName(_) | NamespaceError::Exists(_) => Some("name"),
            NamespaceError::NoSuchUser(_) | NamespaceError::Owner { .. } => Some("user"),
            NamespaceError::BadRole(_) => Some("role"),
            _ => None,
        }
    }
}

/// The namespaces file, re-read when it changes on disk.
pub struct Namespaces {
    file: JsonFile<Vec<Entry>>,
}

impl Namespaces {
    pub fn open(data_dir: &Path) -> Result<Self, FileError> {
        Ok(Self {
            file: JsonFile::open(data_dir.join("namespaces.json"))?,
        })
    }

    /// Reads the file again if it changed. The last good read stands on an error: a file being
    /// fixed by hand locks nobody out.
    fn refresh(&self) {
        if let Err(err) = self.file.refresh() {
            tracing::warn!(error = %err, "re-reading the namespaces file");
        }
    }

    fn entries(&self) -> Vec<Entry> {
        self.refresh();
        self.file.get()
    }

    /// Whether a team namespace of this name exists (a user of that name cannot be added).
    pub fn is_team_namespace(&self, name: &str) -> bool {
        self.entries()
            .iter()
            .any(|e| e.name == name && e.owner != name)
    }

    /// What `user` is to `namespace`: its owner (their own, or one they were made owner of), a
    /// member, or nothing.
    pub fn role_of(&self, user: &User, namespace: &str) -> Option<Role> {
        if user.namespace == namespace {
            return Some(Role::Owner);
        }
        self.refresh();
        self.file
            .read(|entries| {
                let entry = entries.iter().find(|e| e.name == namespace)?;
                if entry.owner == user.name {
                    Some(Role::Owner)
                } else {
                    entry.members.get(&user.name).copied()
                }
            })
            .flatten()
    }

    /// The namespaces `user` is in, their own first; an admin is shown every one.
    pub fn of(&self, user: &User, users: &Users) -> Vec<NamespaceView> {
        let entries = self.entries();
        let mut names: Vec<(String, String)> = users
            .list()
            .into_iter()
            .map(|u| (u.namespace, u.name))
            .collect();
        for entry in &entries {
            if !names.iter().any(|(ns, _)| *ns == entry.name) {
                names.push((entry.name.clone(), entry.owner.clone()));
            }
        }
        let mut shown: Vec<NamespaceView> = names
            .into_iter()
            .filter_map(|(name, personal_owner)| {
                let entry = entries.iter().find(|e| e.name == name);
                let owner = entry.map_or(personal_owner, |e| e.owner.clone());
                let role = self
                    .role_of(user, &name)
                    .or(user.admin.then_some(Role::Owner))?;
                Some(NamespaceView {
                    members: entry.map(|e| e.members.clone()).unwrap_or_default(),
                    name,
                    owner,
                    role,
                })
            })
            .collect();
        shown.sort_by(|a, b| {
            (a.name != user.namespace, &a.name).cmp(&(b.name != user.namespace, &b.name))
        });
        shown
    }

    /// One namespace as `user` sees it, if they are in it (or an admin).
    pub fn view(&self, user: &User, users: &Users, namespace: &str) -> Option<NamespaceView> {
        self.of(user, users)
            .into_iter()
            .find(|ns| ns.name == namespace)
    }

    /// Adds team namespace `name`, owned by `owner`.
    pub fn add(&self, name: &str, owner: &str, users: &Users) -> Result<(), NamespaceError> {
        crate::validate::dns_label("name", name)
            .map_err(|e| NamespaceError::InvalidName(e.message))?;
        if name == RESERVED_NAMESPACE {
            return Err(NamespaceError::InvalidName(format!(
                "{name} is reserved: the local registry keeps the catalog's images under {name}/"
            )));
        }
        users.refresh().map_err(|e| match e {
            crate::users::UserError::File(file) => NamespaceError::File(file),
            other => NamespaceError::InvalidName(other.to_string()),
        })?;
        if users.get(owner).is_none() {
            return Err(NamespaceError::NoSuchUser(owner.to_owned()));
        }
        let mut entries = self.entries();
        if users.list().iter().any(|u| u.namespace == name)
            || entries.iter().any(|e| e.name == name)
        {
            return Err(NamespaceError::Exists(name.to_owned()));
        }
        entries.push(Entry {
            name: name.to_owned(),
            owner: owner.to_owned(),
            members: BTreeMap::new(),
        });
        Ok(self.file.write(&entries)?)
    }

    /// Makes `user` a member of `namespace` as `role` (replacing the role they had).
    pub fn set_member(
        &self,
        namespace: &str,
        user: &str,
        role: Role,
        users: &Users,
    ) -> Result<(), NamespaceError> {
        if role == Role::Owner {
            return Err(NamespaceError::BadRole("owner".into()));
        }
        if users.get(user).is_none() {
            return Err(NamespaceError::NoSuchUser(user.to_owned()));
        }
        let mut entries = self.entries();
        let index = match entries.iter().position(|e| e.name == namespace) {
            Some(index) => index,
            None => {
                // A user's own namespace gets an entry with its first member.
                let owner = users
                    .list()
                    .into_iter()
                    .find(|u| u.namespace == namespace)
                    .ok_or_else(|| NamespaceError::NotFound(namespace.to_owned()))?;
                entries.push(Entry {
                    name: namespace.to_owned(),
                    owner: owner.name,
                    members: BTreeMap::new(),
                });
                entries.len() - 1
            }
        };
        let entry = &mut entries[index];
        let owns_it = users.get(user).is_some_and(|u| u.namespace == namespace);
        if entry.owner == user || owns_it {
            return Err(NamespaceError::Owner {
                namespace: namespace.to_owned(),
                user: user.to_owned(),
            });
        }
        entry.members.insert(user.to_owned(), role);
        Ok(self.file.write(&entries)?)
    }

    /// Takes `user` out of `namespace`.
    pub fn remove_member(&self, namespace: &str, user: &str) -> Result<(), NamespaceError> {
        let mut entries = self.entries();
        let not_a_member = || NamespaceError::NotAMember {
            namespace: namespace.to_owned(),
            user: user.to_owned(),
        };
        let entry = entries
            .iter_mut()
            .find(|e| e.name == namespace)
            .ok_or_else(not_a_member)?;
        if entry.owner == user {
            return Err(NamespaceError::Owner {
                namespace: namespace.to_owned(),
                user: user.to_owned(),
            });
        }
        entry.members.remove(user).ok_or_else(not_a_member)?;
        Ok(self.file.write(&entries)?)
    }

    /// Every namespace, with its owner and members (the CLI's `namespace list`).
    pub fn list(&self, users: &Users) -> Vec<NamespaceView> {
        let admin = User {
            name: String::new(),
            namespace: String::new(),
            admin: true,
            password_hash: String::new(),
        };
        self.of(&admin, users)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_gives_view_sight_edit_work_owners_members_and_shares_one_notebook() {
        use Action::*;
        let can = |role, shared, action| allows(false, role, shared, action);
        for action in [View, Change, Open, Manage] {
            assert!(allows(true, None, false, action), "admins do all");
            assert!(can(Some(Role::Owner), false, action));
            assert!(!can(None, false, action), "strangers do nothing");
        }
        assert!(can(Some(Role::Edit), false, Open) && can(Some(Role::Edit), false, Change));
        assert!(!can(Some(Role::Edit), false, Manage));
        assert!(can(Some(Role::View), false, View));
        assert!(!can(Some(Role::View), false, Open) && !can(Some(Role::View), false, Change));
        // A share opens and shows that notebook, and changes nothing.
        assert!(can(None, true, Open) && can(None, true, View));
        assert!(!can(None, true, Change) && !can(Some(Role::View), true, Manage));
    }

    #[test]
    fn owners_and_members_are_kept_and_bad_changes_are_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        for name in ["alice", "bob", "carol"] {
            users.add(name, false).unwrap();
        }
        let namespaces = Namespaces::open(dir.path()).unwrap();
        namespaces.add("ml-team", "alice", &users).unwrap();
        assert!(matches!(
            namespaces.add("ml-team", "bob", &users),
            Err(NamespaceError::Exists(_))
        ));
        assert!(matches!(
            namespaces.add("bob", "alice", &users),
            Err(NamespaceError::Exists(_))
        ));
        assert!(matches!(
            namespaces.add("Team", "alice", &users),
            Err(NamespaceError::InvalidName(_))
        ));
        assert!(matches!(
            namespaces.add("other", "nobody", &users),
            Err(NamespaceError::NoSuchUser(_))
        ));
        namespaces
            .set_member("ml-team", "bob", Role::Edit, &users)
            .unwrap();
        // A user's own namespace takes members too.
        namespaces
            .set_member("carol", "bob", Role::View, &users)
            .unwrap();
        assert!(matches!(
            namespaces.set_member("ml-team", "alice", Role::View, &users),
            Err(NamespaceError::Owner { .. })
        ));
        assert!(matches!(
            namespaces.set_member("nowhere", "bob", Role::View, &users),
            Err(NamespaceError::NotFound(_))
        ));
        assert!(matches!(
            "admin".parse::<Role>(),
            Err(NamespaceError::BadRole(_))
        ));

        // Another process (a running server) reads the same file.
        let other = Namespaces::open(dir.path()).unwrap();
        let bob = users.get("bob").unwrap();
        let alice = users.get("alice").unwrap();
        assert_eq!(other.role_of(&alice, "ml-team"), Some(Role::Owner));
        assert_eq!(other.role_of(&bob, "ml-team"), Some(Role::Edit));
        assert_eq!(other.role_of(&bob, "carol"), Some(Role::View));
        assert_eq!(other.role_of(&alice, "carol"), None);
        let bobs: Vec<(String, Role)> = other
            .of(&bob, &users)
            .into_iter()
            .map(|ns| (ns.name, ns.role))
            .collect();
        assert_eq!(
            bobs,
            [
                ("bob".to_string(), Role::Owner),
                ("carol".to_string(), Role::View),
                ("ml-team".to_string(), Role::Edit)
            ]
        );
        assert!(other.is_team_namespace("ml-team") && !other.is_team_namespace("carol"));

        namespaces.remove_member("ml-team", "bob").unwrap();
        assert_eq!(other.role_of(&bob, "ml-team"), None);
        assert!(matches!(
            namespaces.remove_member("ml-team", "bob"),
            Err(NamespaceError::NotAMember { .. })
        ));
    }
}
