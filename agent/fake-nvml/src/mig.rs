//! MIG (Multi-Instance GPU) in the fake driver: each card's layout of GPU
//! instances, how it changes over time, and what every instance runs.
//!
//! * **Profiles** are the H100 80GB's (`nvidia-smi mig -lgip`, [`PROFILES`]):
//!   name, compute slices (of 7), memory slices (of 8), SMs and memory. A
//!   layout may use at most 7 compute slices, 8 memory slices and 7
//!   instances, as the card allows.
//! * **Layouts** (`mig_layout=GPU:LAYOUT;…`, [`crate::config`]): `LAYOUT`
//!   is `+`-separated profiles, each optionally `*N` for N of them
//!   (`3g.40gb+4g.40gb`, `1g.10gb*7`); `none` (or nothing) is MIG mode
//!   with no instances, `off` MIG mode disabled. Instance `k` of a layout
//!   (in the order written) has GPU instance id `k + 1` and one compute
//!   instance spanning it, id 0 (`nvidia-smi mig -cgi … -C`). Real drivers
//!   number GPU instances by placement; what matters to a reader is that
//!   the id is stable while the instance lives.
//! * **Reconfiguration** (`mig_reconfig=GPU:LAYOUT@MS;…`): from `MS` ms
//!   after the fleet start the card has that layout. An instance whose id
//!   keeps its profile across a change lives on (same UUID, same
//!   workload); one whose profile changes is destroyed and created again
//!   (a new UUID); ids beyond the new layout are destroyed.
//! * **MIG mode**: a card named in either key, or every card with `mig=1`,
//!   supports MIG; `nvmlDeviceGetMigMode` reports enabled while its layout
//!   is not `off`. Other cards answer `NOT_SUPPORTED`, as before.
//! * **Workloads**: every instance runs a job of the simulator's demo fleet
//!   ([`FleetPlan::gpu`], picked by card and instance id) with noise of
//!   its own (seed, node, card, instance), so instances differ and are
//!   deterministic. Its tensor activity is a fraction of *its* SMs.
//! * **The card** is the SM-weighted mix of its instances over the card's
//!   SMs: each instance weighs its SMs / the card's 132, SMs in no instance
//!   are idle. That holds for every counter, the SM clock included (one
//!   clock for the whole GPU, rounded to whole MHz as the driver reports
//!   it), so the card's whole-GPU GPM tensor activity is
//!   Σ SMs_i × activity_i / 132, and an instance's OFU at a tick is its
//!   tensor activity × min(the card's clock, f_max) / f_max.
//!
//! Everything here is pure and public, so tests compute the same ground
//! truth the fake answers with ([`MigNode::instance_window`]).

use crate::config::FakeConfig;
pub use crate::layout::{
    parse_card, profile_named, Layout, MigChange, Profile, COMPUTE_SLICES, MAX_INSTANCES,
    MEMORY_SLICES, PROFILES,
};
use flopwatch_sim::{window_over, FleetPlan, GpuState, SimModel, WindowMean, Workload, TICK_MS};

/// One GPU instance alive at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceAt {
    /// GPU instance id (1, 2, … in layout order).
    pub gpu_instance_id: u32,
    /// Compute instance id (always 0: one compute instance per GPU
    /// instance).
    pub compute_instance_id: u32,
    /// Its profile.
    pub profile: Profile,
    /// Which layout of the card's timeline created it (a recreated
    /// instance has a new one, hence a new UUID).
    pub generation: usize,
}

/// The MIG side of a fake node: every card's timeline of layouts and every
/// instance's workload.
#[derive(Debug, Clone)]
pub struct MigNode {
    /// Per card: (from unix ms, layout), ascending; empty for a card
    /// without MIG support.
    timelines: Vec<Vec<(i64, Layout)>>,
    /// Workloads instance ids are given: card `g`, id `i` runs
    /// `plans[(3 g + i) % plans.len()]`.
    plans: Vec<Workload>,
    seed: u64,
    node: u64,
}

