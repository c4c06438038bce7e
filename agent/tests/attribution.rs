//! Job attribution: cgroup parsing for every owner shape, the mapping
//! directory, the kubelet pod-resources client against a fake kubelet on a
//! Unix socket, precedence, and the simulated and fake-NVML sources mapped
//! through a fake `/proc` (`tests/fixtures/proc`, see its README).

use flopwatch_agent::attribution::cgroup::{
    parse_cgroup_file, parse_cgroup_path, read_owner, CgroupOwner,
};
use flopwatch_agent::attribution::mapping::read_mapping;
use flopwatch_agent::attribution::pods::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use flopwatch_agent::attribution::pods::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use flopwatch_agent::attribution::pods::{
    device_gpu, gpu_pods, KubeletPodResolver, PodDevice, PodResolver,
};
use flopwatch_agent::attribution::{
    resolve_local, Attribution, AttributionError, AttributionOptions, AttributionStats, Owner, Via,
};
use flopwatch_agent::source::sim::SimSource;
use flopwatch_agent::source::{Capture, GpuSource};
use flopwatch_proto::model::{GpuInfo, JobAssignment};
use flopwatch_sim::FleetPlan;
use futures::future::BoxFuture;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const T0: i64 = 1_700_000_000_000;

const POD_A: &str = "6c1f2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
const POD_B: &str = "0e1d2c3b-4a59-4687-a6b5-c4d3e2f1a0b9";
const CTR_A: &str = "8da390eb92c1a3dcec5f7bf162dee6fac1b42b9ec2afc385e2f609a8f51d4080";
const CTR_B: &str = "bffbc09b4e0b885235403702300ffe8c53208db37617f65c68250ce22b2cdc08";
const CTR_DOCKER: &str = "f6f6b9c6a78875c26e65a60448dec9ec0d21dcc5e801662a1444eabcdb85255e";

fn fixture_proc() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("tests/fixtures/proc")
}

fn opts(proc_root: &Path) -> AttributionOptions {
    AttributionOptions {
        enabled: true,
        proc_root: proc_root.to_path_buf(),
        pod_resources_socket: None,
        mapping_dir: None,
        mfu_dir: None,
        refresh_interval: Duration::from_secs(10),
    }
}

fn pod(uid: &str, container: Option<&str>) -> Option<CgroupOwner> {
    Some(CgroupOwner::Pod {
        uid: uid.to_string(),
        container_id: container.map(str::to_string),
    })
}

fn slurm(id: &str) -> Option<CgroupOwner> {
    Some(CgroupOwner::Slurm {
        job_id: id.to_string(),
    })
}

fn container(id: &str) -> Option<CgroupOwner> {
    Some(CgroupOwner::Container { id: id.to_string() })
}

/// A simulated 8-GPU node; every GPU runs a job (PIDs 10000..=10007).
fn sim() -> SimSource {
    SimSource::new(&FleetPlan::new(1, 8, 30_000), 0, T0, 1).with_pids(10_000)
}

fn job<'a>(c: &'a Capture, uuid: &str) -> Option<&'a JobAssignment> {
    c.jobs.iter().find(|j| j.gpu_uuid == uuid)
}

#[test]
fn cgroup_paths_name_their_owner() {
    let a = CTR_A;
    let u = POD_A.replace('-', "_");
    let static_uid = "5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c";
    let cases: Vec<(String, Option<CgroupOwner>)> = vec![
        // systemd driver (cgroup v1 or v2), each QoS class and runtime.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{a}.scope"),
            pod(POD_A, Some(a)),
        ),
        (
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{a}.scope"),
            pod(POD_A, Some(a)),
        ),
        (
            format!("/kubepods.slice/kubepods-pod{u}.slice/docker-{a}.scope"),
            pod(POD_A, Some(a)),
        ),
        // kind / nested kubelet, and a path seen from a cgroup namespace.
        (
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{a}.scope"),
            pod(POD_A, Some(a)),
        ),
        (
            format!("/../../kubepods-burstable-pod{u}.slice/cri-containerd-{a}.scope"),
            pod(POD_A, Some(a)),
        ),
        // The pod's own slice (no container), and CRI-O's conmon scope.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
            pod(POD_A, None),
        ),
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-conmon-{a}.scope"),
            pod(POD_A, None),
        ),
        // A static pod: its UID is a 32-hex config hash.
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{static_uid}.slice/cri-containerd-{a}.scope"),
            pod(static_uid, Some(a)),
        ),
        // cgroupfs driver.
        (format!("/kubepods/burstable/pod{POD_B}/{a}"), pod(POD_B, Some(a))),
        (format!("/kubepods/besteffort/pod{POD_B}/{a}"), pod(POD_B, Some(a))),
        (format!("/kubepods/pod{POD_B}/{a}"), pod(POD_B, Some(a))),
        (format!("/kubepods/pod{POD_B}"), pod(POD_B, None)),
        // Slurm: cgroup v1 (with and without a node-named root), v2.
        ("/slurm/uid_1000/job_4242/step_0/task_0".into(), slurm("4242")),
        ("/slurm/uid_1000/job_4242/step_batch".into(), slurm("4242")),
        ("/slurm_node07/uid_0/job_17/step_extern".into(), slurm("17")),
        ("/system.slice/slurmstepd.scope/job_4343/step_0/user/task_0".into(), slurm("4343")),
        ("/slurm/uid_1000/job_99/".into(), slurm("99")),
        // Plain containers.
        (format!("/system.slice/docker-{CTR_DOCKER}.scope"), container(CTR_DOCKER)),
        (format!("/docker/{CTR_DOCKER}"), container(CTR_DOCKER)),
        (format!("/machine.slice/libpod-{CTR_DOCKER}.scope"), container(CTR_DOCKER)),
        (format!("/system.slice/docker-{CTR_DOCKER}.scope/init.scope"), container(CTR_DOCKER)),
        // Nothing to name.
        ("/".into(), None),
        ("/user.slice/user-1000.slice/session-3.scope".into(), None),
        ("/system.slice/slurmd.service".into(), None),
        ("/system.slice/slurmstepd.scope/system".into(), None),
        ("/system.slice/containerd.service".into(), None),
        ("/slurm/uid_1000/job_abc/step_0".into(), None),
        ("/kubepods.slice/kubepods-burstable.slice".into(), None),
        ("/kubepods/burstable/podnot-a-uid/abc".into(), None),
        (format!("/system.slice/docker-{}.scope", &CTR_DOCKER[..63]), None),
        ("".into(), None),
    ];
    for (path, want) in cases {
        assert_eq!(parse_cgroup_path(&path), want, "{path}");
    }
}

