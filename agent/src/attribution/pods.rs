//! GPU → pod straight from the kubelet: the pod-resources API
//! (`k8s.io/kubelet/pkg/apis/podresources/v1`, `PodResourcesLister.List`)
//! on the kubelet's Unix socket lists every pod's containers and the
//! devices the device plugins gave them. For `nvidia.com/gpu` the device
//! ids are GPU UUIDs, so this maps GPUs to pods without looking at a
//! single process, and it names the pod, namespace and container.

use super::AttributionError;
use futures::future::BoxFuture;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The generated kubelet pod-resources messages, client and server (the
/// server half lets tests stand in for the kubelet).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("v1");
}

/// One device assigned to one container of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDevice {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Extended resource, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// Device id as the device plugin reported it.
    pub device_id: String,
}

/// Lists the devices assigned to pods on this node.
pub trait PodResolver: Send + Sync {
    /// Every (pod, container, device) the node's pods hold.
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevice>, AttributionError>>;
}

/// Largest `List` reply accepted (the kubelet's own limit is 16 MiB).
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// The kubelet's pod-resources socket, through tonic over a Unix socket.
///
/// The channel is created on first use and reconnects by itself; a socket
/// file that does not exist is [`AttributionError::NoSocket`] without any
/// connection attempt (nodes without Kubernetes).
pub struct KubeletPodResolver {
    socket: PathBuf,
    timeout: Duration,
    channel: Mutex<Option<tonic::transport::Channel>>,
}

impl std::fmt::Debug for KubeletPodResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletPodResolver")
            .field("socket", &self.socket)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KubeletPodResolver {
    /// A resolver for the socket at `socket`; each `List` call gives up
    /// after `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
            channel: Mutex::new(None),
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn channel(&self) -> Result<tonic::transport::Channel, AttributionError> {
        let mut slot = self
            .channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let path = self
            .socket
            .to_str()
            .ok_or_else(|| AttributionError::BadSocket(self.socket.clone()))?;
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{path}"))
            .map_err(|_| AttributionError::BadSocket(self.socket.clone()))?
            .connect_timeout(self.timeout)
            .connect_lazy();
        *slot = Some(channel.clone());
        Ok(channel)
    }

    async fn list_devices(&self) -> Result<Vec<PodDevice>, AttributionError> {
        if !tokio::fs::try_exists(&self.socket).await.unwrap_or(false) {
            return Err(AttributionError::NoSocket(self.socket.clone()));
        }
        let mut client =
            proto::pod_resources_lister_client::PodResourcesListerClient::new(self.channel()?)
                .max_decoding_message_size(MAX_REPLY_BYTES);
        let reply =
            tokio::time::timeout(self.timeout, client.list(proto::ListPodResourcesRequest {}))
                .await
                .map_err(|_| AttributionError::Timeout(self.timeout))?
                .map_err(|s| AttributionError::PodResources(Box::new(s)))?;
        Ok(flatten(reply.into_inner()))
    }
}

impl PodResolver for KubeletPodResolver {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevice>, AttributionError>> {
        Box::pin(self.list_devices())
    }
}

/// One [`PodDevice`] per device id in a `List` reply.
pub fn flatten(reply: proto::ListPodResourcesResponse) -> Vec<PodDevice> {
    let mut out = Vec::new();
    for pod in reply.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                for id in &d.device_ids {
                    out.push(PodDevice {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                        resource: d.resource_name.clone(),
                        device_id: id.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Whether a resource names NVIDIA GPUs (`nvidia.com/gpu`,
/// `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`, ...).
fn is_gpu_resource(resource: &str) -> bool {
    resource.starts_with("nvidia.com/")
}

/// The inventory index a device id names: a UUID (`GPU-…`, `MIG-…`, with a
/// time-slicing replica suffix `::N` dropped), or a bare index (the device
/// plugin's `index` id strategy).
pub fn device_gpu(device_id: &str, uuids: &[String]) -> Option<usize> {
    let id = device_id.split("::").next().unwrap_or(device_id).trim();
    if let Some(i) = uuids.iter().position(|u| u.eq_ignore_ascii_case(id)) {
        return Some(i);
    }
    let index: usize = id.parse().ok()?;
    (index < uuids.len()).then_some(index)
}

/// The pod holding each GPU, by inventory index: `None` for GPUs no pod
/// holds, and for GPUs several pods share (time-slicing), which the
/// process cgroups decide instead.
pub fn gpu_pods(devices: &[PodDevice], uuids: &[String]) -> Vec<Option<PodDevice>> {
    let mut holders: Vec<Vec<&PodDevice>> = vec![Vec::new(); uuids.len()];
    for d in devices.iter().filter(|d| is_gpu_resource(&d.resource)) {
        if let Some(g) = device_gpu(&d.device_id, uuids) {
            holders[g].push(d);
        }
    }
    holders
        .into_iter()
        .map(|h| {
            let first = *h.first()?;
            h.iter()
                .all(|d| d.namespace == first.namespace && d.pod == first.pod)
                .then(|| first.clone())
        })
        .collect()
}
