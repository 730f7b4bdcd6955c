//! Ports of `labforge up`'s notebooks ([`labforge_proxy::ports`]): the label names a notebook of
//! the store, its owner's sharing says who may open it, and each connection is carried by the
//! agent in the notebook's container (`podman exec`), so that no port is published.

use crate::engine_workloads::EngineWorkloads;
use crate::store::Store;
use labforge_crds::host::{port_host_label, port_in_label};
use labforge_proxy::ports::{NotebookPorts, PortError, PortStream, PortTarget};
use labforge_web::users::LocalAuth;
use labforge_web::workloads::{AgentCommand, Workloads as _};
use std::sync::Arc;
use tokio::io::AsyncReadExt as _;

/// What the agent says first, at most, before a connection's bytes.
const MAX_GREETING: usize = 256;

pub struct EnginePorts {
    pub store: Arc<Store>,
    pub auth: Arc<LocalAuth>,
    pub workloads: EngineWorkloads,
}

#[async_trait::async_trait]
impl NotebookPorts for EnginePorts {
    fn resolve(&self, label: &str) -> Option<PortTarget> {
        let port = port_in_label(label)?;
        let target = |namespace: &str, name: &str| PortTarget {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        };
        // The readable form names its notebook; a hashed one is looked for among them all.
        let rest = label.split_once("--").map(|(_, rest)| rest)?;
        if let Some((name, namespace)) = rest.split_once("--")
            && port_host_label(namespace, name, port) == label
            && self.store.get(namespace, name).is_some()
        {
            return Some(target(namespace, name));
        }
        self.store.list(None).into_iter().find_map(|notebook| {
            let namespace = notebook.metadata.namespace.as_deref()?;
            let name = notebook.metadata.name.as_deref()?;
            (port_host_label(namespace, name, port) == label).then(|| target(namespace, name))
        })
    }

    fn may_open(&self, user: &str, target: &PortTarget) -> bool {
        self.store
            .get(&target.namespace, &target.name)
            .is_some_and(|notebook| self.auth.may_open_port(user, &notebook, target.port))
    }

    async fn connect(&self, target: &PortTarget) -> Result<Box<dyn PortStream>, PortError> {
        let (ns, name, port) = (&target.namespace, &target.name, target.port);
        let running = self
            .store
            .get(ns, name)
            .and_then(|notebook| notebook.status)
            .is_some_and(|status| status.ready_replicas > 0);
        if !running {
            return Err(PortError::NotRunning);
        }
        let mut stream = self
            .workloads
            .agent(ns, name, AgentCommand::Connect(port))
            .await
            .map_err(|e| PortError::Unavailable(e.to_string()))?;
        // The agent says it connected before the connection's first byte; without that,
        // nothing listens there.
        let mut greeting = Vec::new();
        loop {
            match stream.read_u8().await {
                Ok(b'\n') => break,
                Ok(byte) if greeting.len() < MAX_GREETING => greeting.push(byte),
                _ => return Err(PortError::NotListening(port)),
            }
        }
        if greeting != labforge_web::workloads::AGENT_CONNECTED.as_bytes() {
            return Err(PortError::NotListening(port));
        }
        Ok(Box::new(stream))
    }
}
