//! Reports: a text summary in the style of `torch.cuda.memory_summary`, and a JSON snapshot
//! with the event timeline.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use crate::device::DeviceState;
use crate::engine::RematStats;
use crate::ledger::{Event, EventKind, Role, RoleBytes};
use crate::runtime::{PoolUsage, SettledReserved};
use crate::units::format_bytes;

/// Live bytes held by the outputs of one Backend method.
#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    /// The Backend method, e.g. `float_matmul`.
    pub op: String,
    /// Live bytes of buffers it produced.
    pub bytes: u64,
    /// Number of such live buffers.
    pub tensors: u64,
}

/// A summary of one device's ledger at one moment. `Display` prints it as a table.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// The device, as its `Debug` form prints it.
    pub device: String,
    /// Bytes of live tensor storage.
    pub live_bytes: u64,
    /// Highest `live_bytes` since the start or the last [`crate::memory::reset_peak`].
    pub peak_bytes: u64,
    /// Live buffers (views share one).
    pub live_tensors: u64,
    /// Highest `live_tensors` since the last reset.
    pub peak_tensors: u64,
    /// Buffers charged since the process started.
    pub total_allocs: u64,
    /// Bytes charged since the process started.
    pub total_alloc_bytes: u64,
    /// Live bytes by producing op, largest first.
    pub holders: Vec<Holder>,
    /// Live bytes by what they are for (see [`crate::memory::set_phase`]).
    pub live_by_role: RoleBytes,
    /// Each role's highest live bytes (its own high, not at one moment).
    pub peak_by_role: RoleBytes,
    /// The device pool's own figures, where the device is a CubeCL one.
    pub pool: Option<PoolUsage>,
    /// On frugal-cuda under a budget: the most its allocator reserved in a settled step of the
    /// plan, beside the growth limit that step began under.
    pub settled_reserved: Option<SettledReserved>,
    /// The memory budget, if one is set ([`crate::memory::set_budget`]).
    pub budget: Option<u64>,
    /// What the budget and checkpoint scopes evicted, recomputed, offloaded and restored.
    pub remat: RematStats,
}

impl Holder {
    /// The ledger's live bytes by op, biggest first (atomics only: no lock).
    pub(crate) fn of(state: &DeviceState) -> Vec<Holder> {
        state
            .ledger
            .holders()
            .into_iter()
            .map(|(op, bytes, tensors)| Holder {
                op: op.name().to_string(),
                bytes,
                tensors,
            })
            .collect()
    }
}

impl MemoryReport {
    pub(crate) fn of(
        state: &DeviceState,
        pool: Option<PoolUsage>,
        settled_reserved: Option<SettledReserved>,
    ) -> Self {
        let ledger = &state.ledger;
        Self {
            device: ledger.label.clone(),
            live_bytes: ledger.bytes().current(),
            peak_bytes: ledger.bytes().peak(),
            live_tensors: ledger.buffers().current(),
            peak_tensors: ledger.buffers().peak(),
            total_allocs: ledger.buffers().total(),
            total_alloc_bytes: ledger.bytes().total(),
            holders: Holder::of(state),
            live_by_role: ledger.live_by_role(),
            peak_by_role: ledger.peak_by_role(),
            pool,
            settled_reserved,
            budget: state.budget.limit(),
            remat: state.budget.stats(),
        }
    }
}

