//! Which images a namespace may run: a saved image belongs to the namespace it was saved in.
//!
//! Saves push to `<saves registry>/<namespace>/<notebook>:<tag>`, and what a user installed,
//! typed or left in their workspace's environment is in those layers. A notebook may run images
//! of the catalog, of any registry but the platform's own, and of its own namespace's
//! repositories there; another namespace's only when that namespace shared the image with it
//! (admins: any). Which names are namespaces is the platform's to say (the web app asks). The
//! refusal reads the same whether or not the image exists, so it tells nobody which tags
//! another namespace has.

use crate::validate::FieldError;

/// The registry (and path) saves push below, `<this>/<namespace>/…`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavesRegistry {
    host: String,
    port: Option<String>,
    /// Path components before the namespace (`team` in `registry.example.com/team`).
    path: Vec<String>,
}

impl SavesRegistry {
    /// `registry` as saves are configured with it: `host[:port][/path]`.
    pub fn new(registry: &str) -> Self {
        let mut components = registry.trim_end_matches('/').split('/');
        let (host, port) = split_host(components.next().unwrap_or_default());
        Self {
            host,
            port,
            path: components.map(str::to_owned).collect(),
        }
    }

    /// The namespace whose repository `image` names in this registry, if it names one. Hosts
    /// are compared as a registry would be reached: case and a trailing dot aside, and on this
    /// machine's loopback any name for it, with the same port.
    pub fn namespace_of(&self, image: &str) -> Option<String> {
        let name = image.split('@').next().unwrap_or(image);
        let (first, rest) = name.split_once('/')?;
        // Docker's rule: the first component is a registry when it has a '.' or ':' or is
        // `localhost`; otherwise the image is on Docker Hub.
        if !(first.contains('.') || first.contains(':') || first == "localhost") {
            return None;
        }
        let (host, port) = split_host(first);
        let number = |port: Option<&str>| port.unwrap_or("443").parse::<u16>().ok();
        let same_port = number(port.as_deref()) == number(self.port.as_deref());
        let same_host = host == self.host || (is_loopback(&host) && is_loopback(&self.host));
        if !(same_host && same_port) {
            return None;
        }
        let mut components = rest.split('/');
        for expected in &self.path {
            if components.next()? != expected {
                return None;
            }
        }
        let namespace = components.next()?;
        // `<registry>/<ns>:tag` has no namespace component: the tag is not a namespace.
        let namespace = namespace.split(':').next().unwrap_or(namespace);
        components.next()?;
        Some(namespace.to_ascii_lowercase())
    }
}

/// A lowercase host without a trailing dot, and its port.
fn split_host(authority: &str) -> (String, Option<String>) {
    let authority = authority.to_ascii_lowercase();
    let (host, port) = match authority.rsplit_once(':') {
        // `[::1]:5000`, `host:5000`; a bare IPv6 literal keeps its colons.
        Some((host, port))
            if port.chars().all(|c| c.is_ascii_digit())
                && (!host.contains(':') || host.ends_with(']')) =>
        {
            (host.to_owned(), Some(port.to_owned()))
        }
        _ => (authority.clone(), None),
    };
    (host.trim_end_matches('.').to_owned(), port)
}

/// `localhost`, a name below it, or a loopback address: this machine, whatever it is called.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    crate::users::is_localhost(host)
        || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            let ip = match ip {
                std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, Into::into),
                v4 => v4,
            };
            ip.is_loopback() || ip.is_unspecified()
        })
}

/// A notebook image asked for by a user.
#[derive(Debug)]
pub struct ImageRequest<'a> {
    pub image: &'a str,
    /// The namespace of the notebook that would run it.
    pub namespace: &'a str,
    pub admin: bool,
    pub in_catalog: bool,
}

