//! The field table: which DCGM field is which catalog metric, in which
//! unit.

use super::Reading;
use flopwatch_proto::metrics as m;
use std::collections::HashMap;

/// DCGM's percent → ratio.
pub(super) const PERCENT: f64 = 0.01;
/// DCGM's MiB → bytes.
pub(super) const MIB: f64 = 1024.0 * 1024.0;
/// DCGM's mJ → J.
pub(super) const MILLI: f64 = 0.001;

/// How the fields mapped to one metric combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    /// The first field of the table present on the page.
    First,
    /// The sum of every field present.
    Sum,
}

/// One row of [`FIELDS`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldMap {
    /// DCGM field, the exporter's metric name.
    pub field: &'static str,
    /// Catalog metric ([`flopwatch_proto::metrics`]).
    pub metric: &'static str,
    /// Factor from the field's unit to the metric's.
    pub scale: f64,
    /// How several fields of one metric combine.
    pub fold: Fold,
}

pub(super) const fn row(
    field: &'static str,
    metric: &'static str,
    scale: f64,
    fold: Fold,
) -> FieldMap {
    FieldMap {
        field,
        metric,
        scale,
        fold,
    }
}

/// DCGM fields → catalog metrics, with unit factors. Adding a row is all a
/// new field needs; a metric with several rows folds them ([`Fold`]).
pub const FIELDS: &[FieldMap] = &[
    // Profiling (DCP) fields: ratios 0..1, averaged by DCGM over its interval.
    row(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        m::TENSOR_ACTIVE,
        1.0,
        Fold::First,
    ),
    row("DCGM_FI_PROF_SM_ACTIVE", m::SM_ACTIVE, 1.0, Fold::First),
    row(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        m::SM_OCCUPANCY,
        1.0,
        Fold::First,
    ),
    row("DCGM_FI_PROF_DRAM_ACTIVE", m::DRAM_ACTIVE, 1.0, Fold::First),
    row(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        m::FP16_ACTIVE,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        m::FP32_ACTIVE,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        m::FP64_ACTIVE,
        1.0,
        Fold::First,
    ),
    // Profiling throughputs: bytes per second.
    row(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        m::PCIE_TX_BYTES_S,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        m::PCIE_RX_BYTES_S,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        m::NVLINK_TX_BYTES_S,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        m::NVLINK_RX_BYTES_S,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        m::GR_ENGINE_ACTIVE,
        1.0,
        Fold::First,
    ),
    // Device fields: point readings.
    row("DCGM_FI_DEV_SM_CLOCK", m::SM_CLOCK_MHZ, 1.0, Fold::First),
    row("DCGM_FI_DEV_MEM_CLOCK", m::MEM_CLOCK_MHZ, 1.0, Fold::First),
    row("DCGM_FI_DEV_POWER_USAGE", m::POWER_W, 1.0, Fold::First),
    row("DCGM_FI_DEV_GPU_TEMP", m::TEMP_C, 1.0, Fold::First),
    row(
        "DCGM_FI_DEV_MEMORY_TEMP",
        m::MEMORY_TEMP_C,
        1.0,
        Fold::First,
    ),
    row("DCGM_FI_DEV_GPU_UTIL", m::GPU_UTIL, PERCENT, Fold::First),
    row(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        m::MEM_COPY_UTIL,
        PERCENT,
        Fold::First,
    ),
    row("DCGM_FI_DEV_ENC_UTIL", m::ENC_UTIL, PERCENT, Fold::First),
    row("DCGM_FI_DEV_DEC_UTIL", m::DEC_UTIL, PERCENT, Fold::First),
    row("DCGM_FI_DEV_FB_USED", m::MEM_USED_BYTES, MIB, Fold::First),
    row(FB_FREE, m::MEM_FREE_BYTES, MIB, Fold::First),
    row(FB_RESERVED, m::MEM_RESERVED_BYTES, MIB, Fold::First),
    // The last XID, a reading as well as events: the value at open shows.
    row(XID_FIELD, m::XID_LAST, 1.0, Fold::First),
    row(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        m::ROW_REMAP_FAILURE,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        m::ENERGY_J,
        MILLI,
        Fold::First,
    ),
    // The clock event reasons under their current name, then the older one.
    row(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        m::THROTTLE_REASONS,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        m::THROTTLE_REASONS,
        1.0,
        Fold::First,
    ),
    // Counters.
    row(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        m::ECC_SBE_TOTAL,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        m::ECC_DBE_TOTAL,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        m::PCIE_REPLAY_TOTAL,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        m::REMAPPED_ROWS_CORRECTABLE_TOTAL,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL,
        1.0,
        Fold::First,
    ),
    row(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        m::NVLINK_ERRORS_TOTAL,
        1.0,
        Fold::Sum,
    ),
    row(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        m::NVLINK_ERRORS_TOTAL,
        1.0,
        Fold::Sum,
    ),
    row(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        m::NVLINK_ERRORS_TOTAL,
        1.0,
        Fold::Sum,
    ),
    row(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        m::NVLINK_ERRORS_TOTAL,
        1.0,
        Fold::Sum,
    ),
];

/// Last XID error of the GPU: a reading ([`m::XID_LAST`]), and a change of
/// it an event.
pub const XID_FIELD: &str = "DCGM_FI_DEV_XID_ERRORS";
/// Device memory, MiB (inventory).
pub(super) const FB_TOTAL: &str = "DCGM_FI_DEV_FB_TOTAL";
/// Device memory in use, MiB (inventory, when there is no total).
pub(super) const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Free device memory, MiB (a reading, and inventory when there is no
/// total).
pub(super) const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
/// Memory reserved by the driver, MiB (a reading, and inventory when there
/// is no total).
pub(super) const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
/// Maximum SM clock, MHz (inventory).
pub(super) const MAX_SM_CLOCK: &str = "DCGM_FI_DEV_MAX_SM_CLOCK";
/// Maximum memory clock, MHz (inventory).
pub(super) const MAX_MEM_CLOCK: &str = "DCGM_FI_DEV_MAX_MEM_CLOCK";

/// Fields read only for something other than a reading (the inventory).
pub(super) const OTHER_FIELDS: [&str; 3] = [FB_TOTAL, MAX_SM_CLOCK, MAX_MEM_CLOCK];

/// The field's static name, when this module reads it.
pub(super) fn known_field(name: &str) -> Option<&'static str> {
    FIELDS
        .iter()
        .map(|f| f.field)
        .chain(OTHER_FIELDS)
        .find(|f| *f == name)
}

/// Whether `v` is one of DCGM's blank sentinels (int64 blanks start at
/// `0x7ffffffffffffff0`, which is 2^63 as a float; float blanks are 2^47
/// plus 0..3), i.e. no data.
pub fn is_blank(v: f64) -> bool {
    const FP64_BLANK: f64 = 140_737_488_355_328.0;
    v >= 9.223_372_036_854_775e18 || (FP64_BLANK..FP64_BLANK + 16.0).contains(&v)
}

/// Converts the fields of one device (`fields`: DCGM field → raw value)
/// into catalog readings through [`FIELDS`], in table order.
pub fn map_fields(fields: &HashMap<&'static str, f64>) -> Vec<Reading> {
    let mut out: Vec<Reading> = Vec::new();
    for row in FIELDS {
        let Some(&raw) = fields.get(row.field) else {
            continue;
        };
        let value = raw * row.scale;
        match out.iter_mut().find(|r| r.metric == row.metric) {
            None => out.push(Reading::new(row.metric, value)),
            Some(r) if row.fold == Fold::Sum => r.value += value,
            Some(_) => {}
        }
    }
    out
}