impl MigNode {
    /// The MIG layouts `config` describes, for a fleet started at
    /// `start_ms` (unix ms).
    pub fn new(config: &FakeConfig, start_ms: i64) -> Self {
        let mut timelines: Vec<Vec<(i64, Layout)>> = vec![Vec::new(); config.gpus];
        let named = |g: usize| {
            config.mig_layout.iter().any(|(c, _)| *c == g)
                || config.mig_reconfig.iter().any(|c| c.gpu == g)
        };
        for (g, timeline) in timelines.iter_mut().enumerate() {
            if !config.mig && !named(g) {
                continue;
            }
            let initial = config
                .mig_layout
                .iter()
                .rev()
                .find(|(c, _)| *c == g)
                .map_or(
                    if config.mig {
                        Layout::On(Vec::new())
                    } else {
                        Layout::Off
                    },
                    |(_, l)| l.clone(),
                );
            timeline.push((i64::MIN, initial));
            let mut changes: Vec<&MigChange> =
                config.mig_reconfig.iter().filter(|c| c.gpu == g).collect();
            changes.sort_by_key(|c| c.at_ms);
            for c in changes {
                timeline.push((start_ms.saturating_add(c.at_ms), c.layout.clone()));
            }
        }
        let fleet = FleetPlan::new(1, 8, config.regress_after_ms);
        Self {
            timelines,
            plans: (0..8).map(|g| fleet.gpu(0, g).workload).collect(),
            seed: config.seed,
            node: config.node as u64,
        }
    }

    /// Whether any card ever has MIG instances (when none does, the cards
    /// are the simulator's GPUs as they are).
    pub fn has_instances(&self) -> bool {
        self.timelines
            .iter()
            .flatten()
            .any(|(_, l)| !l.instances().is_empty())
    }

    /// Whether card `gpu` supports MIG at all.
    pub fn supported(&self, gpu: usize) -> bool {
        self.timelines.get(gpu).is_some_and(|t| !t.is_empty())
    }

    /// Index of the layout card `gpu` has at `t_ms` in its timeline.
    fn step_at(&self, gpu: usize, t_ms: i64) -> Option<usize> {
        let t = self.timelines.get(gpu)?;
        t.partition_point(|(from, _)| *from <= t_ms).checked_sub(1)
    }

    /// Card `gpu`'s layout at `t_ms` (`Off` for a card without MIG).
    pub fn layout_at(&self, gpu: usize, t_ms: i64) -> &Layout {
        match self.step_at(gpu, t_ms) {
            Some(i) => &self.timelines[gpu][i].1,
            None => &Layout::Off,
        }
    }

    /// The instances of card `gpu` at `t_ms`, by id.
    pub fn instances_at(&self, gpu: usize, t_ms: i64) -> Vec<InstanceAt> {
        let Some(step) = self.step_at(gpu, t_ms) else {
            return Vec::new();
        };
        let timeline = &self.timelines[gpu];
        timeline[step]
            .1
            .instances()
            .iter()
            .enumerate()
            .map(|(k, &profile)| {
                // Back through the changes that kept this id's profile.
                let mut generation = step;
                while generation > 0
                    && timeline[generation - 1].1.instances().get(k) == Some(&profile)
                {
                    generation -= 1;
                }
                InstanceAt {
                    gpu_instance_id: k as u32 + 1,
                    compute_instance_id: 0,
                    profile,
                    generation,
                }
            })
            .collect()
    }

    /// Instance `gpu_instance_id` of card `gpu` at `t_ms`, if it exists.
    pub fn instance_at(&self, gpu: usize, gpu_instance_id: u32, t_ms: i64) -> Option<InstanceAt> {
        self.instances_at(gpu, t_ms)
            .into_iter()
            .find(|i| i.gpu_instance_id == gpu_instance_id)
    }

    /// The MIG device UUID of `instance` on the card whose UUID is
    /// `card_uuid` (`MIG-` and a UUID derived from the card's, the instance
    /// id and its generation).
    pub fn uuid(&self, card_uuid: &str, instance: &InstanceAt) -> String {
        let mut a = card_uuid
            .bytes()
            .fold(0x004d_4947_u64, |h, b| mix(h ^ u64::from(b)));
        a = mix(a ^ u64::from(instance.gpu_instance_id) ^ ((instance.generation as u64) << 32));
        let b = mix(a);
        format!(
            "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            a as u16,
            (b >> 48) as u16,
            b & 0xFFFF_FFFF_FFFF
        )
    }

    /// What instance `gpu_instance_id` of card `gpu` runs, and its noise key.
    pub fn workload(&self, gpu: usize, gpu_instance_id: u32) -> (&Workload, u64) {
        let w = &self.plans[(3 * gpu + gpu_instance_id as usize) % self.plans.len()];
        let key = mix(self.seed
            ^ mix((self.node << 20) ^ ((gpu as u64) << 8) ^ 0x4d49_4700)
            ^ u64::from(gpu_instance_id));
        (w, key)
    }