#[test]
fn cgroup_files_take_the_most_specific_line() {
    let v1 = format!(
        "12:pids:/kubepods/besteffort/pod{POD_B}\n\
         11:memory:/kubepods/besteffort/pod{POD_B}/{CTR_B}\n\
         1:name=systemd:/system.slice/containerd.service\n0::/\n"
    );
    assert_eq!(parse_cgroup_file(&v1), pod(POD_B, Some(CTR_B)));
    // A path holding ':' is kept whole (split at the first two only).
    let colon = "0::/slurm/uid_1000/job_5/step_0:odd\n";
    assert_eq!(parse_cgroup_file(colon), slurm("5"));
    assert_eq!(parse_cgroup_file("0::/\n"), None);
    assert_eq!(parse_cgroup_file(""), None);
}

#[test]
fn garbage_cgroup_content_names_no_owner() {
    for text in [
        "not a cgroup file",
        ":::::::",
        "0:",
        "\u{0}\u{1}\u{2}",
        "12:memory",
        "x:y:/kubepods/pod/zz",
        "0::/kubepods-burstable-pod_____.slice",
        "0::/kubepods-burstable-podgggggggg_gggg_gggg_gggg_gggggggggggg.slice",
    ] {
        assert_eq!(parse_cgroup_file(text), None, "{text:?}");
    }
    // A very long line and invalid UTF-8 neither panic nor name an owner.
    let long = format!("0::/{}\n", "a/".repeat(100_000));
    assert_eq!(parse_cgroup_file(&long), None);
    assert_eq!(read_owner(&fixture_proc(), 10_006).unwrap(), None);
    // A huge file is read only in part.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("42")).unwrap();
    std::fs::write(dir.path().join("42/cgroup"), vec![b'\xff'; 1 << 20]).unwrap();
    assert_eq!(read_owner(dir.path(), 42).unwrap(), None);
}

#[test]
fn fixture_processes_resolve_to_their_owners() {
    let p = fixture_proc();
    assert_eq!(read_owner(&p, 10_000).unwrap(), pod(POD_A, Some(CTR_A)));
    assert_eq!(read_owner(&p, 10_002).unwrap(), pod(POD_B, Some(CTR_B)));
    assert_eq!(read_owner(&p, 10_003).unwrap(), slurm("4242"));
    assert_eq!(read_owner(&p, 10_004).unwrap(), slurm("4343"));
    assert_eq!(read_owner(&p, 10_005).unwrap(), container(CTR_DOCKER));
    assert!(
        read_owner(&p, 10_007).is_err(),
        "an ended process is an error"
    );
}

#[test]
fn owners_become_job_ids() {
    let o = Owner::from_cgroup(&pod(POD_A, Some(CTR_A)).unwrap());
    assert_eq!(
        (o.job_id.as_str(), o.container.as_str()),
        (POD_A, &CTR_A[..12])
    );
    let o = Owner::from_cgroup(&slurm("4242").unwrap());
    assert_eq!((o.job_id.as_str(), o.hpc_job.as_str()), ("4242", "4242"));
    let o = Owner::from_cgroup(&container(CTR_DOCKER).unwrap());
    assert_eq!(o.job_id, &CTR_DOCKER[..12]);
    assert_eq!(o.container, &CTR_DOCKER[..12]);
    let o = Owner::from_pod(&PodDevice {
        namespace: "ml".into(),
        pod: "trainer-0".into(),
        container: "main".into(),
        resource: "nvidia.com/gpu".into(),
        device_id: "GPU-x".into(),
    });
    assert_eq!(o.job_id, "ml/trainer-0");
    assert_eq!(
        (o.pod.as_str(), o.namespace.as_str(), o.container.as_str()),
        ("trainer-0", "ml", "main")
    );
    assert_eq!(o.via, Via::PodResources);
}

