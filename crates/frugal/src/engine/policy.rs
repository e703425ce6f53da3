//! The eviction policy: which tensor to drop when live bytes exceed the budget, and whether to
//! recompute it or copy it to host memory.
//!
//! Each resident tensor that can be dropped gets a score, as in DTR (Kirisame et al., ICLR
//! 2021): the cost of bringing it back divided by the bytes it frees and by how long it has
//! gone unused. The lowest score goes first. The cost of a recomputation is the op's estimated
//! memory traffic (plus arithmetic for matmul and convolution) and that of its evicted inputs,
//! which would be recomputed with it; the cost of an offload is a round trip over the host
//! link, [`Policy::host_cost_per_byte`] per byte. Tensors that cannot be replayed identically
//! (random draws, uploads, empty buffers, outputs of ops that consumed their last input) can
//! only be offloaded.
//!
//! With a storage type set ([`crate::memory::set_storage_precision`]), f32 tensors may also be
//! compressed: kept on the device in bf16/f16, freeing half their bytes, for
//! [`COMPRESS_COST_PER_BYTE`] bytes of traffic per byte (the two casts). Compression and
//! recomputation need no wait for the device, so both rank before offloads, by score; the
//! score counts the bytes an action frees (half, for compression). The eviction mode restricts
//! recomputation and offload only: compression is on whenever a storage type is set.

use super::CellInfo;

/// What to do with a tensor chosen for eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Drop the device buffer; re-run the op that made it when it is read.
    Recompute,
    /// Copy it to host memory, free the device buffer, copy it back when it is read.
    Offload,
    /// Keep it on the device in a 16-bit storage type (see
    /// [`crate::memory::set_storage_precision`]), cast back to f32 when it is read. Lossy: the
    /// restored tensor is the f32 value of the rounded one.
    Compress,
    /// Keep a tensor of only 0 and 1 (dropout's mask) on the device as booleans, made a float
    /// again when it is read. Exact, and a quarter of an f32 tensor's bytes.
    Pack,
}

/// Which actions the policy may choose from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionMode {
    /// The cheaper of recomputation and offload, by estimated cost.
    #[default]
    Auto,
    /// Only recomputation; tensors that cannot be recomputed stay.
    RecomputeOnly,
    /// Only host offload, except tensors with a strided layout (views and what is computed
    /// from them), which a host copy would not reproduce exactly: those are recomputed.
    OffloadOnly,
}

/// Tuning of the eviction policy for one device (see [`crate::memory::set_policy`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// Which actions may be used. In `Auto`, a tensor that can be recomputed is preferred to
    /// one that must be offloaded whatever their scores: a host copy waits for the device to
    /// finish its queue, which costs more than the bytes moved.
    pub mode: EvictionMode,
    /// Cost of moving one byte to the host and back, in units of one byte of device memory
    /// traffic. The default, 64, is about an H100's memory bandwidth over PCIe 4 x16 in both
    /// directions.
    pub host_cost_per_byte: f64,
    /// The longest chain of evicted tensors one read may recompute. Tensors whose recipe would
    /// go deeper are offloaded or kept instead.
    pub max_depth: u32,
    /// Under a budget, whether the end of a checkpoint scope leaves the scope's costly products
    /// (matmul, linear, convolution and attention outputs whose recomputation is estimated at
    /// 8 or more bytes of memory traffic per byte they hold, e.g. a linear layer's output
    /// contracting 512 or more features, not `q·kᵀ` over 64) on the device, for the budget to
    /// evict by score when it needs room, and evicts only the rest: selective checkpointing.
    /// Without a budget a scope evicts everything it can whatever this says. Off by default:
    /// on the reference GPT step under a budget of 1/3 of its peak the kept products crowded
    /// the budget, which then offloaded parameters (`docs/results.md`).
    pub scope_keeps_products: bool,
    /// Once the budget has learned the training step (the same tensors created in the same
    /// order, step after step), score tensors by how soon the step will read them again, in
    /// one deterministic pass over all of them, so that every step makes the same choices;
    /// otherwise, and until a step is learned, by how long they have gone unused (DTR). On by
    /// default.
    pub planned: bool,
    /// Once the step is learned and its peak would not fit the budget, cut the step's forward
    /// pass into segments and evict, at each segment's end, what the forward pass will not
    /// read again (checkpoints read across an end stay), as `checkpoint` scopes would; and
    /// keep no recipe for parameters and optimizer state (it would hold the previous step's
    /// state on the device). Not under [`EvictionMode::OffloadOnly`], which recomputes nothing.
    /// On by default: without it, a budget alone on Burn's fused backends restores in orders
    /// the fusion has not compiled, step after step.
    pub forward_segments: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            mode: EvictionMode::Auto,
            host_cost_per_byte: 64.0,
            max_depth: 32,
            scope_keeps_products: false,
            planned: true,
            forward_segments: true,
        }
    }
}

/// Device memory traffic of compressing one byte of f32 and restoring it: read 4 and write 2
/// bytes per element, then read 2 and write 4: 12 bytes per 4-byte element.
pub const COMPRESS_COST_PER_BYTE: f64 = 3.0;