    /// Each instance's own state during `tick` (as if it had the card to
    /// itself, clock included) and the card's mix of them; `None` when the
    /// card is not in MIG mode then.
    fn tick(&self, model: &SimModel, gpu: usize, tick: i64) -> Option<(Vec<GpuState>, GpuState)> {
        let layout = self.layout_at(gpu, tick * TICK_MS);
        if !layout.is_on() {
            return None;
        }
        let m = &model.model;
        let card_sms = f64::from(m.sm_count);
        let mut own = Vec::with_capacity(layout.instances().len());
        let mut card = GpuState::default();
        let mut rest = 1.0;
        for (k, p) in layout.instances().iter().enumerate() {
            let (workload, key) = self.workload(gpu, k as u32 + 1);
            let s = workload.state(m, key, model.start_ms, tick);
            let w = f64::from(p.sm_count) / card_sms;
            card.add_scaled(&s, w);
            rest -= w;
            own.push(s);
        }
        if rest > 0.0 {
            let (_, key) = self.workload(gpu, 0);
            card.add_scaled(&Workload::Idle.state(m, key, model.start_ms, tick), rest);
        }
        // The driver's resolution: whole MHz, whole mW, whole bytes.
        card.sm_clock_mhz = card.sm_clock_mhz.round();
        card.power_w = (card.power_w * 1000.0).round() / 1000.0;
        card.mem_used_bytes = card.mem_used_bytes.round();
        Some((own, card))
    }

    /// Card `gpu`'s state during `tick`: the mix of its instances in MIG
    /// mode, the simulator's GPU otherwise.
    pub fn card_tick(&self, model: &SimModel, gpu: usize, tick: i64) -> GpuState {
        match self.tick(model, gpu, tick) {
            Some((_, card)) => card,
            None => model.state_at(gpu, tick * TICK_MS),
        }
    }

    /// Card `gpu`'s state at `t_ms` (what a point read returns).
    pub fn card_state_at(&self, model: &SimModel, gpu: usize, t_ms: i64) -> GpuState {
        self.card_tick(model, gpu, t_ms.div_euclid(TICK_MS))
    }

    /// Card `gpu`'s exact means over `[from_ms, to_ms)` (its whole-GPU GPM
    /// window).
    pub fn card_window(
        &self,
        model: &SimModel,
        gpu: usize,
        from_ms: i64,
        to_ms: i64,
    ) -> WindowMean {
        if !self.supported(gpu) {
            return model.window(gpu, from_ms, to_ms);
        }
        let f = f64::from(model.model.tensor_clock_mhz);
        window_over(from_ms, to_ms, f, |t| self.card_tick(model, gpu, t))
    }

    /// Instance `gpu_instance_id` of card `gpu` during `tick`: its own
    /// counters with the card's SM clock; `None` when it does not exist.
    pub fn instance_tick(
        &self,
        model: &SimModel,
        gpu: usize,
        gpu_instance_id: u32,
        tick: i64,
    ) -> Option<GpuState> {
        let k = usize::try_from(gpu_instance_id).ok()?.checked_sub(1)?;
        let (own, card) = self.tick(model, gpu, tick)?;
        let mut s = *own.get(k)?;
        s.sm_clock_mhz = card.sm_clock_mhz;
        Some(s)
    }

    /// Exact means of instance `gpu_instance_id` of card `gpu` over
    /// `[from_ms, to_ms)` (its MIG GPM window), with its ground-truth OFU
    /// (tick by tick, against the card's clock). Ticks where the instance
    /// does not exist count as idle.
    pub fn instance_window(
        &self,
        model: &SimModel,
        gpu: usize,
        gpu_instance_id: u32,
        from_ms: i64,
        to_ms: i64,
    ) -> WindowMean {
        let f = f64::from(model.model.tensor_clock_mhz);
        window_over(from_ms, to_ms, f, |t| {
            self.instance_tick(model, gpu, gpu_instance_id, t)
                .unwrap_or_default()
        })
    }
}

