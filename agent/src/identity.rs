//! Who this node is: hostname and kernel boot id.

use flopwatch_proto::model::NodeIdentity;
use std::collections::BTreeMap;

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The hostname (`/proc/sys/kernel/hostname`), or "localhost".
pub(crate) fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into())
}

/// The kernel boot id, or a fixed marker where there is none.
pub fn boot_id() -> String {
    read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_else(|| "unknown-boot".into())
}

/// This node's identity; `node_id` empty means the hostname.
pub fn node_identity(node_id: &str, labels: BTreeMap<String, String>) -> NodeIdentity {
    let hostname = hostname();
    NodeIdentity {
        node_id: if node_id.is_empty() {
            hostname.clone()
        } else {
            node_id.to_string()
        },
        hostname,
        boot_id: boot_id(),
        labels,
    }
}
