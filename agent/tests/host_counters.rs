//! Node-level counters over fake sysfs and procfs trees: InfiniBand byte
//! rates (4-byte words), a 32-bit counter wrap, a reset, a port that
//! disappears and comes back, CPU utilization per NUMA node, memory, and
//! the whole path through `source::open` and the agent's series keys.

use flopwatch_agent::source;
use flopwatch_agent::source::host::HostReader;
use flopwatch_agent::source::infiniband::IbReader;
use flopwatch_agent::source::node::{DeviceReader, DeviceReading};
use flopwatch_config::{AgentConfig, SourceKind};
use flopwatch_proto::metrics as m;
use std::path::Path;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A port with its counters (words, discards, errors) and state.
fn port(sys: &Path, dev: &str, port: u32, xmit: u64, rcv: u64, discards: u64) {
    let d = sys.join(format!("class/infiniband/{dev}/ports/{port}"));
    let c = d.join("counters");
    write(&c.join("port_xmit_data"), &format!("{xmit}\n"));
    write(&c.join("port_rcv_data"), &format!("{rcv}\n"));
    write(&c.join("port_xmit_discards"), &format!("{discards}\n"));
    write(&c.join("port_rcv_errors"), "0\n");
    write(&c.join("symbol_error"), "0\n");
    write(&c.join("link_error_recovery"), "0\n");
    write(&c.join("link_downed"), "0\n");
    write(&d.join("hw_counters/out_of_buffer"), "7\n");
    write(&d.join("state"), "4: ACTIVE\n");
    write(&d.join("phys_state"), "5: LinkUp\n");
    write(&d.join("rate"), "400 Gb/sec (4X NDR)\n");
}

fn value(r: &[DeviceReading], device: usize, metric: &str) -> Option<f64> {
    r.iter()
        .find(|d| d.device == device)?
        .readings
        .iter()
        .find(|x| x.metric == metric)
        .map(|x| x.value)
}

#[test]
fn infiniband_rates_wrap_reset_and_a_port_that_disappears() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    port(&sys, "mlx5_0", 1, 1_000, 2_000, 3);
    port(&sys, "mlx5_1", 1, 4_294_967_000, 0, 0);
    let mut ib = IbReader::discover(&sys);
    let ids: Vec<&str> = ib.devices().iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, vec!["ib:mlx5_0:1", "ib:mlx5_1:1"]);
    let r = ib.read(10_000);
    // First read: state, rate and totals, no throughput yet.
    assert_eq!(value(&r, 0, m::IB_PORT_ACTIVE), Some(1.0));
    assert_eq!(value(&r, 0, m::IB_LINK_RATE_GBPS), Some(400.0));
    assert_eq!(value(&r, 0, m::IB_RX_BYTES_S), None);
    assert_eq!(value(&r, 0, m::IB_TX_DISCARDS_TOTAL), Some(0.0));

    // 2 s later: 5e9 words out and 2.5e9 words in on mlx5_0 (10 GB/s and
    // 5 GB/s), and mlx5_1's 32-bit counter wrapped after 1 000 words.
    port(
        &sys,
        "mlx5_0",
        1,
        1_000 + 5_000_000_000,
        2_000 + 2_500_000_000,
        5,
    );
    port(&sys, "mlx5_1", 1, 704, 0, 0);
    let r = ib.read(12_000);
    assert_eq!(r[0].window_ms, 2_000);
    assert_eq!(value(&r, 0, m::IB_TX_BYTES_S), Some(10e9));
    assert_eq!(value(&r, 0, m::IB_RX_BYTES_S), Some(5e9));
    assert_eq!(value(&r, 0, m::IB_TX_DISCARDS_TOTAL), Some(2.0));
    assert_eq!(value(&r, 1, m::IB_TX_BYTES_S), Some(1_000.0 * 4.0 / 2.0));

    // A reset (counters cleared): no rate for that window, then normal.
    port(&sys, "mlx5_0", 1, 100, 100, 1);
    let r = ib.read(13_000);
    assert_eq!(value(&r, 0, m::IB_TX_BYTES_S), None);
    assert_eq!(value(&r, 0, m::IB_TX_DISCARDS_TOTAL), Some(3.0));
    port(&sys, "mlx5_0", 1, 100 + 250_000, 100, 1);
    let r = ib.read(14_000);
    assert_eq!(value(&r, 0, m::IB_TX_BYTES_S), Some(1e6));

    // mlx5_1 disappears: inactive, nothing else; comes back: re-baselines.
    std::fs::remove_dir_all(sys.join("class/infiniband/mlx5_1")).unwrap();
    let r = ib.read(15_000);
    assert_eq!(r.len(), 2);
    let gone = r.iter().find(|d| d.device == 1).unwrap();
    assert_eq!(gone.readings.len(), 1);
    assert_eq!(value(&r, 1, m::IB_PORT_ACTIVE), Some(0.0));
    assert_eq!(value(&r, 0, m::IB_PORT_ACTIVE), Some(1.0));
    port(&sys, "mlx5_1", 1, 50, 0, 0);
    let r = ib.read(16_000);
    assert_eq!(value(&r, 1, m::IB_PORT_ACTIVE), Some(1.0));
    assert_eq!(value(&r, 1, m::IB_TX_BYTES_S), None);
    port(&sys, "mlx5_1", 1, 550, 0, 0);
    let r = ib.read(17_000);
    assert_eq!(value(&r, 1, m::IB_TX_BYTES_S), Some(2_000.0));

    // A port whose link is down reports 0.
    write(
        &sys.join("class/infiniband/mlx5_1/ports/1/state"),
        "1: DOWN\n",
    );
    let r = ib.read(18_000);
    assert_eq!(value(&r, 1, m::IB_PORT_ACTIVE), Some(0.0));
}

