//! Layer 1, the ledger: live, peak and total bytes and buffers of one device, attributed to
//! the op that produced them and to their role, calls per op, and an optional bounded
//! timeline.
//!
//! Owns: counting and the timeline, nothing else. Imports: `vocabulary`, `units`. The hot path
//! ([`Ledger::charge`] / [`Ledger::release`]) touches a handful of relaxed atomics and takes no
//! lock and makes no allocation unless the timeline is recording.

mod role;
mod stat;
mod timeline;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use burn_backend::{DType, Shape};

use crate::units::tensor_bytes;
use crate::vocabulary::{OP_COUNT, OpId};
use role::RoleCounts;

pub use role::{Phase, Role, RoleBytes};
pub(crate) use stat::Stat;
pub(crate) use timeline::Timeline;
pub use timeline::{Event, EventKind};

/// What the ledger counts per op.
#[derive(Default)]
struct PerOp {
    live_bytes: AtomicU64,
    live_buffers: AtomicU64,
    calls: AtomicU64,
}

/// A charged buffer, as the ledger numbered it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Charge {
    /// Bytes of the buffer.
    pub(crate) bytes: u64,
    /// The op that produced it.
    pub(crate) op: OpId,
    /// Its number on the device (the n-th buffer charged).
    pub(crate) seq: u64,
    /// What it is for, as of now.
    pub(crate) role: Role,
}

/// The counters of one device.
pub(crate) struct Ledger {
    /// The device, as its `Debug` form prints it.
    pub(crate) label: String,
    bytes: Stat,
    buffers: Stat,
    by_op: Box<[PerOp]>,
    roles: RoleCounts,
    timeline_on: AtomicBool,
    timeline: Mutex<Timeline>,
}

impl Ledger {
    pub(crate) fn new(label: String) -> Self {
        Self {
            label,
            bytes: Stat::default(),
            buffers: Stat::default(),
            by_op: (0..OP_COUNT).map(|_| PerOp::default()).collect(),
            roles: RoleCounts::new(),
            timeline_on: AtomicBool::new(false),
            timeline: Mutex::new(Timeline::new()),
        }
    }

    #[inline]
    pub(crate) fn count_call(&self, op: OpId) {
        self.by_op[op.index()].calls.fetch_add(1, Relaxed);
    }

    /// Records a new buffer of `shape` and `dtype` produced by `op`, with the role of the
    /// current phase.
    #[inline]
    pub(crate) fn charge(&self, shape: &Shape, dtype: DType, op: OpId) -> Charge {
        self.charge_as(shape, dtype, op, self.roles.current())
    }

    /// Records a new buffer of `shape` and `dtype` produced by `op`, for `role` (a restored
    /// buffer keeps the role it had).
    #[inline]
    pub(crate) fn charge_as(&self, shape: &Shape, dtype: DType, op: OpId, role: Role) -> Charge {
        let bytes = tensor_bytes(shape, dtype);
        let (seq, _) = self.buffers.add(1);
        let (_, live) = self.bytes.add(bytes);
        let per_op = &self.by_op[op.index()];
        per_op.live_bytes.fetch_add(bytes, Relaxed);
        per_op.live_buffers.fetch_add(1, Relaxed);
        self.roles.add(role, bytes);
        if self.timeline_on.load(Relaxed) {
            self.push_event(Event {
                seq: 0,
                kind: EventKind::Alloc,
                op: op.name().to_string(),
                bytes,
                shape: shape.iter().copied().collect(),
                dtype: format!("{dtype:?}"),
                alloc_seq: seq,
                live_bytes: live,
                role,
                live_by_role: self.roles.live(),
            });
        }
        Charge {
            bytes,
            op,
            seq,
            role,
        }
    }

    /// Moves a live buffer of `bytes` from role `from` to role `to`.
    pub(crate) fn move_role(&self, bytes: u64, from: Role, to: Role) {
        if from != to {
            self.roles.sub(from, bytes);
            self.roles.add(to, bytes);
        }
    }

    /// Sets the phase, which decides the role of the buffers made from now on.
    pub(crate) fn set_phase(&self, phase: Phase) {
        self.roles.set_phase(phase);
    }

    /// Live bytes per role now.
    pub(crate) fn live_by_role(&self) -> RoleBytes {
        self.roles.live()
    }

    /// Each role's highest live bytes since the last reset.
    pub(crate) fn peak_by_role(&self) -> RoleBytes {
        self.roles.peak()
    }