#[test]
fn mapping_dir_by_index_and_by_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("0"), "1234\n").unwrap();
    std::fs::write(d.join("1"), "\n\n  5678  \nextra\n").unwrap();
    std::fs::write(d.join("GPU-bbbb"), "by-uuid\n").unwrap();
    std::fs::write(d.join("2"), "by-index\n").unwrap();
    std::fs::write(d.join("3"), "").unwrap();
    std::fs::write(d.join("4"), "x".repeat(300)).unwrap();
    std::fs::write(d.join("5"), "job\u{7}bell\n").unwrap();
    std::fs::create_dir(d.join("6")).unwrap();
    assert_eq!(read_mapping(d, 0, "GPU-aaaa").as_deref(), Some("1234"));
    assert_eq!(read_mapping(d, 1, "GPU-aaaa").as_deref(), Some("5678"));
    // The UUID-named file wins over the index-named one.
    assert_eq!(read_mapping(d, 2, "GPU-bbbb").as_deref(), Some("by-uuid"));
    assert_eq!(read_mapping(d, 3, "GPU-cccc"), None, "empty file");
    assert_eq!(read_mapping(d, 4, "GPU-cccc"), None, "over-long id");
    assert_eq!(read_mapping(d, 5, "GPU-cccc"), None, "control characters");
    assert_eq!(read_mapping(d, 6, "GPU-cccc"), None, "a directory");
    assert_eq!(read_mapping(d, 7, "GPU-cccc"), None, "no file");
    assert_eq!(
        read_mapping(d, 0, "../0"),
        Some("1234".into()),
        "odd uuid falls back to index"
    );
    assert_eq!(
        read_mapping(Path::new("/nonexistent/flopwatch"), 0, "GPU-a"),
        None
    );
}

