//! Scrapes a local dcgm-exporter `/metrics` page: the source for fleets
//! (A100, L40S) where NVML has no tensor counter but DCGM's profiling
//! fields do.
//!
//! * **One HTTP GET per capture** (plain `http://`, connect and whole-request
//!   timeouts of [`TIMEOUT`], no proxy, at most [`MAX_PAGE_BYTES`]). The page
//!   is the Prometheus text exposition format ([`parse`]); a malformed line
//!   fails that capture with its line number, never a panic.
//! * **Fields** become catalog metrics through one table, [`FIELDS`], which
//!   also converts units (percent → ratio, MiB → bytes, mJ → J). Fields the
//!   table does not know are ignored, counted
//!   ([`DcgmExporterSource::ignored_fields`]) and logged once each at debug
//!   level. DCGM's blank values (its "not supported / no data" sentinels)
//!   and non-finite values give no reading.
//! * **Inventory**: from the first scrape, made when the source opens (an
//!   unreachable exporter, or a page without GPUs, fails the open with
//!   [`SourceError::Exporter`], which the agent retries with backoff until
//!   the exporter answers; a bad URL is [`SourceError::Config`], which it
//!   does not: [`SourceError::is_transient`]). A GPU is
//!   a `UUID` label (`gpu` when there is none); `gpu`, `modelName`,
//!   `pci_bus_id` and a `DCGM_FI_DRIVER_VERSION` label fill its [`GpuInfo`],
//!   `DCGM_FI_DEV_FB_TOTAL` (else used + free + reserved) its memory and
//!   `DCGM_FI_DEV_MAX_SM_CLOCK` / `DCGM_FI_DEV_MAX_MEM_CLOCK` its maximum
//!   clocks, when the page has them. A later scrape that lacks a GPU gives it
//!   no readings for that capture (warned once per absence); a device that
//!   appears later (a MIG instance created, a GPU the exporter saw late) is
//!   appended to the inventory at that scrape, and the agent opens its
//!   stream again with it ([`GpuSource::inventory`]).
//! * **MIG**: samples carrying `GPU_I_ID` belong to a MIG GPU instance,
//!   which gets its own inventory entry after its parent GPU: UUID
//!   `MIG-<parent UUID>/<GPU_I_ID>`, [`Mig::Instance`] with the parent's UUID,
//!   the GPU instance id and `GPU_I_PROFILE` (the collector scales the card's
//!   peak by the profile's SMs), the parent's model. DCGM reports the
//!   profiling fields per instance and the device fields per GPU; an
//!   instance without its own `DCGM_FI_DEV_SM_CLOCK` gets its parent's (the
//!   clock is the whole GPU's), so OFU can be computed per instance. A page
//!   with both the card's row and its instances' (dcgm-exporter `-d g,i`)
//!   lists the card as [`Mig::Card`]: its device fields are its own, its
//!   compute activity ([`super::INSTANCE_ACTIVITY`], the aggregate of its
//!   instances) is dropped, so no card counts twice.
//! * **Window**: dcgm-exporter publishes the values DCGM collected at its
//!   own interval (`-c`, milliseconds, 30 000 by default); the profiling
//!   fields are DCGM's averages over that interval. Each capture reports the
//!   page as it is at `now_ms`, with [`GpuCapture::window_ms`] the time
//!   since the previous capture (0 for the first), as the other sources do.
//!   The real resolution is therefore bounded by the exporter's `-c`: run it
//!   with `-c 1000` or lower, and an agent `interval` no shorter than that
//!   (shorter intervals repeat the same values). At the default interval
//!   the agent learns how often the page's values change and captures that
//!   often ([`crate::RefreshPaced`]). Sample timestamps, which dcgm-exporter
//!   does not write, are parsed and ignored.
//! * **Jobs**: `pod` / `namespace` / `container` labels (Kubernetes mode;
//!   `pod_name` / `pod_namespace` / `container_name` of the 1.x names) and
//!   `hpc_job` labels become [`JobAssignment`]s: job id `namespace/pod`, else
//!   the HPC job. A GPU the page shows with several owners (time-slicing)
//!   lists them all, each with an even [`Share`] ([`Split::Equal`](flopwatch_proto::model::Split::Equal)):
//!   the page has no per-process figure to apportion by.
//! * **Events**: `DCGM_FI_DEV_XID_ERRORS` holds the last XID seen; a change
//!   to a non-zero value is an `"xid"` event with the XID as code. The value
//!   at open is the baseline, and a repeat of the same XID is invisible.

