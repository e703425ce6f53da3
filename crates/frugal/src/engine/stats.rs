//! What the budget and checkpoint scopes did on one device: [`RematStats`] and the atomic
//! counters behind it, both generated from one field list.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// Declares [`RematStats`], the [`Counter`] naming each field, and the arithmetic of
/// [`RematStats::since`]: `event` fields count things that happened (subtracted), `level`
/// fields are readings of a level (taken as they are now).
macro_rules! remat_stats {
    ($($(#[doc = $doc:literal])* $kind:ident $name:ident,)*) => {
        /// Counters of what the budget and checkpoint scopes did on one device.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct RematStats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        /// One field of [`RematStats`].
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Clone, Copy, Debug)]
        pub(crate) enum Counter {
            $($name,)*
        }

        const COUNTERS: usize = [$(stringify!($name)),*].len();

        impl RematStats {
            /// What happened since `start` (an earlier reading of the same device): every
            /// counter as a difference; `host_bytes` and `peak_host_bytes` as they are now.
            pub fn since(&self, start: &RematStats) -> RematStats {
                RematStats {
                    $($name: remat_stats!(@since $kind, self.$name, start.$name),)*
                }
            }

            /// Recomputed work over the forward pass's work (the cost model's estimates;
            /// the whole work's third when the program does not mark its phases, see
            /// [`crate::memory::set_phase`]); 0 when nothing was made. Above 1, eviction
            /// recomputes more than checkpointing ever does (each forward op at most once).
            pub fn recompute_ratio(&self) -> f64 {
                let forward = match self.forward_cost {
                    0 => self.made_cost / 3,
                    forward => forward,
                };
                if forward == 0 {
                    return 0.0;
                }
                self.recomputed_cost as f64 / forward as f64
            }

            fn read(counters: &[AtomicU64; COUNTERS]) -> Self {
                RematStats {
                    $($name: counters[Counter::$name as usize].load(Relaxed),)*
                }
            }
        }
    };
    (@since event, $now:expr, $start:expr) => { $now.saturating_sub($start) };
    (@since level, $now:expr, $start:expr) => { $now };
}