#[test]
fn local_resolution_uses_cgroups_then_the_mapping_dir() {
    let map = tempfile::tempdir().unwrap();
    let uuids: Vec<String> = (0..10).map(|g| format!("GPU-{g}")).collect();
    std::fs::write(map.path().join("0"), "mapped-0\n").unwrap();
    std::fs::write(map.path().join("GPU-8"), "mapped-8\n").unwrap();
    let mut o = opts(&fixture_proc());
    o.mapping_dir = Some(map.path().to_path_buf());
    let processes: Vec<(usize, u32)> = (0..8).map(|g| (g, 10_000 + g as u32)).collect();
    let stats = AttributionStats::default();
    let owners = resolve_local(&o, &uuids, &processes, &stats);
    let ids: Vec<Option<&str>> = owners
        .iter()
        .map(|o| o.as_ref().map(|o| o.job_id.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![
            Some(POD_A), // the cgroup beats the mapping file for GPU 0
            Some(POD_A),
            Some(POD_B),
            Some("4242"),
            Some("4343"),
            Some(&CTR_DOCKER[..12]),
            None, // garbage cgroup
            None, // ended process
            Some("mapped-8"),
            None,
        ]
    );
    assert_eq!(owners[0].as_ref().unwrap().via, Via::Cgroup);
    assert_eq!(owners[8].as_ref().unwrap().via, Via::MappingDir);
    assert_eq!(owners[3].as_ref().unwrap().hpc_job, "4242");
    assert_eq!(stats.pids_read.load(Ordering::Relaxed), 7);
    assert_eq!(stats.pids_skipped.load(Ordering::Relaxed), 1);
}

#[test]
fn a_gpus_processes_vote_for_its_owner() {
    let uuids = vec!["GPU-0".to_string(), "GPU-1".to_string()];
    let stats = AttributionStats::default();
    // GPU 0: two processes of pod A, one of Slurm job 4242: pod A.
    // GPU 1: one each of Slurm 4242 and 4343: the smaller id.
    let processes = [
        (0, 10_000),
        (0, 10_003),
        (0, 10_001),
        (1, 10_004),
        (1, 10_003),
        (7, 10_000),
    ];
    let owners = resolve_local(&opts(&fixture_proc()), &uuids, &processes, &stats);
    assert_eq!(owners[0].as_ref().unwrap().job_id, POD_A);
    assert_eq!(owners[1].as_ref().unwrap().job_id, "4242");
    // 10003 sits on two GPUs but is read once; GPU 7 is not in the inventory.
    assert_eq!(stats.pids_read.load(Ordering::Relaxed), 4);
}

/// A GPU two owners' processes share (time-slicing): both are listed,
/// each with its share, by the SM utilisation of its processes, else
/// evenly; the shares make the whole GPU.
#[test]
fn a_shared_gpu_lists_every_owner_with_its_share() {
    use flopwatch_agent::attribution::resolve_claims;
    use flopwatch_proto::model::Split;
    let uuids = vec!["GPU-0".to_string(), "GPU-1".to_string()];
    let stats = AttributionStats::default();
    // GPU 0: pod A (10000, 10001) and Slurm 4242 (10003); GPU 1: 4242.
    let processes = [(0, 10_000), (0, 10_003), (0, 10_001), (1, 10_003)];
    let claims = resolve_claims(&opts(&fixture_proc()), &uuids, &processes, &stats);
    let owners: Vec<(&str, usize)> = claims[0]
        .iter()
        .map(|c| (c.owner.job_id.as_str(), c.pids.len()))
        .collect();
    assert_eq!(owners, [(POD_A, 2), ("4242", 1)]);
    assert_eq!(claims[1].len(), 1);

    let inventory: Vec<GpuInfo> = uuids
        .iter()
        .map(|u| GpuInfo {
            uuid: u.clone(),
            ..Default::default()
        })
        .collect();
    let mut attribution = Attribution::new(opts(&fixture_proc()), None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(attribution.refresh(T0, &inventory, &processes));
    // SM utilisation: pod A's processes 30 % + 10 %, Slurm's 60 %.
    let util = [
        (0, 10_000, 30.0),
        (0, 10_001, 10.0),
        (0, 10_003, 60.0),
        (1, 10_003, 90.0),
    ];
    let mut c = Capture {
        ts_ms: T0,
        ..Default::default()
    };
    attribution.apply_with_util(T0, &mut c, &inventory, &util);
    let on = |c: &Capture, gpu: &str| -> Vec<(String, Option<(u32, Split)>)> {
        c.jobs
            .iter()
            .filter(|j| j.gpu_uuid == gpu)
            .map(|j| (j.job_id.clone(), j.share.map(|s| (s.ppm, s.split))))
            .collect()
    };
    assert_eq!(
        on(&c, "GPU-0"),
        [
            (POD_A.to_string(), Some((400_000, Split::SmUtil))),
            ("4242".to_string(), Some((600_000, Split::SmUtil)))
        ]
    );
    // The one owner of GPU 1 holds it whole: no share.
    assert_eq!(on(&c, "GPU-1"), [("4242".to_string(), None)]);
    // No per-process figure (or idle processes): an even split.
    let mut c = Capture {
        ts_ms: T0 + 1_000,
        ..Default::default()
    };
    attribution.apply(T0 + 1_000, &mut c, &inventory);
    assert_eq!(
        on(&c, "GPU-0"),
        [
            (POD_A.to_string(), Some((500_000, Split::Equal))),
            ("4242".to_string(), Some((500_000, Split::Equal)))
        ]
    );
    // Each job keeps the time it was first seen on the GPU.
    assert!(c.jobs.iter().all(|j| j.since_ms == T0), "{:?}", c.jobs);
}

/// Shares always make exactly one GPU, whatever the rounding.
#[test]
fn apportioned_shares_sum_to_one_gpu() {
    use flopwatch_agent::attribution::{apportion, Claim, Owner};
    let claim = |job: &str, pids: &[u32]| Claim {
        owner: Owner::from_mapping(job),
        pids: pids.to_vec(),
    };
    let claims = [claim("a", &[1]), claim("b", &[2]), claim("c", &[3, 4])];
    for util in [
        vec![(1, 33.0), (2, 33.0), (3, 17.0), (4, 17.0)],
        vec![(1, 1.0), (2, 1.0), (3, 1.0)],
        vec![(1, 0.0)],
        vec![(1, f64::NAN), (2, 5.0)],
    ] {
        let util: std::collections::HashMap<u32, f64> = util.into_iter().collect();
        let shares = apportion(&claims, &util);
        assert_eq!(shares.len(), 3);
        assert_eq!(
            shares.iter().map(|s| s.ppm).sum::<u32>(),
            1_000_000,
            "{util:?}"
        );
    }
}

#[test]
fn a_pid_that_vanishes_between_listing_and_reading_is_skipped() {
    let proc_root = tempfile::tempdir().unwrap();
    for pid in [10_000u32, 10_003] {
        let src = fixture_proc().join(pid.to_string()).join("cgroup");
        let dst = proc_root.path().join(pid.to_string());
        std::fs::create_dir(&dst).unwrap();
        std::fs::copy(src, dst.join("cgroup")).unwrap();
    }
    let mut source = sim();
    let inventory = source.inventory().to_vec();
    source.capture(T0).unwrap();
    let listed = source.processes();
    assert_eq!(listed.len(), 8);
    // Process 10000 ends after the listing, before its cgroup is read.
    std::fs::remove_dir_all(proc_root.path().join("10000")).unwrap();
    let uuids: Vec<String> = inventory.iter().map(|g| g.uuid.clone()).collect();
    let stats = AttributionStats::default();
    let owners = resolve_local(&opts(proc_root.path()), &uuids, &listed, &stats);
    assert!(owners[0].is_none());
    assert_eq!(owners[3].as_ref().unwrap().job_id, "4242");
    assert_eq!(stats.pids_read.load(Ordering::Relaxed), 1);
    assert_eq!(stats.pids_skipped.load(Ordering::Relaxed), 7);
}

#[test]
fn device_ids_name_gpus_by_uuid_replica_or_index() {
    let uuids = vec!["GPU-aaaa".to_string(), "GPU-bbbb".to_string()];
    assert_eq!(device_gpu("GPU-bbbb", &uuids), Some(1));
    assert_eq!(device_gpu("gpu-BBBB", &uuids), Some(1));
    assert_eq!(device_gpu("GPU-aaaa::3", &uuids), Some(0));
    assert_eq!(device_gpu("1", &uuids), Some(1));
    assert_eq!(device_gpu("2", &uuids), None);
    assert_eq!(device_gpu("GPU-cccc", &uuids), None);
    assert_eq!(device_gpu("", &uuids), None);
}

fn dev(ns: &str, pod: &str, container: &str, resource: &str, id: &str) -> PodDevice {
    PodDevice {
        namespace: ns.into(),
        pod: pod.into(),
        container: container.into(),
        resource: resource.into(),
        device_id: id.into(),
    }
}

#[test]
fn shared_gpus_are_left_to_the_cgroups() {
    let uuids = vec![
        "GPU-0".to_string(),
        "GPU-1".to_string(),
        "GPU-2".to_string(),
    ];
    let devices = vec![
        dev("ml", "a", "main", "nvidia.com/gpu", "GPU-0"),
        dev("ml", "a", "sidecar", "nvidia.com/gpu", "GPU-0"),
        dev("ml", "b", "main", "nvidia.com/gpu.shared", "GPU-1::0"),
        dev("ml", "c", "main", "nvidia.com/gpu.shared", "GPU-1::1"),
        dev("ml", "d", "main", "example.com/fpga", "GPU-2"),
    ];
    let pods = gpu_pods(&devices, &uuids);
    assert_eq!(pods[0].as_ref().map(|d| d.pod.as_str()), Some("a"));
    assert_eq!(pods[0].as_ref().map(|d| d.container.as_str()), Some("main"));
    assert!(pods[1].is_none(), "time-sliced between two pods");
    assert!(pods[2].is_none(), "not an NVIDIA resource");
}

/// A pod resolver with a fixed answer.
struct Fixed(Vec<PodDevice>);

impl PodResolver for Fixed {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevice>, AttributionError>> {
        let d = self.0.clone();
        Box::pin(async move { Ok(d) })
    }
}

#[tokio::test]
async fn precedence_pods_then_cgroups_then_mapping_then_source_then_label() {
    let mut source = sim();
    let inventory = source.inventory().to_vec();
    let uuids: Vec<String> = inventory.iter().map(|g| g.uuid.clone()).collect();
    let map = tempfile::tempdir().unwrap();
    // Every GPU has a mapping file; only those without a better owner use it.
    for g in 0..8 {
        std::fs::write(map.path().join(g.to_string()), format!("hpc-{g}\n")).unwrap();
    }
    std::fs::remove_file(map.path().join("7")).unwrap();
    let mut o = opts(&fixture_proc());
    o.mapping_dir = Some(map.path().to_path_buf());
    let pods = Fixed(vec![dev(
        "ml",
        "trainer-0",
        "main",
        "nvidia.com/gpu",
        &uuids[0],
    )]);
    let mut attribution = Attribution::with_resolver(o, Some("label".into()), Some(Arc::new(pods)));
    let mut capture = source.capture(T0).unwrap();
    // GPU 6's cgroup is garbage and GPU 7's process ended: 6 falls to the
    // mapping dir, 7 (no mapping file) to the simulator's own job.
    attribution
        .refresh(T0, &inventory, &source.processes())
        .await;
    attribution.apply(T0, &mut capture, &inventory);
    let ids: Vec<&str> = uuids
        .iter()
        .map(|u| job(&capture, u).unwrap().job_id.as_str())
        .collect();
    assert_eq!(
        ids,
        vec![
            "ml/trainer-0", // pod-resources beats the cgroup (pod A)
            POD_A,
            POD_B,
            "4242",
            "4343",
            &CTR_DOCKER[..12],
            "hpc-6",
            "finetune",
        ]
    );
    let j0 = job(&capture, &uuids[0]).unwrap();
    assert_eq!(
        (
            j0.pod.as_str(),
            j0.namespace.as_str(),
            j0.container.as_str()
        ),
        ("trainer-0", "ml", "main")
    );
    assert_eq!(job(&capture, &uuids[3]).unwrap().hpc_job, "4242");
    assert_eq!(job(&capture, &uuids[6]).unwrap().hpc_job, "hpc-6");
    assert!(capture.jobs.iter().all(|j| j.since_ms == T0));

    // The label covers GPUs nobody else names.
    let mut idle = SimSource::from_model(flopwatch_sim::SimModel::with_plans(
        vec![flopwatch_sim::GpuPlan {
            job: None,
            workload: flopwatch_sim::Workload::Idle,
            turns: None,
        }],
        T0,
        1,
    ));
    let inv = idle.inventory().to_vec();
    let mut attribution = Attribution::new(opts(&fixture_proc()), Some("label".into()));
    attribution.refresh(T0, &inv, &idle.processes()).await;
    let mut c = idle.capture(T0).unwrap();
    attribution.apply(T0, &mut c, &inv);
    assert_eq!(c.jobs.len(), 1);
    assert_eq!(c.jobs[0].job_id, "label");
}

#[tokio::test]
async fn disabled_attribution_keeps_source_jobs_and_label() {
    let mut source = sim();
    let inventory = source.inventory().to_vec();
    let mut attribution = Attribution::new(AttributionOptions::disabled(), Some("label".into()));
    assert!(!attribution.due(T0));
    attribution
        .refresh(T0, &inventory, &source.processes())
        .await;
    let mut capture = source.capture(T0).unwrap();
    let before = capture.jobs.clone();
    attribution.apply(T0, &mut capture, &inventory);
    assert_eq!(
        capture.jobs, before,
        "the simulator's own jobs, since_ms kept"
    );
}

#[tokio::test]
async fn since_ms_holds_until_the_job_changes() {
    let proc_root = tempfile::tempdir().unwrap();
    let cg = proc_root.path().join("10000");
    std::fs::create_dir(&cg).unwrap();
    std::fs::write(cg.join("cgroup"), "0::/slurm/uid_1/job_1/step_0\n").unwrap();
    let inventory = vec![GpuInfo {
        uuid: "GPU-0".into(),
        ..Default::default()
    }];
    let mut attribution = Attribution::new(opts(proc_root.path()), None);
    let at = |t: i64, attribution: &mut Attribution| {
        let mut c = Capture {
            ts_ms: t,
            ..Default::default()
        };
        attribution.apply(t, &mut c, &inventory);
        c.jobs.first().map(|j| (j.job_id.clone(), j.since_ms))
    };
    attribution.refresh(T0, &inventory, &[(0, 10_000)]).await;
    assert_eq!(at(T0, &mut attribution), Some(("1".into(), T0)));
    attribution
        .refresh(T0 + 10_000, &inventory, &[(0, 10_000)])
        .await;
    assert_eq!(at(T0 + 10_000, &mut attribution), Some(("1".into(), T0)));
    std::fs::write(cg.join("cgroup"), "0::/slurm/uid_1/job_2/step_0\n").unwrap();
    attribution
        .refresh(T0 + 20_000, &inventory, &[(0, 10_000)])
        .await;
    assert_eq!(
        at(T0 + 20_000, &mut attribution),
        Some(("2".into(), T0 + 20_000))
    );
    attribution.refresh(T0 + 30_000, &inventory, &[]).await;
    assert_eq!(at(T0 + 30_000, &mut attribution), None, "the job ended");
}

#[tokio::test]
async fn tick_refreshes_in_the_background_at_most_every_interval() {
    let mut source = sim();
    let inventory = source.inventory().to_vec();
    let mut attribution = Attribution::new(opts(&fixture_proc()), None);
    let stats = attribution.stats();
    let mut listed = 0;
    let mut now = T0;
    let mut capture = source.capture(now).unwrap();
    attribution.tick(now, &inventory, || {
        listed += 1;
        source.processes()
    });
    assert!(attribution.owners().is_empty(), "nothing waited for");
    // The lookup runs off the sampling path; a later capture installs it.
    for _ in 0..400 {
        now += 1;
        attribution.tick(now, &inventory, || {
            listed += 1;
            source.processes()
        });
        if !attribution.owners().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(stats.refreshes.load(Ordering::Relaxed), 1);
    attribution.apply(now, &mut capture, &inventory);
    assert_eq!(job(&capture, &inventory[3].uuid).unwrap().job_id, "4242");
    // Not again before the interval has passed...
    for t in (500..10_000).step_by(100) {
        attribution.tick(T0 + t, &inventory, || {
            listed += 1;
            Vec::new()
        });
    }
    assert_eq!(listed, 1);
    assert!(attribution.due(T0 + 10_000));
    // ...and again once it has.
    attribution.tick(T0 + 10_000, &inventory, || {
        listed += 1;
        Vec::new()
    });
    assert_eq!(listed, 2);
    assert!(!attribution.due(T0 + 20_000), "one refresh at a time");
}

/// A fake kubelet: `List` answers with `reply` after `delay`.
#[derive(Clone)]
struct FakeKubelet {
    reply: ListPodResourcesResponse,
    delay: Duration,
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _request: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        tokio::time::sleep(self.delay).await;
        Ok(tonic::Response::new(self.reply.clone()))
    }
}

/// Serves `kubelet` on a new Unix socket in `dir`; returns its path and a
/// handle that stops it when dropped.
fn serve(dir: &Path, kubelet: FakeKubelet) -> (PathBuf, tokio::sync::oneshot::Sender<()>) {
    let path = dir.join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    (path, stop)
}

fn reply(pods: &[(&str, &str, &str, &str, &[&str])]) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: pods
            .iter()
            .map(|(ns, name, container, resource, ids)| PodResources {
                name: name.to_string(),
                namespace: ns.to_string(),
                containers: vec![ContainerResources {
                    name: container.to_string(),
                    devices: vec![ContainerDevices {
                        resource_name: resource.to_string(),
                        device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    }],
                }],
            })
            .collect(),
    }
}