use super::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{fit_id, Event, GpuInfo, JobAssignment, Mig, MigInstance, Share};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;
use tracing::{debug, info, warn};

mod fields;
mod text;

pub use fields::*;
pub use text::*;

/// Connect timeout, and the limit of one whole request.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Largest page read, bytes.
pub const MAX_PAGE_BYTES: u64 = 16 << 20;
/// Most distinct ignored field names remembered (a page of garbage cannot
/// grow the set without bound).
const MAX_IGNORED_NAMES: usize = 1024;

// ---------------------------------------------------------------------------
// Devices on a page.

/// A device on the page: a GPU (its UUID, else its `gpu` index) and, for a
/// MIG GPU instance, its `GPU_I_ID`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct DeviceKey {
    gpu: String,
    instance: Option<String>,
}

/// Who owns a device, from its labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Owner {
    pod: String,
    namespace: String,
    container: String,
    hpc_job: String,
}

/// What one scrape says about one device.
#[derive(Debug, Default)]
struct Seen {
    /// The identity labels of its first sample.
    index: Option<u32>,
    uuid: String,
    model: String,
    pci_bus_id: String,
    driver: String,
    /// A MIG instance's `GPU_I_PROFILE`.
    profile: String,
    /// Known fields' raw values (the last sample of each wins).
    fields: HashMap<&'static str, f64>,
    owners: BTreeSet<Owner>,
}

/// A page grouped by device.
#[derive(Debug, Default)]
struct Page {
    devices: BTreeMap<DeviceKey, Seen>,
    /// Fields of GPU samples this module does not read.
    unknown: BTreeSet<String>,
}

fn group(samples: &[Sample]) -> Page {
    let mut page = Page::default();
    for s in samples {
        let uuid = s.first_label(&["UUID", "uuid"]).unwrap_or_default();
        let gpu = s.first_label(&["gpu"]);
        let id = match (uuid, gpu) {
            ("", None) => continue, // not a GPU's sample (exporter, NVSwitch, CPU)
            ("", Some(g)) => format!("gpu:{g}"),
            (u, _) => u.to_string(),
        };
        let key = DeviceKey {
            gpu: id,
            instance: s.first_label(&["GPU_I_ID"]).map(str::to_string),
        };
        let seen = page.devices.entry(key).or_insert_with(|| Seen {
            index: gpu.and_then(|g| g.parse().ok()),
            uuid: uuid.to_string(),
            model: s
                .first_label(&["modelName"])
                .unwrap_or_default()
                .to_string(),
            pci_bus_id: s
                .first_label(&["pci_bus_id"])
                .unwrap_or_default()
                .to_string(),
            driver: s
                .first_label(&["DCGM_FI_DRIVER_VERSION"])
                .unwrap_or_default()
                .to_string(),
            profile: s
                .first_label(&["GPU_I_PROFILE"])
                .unwrap_or_default()
                .to_string(),
            ..Seen::default()
        });
        let owner = Owner {
            pod: s
                .first_label(&["pod", "pod_name"])
                .unwrap_or_default()
                .to_string(),
            namespace: s
                .first_label(&["namespace", "pod_namespace"])
                .unwrap_or_default()
                .to_string(),
            container: s
                .first_label(&["container", "container_name"])
                .unwrap_or_default()
                .to_string(),
            hpc_job: s.first_label(&["hpc_job"]).unwrap_or_default().to_string(),
        };
        if !owner.pod.is_empty() || !owner.hpc_job.is_empty() {
            seen.owners.insert(owner);
        }
        match known_field(&s.name) {
            Some(field) if s.value.is_finite() && !is_blank(s.value) => {
                seen.fields.insert(field, s.value);
            }
            Some(_) => {}
            None => {
                if page.unknown.len() < MAX_IGNORED_NAMES {
                    page.unknown.insert(s.name.clone());
                }
            }
        }
    }
    page
}