    /// Removes a buffer whose last tensor was dropped.
    #[inline]
    pub(crate) fn release(&self, charge: &Charge) {
        let live = self.bytes.sub(charge.bytes);
        self.buffers.sub(1);
        let per_op = &self.by_op[charge.op.index()];
        per_op.live_bytes.fetch_sub(charge.bytes, Relaxed);
        per_op.live_buffers.fetch_sub(1, Relaxed);
        self.roles.sub(charge.role, charge.bytes);
        if self.timeline_on.load(Relaxed) {
            self.push_event(Event {
                seq: 0,
                kind: EventKind::Free,
                op: charge.op.name().to_string(),
                bytes: charge.bytes,
                shape: Vec::new(),
                dtype: String::new(),
                alloc_seq: charge.seq,
                live_bytes: live,
                role: charge.role,
                live_by_role: self.roles.live(),
            });
        }
    }

    /// Adds a named mark (e.g. "backward") to the timeline, if it is on.
    pub(crate) fn mark(&self, label: &str) {
        if self.timeline_on.load(Relaxed) {
            self.push_event(Event {
                seq: 0,
                kind: EventKind::Mark,
                op: label.to_string(),
                bytes: 0,
                shape: Vec::new(),
                dtype: String::new(),
                alloc_seq: 0,
                live_bytes: self.live_bytes(),
                role: Role::Other,
                live_by_role: self.roles.live(),
            });
        }
    }

    fn push_event(&self, event: Event) {
        self.timeline.lock().unwrap().push(event);
    }

    /// Starts (capacity > 0) or stops (capacity 0) recording events; clears earlier ones.
    pub(crate) fn set_timeline(&self, capacity: usize) {
        self.timeline.lock().unwrap().restart(capacity);
        self.timeline_on.store(capacity > 0, Relaxed);
    }

    pub(crate) fn with_timeline<R>(&self, f: impl FnOnce(&Timeline) -> R) -> R {
        f(&self.timeline.lock().unwrap())
    }

    /// Bytes of live buffers.
    #[inline]
    pub(crate) fn live_bytes(&self) -> u64 {
        self.bytes.current()
    }

    /// Live bytes and live buffers: current, peak and total.
    pub(crate) fn bytes(&self) -> &Stat {
        &self.bytes
    }

    /// Live buffers: current, peak and total.
    pub(crate) fn buffers(&self) -> &Stat {
        &self.buffers
    }

    pub(crate) fn reset_peak(&self) {
        self.bytes.reset_peak();
        self.buffers.reset_peak();
        self.roles.reset_peak();
    }

    /// Live bytes and buffer count of each op that holds any, largest first.
    pub(crate) fn holders(&self) -> Vec<(OpId, u64, u64)> {
        let mut out: Vec<_> = self
            .by_op
            .iter()
            .enumerate()
            .filter_map(|(i, per_op)| {
                let buffers = per_op.live_buffers.load(Relaxed);
                (buffers > 0).then(|| {
                    (
                        OpId::from_index(i),
                        per_op.live_bytes.load(Relaxed),
                        buffers,
                    )
                })
            })
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)));
        out
    }

    /// How many times `op` was called.
    pub(crate) fn calls(&self, op: OpId) -> u64 {
        self.by_op[op.index()].calls.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::families::float;

    #[test]
    fn charges_and_releases_balance_per_op_and_in_total() {
        let ledger = Ledger::new("test".into());
        let matmul = float::op(float::Op::float_matmul);
        let exp = float::op(float::Op::float_exp);
        ledger.set_timeline(16);
        let a = ledger.charge(&Shape::new([4, 4]), DType::F32, matmul);
        let b = ledger.charge(&Shape::new([8]), DType::F16, exp);
        assert_eq!((a.bytes, a.seq, b.bytes, b.seq), (64, 0, 16, 1));
        assert_eq!(ledger.holders(), vec![(matmul, 64, 1), (exp, 16, 1)]);
        ledger.release(&a);
        assert_eq!(ledger.live_bytes(), 16);
        assert_eq!(ledger.bytes().peak(), 80);
        assert_eq!(ledger.buffers().total(), 2);
        ledger.release(&b);
        assert!(ledger.holders().is_empty());
        let kinds: Vec<_> = ledger.with_timeline(|t| t.events.iter().map(|e| e.kind).collect());
        use EventKind::*;
        assert_eq!(kinds, vec![Alloc, Alloc, Free, Free]);
    }
}
