//! The metric catalog: every metric an agent may send, by stable name.
//!
//! Names are part of the protocol (`Series.metric`) and of the Prometheus
//! exposition, so they never change meaning. A collector rejects names it
//! does not know (`unknown_metric`).

/// How a metric's value relates to its sampling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    /// Hardware-averaged over the window (GPM, DCGM profiling fields):
    /// any interval yields the exact window mean.
    WindowMean,
    /// An instantaneous reading at the sample's timestamp.
    Point,
    /// A monotonically increasing counter.
    Counter,
}

/// One catalog entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricDef {
    /// Stable name on the wire and in storage.
    pub name: &'static str,
    /// Unit of the value.
    pub unit: &'static str,
    /// How the value relates to its window.
    pub aggregation: Aggregation,
    /// One-line description.
    pub help: &'static str,
}

macro_rules! catalog {
    ($($ident:ident = $name:literal, $unit:literal, $agg:ident, $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $ident: &str = $name;
        )*
        /// Every metric flopwatch knows, in a fixed order.
        pub const CATALOG: &[MetricDef] = &[
            $(MetricDef { name: $name, unit: $unit, aggregation: Aggregation::$agg, help: $help },)*
        ];

        /// Catalog positions, counted by the compiler.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum Position {
            $($ident,)*
        }

        /// `name`'s position in [`CATALOG`]: what a set of metrics keyed
        /// by bit is indexed by (one match, no scan of the catalog).
        pub fn index(name: &str) -> Option<usize> {
            match name {
                $($name => Some(Position::$ident as usize),)*
                _ => None,
            }
        }
    };
}