#[test]
fn no_infiniband_tree_means_no_ports() {
    let dir = tempfile::tempdir().unwrap();
    let mut ib = IbReader::discover(dir.path());
    assert!(ib.devices().is_empty());
    assert!(ib.read(1_000).is_empty());
}

fn stat(proc_: &Path, cpus: &[(u64, u64)]) {
    // (busy, idle) jiffies per CPU: user=busy, idle=idle, rest 0.
    let (b, i) = cpus
        .iter()
        .fold((0, 0), |(b, i), (b2, i2)| (b + b2, i + i2));
    let mut s = format!("cpu  {b} 0 0 {i} 0 0 0 0 0 0\n");
    for (n, (b, i)) in cpus.iter().enumerate() {
        s.push_str(&format!("cpu{n} {b} 0 0 {i} 0 0 0 0 0 0\n"));
    }
    s.push_str("intr 1 2 3\nctxt 5\n");
    write(&proc_.join("stat"), &s);
}

#[test]
fn cpu_utilization_frequency_and_memory_per_numa_node() {
    let dir = tempfile::tempdir().unwrap();
    let (sys, proc_) = (dir.path().join("sys"), dir.path().join("proc"));
    let node = sys.join("devices/system/node");
    write(&node.join("node0/cpulist"), "0-1\n");
    write(&node.join("node1/cpulist"), "2-3\n");
    write(
        &node.join("node0/meminfo"),
        "Node 0 MemTotal:  1000 kB\nNode 0 MemFree:   400 kB\n",
    );
    write(
        &node.join("node1/meminfo"),
        "Node 1 MemTotal:  1000 kB\nNode 1 MemFree:   300 kB\n",
    );
    write(
        &proc_.join("meminfo"),
        "MemTotal: 2000 kB\nMemFree: 700 kB\nMemAvailable: 900 kB\n",
    );
    for (c, khz) in [
        (0, 2_000_000),
        (1, 3_000_000),
        (2, 1_000_000),
        (3, 1_000_000),
    ] {
        write(
            &sys.join(format!(
                "devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq"
            )),
            &format!("{khz}\n"),
        );
    }
    stat(&proc_, &[(0, 0), (0, 0), (0, 0), (0, 0)]);
    let mut h = HostReader::discover(&sys, &proc_);
    let ids: Vec<&str> = h.devices().iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, vec!["numa:0", "numa:1", "host"]);
    let r = h.read(1_000);
    assert_eq!(value(&r, 0, m::HOST_CPU_UTIL), None);
    assert_eq!(value(&r, 0, m::HOST_CPU_FREQ_MHZ), Some(2_500.0));
    assert_eq!(value(&r, 2, m::HOST_CPU_FREQ_MHZ), Some(1_750.0));
    assert_eq!(
        value(&r, 0, m::HOST_MEM_AVAILABLE_BYTES),
        Some(400.0 * 1024.0)
    );
    assert_eq!(
        value(&r, 1, m::HOST_MEM_AVAILABLE_BYTES),
        Some(300.0 * 1024.0)
    );
    assert_eq!(
        value(&r, 2, m::HOST_MEM_AVAILABLE_BYTES),
        Some(900.0 * 1024.0)
    );
    // Node 0 fully busy, node 1 a quarter busy.
    stat(&proc_, &[(100, 0), (100, 0), (25, 75), (25, 75)]);
    let r = h.read(2_000);
    assert_eq!(value(&r, 0, m::HOST_CPU_UTIL), Some(1.0));
    assert_eq!(value(&r, 1, m::HOST_CPU_UTIL), Some(0.25));
    assert_eq!(value(&r, 2, m::HOST_CPU_UTIL), Some(0.625));
    assert_eq!(r[0].window_ms, 1_000);

    // A plan that skips the host's utilization and every memory: those
    // files go unread, and the host's next utilization is the exact mean
    // since its last read, its window the whole span.
    let skip_host_util = |d: usize, metric: &str| {
        metric != m::HOST_MEM_AVAILABLE_BYTES && !(d == 2 && metric == m::HOST_CPU_UTIL)
    };
    stat(&proc_, &[(200, 0), (200, 0), (25, 175), (25, 175)]);
    write(&proc_.join("meminfo"), "MemAvailable: 1 kB\n");
    let r = h.read_planned(3_000, &skip_host_util);
    assert_eq!(value(&r, 0, m::HOST_CPU_UTIL), Some(1.0));
    assert_eq!(value(&r, 1, m::HOST_CPU_UTIL), Some(0.0));
    assert_eq!(value(&r, 2, m::HOST_CPU_UTIL), None);
    assert_eq!(value(&r, 2, m::HOST_CPU_FREQ_MHZ), Some(1_750.0));
    assert_eq!(value(&r, 2, m::HOST_MEM_AVAILABLE_BYTES), None);
    stat(&proc_, &[(300, 0), (300, 0), (25, 275), (25, 275)]);
    let r = h.read(4_000);
    // Host, 2,000 to 4,000 ms: 400 busy of 800 jiffies.
    assert_eq!(value(&r, 2, m::HOST_CPU_UTIL), Some(0.5));
    let util = |d: usize| {
        r.iter()
            .find(|x| x.device == d)
            .unwrap()
            .readings
            .iter()
            .find(|x| x.metric == m::HOST_CPU_UTIL)
            .unwrap()
            .window_ms
    };
    assert_eq!(util(2), Some(2_000));
    assert_eq!(util(0), None);
    assert!(r.iter().all(|x| x.window_ms == 1_000), "{r:?}");
    assert_eq!(value(&r, 2, m::HOST_MEM_AVAILABLE_BYTES), Some(1024.0));
    // Nothing wanted: nothing read, no device reported.
    assert!(h.read_planned(5_000, &|_, _| false).is_empty());
}

