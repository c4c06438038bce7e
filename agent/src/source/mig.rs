//! MIG (Multi-Instance GPU) through NVML: a card's MIG devices, kept up to
//! date while the card is reconfigured, for [`super::nvml`].
//!
//! * **Enumeration**: `nvmlDeviceGetMaxMigDeviceCount` on the card, then
//!   `nvmlDeviceGetMigDeviceHandleByIndex` for every index (`NOT_FOUND` is
//!   an empty slot). Of each MIG device: its UUID (`MIG-…`),
//!   `nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId` and
//!   `nvmlDeviceGetAttributes_v2` (SMs, slices, memory).
//! * **The instance's [`GpuInfo`]**: the card's model, index (a MIG device
//!   has no NVML index of its own; the card's tells which card it is on),
//!   driver, PCI bus id, clocks and GPM support; its own UUID, SM count
//!   (`multiprocessorCount`: the collector scales the card's peak by the
//!   instance's share of SMs) and memory (`memorySizeMB`).
//! * **The profile name** is derived as `nvidia-smi` names GPU instance
//!   profiles: `<gpuInstanceSliceCount>g.<memory>gb`, the memory in GiB
//!   rounded *up* (`memorySizeMB` is what is usable, a little under the
//!   nominal size: 40 320 MiB is `3g.40gb`, 9 984 MiB `1g.10gb`, 4 864 MiB
//!   an A100's `1g.5gb`). A compute instance smaller than its GPU
//!   instance still carries the GPU instance's profile.
//! * **Reconfiguration**: the card's MIG mode and devices are read again
//!   at the first capture and then every [`RESCAN_MS`] (about 8 NVML calls
//!   per card, too many for every 100 ms capture), and at the next capture
//!   after an instance's GPM sample finds the instance gone. A new instance
//!   is appended to the inventory; one that disappears stays listed and
//!   gives no readings; one created again with the same (GPU instance,
//!   compute instance) ids takes its old entry back, updated in place
//!   (UUID, profile, SMs), with a fresh GPM window. Each is logged at
//!   info. A card that leaves MIG mode has all its instances gone and is
//!   a whole GPU again.
//! * **GPM per instance**: `nvmlGpmMigSampleGet(card, GPU instance id)`,
//!   diffed between captures by `nvmlGpmMetricsGet` like the card's own
//!   samples ([`super::gpm`]). GPM counts per GPU instance: with several
//!   compute instances in one, only the first (lowest compute instance
//!   id) reports them.
//!
//! The two instance-id calls nvml-wrapper 0.13 lacks are made here through
//! its loaded library, the crate's only `unsafe` code besides
//! [`super::gpm`].

#![allow(unsafe_code)]

use super::gpm::GpmPair;
use flopwatch_proto::model::{GpuInfo, Mig, MigInstance};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use tracing::info;

/// How often a card's MIG mode and devices are read again, ms.
pub const RESCAN_MS: i64 = 2_000;

/// One MIG device as the driver lists it now.
struct Found {
    device: Device<'static>,
    uuid: String,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    sm_count: u32,
    memory_mb: u64,
    profile: String,
}

/// A listed MIG instance of a card.
pub(super) struct Instance {
    /// Its position in the inventory.
    pub pos: usize,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// Its MIG device handle; `None` once the instance is gone.
    pub device: Option<Device<'static>>,
    /// Its GPM samples (`nvmlGpmMigSampleGet` on the card).
    pub gpm_pair: GpmPair,
    /// Whether its last GPM sample was refused for lack of permission.
    pub gpm_denied: bool,
}

/// A card's MIG state: its mode and its listed instances.
pub(super) struct MigCard {
    /// Whether MIG mode is enabled (as last read).
    pub mode: bool,
    /// Whether the card's instances are listed (MIG mode on, and the
    /// driver enumerates them): the card is then [`Mig::Card`] and its
    /// compute activity is its instances'.
    pub listed: bool,
    /// Every instance ever listed, live or gone.
    pub instances: Vec<Instance>,
    /// When the devices were last read (unix ms); `None`: at the next
    /// capture.
    scanned_ms: Option<i64>,
    /// Read again at the next capture (an instance was found gone).
    pub rescan: bool,
}