const TOP_HOLDERS: usize = 10;
const WIDTH: usize = 75;

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule =
            |f: &mut fmt::Formatter<'_>, c: char| writeln!(f, "|{}|", c.to_string().repeat(WIDTH));
        rule(f, '=')?;
        writeln!(f, "|{:^WIDTH$}|", "Frugal memory summary")?;
        writeln!(f, "|{:^WIDTH$}|", format!("device: {}", self.device))?;
        rule(f, '-')?;
        writeln!(
            f,
            "| {:<26}|{:>15} |{:>15} |{:>13} |",
            "Metric", "Current", "Peak", "Total"
        )?;
        rule(f, '-')?;
        writeln!(
            f,
            "| {:<26}|{:>15} |{:>15} |{:>13} |",
            "Live tensor bytes",
            format_bytes(self.live_bytes),
            format_bytes(self.peak_bytes),
            format_bytes(self.total_alloc_bytes)
        )?;
        writeln!(
            f,
            "| {:<26}|{:>15} |{:>15} |{:>13} |",
            "Live buffers", self.live_tensors, self.peak_tensors, self.total_allocs
        )?;
        if self.live_by_role.other != self.live_bytes || self.peak_by_role.other != self.peak_bytes
        {
            rule(f, '-')?;
            writeln!(
                f,
                "| {:<26}|{:>15} |{:>15} |{:>13} |",
                "Live bytes by role", "Current", "Peak", "Share"
            )?;
            for role in Role::ALL {
                let live = self.live_by_role.get(role);
                let share = if self.live_bytes == 0 {
                    0.0
                } else {
                    100.0 * live as f64 / self.live_bytes as f64
                };
                writeln!(
                    f,
                    "| {:<26}|{:>15} |{:>15} |{:>12.1}% |",
                    format!("  {}", role.label()),
                    format_bytes(live),
                    format_bytes(self.peak_by_role.get(role)),
                    share
                )?;
            }
        }
        let remat = &self.remat;
        if self.budget.is_some() || *remat != RematStats::default() {
            rule(f, '-')?;
            let budget = self.budget.map_or("none".to_string(), format_bytes);
            writeln!(f, "| {:<26}|{budget:>15} |{:>32}|", "Budget", "")?;
            writeln!(
                f,
                "| {:<26}|{:>15} |{:>15} |{:>13} |",
                "Rematerialisation", "Count", "Bytes", ""
            )?;
            for (label, count, bytes) in [
                (
                    "  evicted to recompute",
                    remat.evictions,
                    remat.evicted_bytes,
                ),
                ("  recomputed", remat.recomputes, remat.recomputed_bytes),
                ("  offloaded to host", remat.offloads, remat.offloaded_bytes),
                ("  uploaded from host", remat.uploads, remat.uploaded_bytes),
                (
                    "  compressed (16-bit)",
                    remat.compressions,
                    remat.compressed_bytes,
                ),
                ("  packed (0/1 as bool)", remat.packs, remat.packed_bytes),
            ] {
                // The recomputed work beside what the forward pass made (see
                // `RematStats::recompute_ratio`).
                let ratio = remat.recompute_ratio();
                let note = match label == "  recomputed" && ratio > 0.0 {
                    true => format!("{ratio:.2}x fwd"),
                    false => String::new(),
                };
                writeln!(
                    f,
                    "| {label:<26}|{count:>15} |{:>15} |{note:>13} |",
                    format_bytes(bytes),
                )?;
            }
            writeln!(
                f,
                "| {:<26}|{:>15} |{:>15} |{:>13} |",
                "  host memory",
                format_bytes(remat.host_bytes),
                format_bytes(remat.peak_host_bytes),
                ""
            )?;
            let step = match remat.plan_period {
                0 => "not learned".to_string(),
                n => format!("{n} tensors"),
            };
            writeln!(
                f,
                "| {:<26}|{step:>15} |{:>15} |{:>13} |",
                "Learned step",
                format!("{} re-plans", remat.replans),
                format!("{} planned", remat.planned_rounds),
            )?;
            // A selection drops chosen tensors at its cuts; segments drop whole segments.
            let (label, segments, bytes) = match (remat.plan_segments, remat.plan_selected_bytes) {
                (0, _) => ("  forward segments", "none".to_string(), 0),
                (n, 0) => (
                    "  forward segments",
                    format!("{n}"),
                    remat.plan_segment_bytes,
                ),
                (n, selected) => ("  selective recompute", format!("{n} cuts"), selected),
            };
            writeln!(
                f,
                "| {:<26}|{segments:>15} |{:>15} |{:>13} |",
                label,
                format_bytes(bytes),
                format!("{} over budget", remat.budget_rounds),
            )?;
            if remat.plan_segments > 0 {
                writeln!(
                    f,
                    "| {:<26}|{:>15} |{:>15} |{:>13} |",
                    "  estimated peak",
                    format_bytes(remat.plan_estimated_peak),
                    format!("{} room rounds", remat.room_rounds),
                    "",
                )?;
                // What the estimate predicted, measured on the first step made under it.
                if remat.plan_measured_peak > 0 && remat.plan_estimated_peak > 0 {
                    let ratio = remat.plan_measured_peak as f64 / remat.plan_estimated_peak as f64;
                    writeln!(
                        f,
                        "| {:<26}|{:>15} |{:>15} |{:>13} |",
                        "  measured peak",
                        format_bytes(remat.plan_measured_peak),
                        format!("{ratio:.3}x estimate"),
                        "",
                    )?;
                }
            }
            // No eviction brings live bytes below the largest op's own inputs and output.
            if remat.plan_op_floor > 0 {
                let note = match self.budget {
                    Some(budget) if remat.plan_op_floor > budget => "over budget",
                    _ => "",
                };
                writeln!(
                    f,
                    "| {:<26}|{:>15} |{:>15} |{note:>13} |",
                    "  largest op at once",
                    format_bytes(remat.plan_op_floor),
                    "",
                )?;
            }
            if remat.plan_parked_bytes > 0 {
                writeln!(
                    f,
                    "| {:<26}|{:>15} |{:>15} |{:>13} |",
                    "  optimizer state parked",
                    format_bytes(remat.plan_parked_bytes),
                    format!("{} in all", format_bytes(remat.parked_bytes)),
                    "",
                )?;
            }
            writeln!(
                f,
                "| {:<26}|{:>15} |{:>15} |{:>13} |",
                "Time (ms)", "searching", "offload waits", "uploads"
            )?;
            writeln!(
                f,
                "| {:<26}|{:>15.1} |{:>15.1} |{:>13.1} |",
                format!("  {} offload batches", remat.offload_batches),
                remat.search_nanos as f64 / 1e6,
                remat.offload_nanos as f64 / 1e6,
                remat.upload_nanos as f64 / 1e6,
            )?;
        }
        if let Some(pool) = &self.pool {
            rule(f, '-')?;
            writeln!(f, "| {:<WIDTH$}|", "Device pool (CubeCL), current")?;
            for (label, value) in [
                ("  in use", format_bytes(pool.bytes_in_use)),
                ("  padding", format_bytes(pool.bytes_padding)),
                ("  reserved", format_bytes(pool.bytes_reserved)),
                ("  allocations", pool.allocations.to_string()),
            ] {
                writeln!(f, "| {label:<26}|{value:>15} |{:>32}|", "")?;
            }
        }
        if let Some(settled) = &self.settled_reserved {
            rule(f, '-')?;
            writeln!(
                f,
                "| {:<WIDTH$}|",
                "Reserved in settled steps (frugal-cuda)"
            )?;
            for (label, value) in [
                ("  limit they began under", format_bytes(settled.limit)),
                ("  peak reserved", format_bytes(settled.peak_reserved)),
                (
                    "  steps past their limit",
                    settled.steps_over_limit.to_string(),
                ),
            ] {
                writeln!(f, "| {label:<26}|{value:>15} |{:>32}|", "")?;
            }
        }
        rule(f, '-')?;
        writeln!(
            f,
            "| {:<26}|{:>15} |{:>15} |{:>13} |",
            "Top holders (by op)", "Bytes", "Buffers", "Share"
        )?;
        rule(f, '-')?;
        for holder in self.holders.iter().take(TOP_HOLDERS) {
            let share = if self.live_bytes == 0 {
                0.0
            } else {
                100.0 * holder.bytes as f64 / self.live_bytes as f64
            };
            writeln!(
                f,
                "| {:<26}|{:>15} |{:>15} |{:>12.1}% |",
                holder.op,
                format_bytes(holder.bytes),
                holder.tensors,
                share
            )?;
        }
        if self.holders.len() > TOP_HOLDERS {
            writeln!(
                f,
                "| {:<WIDTH$}|",
                format!("... and {} more ops", self.holders.len() - TOP_HOLDERS)
            )?;
        }
        rule(f, '=')
    }
}