#[test]
fn the_agent_source_reads_a_configured_tree_and_keys_series_by_device() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    port(&sys, "mlx5_0", 1, 0, 0, 0);
    let mut cfg = AgentConfig::default();
    cfg.host.sys_root = sys.clone();
    cfg.host.cpu_memory = false;
    cfg.sim.gpus = 2;
    let mut src = source::open(&SourceKind::Sim, &cfg, 0).unwrap();
    assert_eq!(src.inventory().len(), 2);
    let ids: Vec<String> = src.devices().iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids, vec!["ib:mlx5_0:1"]);
    src.capture(1_000).unwrap();
    // 25 GB/s in over 500 ms.
    port(&sys, "mlx5_0", 1, 0, 25_000_000_000 / 4 / 2, 0);
    let c = src.capture(1_500).unwrap();
    let dev = c.gpus.iter().find(|g| g.gpu == 2).unwrap();
    let rx = dev
        .readings
        .iter()
        .find(|r| r.metric == m::IB_RX_BYTES_S)
        .unwrap();
    assert_eq!(rx.value, 25e9);
    let owners = source::series_owners(src.as_ref(), "node-7");
    assert_eq!(owners[2].uuid, "ib:mlx5_0:1@node-7");

    // Without its own roots, a simulated node simulates its ports when
    // asked to, and has none otherwise.
    let mut sim = AgentConfig::default();
    sim.sim.node_counters = true;
    let src = source::open(&SourceKind::Sim, &sim, 0).unwrap();
    assert_eq!(src.devices().len(), 8 + 2 + 1);
    let plain = source::open(&SourceKind::Sim, &AgentConfig::default(), 0).unwrap();
    assert!(plain.devices().is_empty());
}