/// What a rescan found wrong: the call and the driver's error.
pub(super) type ScanError = (&'static str, NvmlError);

impl MigCard {
    /// A card whose MIG mode is `mode`, with nothing listed yet.
    pub(super) fn new(mode: bool) -> Self {
        Self {
            mode,
            listed: false,
            instances: Vec::new(),
            scanned_ms: None,
            rescan: false,
        }
    }

    /// Whether the devices are due to be read again at `now_ms`.
    pub(super) fn due(&self, now_ms: i64) -> bool {
        self.rescan
            || self
                .scanned_ms
                .is_none_or(|t| now_ms - t >= RESCAN_MS || now_ms < t)
    }

    /// Reads the card's MIG devices (with `mode` its MIG mode now, `None`
    /// when unreadable: kept as it was) and brings the listing and
    /// `inventory` up to date: the card's entry is `inventory[card_pos]`,
    /// new instances are appended, gone ones kept. `now_ms` is `None` at
    /// open (the first capture reads again). An error leaves the listing
    /// as it was, except that a card without MIG enumeration lists none.
    pub(super) fn refresh(
        &mut self,
        nvml: &'static Nvml,
        card: &Device<'static>,
        card_pos: usize,
        mode: Option<bool>,
        inventory: &mut Vec<GpuInfo>,
        now_ms: Option<i64>,
    ) -> Result<(), ScanError> {
        self.scanned_ms = now_ms;
        self.rescan = false;
        if let Some(mode) = mode {
            if mode != self.mode {
                info!(gpu = %inventory[card_pos].uuid, mig = mode, "MIG mode changed");
            }
            self.mode = mode;
        }
        let found = if self.mode {
            match scan(nvml, card) {
                Ok(found) => found,
                Err((call, e)) if super::gpm::unsupported(&e) => {
                    // Counters stay whole-GPU: nothing to list them by.
                    self.sync(nvml, Vec::new(), card_pos, inventory);
                    self.listed = false;
                    inventory[card_pos].mig = Mig::Off;
                    return Err((call, e));
                }
                Err(e) => return Err(e),
            }
        } else {
            Vec::new()
        };
        self.sync(nvml, found, card_pos, inventory);
        self.listed = self.mode;
        inventory[card_pos].mig = if self.listed { Mig::Card } else { Mig::Off };
        Ok(())
    }

    /// Matches `found` against the listing by (GPU instance, compute
    /// instance) ids.
    fn sync(
        &mut self,
        nvml: &'static Nvml,
        found: Vec<Found>,
        card_pos: usize,
        inventory: &mut Vec<GpuInfo>,
    ) {
        let parent = inventory[card_pos].uuid.clone();
        let mut seen = vec![false; self.instances.len()];
        for f in found {
            let ids = (f.gpu_instance_id, f.compute_instance_id);
            let info = instance_info(&inventory[card_pos], &f);
            match self
                .instances
                .iter()
                .position(|i| (i.gpu_instance_id, i.compute_instance_id) == ids)
            {
                Some(k) => {
                    seen[k] = true;
                    let i = &mut self.instances[k];
                    let entry = &mut inventory[i.pos];
                    let recreated = i.device.is_none() || entry.uuid != info.uuid;
                    if recreated {
                        info!(
                            gpu = %info.uuid,
                            parent = %parent,
                            gpu_instance_id = ids.0,
                            profile = %f.profile,
                            "MIG instance created again"
                        );
                        // No GPM window spans two lives of an instance.
                        i.gpm_pair = GpmPair::new(nvml);
                        i.gpm_denied = false;
                    }
                    if *entry != info {
                        *entry = info;
                    }
                    i.device = Some(f.device);
                }
                None => {
                    info!(
                        gpu = %info.uuid,
                        parent = %parent,
                        gpu_instance_id = ids.0,
                        profile = %f.profile,
                        sm_count = f.sm_count,
                        "MIG instance listed"
                    );
                    self.instances.push(Instance {
                        pos: inventory.len(),
                        gpu_instance_id: ids.0,
                        compute_instance_id: ids.1,
                        device: Some(f.device),
                        gpm_pair: GpmPair::new(nvml),
                        gpm_denied: false,
                    });
                    seen.push(true);
                    inventory.push(info);
                }
            }
        }
        for (i, seen) in self.instances.iter_mut().zip(seen) {
            if !seen && i.device.take().is_some() {
                info!(
                    gpu = %inventory[i.pos].uuid,
                    parent = %parent,
                    gpu_instance_id = i.gpu_instance_id,
                    "MIG instance gone; listed without readings"
                );
                i.gpm_denied = false;
            }
        }
    }
}

/// The inventory entry of MIG device `f` of the card `card`.
fn instance_info(card: &GpuInfo, f: &Found) -> GpuInfo {
    GpuInfo {
        uuid: f.uuid.clone(),
        sm_count: f.sm_count,
        memory_total_bytes: f.memory_mb << 20,
        mig: Mig::Instance(MigInstance {
            parent_uuid: card.uuid.clone(),
            gpu_instance_id: f.gpu_instance_id,
            compute_instance_id: f.compute_instance_id,
            profile: f.profile.clone(),
        }),
        ..card.clone()
    }
}

/// `nvidia-smi`'s name of a GPU instance profile (module docs).
pub fn profile_name(gpu_instance_slices: u32, memory_mb: u64) -> String {
    format!("{gpu_instance_slices}g.{}gb", memory_mb.div_ceil(1024))
}

/// The card's MIG devices now, in index order.
fn scan(nvml: &'static Nvml, card: &Device<'static>) -> Result<Vec<Found>, ScanError> {
    let max = card
        .mig_device_count()
        .map_err(|e| ("nvmlDeviceGetMaxMigDeviceCount", e))?;
    let mut out = Vec::new();
    for index in 0..max {
        let device = match card.mig_device_by_index(index) {
            Ok(d) => d,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(("nvmlDeviceGetMigDeviceHandleByIndex", e)),
        };
        let uuid = device.uuid().map_err(|e| ("nvmlDeviceGetUUID(MIG)", e))?;
        let gpu_instance_id =
            instance_id(nvml, &device, Id::Gpu).map_err(|e| ("nvmlDeviceGetGpuInstanceId", e))?;
        let compute_instance_id = instance_id(nvml, &device, Id::Compute)
            .map_err(|e| ("nvmlDeviceGetComputeInstanceId", e))?;
        let a = device
            .attributes()
            .map_err(|e| ("nvmlDeviceGetAttributes_v2(MIG)", e))?;
        out.push(Found {
            device,
            uuid,
            gpu_instance_id,
            compute_instance_id,
            sm_count: a.multiprocessor_count,
            memory_mb: a.memory_size_mb,
            profile: profile_name(a.gpu_instance_slice_count, a.memory_size_mb),
        });
    }
    Ok(out)
}

/// Which id of a MIG device.
#[derive(Clone, Copy)]
enum Id {
    Gpu,
    Compute,
}

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a
/// MIG device.
fn instance_id(nvml: &'static Nvml, device: &Device<'static>, id: Id) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let get = match id {
        Id::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        Id::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut out: std::ffi::c_uint = 0;
    // SAFETY: the handle is live (the MIG device was just enumerated) and
    // `out` is valid for the one write the driver makes.
    nvml_try(unsafe { get(device.handle(), &mut out) })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_named_as_nvidia_smi_names_them() {
        // H100 80GB (usable MiB per `nvidia-smi mig -lgip`).
        assert_eq!(profile_name(1, 9_984), "1g.10gb");
        assert_eq!(profile_name(1, 20_096), "1g.20gb");
        assert_eq!(profile_name(2, 20_096), "2g.20gb");
        assert_eq!(profile_name(3, 40_320), "3g.40gb");
        assert_eq!(profile_name(4, 40_320), "4g.40gb");
        assert_eq!(profile_name(7, 81_152), "7g.80gb");
        // A100 40GB.
        assert_eq!(profile_name(1, 4_864), "1g.5gb");
        assert_eq!(profile_name(3, 20_096), "3g.20gb");
        assert_eq!(profile_name(7, 40_192), "7g.40gb");
    }
}