/// A report plus the recorded timeline, ready to export as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// The summary at the moment of the snapshot.
    pub report: MemoryReport,
    /// Events kept by the bounded timeline, oldest first (empty unless recording was on).
    pub events: Vec<Event>,
    /// Events that fell off the front of the timeline because it was full.
    pub dropped_events: u64,
    /// On frugal-cuda, its allocator at the moment of the snapshot: segments, blocks and, when
    /// `frugal_cuda::record_allocation_trace` was on, its trace. `None` on other devices. Left
    /// out of the JSON (the trace can be large); [`Snapshot::write_memory_viz`] writes it.
    #[serde(skip)]
    pub allocator: Option<crate::runtime::AllocatorView>,
}

impl Snapshot {
    /// The snapshot as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a snapshot always serialises")
    }

    /// Who held the live bytes at the highest point of the recorded timeline, found by
    /// replaying its events. `None` if nothing was recorded or events fell off the front of
    /// the timeline (the replay would miss their buffers).
    pub fn holders_at_peak(&self) -> Option<PeakHolders> {
        if self.dropped_events > 0 {
            return None;
        }
        let (peak_at, peak) = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EventKind::Alloc)
            .max_by_key(|(at, e)| (e.live_bytes, std::cmp::Reverse(*at)))?;
        // Buffer number -> index of its alloc event, for the buffers live at the peak.
        let mut live: HashMap<u64, usize> = HashMap::new();
        for (at, event) in self.events[..=peak_at].iter().enumerate() {
            match event.kind {
                EventKind::Alloc => {
                    live.insert(event.alloc_seq, at);
                }
                EventKind::Free => {
                    live.remove(&event.alloc_seq);
                }
                EventKind::Mark => {}
            }
        }
        let mut by_op: HashMap<&str, (u64, u64)> = HashMap::new();
        for &at in live.values() {
            let event = &self.events[at];
            let entry = by_op.entry(&event.op).or_default();
            entry.0 += event.bytes;
            entry.1 += 1;
        }
        let mut holders: Vec<Holder> = by_op
            .into_iter()
            .map(|(op, (bytes, tensors))| Holder {
                op: op.to_string(),
                bytes,
                tensors,
            })
            .collect();
        holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.op.cmp(&b.op)));
        let recorded: u64 = holders.iter().map(|h| h.bytes).sum();
        let mark = self.events[..peak_at]
            .iter()
            .rev()
            .find(|e| e.kind == EventKind::Mark)
            .map(|e| e.op.clone());
        Some(PeakHolders {
            seq: peak.seq,
            live_bytes: peak.live_bytes,
            after_mark: mark,
            holders,
            before_recording_bytes: peak.live_bytes.saturating_sub(recorded),
        })
    }
}