remat_stats! {
    /// Tensors evicted to be recomputed later (by the budget or a scope's end).
    event evictions,
    /// Bytes of those.
    event evicted_bytes,
    /// Evicted tensors recomputed when read.
    event recomputes,
    /// Bytes of those.
    event recomputed_bytes,
    /// Tensors copied to host memory.
    event offloads,
    /// Bytes of those.
    event offloaded_bytes,
    /// Offloaded tensors copied back when read.
    event uploads,
    /// Bytes of those.
    event uploaded_bytes,
    /// Bytes held in host memory now.
    level host_bytes,
    /// Highest `host_bytes`.
    level peak_host_bytes,
    /// Reads of offloaded tensors from the device, each a wait for its queue to drain (a
    /// batch of offloads shares one).
    event offload_batches,
    /// Nanoseconds spent choosing tensors to evict.
    event search_nanos,
    /// Nanoseconds spent waiting for offloads to reach host memory.
    event offload_nanos,
    /// Nanoseconds spent handing host copies back to the device (the copies themselves may
    /// run later, asynchronously).
    event upload_nanos,
    /// Tensors kept on the device in the 16-bit storage type (see
    /// [`crate::memory::set_storage_precision`]).
    event compressions,
    /// Their bytes before compression (half of it was freed).
    event compressed_bytes,
    /// Compressed tensors cast back when read.
    event decompressions,
    /// Tensors of only 0 and 1 (dropout's masks) kept on the device as booleans: exact, a
    /// quarter of an f32 tensor's bytes.
    event packs,
    /// Their bytes before packing.
    event packed_bytes,
    /// Packed tensors made floats again when read.
    event unpacks,
    /// The training step the plan learned, in managed tensors created per step (0: none yet;
    /// the budget then scores tensors by staleness).
    level plan_period,
    /// Times a learned step was replaced or broken (new shapes or a different op sequence).
    level replans,
    /// Eviction rounds that scored every tensor by its predicted next read.
    event planned_rounds,
    /// Times live bytes went over the budget and it had to evict (the segments, when there
    /// are any, were not enough).
    event budget_rounds,
    /// Eviction rounds before an op, making room under the budget for the tensor the learned
    /// step says the op makes (so that the output does not take live bytes over the budget).
    event room_rounds,
    /// Segments the learned step's forward pass is cut into (0: none: no step learned yet, or
    /// its peak fits the budget); the end of each evicts its tensors that only the backward
    /// pass reads, as a checkpoint scope would.
    level plan_segments,
    /// Bytes kept for the backward pass per segment the cuts aim at.
    level plan_segment_bytes,
    /// The step's peak live bytes under its segments, as simulated from the recorded step
    /// when they were cut (0: no segments).
    level plan_estimated_peak,
    /// The most bytes live when a tensor was made, over the first step made wholly under the
    /// plan's current cuts (0: none has run yet): what [`Self::plan_estimated_peak`] predicted,
    /// measured.
    level plan_measured_peak,
    /// Bytes of optimizer state the plan parks in host memory for each step's forward and
    /// backward passes, because no segments fit the budget beside it (0: none).
    level plan_parked_bytes,
    /// Bytes of the forward pass's tensors the plan drops one by one after their last forward
    /// read and recomputes alone, from inputs it keeps, when the backward pass reads them:
    /// selective recomputation, chosen instead of segments when it fits (0: none).
    level plan_selected_bytes,
    /// The most bytes one op of the learned step holds at once, its inputs and its output
    /// (0: not computed: no step learned, or its peak fits the budget). Live bytes reach it
    /// while that op runs whatever is evicted: a budget below it is kept between ops, not
    /// during that one.
    level plan_op_floor,
    /// Bytes parked so far (each step's share of `offloaded_bytes` that the plan, not an
    /// eviction round, moved; they come back when the optimizer reads them).
    event parked_bytes,
    /// Steps begun under a plan whose cuts had stopped adapting (each is handed to the step
    /// hook, see [`crate::memory::set_budget`]: on frugal-cuda the allocator judges what its
    /// misses cost in the step before).
    event settled_steps,
    /// Times the forward pass was cut into segments (again when the step or budget changed,
    /// or when a step under the plan still needed the budget to evict).
    event segment_plans,
    /// Times the device's allocator, out of memory, asked the budget to free memory from
    /// inside the allocation (frugal-cuda's out-of-memory handler).
    event allocation_rescues,
    /// Bytes the budget freed for those, by dropping tensors it can recompute.
    event rescued_bytes,
    /// Estimated work of the ops that made managed tensors (views and moves onto an existing
    /// buffer left out), in the cost model's unit: bytes of device memory traffic, a
    /// product's multiply-adds converted at a GPU's ratio of arithmetic to bandwidth.
    event made_cost,
    /// The share of `made_cost` made in the forward pass (see [`crate::memory::set_phase`]).
    event forward_cost,
    /// Estimated work of the recomputations, in the same unit. More than `forward_cost` in
    /// a step means eviction is recomputing more than the forward pass: checkpointing
    /// recomputes each forward op at most once, and smaller micro-batches recompute nothing
    /// (see [`crate::MicroBatching`]).
    event recomputed_cost,
}

/// The live counters of one device, one relaxed atomic per [`RematStats`] field.
pub(crate) struct Counters([AtomicU64; COUNTERS]);

impl Default for Counters {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Counters {
    /// Adds `n` to `counter`; returns its new value.
    #[inline]
    pub(crate) fn add(&self, counter: Counter, n: u64) -> u64 {
        self.0[counter as usize].fetch_add(n, Relaxed) + n
    }

    /// Subtracts `n` from `counter`.
    pub(crate) fn sub(&self, counter: Counter, n: u64) {
        self.0[counter as usize].fetch_sub(n, Relaxed);
    }

    /// Sets `counter` to `value` (a level).
    pub(crate) fn set(&self, counter: Counter, value: u64) {
        self.0[counter as usize].store(value, Relaxed);
    }

    /// Raises `counter` to `value` if it is lower.
    pub(crate) fn max(&self, counter: Counter, value: u64) {
        self.0[counter as usize].fetch_max(value, Relaxed);
    }

    /// `counter` as it is now.
    #[inline]
    pub(crate) fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize].load(Relaxed)
    }

    /// The counters as they are now.
    pub(crate) fn read(&self) -> RematStats {
        RematStats::read(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_events_and_keeps_levels() {
        let counters = Counters::default();
        counters.add(Counter::evictions, 2);
        counters.add(Counter::host_bytes, 100);
        let start = counters.read();
        counters.add(Counter::evictions, 3);
        counters.sub(Counter::host_bytes, 40);
        counters.max(Counter::peak_host_bytes, 100);
        let delta = counters.read().since(&start);
        assert_eq!(delta.evictions, 3);
        assert_eq!(delta.host_bytes, 60);
        assert_eq!(delta.peak_host_bytes, 100);
    }
}