#[tokio::test]
async fn pod_resources_from_a_fake_kubelet_map_gpus_to_pods() {
    let mut source = sim();
    let inventory = source.inventory().to_vec();
    let u: Vec<&str> = inventory.iter().map(|g| g.uuid.as_str()).collect();
    let dir = tempfile::tempdir().unwrap();
    let (socket, _stop) = serve(
        dir.path(),
        FakeKubelet {
            reply: reply(&[
                (
                    "ml",
                    "llm-pretrain-0",
                    "trainer",
                    "nvidia.com/gpu",
                    &[u[0], u[1]],
                ),
                ("ml", "llm-pretrain-1", "trainer", "nvidia.com/gpu", &[u[2]]),
                ("web", "nginx", "nginx", "cpu", &[]),
                ("ml", "other-node", "x", "nvidia.com/gpu", &["GPU-not-here"]),
            ]),
            delay: Duration::ZERO,
        },
    );
    // The client alone.
    let resolver = KubeletPodResolver::new(&socket, Duration::from_secs(5));
    let devices = resolver.list().await.unwrap();
    assert_eq!(devices.len(), 4);
    assert_eq!(
        devices[0],
        dev("ml", "llm-pretrain-0", "trainer", "nvidia.com/gpu", u[0])
    );
    // A second call reuses the channel.
    assert_eq!(resolver.list().await.unwrap().len(), 4);

    // Through the agent's attribution, with cgroups for the other GPUs.
    let mut o = opts(&fixture_proc());
    o.pod_resources_socket = Some(socket.clone());
    let mut attribution = Attribution::new(o, None);
    let mut capture = source.capture(T0).unwrap();
    attribution
        .refresh(T0, &inventory, &source.processes())
        .await;
    attribution.apply(T0, &mut capture, &inventory);
    let j = |g: usize| job(&capture, u[g]).unwrap();
    assert_eq!(j(0).job_id, "ml/llm-pretrain-0");
    assert_eq!(
        (
            j(0).pod.as_str(),
            j(0).namespace.as_str(),
            j(0).container.as_str()
        ),
        ("llm-pretrain-0", "ml", "trainer")
    );
    assert_eq!(j(1).job_id, "ml/llm-pretrain-0");
    assert_eq!(
        j(2).job_id,
        "ml/llm-pretrain-1",
        "the kubelet beats the cgroup"
    );
    assert_eq!(j(3).job_id, "4242");
    assert_eq!(
        attribution.owners()[0].as_ref().unwrap().via,
        Via::PodResources
    );
    assert_eq!(
        attribution
            .stats()
            .pod_resources_errors
            .load(Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn pod_resources_failures_fall_back_to_cgroups() {
    let mut source = sim();
    let inventory = source.inventory().to_vec();
    let dir = tempfile::tempdir().unwrap();

    // No socket at all: quiet, not an error.
    let missing = dir.path().join("absent.sock");
    let r = KubeletPodResolver::new(&missing, Duration::from_secs(1));
    assert!(matches!(r.list().await, Err(AttributionError::NoSocket(_))));

    // A kubelet slower than the timeout.
    let (slow, _stop) = serve(
        dir.path(),
        FakeKubelet {
            reply: reply(&[(
                "ml",
                "late",
                "c",
                "nvidia.com/gpu",
                &[inventory[0].uuid.as_str()],
            )]),
            delay: Duration::from_secs(30),
        },
    );
    let r = KubeletPodResolver::new(&slow, Duration::from_millis(200));
    assert!(matches!(r.list().await, Err(AttributionError::Timeout(_))));

    // A path that is not a socket: counted, and the cgroups still answer.
    let not_socket = dir.path().join("file.sock");
    std::fs::write(&not_socket, "").unwrap();
    let mut o = opts(&fixture_proc());
    o.pod_resources_socket = Some(not_socket);
    let mut attribution = Attribution::new(o, None);
    let mut capture = source.capture(T0).unwrap();
    attribution
        .refresh(T0, &inventory, &source.processes())
        .await;
    attribution.apply(T0, &mut capture, &inventory);
    assert_eq!(
        attribution
            .stats()
            .pod_resources_errors
            .load(Ordering::Relaxed),
        1
    );
    assert_eq!(job(&capture, &inventory[0].uuid).unwrap().job_id, POD_A);
}

#[test]
fn options_follow_the_config_file() {
    let cfg: flopwatch_config::AgentConfig = flopwatch_config::parse_str(
        "source = \"sim\"\n[attribution]\nproc_root = \"/host/proc\"\npod_resources_socket = \"\"\n\
         mapping_dir = \"/run/hpc\"\nrefresh_interval = \"5s\"\n",
        Path::new("agent.toml"),
    )
    .unwrap();
    let o = AttributionOptions::from_settings(&cfg);
    assert_eq!(
        o,
        AttributionOptions {
            enabled: true,
            proc_root: "/host/proc".into(),
            pod_resources_socket: None,
            mapping_dir: Some("/run/hpc".into()),
            mfu_dir: None,
            refresh_interval: Duration::from_secs(5),
        }
    );
    let d = AttributionOptions::default();
    assert!(d.enabled);
    assert_eq!(d.proc_root, Path::new("/proc"));
    assert_eq!(
        d.pod_resources_socket.as_deref(),
        Some(Path::new("/var/lib/kubelet/pod-resources/kubelet.sock"))
    );
    assert_eq!(d.refresh_interval, Duration::from_secs(10));
}

/// The NVML source against the fake driver: its compute processes (PID
/// 10000 + GPU index on busy GPUs) map through the fixture `/proc`.
#[test]
fn nvml_processes_map_through_the_proc_tree() {
    // The one fake library of the process, held for the whole test.
    let _driver = crate::fake::hold();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(nvml_processes_map());
}

async fn nvml_processes_map() {
    use flopwatch_agent::source::nvml::NvmlSource;
    use flopwatch_fake_nvml::{control, library_path};
    let path = library_path().expect("the fake NVML library is built next to this test");
    control::set_time_ms(T0 + 1_000).unwrap();
    control::configure(&format!("start_ms={T0},gpus=8,seed=1")).unwrap();
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    let inventory = source.inventory().to_vec();
    let mut capture = source.capture(T0 + 1_000).unwrap();
    let processes = source.processes();
    assert_eq!(
        processes,
        (0..8).map(|g| (g, 10_000 + g as u32)).collect::<Vec<_>>()
    );
    let mut attribution = Attribution::new(opts(&fixture_proc()), Some("unattributed".into()));
    attribution
        .refresh(T0 + 1_000, &inventory, &processes)
        .await;
    attribution.apply(T0 + 1_000, &mut capture, &inventory);
    let ids: Vec<&str> = inventory
        .iter()
        .map(|g| job(&capture, &g.uuid).unwrap().job_id.as_str())
        .collect();
    assert_eq!(
        ids,
        vec![
            POD_A,
            POD_A,
            POD_B,
            "4242",
            "4343",
            &CTR_DOCKER[..12],
            "unattributed",
            "unattributed"
        ]
    );
    let j2 = job(&capture, &inventory[2].uuid).unwrap();
    assert_eq!(j2.container, &CTR_B[..12]);
}

#[test]
fn one_refresh_reads_a_bounded_number_of_processes() {
    use flopwatch_agent::attribution::MAX_PIDS_PER_REFRESH;
    let uuids = vec!["GPU-0".to_string(), "GPU-1".to_string()];
    // Thousands of processes that do not exist, then a real one: the real
    // one is past the bound and is not read.
    let mut processes: Vec<(usize, u32)> = (0..MAX_PIDS_PER_REFRESH as u32)
        .map(|i| (0, 1_000_000 + i))
        .collect();
    processes.push((1, 10_003));
    let stats = AttributionStats::default();
    let owners = resolve_local(&opts(&fixture_proc()), &uuids, &processes, &stats);
    assert!(owners.iter().all(Option::is_none));
    assert_eq!(stats.pids_read.load(Ordering::Relaxed), 0);
    assert_eq!(
        stats.pids_skipped.load(Ordering::Relaxed),
        MAX_PIDS_PER_REFRESH as u64 + 1
    );
}

/// The agent's sampling loop carries the looked-up owners in its batches
/// (no collector: the batches stay in the outbox, where the test reads them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_loop_sends_attributed_jobs() {
    use flopwatch_agent::FixedSampler;
    use flopwatch_agent::TokioClock;
    use flopwatch_agent::{Agent, AgentOptions};
    use flopwatch_proto::model::NodeIdentity;
    let source = sim();
    let uuids: Vec<String> = source.inventory().iter().map(|g| g.uuid.clone()).collect();
    let agent = Agent::start_with_attribution(
        Box::new(source),
        Box::new(FixedSampler::new(Duration::from_millis(20))),
        AgentOptions {
            flush_interval: Duration::from_millis(40),
            max_in_flight: 1024,
            drain_timeout: Duration::from_millis(10),
            // Nothing listens there: batches wait in the outbox.
            ..AgentOptions::new(
                NodeIdentity::named("n0", "b"),
                vec!["http://127.0.0.1:1".into()],
            )
        },
        opts(&fixture_proc()),
        Arc::new(TokioClock::new()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while agent.attribution.refreshes.load(Ordering::Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no refresh");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A few more captures, so one after the refresh finished.
    let seen = agent.stats.captures.load(Ordering::Relaxed);
    while agent.stats.captures.load(Ordering::Relaxed) < seen + 3 {
        assert!(tokio::time::Instant::now() < deadline, "no captures");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let outbox = agent.outbox.clone();
    agent.stop().await;
    let batches = outbox.next_to_send(usize::MAX);
    let last = batches.last().expect("batches");
    let id = |g: usize| {
        last.jobs
            .iter()
            .find(|j| j.gpu_uuid == uuids[g])
            .map(|j| j.job_id.clone())
    };
    assert_eq!(id(0).as_deref(), Some(POD_A));
    assert_eq!(id(3).as_deref(), Some("4242"));
    assert_eq!(id(5).as_deref(), Some(&CTR_DOCKER[..12]));
    assert_eq!(
        id(7).as_deref(),
        Some("finetune"),
        "the simulator's own job"
    );
}

#[test]
fn long_ids_are_shortened_but_stay_distinct() {
    use flopwatch_agent::attribution::{fit_id, MAX_JOB_ID_BYTES};
    assert_eq!(fit_id("ml/trainer-0".into()), "ml/trainer-0");
    let long = |i: usize| format!("ml/{}-{i}", "é".repeat(120));
    let (a, b) = (fit_id(long(0)), fit_id(long(1)));
    assert!(a.len() <= MAX_JOB_ID_BYTES && b.len() <= MAX_JOB_ID_BYTES);
    assert_ne!(a, b);
    assert!(a.starts_with("ml/é"));
    let o = Owner::from_pod(&dev("ml", &"p".repeat(253), "c", "nvidia.com/gpu", "GPU-0"));
    assert_eq!(o.job_id.len(), MAX_JOB_ID_BYTES);
    assert_eq!(o.pod.len(), 253, "the pod name itself is kept");
}

/// A pod resolver whose answer the test changes.
struct Changing(std::sync::Mutex<Vec<PodDevice>>);

impl PodResolver for Changing {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevice>, AttributionError>> {
        let d = self.0.lock().map(|d| d.clone()).unwrap_or_default();
        Box::pin(async move { Ok(d) })
    }
}

/// Every lookup lets go of a GPU when its owner leaves: the pod gone from
/// pod-resources, the processes (and their cgroups) gone, the mapping file
/// removed. The GPU then runs no job — nothing remembers the last owner.
#[tokio::test]
async fn every_lookup_lets_go_when_its_owner_leaves() {
    // Eight GPUs of no job of the source's own, so what is left is the
    // lookups' doing.
    let mut source = SimSource::from_model(flopwatch_sim::SimModel::with_plans(
        (0..8)
            .map(|_| flopwatch_sim::GpuPlan {
                job: None,
                workload: flopwatch_sim::Workload::Idle,
                turns: None,
            })
            .collect(),
        T0,
        1,
    ));
    let inventory = source.inventory().to_vec();
    let uuids: Vec<String> = inventory.iter().map(|g| g.uuid.clone()).collect();
    let map = tempfile::tempdir().unwrap();
    std::fs::write(map.path().join("6"), "hpc-6\n").unwrap();
    let mut o = opts(&fixture_proc());
    o.mapping_dir = Some(map.path().to_path_buf());
    let pods = Arc::new(Changing(std::sync::Mutex::new(vec![dev(
        "ml",
        "trainer-0",
        "main",
        "nvidia.com/gpu",
        &uuids[0],
    )])));
    let mut attribution = Attribution::with_resolver(o, None, Some(pods.clone()));
    // The fixture's processes: PID 10000 + g on GPU g (cgroups of pods,
    // Slurm jobs and containers).
    let processes: Vec<(usize, u32)> = (1..6).map(|g| (g, 10_000 + g as u32)).collect();
    attribution.refresh(T0, &inventory, &processes).await;
    let mut c = source.capture(T0).unwrap();
    attribution.apply(T0, &mut c, &inventory);
    let owned: Vec<usize> = (0..8).filter(|&g| job(&c, &uuids[g]).is_some()).collect();
    assert_eq!(owned, [0, 1, 2, 3, 4, 5, 6], "{:?}", c.jobs);

    // Everyone leaves.
    pods.0.lock().unwrap().clear();
    std::fs::remove_file(map.path().join("6")).unwrap();
    attribution.refresh(T0 + 10_000, &inventory, &[]).await;
    let mut c = source.capture(T0 + 10_000).unwrap();
    attribution.apply(T0 + 10_000, &mut c, &inventory);
    assert!(
        c.jobs.is_empty(),
        "owners outlived their jobs: {:?}",
        c.jobs
    );

    // An emptied mapping file names no one either.
    std::fs::write(map.path().join("6"), "hpc-6\n").unwrap();
    attribution.refresh(T0 + 20_000, &inventory, &[]).await;
    let mut c = source.capture(T0 + 20_000).unwrap();
    attribution.apply(T0 + 20_000, &mut c, &inventory);
    assert_eq!(c.jobs.len(), 1);
    std::fs::write(map.path().join("6"), "").unwrap();
    attribution.refresh(T0 + 30_000, &inventory, &[]).await;
    let mut c = source.capture(T0 + 30_000).unwrap();
    attribution.apply(T0 + 30_000, &mut c, &inventory);
    assert!(c.jobs.is_empty(), "{:?}", c.jobs);
}
