//! The per-device ledger: live and peak bytes, attribution to the producing op, and an optional
//! bounded timeline of events.
//!
//! The hot path (`charge` / `release`) touches a handful of relaxed atomics and takes no lock
//! and makes no allocation unless the timeline is switched on for the device.

use std::any::TypeId;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};

use burn_backend::{DeviceId, DeviceOps, TensorMetadata};

use crate::budget::Budget;
use crate::ops::{OP_COUNT, OpId};
use crate::precision::PrecisionTable;
use crate::report::{Event, EventKind};
use crate::tensor::{Storage, tensor_bytes};

/// Counters for one device. Ledgers live for the whole process (they are leaked once per
/// device), so tensors can point at theirs with a plain `&'static` and no reference count.
pub(crate) struct Ledger {
    key: (TypeId, DeviceId),
    pub(crate) label: String,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    live_tensors: AtomicU64,
    peak_tensors: AtomicU64,
    total_allocs: AtomicU64,
    total_alloc_bytes: AtomicU64,
    live_bytes_by_op: Box<[AtomicU64]>,
    live_tensors_by_op: Box<[AtomicU64]>,
    calls_by_op: Box<[AtomicU64]>,
    timeline_on: AtomicBool,
    timeline: Mutex<Timeline>,
    /// The device's memory budget and what it has evicted.
    pub(crate) budget: Budget,
    /// The device's autocast table (all `Keep` while autocast is off).
    pub(crate) precision: PrecisionTable,
}

pub(crate) struct Timeline {
    pub(crate) capacity: usize,
    pub(crate) events: VecDeque<Event>,
    pub(crate) dropped: u64,
    next_seq: u64,
}