/// Per-device state carried between captures.
#[derive(Debug)]
struct Device {
    key: DeviceKey,
    /// Inventory index of the parent GPU of a MIG instance, when the page
    /// has the parent.
    parent: Option<usize>,
    /// The last XID value seen.
    last_xid: Option<f64>,
    /// Whether the previous scrape lacked the device (warned once).
    missing: bool,
}

/// The devices listed so far: the inventory and what each entry carries
/// between captures. It only grows ([`GpuSource::inventory`]): a device
/// that leaves the page stays listed without readings, one that appears is
/// appended, and a GPU whose first MIG instance appears becomes
/// [`Mig::Card`] in place.
#[derive(Debug, Default)]
struct Listing {
    infos: Vec<GpuInfo>,
    devices: Vec<Device>,
    index: HashMap<DeviceKey, usize>,
}

/// Where a page's devices sort: GPUs by index, each GPU before its MIG
/// instances, instances by GPU instance id.
fn order(page: &Page, k: &DeviceKey) -> (u32, String, Option<u64>, Option<String>) {
    let index = page
        .devices
        .get(k)
        .and_then(|s| s.index)
        .unwrap_or(u32::MAX);
    let instance = k
        .instance
        .as_ref()
        .map(|i| i.parse::<u64>().unwrap_or(u64::MAX));
    (index, k.gpu.clone(), instance, k.instance.clone())
}

impl Listing {
    /// Lists the devices of `page` not listed yet, in [`order`], and
    /// updates what changed in place (a GPU that gained instances, an
    /// instance's profile). Returns the UUIDs of the devices added.
    fn extend(&mut self, page: &Page) -> Vec<String> {
        let mut keys: Vec<&DeviceKey> = page
            .devices
            .keys()
            .filter(|k| !self.index.contains_key(*k))
            .collect();
        keys.sort_by_key(|k| order(page, k));
        let mut added = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(seen) = page.devices.get(key) else {
                continue;
            };
            let position = self.infos.len();
            let info = describe(page, key, seen, position);
            added.push(info.uuid.clone());
            self.index.insert(key.clone(), position);
            self.devices.push(Device {
                key: key.clone(),
                parent: None,
                last_xid: seen.fields.get(XID_FIELD).copied(),
                missing: false,
            });
            self.infos.push(info);
        }
        // Parents: an instance's GPU row, which is then a card counted
        // through its instances. A profile the page changed is taken.
        for g in 0..self.devices.len() {
            let key = &self.devices[g].key;
            if key.instance.is_none() {
                continue;
            }
            let parent_key = DeviceKey {
                gpu: key.gpu.clone(),
                instance: None,
            };
            let parent = self.index.get(&parent_key).copied();
            if let Some(p) = parent {
                self.infos[p].mig = Mig::Card;
            }
            let profile = page
                .devices
                .get(key)
                .map(|s| s.profile.clone())
                .filter(|p| !p.is_empty());
            if let (Mig::Instance(i), Some(profile)) = (&mut self.infos[g].mig, profile) {
                i.profile = profile;
            }
            self.devices[g].parent = parent;
        }
        added
    }
}

/// A device's inventory entry from its first sample's labels and fields.
fn describe(page: &Page, key: &DeviceKey, seen: &Seen, position: usize) -> GpuInfo {
    let parent_key = DeviceKey {
        gpu: key.gpu.clone(),
        instance: None,
    };
    let parent_seen = page.devices.get(&parent_key);
    let gpu_uuid = if seen.uuid.is_empty() {
        format!("GPU-dcgm-exporter-{}", key.gpu.trim_start_matches("gpu:"))
    } else {
        seen.uuid.clone()
    };
    let field = |name: &str| {
        seen.fields
            .get(name)
            .or_else(|| parent_seen.and_then(|p| p.fields.get(name)))
            .copied()
    };
    let memory_mib = seen.fields.get(FB_TOTAL).copied().or_else(|| {
        let used = seen.fields.get(FB_USED)?;
        let free = seen.fields.get(FB_FREE)?;
        Some(used + free + seen.fields.get(FB_RESERVED).copied().unwrap_or(0.0))
    });
    let clock = |v: Option<f64>| v.map_or(0, |v| v.clamp(0.0, f64::from(u32::MAX)) as u32);
    let mut info = GpuInfo {
        index: seen.index.unwrap_or(position as u32),
        uuid: gpu_uuid.clone(),
        model: if seen.model.is_empty() {
            "unknown".to_string()
        } else {
            seen.model.clone()
        },
        sm_count: 0,
        max_sm_clock_mhz: clock(field(MAX_SM_CLOCK)),
        max_mem_clock_mhz: clock(field(MAX_MEM_CLOCK)),
        driver_version: if seen.driver.is_empty() {
            "unknown".to_string()
        } else {
            seen.driver.clone()
        },
        pci_bus_id: seen.pci_bus_id.clone(),
        gpm_supported: false,
        memory_total_bytes: memory_mib.map_or(0, |mib| (mib.max(0.0) * MIB) as u64),
        mig: Mig::Off,
    };
    if let Some(gi) = &key.instance {
        info.uuid = format!("MIG-{gpu_uuid}/{gi}");
        info.mig = Mig::Instance(MigInstance {
            parent_uuid: gpu_uuid,
            gpu_instance_id: gi.parse().unwrap_or(0),
            compute_instance_id: 0,
            profile: seen.profile.clone(),
        });
    }
    info
}