/// The holders of the live bytes at a timeline's peak (see [`Snapshot::holders_at_peak`]).
#[derive(Clone, Debug, Serialize)]
pub struct PeakHolders {
    /// The timeline position of the allocation that reached the peak.
    pub seq: u64,
    /// Live bytes on the device at the peak.
    pub live_bytes: u64,
    /// The last mark recorded before the peak (e.g. "backward"), if any.
    pub after_mark: Option<String>,
    /// Bytes of the buffers live at the peak that were allocated during recording, by the
    /// Backend method that produced them, most bytes first.
    pub holders: Vec<Holder>,
    /// Live bytes at the peak held by buffers allocated before recording started.
    pub before_recording_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settled_steps_reserved_bytes_print_beside_the_limit_they_began_under() {
        let device = burn::backend::ndarray::NdArrayDevice::Cpu;
        let mut report = MemoryReport::of(DeviceState::of_device(&device), None, None);
        assert!(!report.to_string().contains("settled steps"));
        report.settled_reserved = Some(SettledReserved {
            peak_reserved: 3 << 30,
            limit: 4 << 30,
            steps_over_limit: 2,
        });
        let text = report.to_string();
        let line = |label: &str| {
            text.lines()
                .find(|line| line.contains(label))
                .unwrap_or_else(|| panic!("no {label:?} line in\n{text}"))
                .to_string()
        };
        assert!(text.contains("Reserved in settled steps (frugal-cuda)"));
        assert!(line("limit they began under").contains(&format_bytes(4 << 30)));
        assert!(line("peak reserved").contains(&format_bytes(3 << 30)));
        assert!(line("steps past their limit").contains('2'));
    }
}