/// How a tensor can be kept on the device in fewer bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shrink {
    /// In the budget's 16-bit storage type: half of an f32 tensor's bytes (lossy).
    Compress,
    /// As booleans, in `packed` bytes (exact: its elements are only 0 and 1).
    Pack { packed: u64 },
}

impl Shrink {
    /// The bytes shrinking a tensor of `bytes` frees.
    fn frees(self, bytes: f64) -> f64 {
        match self {
            Shrink::Compress => bytes / 2.0,
            Shrink::Pack { packed } => bytes - packed as f64,
        }
    }

    /// Device memory traffic of shrinking a tensor of `bytes` and restoring it.
    fn cost(self, bytes: f64) -> f64 {
        match self {
            Shrink::Compress => COMPRESS_COST_PER_BYTE * bytes,
            // Read it and write the booleans; read them and write it again.
            Shrink::Pack { packed } => 2.0 * (bytes + packed as f64),
        }
    }

    fn action(self) -> Action {
        match self {
            Shrink::Compress => Action::Compress,
            Shrink::Pack { .. } => Action::Pack,
        }
    }
}

/// One resident tensor that may be evicted, scored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub(crate) score: f64,
    pub(crate) action: Action,
    /// The step plan expects the tensor to outlive the step.
    outlives_step: bool,
}

impl Candidate {
    /// Orders candidates, best first: recomputation and compression, then offloads of
    /// tensors the step makes and drops (an activation goes to the host and back once), then
    /// offloads of tensors that outlive the step (parameters and optimizer state, read again
    /// in every phase of every step); by score within each.
    pub(crate) fn rank(&self) -> (u8, f64) {
        let tier = match (self.action, self.outlives_step) {
            (Action::Offload, true) => 2,
            (Action::Offload, false) => 1,
            _ => 0,
        };
        (tier, self.score)
    }

    /// The one order every search of the budget ranks candidates by: [`Self::rank`]'s tier,
    /// then score (ties keep their order).
    pub(crate) fn cmp_rank(&self, other: &Candidate) -> std::cmp::Ordering {
        let ((tier, score), (other_tier, other_score)) = (self.rank(), other.rank());
        tier.cmp(&other_tier).then(score.total_cmp(&other_score))
    }
}

impl Candidate {
    /// Scores a tensor that frees `bytes` when evicted, whose recomputation would cost
    /// `recompute` (`None`: it cannot be recomputed) and which may be kept in fewer bytes by
    /// `shrink`, or `None` if the policy allows no action for it. Each action's cost is divided
    /// by the bytes it frees.
    pub(crate) fn new(
        cell: &CellInfo,
        bytes: u64,
        now: u64,
        recompute: Option<f64>,
        can_offload: bool,
        shrink: Option<Shrink>,
        policy: &Policy,
    ) -> Option<Self> {
        let bytes = bytes as f64;
        let can_offload = can_offload && policy.mode != EvictionMode::RecomputeOnly;
        let offload = can_offload.then_some(bytes * policy.host_cost_per_byte);
        let (cost, action) = match (policy.mode, recompute, offload) {
            (EvictionMode::RecomputeOnly, Some(r), _) => (Some(r), Action::Recompute),
            (EvictionMode::OffloadOnly, _, Some(o)) => (Some(o), Action::Offload),
            // A host copy would not keep a strided layout (and some backends round reductions
            // by layout), so such a tensor is recomputed even here rather than kept.
            (EvictionMode::OffloadOnly, Some(r), None) if cell.strided => {
                (Some(r), Action::Recompute)
            }
            (EvictionMode::Auto, Some(r), _) => (Some(r), Action::Recompute),
            (EvictionMode::Auto, None, Some(o)) => (Some(o), Action::Offload),
            _ => (None, Action::Recompute),
        };
        // Cost per byte freed: shrinking frees only part of a tensor.
        let per_byte = cost.map(|c| (c + 1.0) / bytes);
        let shrink_per_byte = shrink
            .filter(|s| s.frees(bytes) > 0.0)
            .map(|s| ((s.cost(bytes) + 1.0) / s.frees(bytes), s.action()));
        let (per_byte, action) = match (per_byte, shrink_per_byte) {
            (Some(p), Some((c, shrink))) if c < p || action == Action::Offload => (c, shrink),
            (Some(p), _) => (p, action),
            (None, Some((c, shrink))) => (c, shrink),
            (None, None) => return None,
        };
        // How soon it is needed again: predicted by the step plan when it knows the step
        // (Belady's rule), else how long it has gone unused (DTR's staleness).
        let staleness = match cell.predicted() {
            Some(distance) => distance as f64 + 1.0,
            None => now.saturating_sub(cell.last_use()) as f64 + 1.0,
        };
        // A tensor the program no longer holds is only kept for others' recomputation.
        let dead = if cell.is_dead() { 0.5 } else { 1.0 };
        Some(Self {
            score: dead * per_byte / staleness,
            action,
            outlives_step: cell.outlives_step(),
        })
    }
}