/// Builds the inventory from the first scrape, parents before their MIG
/// instances, GPUs by index.
#[cfg(test)]
fn inventory(page: &Page) -> (Vec<GpuInfo>, Vec<Device>) {
    let mut listing = Listing::default();
    listing.extend(page);
    (listing.infos, listing.devices)
}

// ---------------------------------------------------------------------------
// The source.

/// A dcgm-exporter page, scraped once per capture.
pub struct DcgmExporterSource {
    url: String,
    agent: ureq::Agent,
    listing: Listing,
    last_ms: Option<i64>,
    /// Field names ignored so far (each logged once).
    ignored: HashSet<String>,
}

impl std::fmt::Debug for DcgmExporterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcgmExporterSource")
            .field("url", &self.url)
            .field("gpus", &self.listing.infos.len())
            .finish_non_exhaustive()
    }
}

impl DcgmExporterSource {
    /// Opens the exporter at `url` with the default [`TIMEOUT`]: scrapes it
    /// once for the inventory.
    pub fn open(url: &str) -> Result<Self, SourceError> {
        Self::open_with_timeout(url, TIMEOUT)
    }

    /// [`open`](Self::open) with another connect and request timeout.
    ///
    /// `url` is `http://HOST:PORT/PATH`; without a scheme `http://` is
    /// assumed, without a path `/metrics`. Other schemes are
    /// [`SourceError::Config`]; an unreachable exporter, a status other
    /// than 200, a malformed page or a page without GPUs is
    /// [`SourceError::Exporter`].
    pub fn open_with_timeout(url: &str, timeout: Duration) -> Result<Self, SourceError> {
        let url = normalize_url(url)?;
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(timeout))
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .build();
        let mut source = Self {
            url,
            agent: config.into(),
            listing: Listing::default(),
            last_ms: None,
            ignored: HashSet::new(),
        };
        let page = source.scrape()?;
        if page.devices.is_empty() {
            return Err(source.error(
                "the page has no GPU (no sample with a `gpu` or `UUID` label); is this a dcgm-exporter?"
                    .to_string(),
            ));
        }
        source.listing.extend(&page);
        source.note_ignored(&page.unknown);
        info!(
            url = %source.url,
            gpus = source.listing.infos.len(),
            "dcgm-exporter source opened"
        );
        Ok(source)
    }

    /// The URL scraped.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Distinct field names seen on GPU samples that map to nothing.
    pub fn ignored_fields(&self) -> usize {
        self.ignored.len()
    }

    fn error(&self, message: String) -> SourceError {
        SourceError::Exporter {
            url: self.url.clone(),
            message,
        }
    }

    /// One GET, parsed and grouped.
    fn scrape(&self) -> Result<Page, SourceError> {
        let mut response = self
            .agent
            .get(&self.url)
            .header("Accept", "text/plain")
            .call()
            .map_err(|e| self.error(format!("cannot scrape: {e}")))?;
        let status = response.status();
        if status != ureq::http::StatusCode::OK {
            return Err(self.error(format!("HTTP status {status}, expected 200 OK")));
        }
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_PAGE_BYTES)
            .read_to_string()
            .map_err(|e| self.error(format!("reading the page: {e}")))?;
        let samples = parse(&text).map_err(|e| self.error(e.to_string()))?;
        Ok(group(&samples))
    }

    fn note_ignored(&mut self, unknown: &BTreeSet<String>) {
        for name in unknown {
            if self.ignored.len() >= MAX_IGNORED_NAMES {
                break;
            }
            if self.ignored.insert(name.clone()) {
                debug!(field = %name, "dcgm-exporter field not mapped to a metric; ignored");
            }
        }
    }
}

