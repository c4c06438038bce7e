//! Who owns a process, from its cgroup: `<proc_root>/<pid>/cgroup`.
//!
//! Every line of that file is `hierarchy:controllers:path` (cgroup v1 has
//! one line per hierarchy, v2 a single `0::path`). The path names the
//! owner in one of a few well-known shapes:
//!
//! | owner | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | Kubernetes pod | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope` | `/kubepods/burstable/pod<uid>/<id>` |
//! | Slurm job | `/system.slice/slurmstepd.scope/job_<id>/step_0/user/task_0` | `/slurm/uid_<uid>/job_<id>/step_0/task_0` |
//! | plain container | `/system.slice/docker-<id>.scope` | `/docker/<id>` |
//!
//! Container ids are 64 hex digits, bare or as `cri-containerd-<id>.scope`,
//! `docker-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`. Paths seen
//! from inside a cgroup namespace start with `/../..`; matching works on
//! path elements, so that prefix does not matter. Parsing never fails: a
//! line or path it does not recognise simply names no owner.

use std::io::Read;
use std::path::Path;

/// Most bytes read from one cgroup file (real ones are a few hundred).
const MAX_CGROUP_BYTES: u64 = 64 * 1024;

/// The owner a cgroup path names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CgroupOwner {
    /// A Kubernetes pod, by UID (with dashes), and the container when the
    /// path names one.
    Pod {
        /// Pod UID, e.g. `1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901`.
        uid: String,
        /// Full 64-hex container id.
        container_id: Option<String>,
    },
    /// A Slurm job.
    Slurm {
        /// Job id.
        job_id: String,
    },
    /// A container outside Kubernetes (Docker, Podman, containerd).
    Container {
        /// Full 64-hex container id.
        id: String,
    },
}

impl CgroupOwner {
    /// How specific the owner is; the best one across a file's lines wins.
    fn rank(&self) -> u8 {
        match self {
            CgroupOwner::Pod {
                container_id: Some(_),
                ..
            } => 4,
            CgroupOwner::Pod { .. } => 3,
            CgroupOwner::Slurm { .. } => 2,
            CgroupOwner::Container { .. } => 1,
        }
    }
}

/// The first 12 hex digits of a container id, as `docker ps` shows it.
pub fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// The owner named by the contents of a `/proc/<pid>/cgroup` file: the
/// most specific owner any line names (a pod with its container over a pod,
/// over a Slurm job, over a bare container).
pub fn parse_cgroup_file(text: &str) -> Option<CgroupOwner> {
    let mut best: Option<CgroupOwner> = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let Some(owner) = parse_cgroup_path(path) {
            if best.as_ref().is_none_or(|b| owner.rank() > b.rank()) {
                best = Some(owner);
            }
        }
    }
    best
}

/// The owner one cgroup path names, if any.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupOwner> {
    let elements: Vec<&str> = path
        .trim()
        .split('/')
        .filter(|e| !e.is_empty() && *e != "." && *e != "..")
        .collect();
    if elements.iter().any(|e| e.contains("kubepods")) {
        if let Some(uid) = elements.iter().find_map(|e| pod_uid(e)) {
            let container_id = elements.iter().rev().find_map(|e| container_id(e));
            return Some(CgroupOwner::Pod { uid, container_id });
        }
    }
    if let Some(job_id) = slurm_job(&elements) {
        return Some(CgroupOwner::Slurm { job_id });
    }
    // A bare container: its id in the last element that holds one, under a
    // known runtime's prefix (`docker-…`) or as the whole element under a
    // runtime parent (`/docker/<id>`).
    elements
        .iter()
        .rev()
        .find_map(|e| container_id(e))
        .map(|id| CgroupOwner::Container { id })
}

/// A pod UID from one path element: `kubepods-burstable-pod<uid>.slice`
/// (systemd, `_` for `-`) or `pod<uid>` (cgroupfs).
fn pod_uid(element: &str) -> Option<String> {
    let raw = if let Some(stem) = element.strip_suffix(".slice") {
        let (_, uid) = stem.rsplit_once("-pod")?;
        uid
    } else {
        element.strip_prefix("pod")?
    };
    let uid = raw.replace('_', "-").to_ascii_lowercase();
    // 36 for an API pod's UID; 32 hex for a static pod's (a config hash).
    let ok = (32..=36).contains(&uid.len())
        && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        && uid.bytes().filter(u8::is_ascii_hexdigit).count() == 32;
    ok.then_some(uid)
}

/// Runtime prefixes of a systemd scope holding a container.
const SCOPE_PREFIXES: [&str; 6] = [
    "cri-containerd-",
    "docker-",
    "crio-",
    "cri-o-",
    "libpod-",
    "nerdctl-",
];

/// A 64-hex container id from one path element: `<prefix><id>.scope` or
/// the bare id. Conmon scopes (`crio-conmon-<id>.scope`) are not the
/// container and name none.
fn container_id(element: &str) -> Option<String> {
    let id = match element.strip_suffix(".scope") {
        Some(stem) => SCOPE_PREFIXES.iter().find_map(|p| stem.strip_prefix(p))?,
        None => element,
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// A Slurm job id: a `job_<digits>` element below an element starting with
/// `slurm` (`slurm`, `slurm_<node>`, `slurmstepd.scope`, ...). With the v1
/// layout the job sits under `uid_<uid>`.
fn slurm_job(elements: &[&str]) -> Option<String> {
    let root = elements.iter().position(|e| e.starts_with("slurm"))?;
    elements[root + 1..].iter().find_map(|e| {
        let id = e.strip_prefix("job_")?;
        (!id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit()))
            .then(|| id.to_string())
    })
}

/// Reads `<proc_root>/<pid>/cgroup` (at most 64 KiB) and parses it.
///
/// `Err` when the file cannot be read: the process ended (or was never
/// there), or is not ours to read. `Ok(None)` when it names no owner.
pub fn read_owner(proc_root: &Path, pid: u32) -> std::io::Result<Option<CgroupOwner>> {
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("cgroup"))?;
    let mut bytes = Vec::new();
    file.take(MAX_CGROUP_BYTES).read_to_end(&mut bytes)?;
    Ok(parse_cgroup_file(&String::from_utf8_lossy(&bytes)))
}