fn atomics(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

static LEDGERS: RwLock<Vec<&'static Ledger>> = RwLock::new(Vec::new());

impl Ledger {
    fn new(key: (TypeId, DeviceId), label: String) -> Self {
        Self {
            key,
            label,
            live_bytes: AtomicU64::new(0),
            peak_bytes: AtomicU64::new(0),
            live_tensors: AtomicU64::new(0),
            peak_tensors: AtomicU64::new(0),
            total_allocs: AtomicU64::new(0),
            total_alloc_bytes: AtomicU64::new(0),
            live_bytes_by_op: atomics(OP_COUNT),
            live_tensors_by_op: atomics(OP_COUNT),
            calls_by_op: atomics(OP_COUNT),
            timeline_on: AtomicBool::new(false),
            timeline: Mutex::new(Timeline {
                capacity: 0,
                events: VecDeque::new(),
                dropped: 0,
                next_seq: 0,
            }),
            budget: Budget::default(),
            precision: PrecisionTable::default(),
        }
    }

    /// The ledger of `device`, created on first use.
    pub(crate) fn of_device<D: DeviceOps + 'static>(device: &D) -> &'static Ledger {
        let key = (TypeId::of::<D>(), device.id());
        if let Some(found) = LEDGERS.read().unwrap().iter().find(|l| l.key == key) {
            return found;
        }
        let mut all = LEDGERS.write().unwrap();
        if let Some(found) = all.iter().find(|l| l.key == key) {
            return found;
        }
        let ledger: &'static Ledger = Box::leak(Box::new(Ledger::new(key, format!("{device:?}"))));
        all.push(ledger);
        ledger
    }

    /// The ledger for calls that name no tensor and no device (e.g. capability queries): they
    /// are counted, never charged.
    pub(crate) fn unattributed() -> &'static Ledger {
        static UNATTRIBUTED: std::sync::OnceLock<&'static Ledger> = std::sync::OnceLock::new();
        UNATTRIBUTED.get_or_init(|| {
            Box::leak(Box::new(Ledger::new(
                (TypeId::of::<()>(), DeviceId::new(u16::MAX, u16::MAX)),
                "unattributed".into(),
            )))
        })
    }

    /// Every ledger created so far, in creation order.
    pub(crate) fn all() -> Vec<&'static Ledger> {
        LEDGERS.read().unwrap().clone()
    }

    #[inline]
    pub(crate) fn count_call(&self, op: OpId) {
        self.calls_by_op[op.index()].fetch_add(1, Relaxed);
    }

    /// Records a new buffer produced by `op` and returns its record.
    #[inline]
    pub(crate) fn charge<P: TensorMetadata>(&'static self, tensor: &P, op: OpId) -> Storage {
        let shape = tensor.shape();
        let dtype = tensor.dtype();
        let bytes = tensor_bytes(&shape, dtype);
        let seq = self.total_allocs.fetch_add(1, Relaxed);
        let live = self.live_bytes.fetch_add(bytes, Relaxed) + bytes;
        // A plain load first: the read-modify-write is only needed at a new high.
        if live > self.peak_bytes.load(Relaxed) {
            self.peak_bytes.fetch_max(live, Relaxed);
        }
        let tensors = self.live_tensors.fetch_add(1, Relaxed) + 1;
        if tensors > self.peak_tensors.load(Relaxed) {
            self.peak_tensors.fetch_max(tensors, Relaxed);
        }
        self.total_alloc_bytes.fetch_add(bytes, Relaxed);
        self.live_bytes_by_op[op.index()].fetch_add(bytes, Relaxed);
        self.live_tensors_by_op[op.index()].fetch_add(1, Relaxed);
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
            });
        }
        Storage {
            ledger: self,
            bytes,
            op,
            seq,
        }
    }

    /// Removes a buffer whose last tensor was dropped.
    #[inline]
    pub(crate) fn release(&self, storage: &Storage) {
        let live = self.live_bytes.fetch_sub(storage.bytes, Relaxed) - storage.bytes;
        self.live_tensors.fetch_sub(1, Relaxed);
        self.live_bytes_by_op[storage.op.index()].fetch_sub(storage.bytes, Relaxed);
        self.live_tensors_by_op[storage.op.index()].fetch_sub(1, Relaxed);
        if self.timeline_on.load(Relaxed) {
            self.push_event(Event {
                seq: 0,
                kind: EventKind::Free,
                op: storage.op.name().to_string(),
                bytes: storage.bytes,
                shape: Vec::new(),
                dtype: String::new(),
                alloc_seq: storage.seq,
                live_bytes: live,
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
            });
        }
    }

    fn push_event(&self, mut event: Event) {
        let mut timeline = self.timeline.lock().unwrap();
        if timeline.capacity == 0 {
            return;
        }
        event.seq = timeline.next_seq;
        timeline.next_seq += 1;
        if timeline.events.len() == timeline.capacity {
            timeline.events.pop_front();
            timeline.dropped += 1;
        }
        timeline.events.push_back(event);
    }

    /// Starts (capacity > 0) or stops (capacity 0) recording events; clears earlier ones.
    pub(crate) fn set_timeline(&self, capacity: usize) {
        let mut timeline = self.timeline.lock().unwrap();
        timeline.capacity = capacity;
        timeline.events = VecDeque::with_capacity(capacity.min(1 << 16));
        timeline.dropped = 0;
        timeline.next_seq = 0;
        self.timeline_on.store(capacity > 0, Relaxed);
    }

    pub(crate) fn with_timeline<R>(&self, f: impl FnOnce(&Timeline) -> R) -> R {
        f(&self.timeline.lock().unwrap())
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Relaxed)
    }

    pub(crate) fn peak_bytes(&self) -> u64 {
        self.peak_bytes.load(Relaxed)
    }

    pub(crate) fn live_tensors(&self) -> u64 {
        self.live_tensors.load(Relaxed)
    }

    pub(crate) fn peak_tensors(&self) -> u64 {
        self.peak_tensors.load(Relaxed)
    }

    pub(crate) fn total_allocs(&self) -> u64 {
        self.total_allocs.load(Relaxed)
    }

    pub(crate) fn total_alloc_bytes(&self) -> u64 {
        self.total_alloc_bytes.load(Relaxed)
    }

    pub(crate) fn reset_peak(&self) {
        self.peak_bytes.store(self.live_bytes(), Relaxed);
        self.peak_tensors.store(self.live_tensors(), Relaxed);
    }

    /// Live bytes and tensor count of each op that holds any, largest first.
    pub(crate) fn holders(&self) -> Vec<(OpId, u64, u64)> {
        let mut out: Vec<_> = (0..OP_COUNT)
            .filter_map(|i| {
                let tensors = self.live_tensors_by_op[i].load(Relaxed);
                (tensors > 0).then(|| {
                    (
                        OpId::from_index(i),
                        self.live_bytes_by_op[i].load(Relaxed),
                        tensors,
                    )
                })
            })
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)));
        out
    }

    pub(crate) fn calls(&self, op: OpId) -> u64 {
        self.calls_by_op[op.index()].load(Relaxed)
    }
}