/// `http://` assumed, `/metrics` when there is no path.
pub(crate) fn normalize_url(url: &str) -> Result<String, SourceError> {
    const HINT: &str = "use http://HOST:PORT/metrics";
    let url = url.trim();
    let bad = |what: String| SourceError::Config(format!("dcgm-exporter:{url}: {what}; {HINT}"));
    let rest = match url.split_once("://") {
        None => url,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) => return Err(bad(format!("scheme `{scheme}` is not supported"))),
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("no host".to_string()));
    }
    Ok(if rest.contains('/') {
        format!("http://{rest}")
    } else {
        format!("http://{rest}/metrics")
    })
}

impl GpuSource for DcgmExporterSource {
    fn name(&self) -> &'static str {
        "dcgm-exporter"
    }

    fn inventory(&self) -> &[GpuInfo] {
        &self.listing.infos
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        let page = self.scrape()?;
        let prev = self.last_ms.replace(now_ms);
        let window_ms = prev.map_or(0, |p| {
            u32::try_from((now_ms - p).max(0)).unwrap_or(u32::MAX)
        });
        self.note_ignored(&page.unknown);
        for uuid in self.listing.extend(&page) {
            info!(gpu = %uuid, url = %self.url, "new device on the dcgm-exporter page");
        }
        let Listing { infos, devices, .. } = &mut self.listing;
        let mut gpus = Vec::with_capacity(devices.len());
        let mut jobs = Vec::new();
        let mut events = Vec::new();
        let mut clocks: Vec<Option<f64>> = vec![None; devices.len()];
        for (g, device) in devices.iter_mut().enumerate() {
            let Some(seen) = page.devices.get(&device.key) else {
                if !device.missing {
                    warn!(
                        gpu = %infos[g].uuid,
                        url = %self.url,
                        "GPU missing from the dcgm-exporter page; no readings until it returns"
                    );
                    device.missing = true;
                }
                continue;
            };
            if device.missing {
                info!(gpu = %infos[g].uuid, "GPU back on the dcgm-exporter page");
                device.missing = false;
            }
            let uuid = &infos[g].uuid;
            let mut readings = map_fields(&seen.fields);
            clocks[g] = readings
                .iter()
                .find(|r| r.metric == m::SM_CLOCK_MHZ)
                .map(|r| r.value);
            if infos[g].mig.is_card() {
                // Its compute activity is its instances' (a `-d g,i` page
                // also has the card's aggregate): counted once, there.
                readings.retain(|r| !super::INSTANCE_ACTIVITY.contains(&r.metric));
            }
            if let Some(&xid) = seen.fields.get(XID_FIELD) {
                if device.last_xid.replace(xid) != Some(xid) && xid != 0.0 {
                    let code = xid as i64;
                    events.push(Event {
                        gpu_uuid: uuid.clone(),
                        kind: "xid".to_string(),
                        ts_ms: now_ms,
                        code,
                        detail: format!("XID error {code} (dcgm-exporter {XID_FIELD})"),
                    });
                }
            }
            // Several owners (time-slicing): each listed with an even
            // share, since the page has no per-process figure.
            let shares: Vec<Option<Share>> = match seen.owners.len() {
                0 | 1 => vec![None],
                n => Share::equal(n).into_iter().map(Some).collect(),
            };
            for (owner, share) in seen.owners.iter().zip(shares) {
                jobs.push(JobAssignment {
                    share,
                    ..assignment(uuid, owner)
                });
            }
            gpus.push(GpuCapture {
                gpu: g,
                window_ms,
                readings,
            });
        }
        // A MIG instance without its own SM clock gets its parent's.
        for capture in &mut gpus {
            let has_clock = capture.readings.iter().any(|r| r.metric == m::SM_CLOCK_MHZ);
            let parent = devices.get(capture.gpu).and_then(|d| d.parent);
            if let (false, Some(Some(clock))) = (has_clock, parent.and_then(|p| clocks.get(p))) {
                capture.readings.push(Reading::new(m::SM_CLOCK_MHZ, *clock));
            }
        }
        Ok(Capture {
            ts_ms: now_ms,
            gpus,
            jobs,
            events,
        })
    }
}