/// SplitMix64, for the fake's own deterministic keys.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(l: &Layout) -> Vec<&'static str> {
        l.instances().iter().map(|p| p.name).collect()
    }

    #[test]
    fn layouts_parse_profiles_counts_and_modes() {
        assert_eq!(
            names(&Layout::parse("3g.40gb+4g.40gb").unwrap()),
            ["3g.40gb", "4g.40gb"]
        );
        assert_eq!(
            names(&Layout::parse(" 1g.10gb*7 ").unwrap()),
            ["1g.10gb"; 7]
        );
        assert_eq!(
            names(&Layout::parse("2g.20gb*2+3g.40gb").unwrap()),
            ["2g.20gb", "2g.20gb", "3g.40gb"]
        );
        assert_eq!(Layout::parse("none"), Ok(Layout::On(Vec::new())));
        assert_eq!(Layout::parse(""), Ok(Layout::On(Vec::new())));
        assert_eq!(Layout::parse("off"), Ok(Layout::Off));
        assert_eq!(
            Layout::parse("7g.80gb").unwrap().instances()[0].sm_count,
            132
        );
    }

    #[test]
    fn layouts_the_card_cannot_hold_are_refused() {
        for bad in [
            "5g.50gb",
            "1g.10gb*8",
            "4g.40gb*2",
            "1g.20gb*5",
            "3g.40gb+7g.80gb",
            "1g.10gb*x",
            "1g.10gb*0",
            "3g.40gb+",
        ] {
            assert!(Layout::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn changes_parse_with_their_time() {
        assert_eq!(
            MigChange::parse("1:2g.20gb+2g.20gb@5000"),
            Ok(MigChange {
                gpu: 1,
                layout: Layout::parse("2g.20gb*2").unwrap(),
                at_ms: 5000
            })
        );
        assert_eq!(MigChange::parse("0:off@-5").unwrap().layout, Layout::Off);
        for bad in ["1:2g.20gb", "x:none@1", "1:none@soon", "2g.20gb@1"] {
            assert!(MigChange::parse(bad).is_err(), "{bad}");
        }
    }

    fn node(spec: &str) -> (MigNode, SimModel) {
        let c = FakeConfig::parse(spec).unwrap();
        let model = SimModel::new(&FleetPlan::new(1, c.gpus, c.regress_after_ms), 0, 0, c.seed);
        (MigNode::new(&c, 0), model)
    }

    #[test]
    fn reconfiguration_keeps_unchanged_instances_and_recreates_changed_ones() {
        let (n, _) = node("gpus=2,mig_layout=0:3g.40gb+2g.20gb+1g.10gb,mig_reconfig=0:3g.40gb+1g.20gb@5000;0:off@9000");
        let before = n.instances_at(0, 4_999);
        let after = n.instances_at(0, 5_000);
        assert_eq!(before.len(), 3);
        assert_eq!(after.len(), 2);
        assert_eq!(
            after[0], before[0],
            "GI 1 kept its profile: the same instance"
        );
        assert_eq!(after[1].profile.name, "1g.20gb");
        assert_ne!(
            n.uuid("GPU-x", &after[1]),
            n.uuid("GPU-x", &before[1]),
            "GI 2 was recreated"
        );
        assert_eq!(n.uuid("GPU-x", &after[0]), n.uuid("GPU-x", &before[0]));
        assert!(n.uuid("GPU-x", &after[0]).starts_with("MIG-"));
        assert_eq!(n.layout_at(0, 9_000), &Layout::Off);
        assert!(n.instances_at(0, 9_000).is_empty());
        assert!(!n.supported(1), "card 1 is named nowhere");
        assert!(n.supported(0));
    }

    #[test]
    fn the_card_is_the_sm_weighted_mix_of_its_instances() {
        let (n, model) = node("gpus=1,seed=4,mig_layout=0:3g.40gb+2g.20gb+1g.10gb");
        let (from, to) = (10_000, 11_000);
        let card = n.card_window(&model, 0, from, to).mean;
        let mix: f64 = [(1, 60.0), (2, 32.0), (3, 16.0)]
            .iter()
            .map(|&(gi, sms)| {
                sms / 132.0
                    * n.instance_window(&model, 0, gi, from, to)
                        .mean
                        .tensor_active
            })
            .sum();
        assert!(
            (card.tensor_active - mix).abs() < 1e-9,
            "{} vs {mix}",
            card.tensor_active
        );
        // Instances differ, and one clock runs them all.
        let a = n.instance_window(&model, 0, 1, from, to).mean;
        let b = n.instance_window(&model, 0, 2, from, to).mean;
        assert_ne!(a.tensor_active, b.tensor_active);
        assert_eq!(a.sm_clock_mhz, card.sm_clock_mhz);
        assert_eq!(b.sm_clock_mhz, card.sm_clock_mhz);
        assert!(n.instance_tick(&model, 0, 4, 1_000).is_none(), "no GI 4");
    }
}