/// The other namespace whose repository `request`'s image is in, when nothing else lets it run
/// (an admin asking, the catalog, an image of another registry or of the requester's own
/// namespace): it runs only if that namespace keeps saves there and shared it.
pub fn foreign_owner(
    registry: Option<&SavesRegistry>,
    request: &ImageRequest<'_>,
) -> Option<String> {
    if request.admin || request.in_catalog {
        return None;
    }
    let owner = registry?.namespace_of(request.image)?;
    (owner != request.namespace).then_some(owner)
}

/// The refusal of `image` in a notebook of `namespace`: the same words for every tag of `owner`'s
/// repositories, there or not.
pub fn refusal(image: &str, owner: &str, namespace: &str) -> FieldError {
    FieldError::new(
        "image",
        format!(
            "{image} is in namespace {owner}'s saved images, which namespace {namespace} may run only if {owner} shares it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_images_namespace_is_read_from_its_repository_however_the_registry_is_named() {
        let local = SavesRegistry::new("127.0.0.1:5000");
        for (image, owner) in [
            ("127.0.0.1:5000/alice/lab:saved-1", Some("alice")),
            ("localhost:5000/alice/lab:saved-1", Some("alice")),
            ("LOCALHOST.:5000/Alice/lab@sha256:00", Some("alice")),
            ("[::1]:5000/alice/lab:v1", Some("alice")),
            ("[::ffff:127.0.0.1]:5000/alice/lab:v1", Some("alice")),
            ("0.0.0.0:5000/alice/lab:v1", Some("alice")),
            ("127.0.0.2:5000/alice/lab:v1", Some("alice")),
            ("registry.localhost:5000/alice/lab:v1", Some("alice")),
            ("127.0.0.1:5001/alice/lab:v1", None),
            ("127.0.0.1:05000/alice/lab:v1", Some("alice")),
            ("127.0.0.1:5000/alice:v1", None),
            ("alice/lab:v1", None),
            ("docker.io/alice/lab:v1", None),
            ("registry.example.com/alice/lab:v1", None),
        ] {
            assert_eq!(local.namespace_of(image).as_deref(), owner, "{image}");
        }
        let team = SavesRegistry::new("Registry.Example.com/team/");
        for (image, owner) in [
            ("registry.example.com/team/bob/lab:v1", Some("bob")),
            ("registry.example.com:443/team/bob/lab:v1", Some("bob")),
            ("registry.example.com/other/bob/lab:v1", None),
            ("registry.example.com:5000/team/bob/lab:v1", None),
            ("localhost/team/bob/lab:v1", None),
        ] {
            assert_eq!(team.namespace_of(image).as_deref(), owner, "{image}");
        }
    }

    #[test]
    fn another_namespaces_image_is_foreign_unless_an_admin_or_the_catalog_asks() {
        let registry = SavesRegistry::new("127.0.0.1:5000");
        let request = |image, admin, in_catalog| ImageRequest {
            image,
            namespace: "bob",
            admin,
            in_catalog,
        };
        let alices = "127.0.0.1:5000/alice/lab:saved-1";
        assert_eq!(
            foreign_owner(Some(&registry), &request(alices, false, false)).as_deref(),
            Some("alice")
        );
        for allowed in [
            request("127.0.0.1:5000/bob/lab:v1", false, false),
            request(alices, true, false),
            request(alices, false, true),
            request("quay.io/jupyter/base-notebook:latest", false, false),
        ] {
            assert_eq!(
                foreign_owner(Some(&registry), &allowed),
                None,
                "{allowed:?}"
            );
        }
        assert_eq!(foreign_owner(None, &request(alices, false, false)), None);
        // The same words whether or not such a tag exists: nothing here asks the registry.
        let missing = "127.0.0.1:5000/alice/lab:no-such-tag";
        let words = |image: &str| refusal(image, "alice", "bob").message.replace(image, "");
        assert_eq!(words(alices), words(missing));
        assert_eq!(refusal(alices, "alice", "bob").field, "image");
    }
}