/// The job an owner's labels name.
fn assignment(gpu_uuid: &str, o: &Owner) -> JobAssignment {
    let job_id = match (o.pod.as_str(), o.namespace.as_str()) {
        ("", _) => o.hpc_job.clone(),
        (pod, "") => pod.to_string(),
        (pod, ns) => format!("{ns}/{pod}"),
    };
    JobAssignment {
        gpu_uuid: gpu_uuid.to_string(),
        job_id: fit_id(job_id),
        pod: o.pod.clone(),
        namespace: o.namespace.clone(),
        container: o.container.clone(),
        hpc_job: o.hpc_job.clone(),
        since_ms: 0,
        share: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(line: &str) -> Sample {
        let mut v = parse(line).unwrap();
        assert_eq!(v.len(), 1, "{line}");
        v.remove(0)
    }

    #[test]
    fn parses_labels_with_escapes_and_spaces() {
        let s = one(
            r#"DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-1",modelName="NVIDIA \"A100\"\\x\nz",pod="",} 1410"#,
        );
        assert_eq!(s.name, "DCGM_FI_DEV_SM_CLOCK");
        assert_eq!(s.label("gpu"), Some("0"));
        assert_eq!(s.label("UUID"), Some("GPU-1"));
        assert_eq!(s.label("modelName"), Some("NVIDIA \"A100\"\\x\nz"));
        assert_eq!(s.label("pod"), Some(""));
        assert_eq!(s.value, 1410.0);
        assert_eq!(s.timestamp_ms, None);
    }

    #[test]
    fn parses_values_timestamps_and_skips_comments() {
        let page = "# HELP a A.\n# TYPE a gauge\n\n   \na 1.5e3 1700000000123\nb{x=\"1\"} NaN\nc +Inf\nd -Inf\n# just a comment\ne{} -0.25\t\nf 7\r\n";
        let v = parse(page).unwrap();
        assert_eq!(v.len(), 6);
        assert_eq!(
            (v[0].value, v[0].timestamp_ms),
            (1500.0, Some(1_700_000_000_123))
        );
        assert!(v[1].value.is_nan());
        assert_eq!(v[2].value, f64::INFINITY);
        assert_eq!(v[3].value, f64::NEG_INFINITY);
        assert_eq!((v[4].name.as_str(), v[4].value), ("e", -0.25));
        assert!(v[4].labels.is_empty());
        assert_eq!(v[5].value, 7.0);
    }

    #[test]
    fn garbage_lines_name_their_line() {
        let cases = [
            ("ok 1\n{x=\"1\"} 2\n", 2, "expected a metric name"),
            ("a{x=\"1} 2\n", 1, "unterminated value"),
            ("a{x=1} 2\n", 1, "expected a quoted value"),
            ("a{x\"1\"} 2\n", 1, "expected `=`"),
            ("a{x=\"1\" y=\"2\"} 2\n", 1, "expected `,` or `}`"),
            ("\n\na\n", 3, "has no value"),
            ("a one\n", 1, "value `one` is not a number"),
            ("a 1 2.5\n", 1, "timestamp `2.5`"),
            ("a 1 2 3\n", 1, "unexpected `3`"),
            ("a{9=\"1\"} 2\n", 1, "expected a label name"),
            ("a 0x10\n", 1, "is not a number"),
        ];
        for (page, line, want) in cases {
            let e = parse(page).expect_err(page);
            assert_eq!(e.line, line, "{page:?}: {e}");
            assert!(e.message.contains(want), "{page:?}: {e}");
        }
    }

    #[test]
    fn maps_fields_with_units_in_table_order() {
        let fields: HashMap<&'static str, f64> = [
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.42),
            ("DCGM_FI_DEV_GPU_UTIL", 87.0),
            ("DCGM_FI_DEV_FB_USED", 1024.0),
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123_456.0),
            ("DCGM_FI_DEV_POWER_USAGE", 312.5),
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 4.0),
            ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 2.0),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 3.0),
        ]
        .into_iter()
        .collect();
        let r = map_fields(&fields);
        let get = |metric: &str| r.iter().find(|r| r.metric == metric).map(|r| r.value);
        assert_eq!(get(m::TENSOR_ACTIVE), Some(0.42));
        assert_eq!(get(m::GPU_UTIL), Some(0.87));
        assert_eq!(get(m::MEM_USED_BYTES), Some(1024.0 * 1024.0 * 1024.0));
        assert_eq!(get(m::ENERGY_J), Some(123.456));
        assert_eq!(get(m::POWER_W), Some(312.5));
        // The current name wins over the older one.
        assert_eq!(get(m::THROTTLE_REASONS), Some(1.0));
        assert_eq!(get(m::NVLINK_ERRORS_TOTAL), Some(5.0));
        assert_eq!(r.len(), 7);
        assert_eq!(r[0].metric, m::TENSOR_ACTIVE);
    }

    #[test]
    fn every_row_names_a_catalog_metric_and_a_dcgm_field() {
        for row in FIELDS {
            assert!(m::lookup(row.metric).is_some(), "{}", row.metric);
            assert!(row.field.starts_with("DCGM_FI_"), "{}", row.field);
            assert!(row.scale > 0.0);
        }
        let mut names: Vec<_> = FIELDS.iter().map(|f| f.field).chain(OTHER_FIELDS).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a field is listed twice");
        // Metrics of several rows must agree on how they fold.
        for a in FIELDS {
            for b in FIELDS.iter().filter(|b| b.metric == a.metric) {
                assert_eq!(a.fold, b.fold, "{}", a.metric);
            }
        }
    }

    #[test]
    fn blanks_and_non_finite_values_give_no_field() {
        assert!(is_blank(9_223_372_036_854_775_794.0));
        assert!(is_blank(140_737_488_355_330.0));
        assert!(!is_blank(140_737_488_355_000.0));
        assert!(!is_blank(1410.0));
        let page = parse(
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS{gpu=\"0\",UUID=\"GPU-a\"} 9223372036854775794\n\
             DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-a\"} 9223372036854775794\n\
             DCGM_FI_DEV_POWER_USAGE{gpu=\"0\",UUID=\"GPU-a\"} NaN\n\
             DCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-a\"} 1410\n\
             dcgm_exporter_build_info{version=\"x\"} 1\n",
        )
        .unwrap();
        let page = group(&page);
        assert_eq!(page.devices.len(), 1);
        let seen = page.devices.values().next().unwrap();
        assert_eq!(seen.fields.len(), 1);
        assert_eq!(seen.fields.get("DCGM_FI_DEV_SM_CLOCK"), Some(&1410.0));
        // Only GPU samples count as ignored fields.
        assert_eq!(
            page.unknown.iter().collect::<Vec<_>>(),
            ["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
        );
    }

    #[test]
    fn mig_instances_follow_their_parent_in_the_inventory() {
        let page = parse(
            "DCGM_FI_DEV_SM_CLOCK{gpu=\"1\",UUID=\"GPU-b\",modelName=\"NVIDIA A100-SXM4-80GB\"} 1410\n\
             DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"1\",UUID=\"GPU-b\",modelName=\"NVIDIA A100-SXM4-80GB\",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\"} 0.5\n\
             DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"1\",UUID=\"GPU-b\",modelName=\"NVIDIA A100-SXM4-80GB\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"10\"} 0.1\n\
             DCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-a\",modelName=\"NVIDIA A100-SXM4-80GB\"} 1400\n",
        )
        .unwrap();
        let (inv, devices) = inventory(&group(&page));
        let uuids: Vec<_> = inv.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-a", "GPU-b", "MIG-GPU-b/2", "MIG-GPU-b/10"]);
        assert_eq!(
            inv[2].mig,
            Mig::Instance(MigInstance {
                parent_uuid: "GPU-b".into(),
                gpu_instance_id: 2,
                compute_instance_id: 0,
                profile: "3g.40gb".into(),
            })
        );
        assert_eq!(inv[2].index, 1);
        assert_eq!(inv[2].model, "NVIDIA A100-SXM4-80GB");
        assert_eq!(devices[2].parent, Some(1));
        assert_eq!(devices[1].parent, None);
        // GPU-b's row is a card counted through its instances; GPU-a is
        // whole.
        assert_eq!(
            (inv[0].mig.clone(), inv[1].mig.clone()),
            (Mig::Off, Mig::Card)
        );
    }

    #[test]
    fn the_listing_only_grows_and_updates_in_place() {
        let row = |gi: Option<(&str, &str)>| {
            match gi {
            None => "DCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-a\"} 1410\n".to_string(),
            Some((id, p)) => format!(
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{gpu=\"0\",UUID=\"GPU-a\",GPU_I_PROFILE=\"{p}\",GPU_I_ID=\"{id}\"}} 0.5\n"
            ),
        }
        };
        let mut listing = Listing::default();
        let page = |rows: &[String]| group(&parse(&rows.concat()).unwrap());
        assert_eq!(listing.extend(&page(&[row(None)])), ["GPU-a"]);
        assert_eq!(listing.infos[0].mig, Mig::Off);
        // An instance is created: appended, and the GPU becomes a card.
        let added = listing.extend(&page(&[row(None), row(Some(("7", "1g.10gb")))]));
        assert_eq!(added, ["MIG-GPU-a/7"]);
        assert_eq!(listing.infos[0].mig, Mig::Card);
        assert_eq!(listing.devices[1].parent, Some(0));
        // Destroyed and created again with another profile: same entry,
        // updated; a second instance is appended after it.
        assert!(listing.extend(&page(&[row(None)])).is_empty());
        let added = listing.extend(&page(&[
            row(None),
            row(Some(("1", "3g.40gb"))),
            row(Some(("7", "2g.20gb"))),
        ]));
        assert_eq!(added, ["MIG-GPU-a/1"]);
        let uuids: Vec<_> = listing.infos.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-a", "MIG-GPU-a/7", "MIG-GPU-a/1"]);
        assert_eq!(listing.infos[1].mig.instance().unwrap().profile, "2g.20gb");
    }

    #[test]
    fn urls_get_a_scheme_and_a_path() {
        assert_eq!(
            normalize_url("localhost:9400").unwrap(),
            "http://localhost:9400/metrics"
        );
        assert_eq!(
            normalize_url("http://10.0.0.1:9400/x").unwrap(),
            "http://10.0.0.1:9400/x"
        );
        assert!(matches!(
            normalize_url("https://h:9400/metrics"),
            Err(SourceError::Config(_))
        ));
        assert!(matches!(
            normalize_url("http://"),
            Err(SourceError::Config(_))
        ));
    }

    #[test]
    fn owners_become_jobs() {
        let pod = Owner {
            pod: "trainer-0".into(),
            namespace: "ml".into(),
            container: "main".into(),
            hpc_job: String::new(),
        };
        let j = assignment("GPU-a", &pod);
        assert_eq!(
            (j.job_id.as_str(), j.pod.as_str(), j.container.as_str()),
            ("ml/trainer-0", "trainer-0", "main")
        );
        let slurm = Owner {
            pod: String::new(),
            namespace: String::new(),
            container: String::new(),
            hpc_job: "4242".into(),
        };
        let j = assignment("GPU-a", &slurm);
        assert_eq!((j.job_id.as_str(), j.hpc_job.as_str()), ("4242", "4242"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(text in any::<String>()) {
            if let Ok(samples) = parse(&text) {
                let _ = group(&samples);
            }
        }

        #[test]
        fn parse_never_panics_on_near_valid_lines(
            text in "[a-zA-Z_{}=\",\\\\ \\n#0-9.+eE-]{0,200}"
        ) {
            if let Ok(samples) = parse(&text) {
                let page = group(&samples);
                let _ = inventory(&page);
            }
        }

        #[test]
        fn label_values_round_trip(value in "\\PC*", v in -1e12f64..1e12) {
            let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let s = one(&format!("x{{l=\"{escaped}\"}} {v}"));
            prop_assert_eq!(s.label("l"), Some(value.as_str()));
            prop_assert_eq!(s.value, v);
        }
    }
}