catalog! {
    TENSOR_ACTIVE = "tensor_active", "ratio", WindowMean,
        "Tensor pipe activity, fraction of cycles any tensor pipe was active (GPM AnyTensorUtil, DCGM PIPE_TENSOR_ACTIVE).";
    SM_CLOCK_MHZ = "sm_clock_mhz", "MHz", Point,
        "SM clock, instantaneous reading.";
    SM_CLOCK_AVG_MHZ = "sm_clock_avg_mhz", "MHz", WindowMean,
        "SM clock averaged over the sampling window (NVML processor-clock samples).";
    SM_ACTIVE = "sm_active", "ratio", WindowMean,
        "Fraction of time at least one warp was resident on an SM.";
    SM_OCCUPANCY = "sm_occupancy", "ratio", WindowMean,
        "Resident warps relative to the maximum.";
    DRAM_ACTIVE = "dram_active", "ratio", WindowMean,
        "Device memory bandwidth utilization.";
    FP16_ACTIVE = "fp16_active", "ratio", WindowMean,
        "FP16/BF16 (non-tensor) pipe activity.";
    FP32_ACTIVE = "fp32_active", "ratio", WindowMean,
        "FP32 pipe activity.";
    FP64_ACTIVE = "fp64_active", "ratio", WindowMean,
        "FP64 pipe activity.";
    GPU_UTIL = "gpu_util", "ratio", WindowMean,
        "Coarse GPU utilization (a kernel was running), NVML utilization rates.";
    MEM_COPY_UTIL = "mem_copy_util", "ratio", WindowMean,
        "Memory copy utilization, NVML utilization rates.";
    POWER_W = "power_w", "W", Point,
        "Board power draw.";
    TEMP_C = "temp_c", "Cel", Point,
        "GPU temperature.";
    MEM_USED_BYTES = "mem_used_bytes", "By", Point,
        "Device memory in use.";
    MEM_CLOCK_MHZ = "mem_clock_mhz", "MHz", Point,
        "Memory clock, instantaneous reading.";
    NVLINK_TX_BYTES_S = "nvlink_tx_bytes_s", "By/s", WindowMean,
        "NVLink transmit throughput.";
    NVLINK_RX_BYTES_S = "nvlink_rx_bytes_s", "By/s", WindowMean,
        "NVLink receive throughput.";
    PCIE_TX_BYTES_S = "pcie_tx_bytes_s", "By/s", WindowMean,
        "PCIe transmit throughput.";
    PCIE_RX_BYTES_S = "pcie_rx_bytes_s", "By/s", WindowMean,
        "PCIe receive throughput.";
    THROTTLE_REASONS = "throttle_reasons", "bitmask", Point,
        "Active clock throttle (clock event) reasons, NVML bitmask.";
    ECC_DBE_TOTAL = "ecc_dbe_total", "1", Counter,
        "Uncorrected (double-bit) ECC errors, volatile count.";
    ECC_SBE_TOTAL = "ecc_sbe_total", "1", Counter,
        "Corrected (single-bit) ECC errors, volatile count.";
    ENERGY_J = "energy_j", "J", Counter,
        "Total energy consumed since driver load.";
    COMPUTE_PROCESSES = "compute_processes", "1", Point,
        "Compute processes running on the GPU.";
    NVLINK_LINKS_ACTIVE = "nvlink_links_active", "1", Point,
        "NVLink links of the GPU that are up (NVML link state).";
    NVLINK_ERRORS_TOTAL = "nvlink_errors_total", "1", Counter,
        "NVLink replay, recovery and CRC errors summed over the GPU's links (NVML error counters).";
    PCIE_REPLAY_TOTAL = "pcie_replay_total", "1", Counter,
        "PCIe replay counter of the GPU (NVML).";
    IB_TX_BYTES_S = "ib_tx_bytes_s", "By/s", WindowMean,
        "InfiniBand port transmit throughput (sysfs port_xmit_data, 4-byte words, over the window).";
    IB_RX_BYTES_S = "ib_rx_bytes_s", "By/s", WindowMean,
        "InfiniBand port receive throughput (sysfs port_rcv_data, 4-byte words, over the window).";
    IB_TX_DISCARDS_TOTAL = "ib_tx_discards_total", "1", Counter,
        "Packets an InfiniBand port discarded on transmit (port_xmit_discards), since the agent started.";
    IB_RX_DISCARDS_TOTAL = "ib_rx_discards_total", "1", Counter,
        "Packets an InfiniBand port dropped on receive for lack of buffers (hw_counters/out_of_buffer), since the agent started.";
    IB_RX_ERRORS_TOTAL = "ib_rx_errors_total", "1", Counter,
        "Malformed packets an InfiniBand port received (port_rcv_errors), since the agent started.";
    IB_LINK_ERRORS_TOTAL = "ib_link_errors_total", "1", Counter,
        "InfiniBand link errors (symbol_error + link_error_recovery + link_downed), since the agent started.";
    IB_PORT_ACTIVE = "ib_port_active", "1", Point,
        "1 when the InfiniBand port's state is ACTIVE and its physical link is up, else 0.";
    IB_LINK_RATE_GBPS = "ib_link_rate_gbps", "Gb/s", Point,
        "Negotiated InfiniBand link rate (sysfs rate).";
    HOST_CPU_UTIL = "host_cpu_util", "ratio", WindowMean,
        "Fraction of CPU time not idle or waiting on I/O, over the window, per NUMA node or host (/proc/stat).";
    HOST_CPU_FREQ_MHZ = "host_cpu_freq_mhz", "MHz", Point,
        "Mean current frequency of the CPUs of a NUMA node or the host (cpufreq scaling_cur_freq).";
    HOST_MEM_AVAILABLE_BYTES = "host_mem_available_bytes", "By", Point,
        "Memory available for new work: MemAvailable of /proc/meminfo for the host, MemFree of the node's meminfo for a NUMA node.";
    GR_ENGINE_ACTIVE = "gr_engine_active", "ratio", WindowMean,
        "Fraction of time the graphics engine (any compute or graphics work) was busy (GPM GraphicsUtil, DCGM PROF_GR_ENGINE_ACTIVE): utilization of a MIG instance.";
    ENC_UTIL = "enc_util", "ratio", WindowMean,
        "Video encoder utilization over the driver's sampling period.";
    DEC_UTIL = "dec_util", "ratio", WindowMean,
        "Video decoder utilization over the driver's sampling period.";
    MEMORY_TEMP_C = "memory_temp_c", "Cel", Point,
        "Device memory (HBM) temperature.";
    MEM_FREE_BYTES = "mem_free_bytes", "By", Point,
        "Device memory free for allocations.";
    MEM_RESERVED_BYTES = "mem_reserved_bytes", "By", Point,
        "Device memory the driver reserves for itself (neither used nor free).";
    REMAPPED_ROWS_CORRECTABLE_TOTAL = "remapped_rows_correctable_total", "1", Counter,
        "Memory rows remapped after correctable ECC errors, over the GPU's life.";
    REMAPPED_ROWS_UNCORRECTABLE_TOTAL = "remapped_rows_uncorrectable_total", "1", Counter,
        "Memory rows remapped after uncorrectable ECC errors, over the GPU's life.";
    ROW_REMAP_FAILURE = "row_remap_failure", "1", Point,
        "1 when a memory row could not be remapped (the GPU needs service), else 0.";
    XID_LAST = "xid_last", "1", Point,
        "Code of the last XID error the driver raised on the GPU (0: none), as DCGM's XID field holds it: read at every capture, so an XID from before the agent started shows too.";
}

/// Looks a metric up by name.
pub fn lookup(name: &str) -> Option<&'static MetricDef> {
    index(name).map(|i| &CATALOG[i])
}

/// The inputs of OFU eq. 1 that the agent reads together on one schedule.
pub const OFU_INPUTS: [&str; 3] = [TENSOR_ACTIVE, SM_CLOCK_AVG_MHZ, SM_CLOCK_MHZ];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_its_catalog_position() {
        for (i, m) in CATALOG.iter().enumerate() {
            assert_eq!(index(m.name), Some(i), "{}", m.name);
        }
        assert_eq!(index("no_such_metric"), None);
        assert_eq!(index(""), None);
    }

    #[test]
    fn names_are_unique_and_found() {
        let mut names: Vec<_> = CATALOG.iter().map(|m| m.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len());
        assert_eq!(
            lookup("tensor_active").unwrap().aggregation,
            Aggregation::WindowMean
        );
        assert!(lookup("no_such_metric").is_none());
    }
}
