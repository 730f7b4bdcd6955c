//! Leader election on a `coordination.k8s.io` Lease, so several controller replicas can run for
//! availability while only one reconciles.
//!
//! The holder renews the lease every `renew_every`; another replica takes it over only after it has
//! not been renewed for `lease_duration`. Writes carry the lease's resourceVersion, so two replicas
//! racing for an expired lease cannot both win: the API server rejects the second with a Conflict.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::Duration;

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration,
        }
    }

    /// Takes or renews the lease; returns whether this replica holds it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, seconds, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(err) => Err(err),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref();
        let renewed = spec.renew_time.as_ref().map(|t| t.0);
        let held_by_me = holder == Some(self.identity.as_str());
        let expired = renewed.is_none_or(|t| {
            now.duration_since(t)
                > SignedDuration::from_secs(i64::from(
                    spec.lease_duration_seconds.unwrap_or(seconds),
                ))
        });
        if !held_by_me && holder.is_some() && !expired {
            return Ok(false);
        }
        let acquired = if held_by_me {
            spec.acquire_time.map_or(now, |t| t.0)
        } else {
            now
        };
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!held_by_me);
        lease.spec = Some(self.spec(acquired, seconds, now, transitions));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err),
        }
    }

    fn spec(
        &self,
        acquired: Timestamp,
        seconds: i32,
        renewed: Timestamp,
        transitions: i32,
    ) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self, retry_every: Duration) -> Result<(), kube::Error> {
        loop {
            if self.try_acquire_or_renew().await? {
                return Ok(());
            }
            tokio::time::sleep(retry_every).await;
        }
    }

    /// Renews until the lease is lost, then returns. It counts as lost when another replica holds
    /// it, or when no renewal succeeded within two thirds of the lease duration: the holder steps
    /// down before any other replica may take over, even if its requests hang.
    pub async fn hold(&self, renew_every: Duration) {
        let deadline = self.lease_duration * 2 / 3;
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(renew_every).await;
            match tokio::time::timeout(renew_every, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_renewal = tokio::time::Instant::now(),
                Ok(Ok(false)) => return,
                Ok(Err(err)) => tracing::warn!(error = %err, "lease renewal failed"),
                Err(_) => tracing::warn!("lease renewal timed out"),
            }
            if last_renewal.elapsed() > deadline {
                return;
            }
        }
    }
}
