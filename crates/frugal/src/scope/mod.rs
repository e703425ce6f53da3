//! Layer 3, checkpoint scopes: which scope new tensors belong to, and what closing one
//! evicts. The public entry, [`crate::checkpoint`], sits in the API layer.
//!
//! Owns: the scope ids of one device, the thread's list of a closing scope's outputs, and the
//! segment the learned step's forward pass is in (an automatic scope the budget opens and
//! closes where [`crate::engine::SegmentEvent`]s say). Imports: `engine`, `op`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use crate::engine::{Budget, Evictable, SegmentEvent, Status};
use crate::op::cost::is_costly_product;

thread_local! {
    /// While a scope closes: the cells its outputs point to, reported by Frugal's ops as the
    /// outputs are visited.
    static COLLECTING: RefCell<Option<Vec<usize>>> = const { RefCell::new(None) };
}

/// Notes a managed tensor read while a scope is collecting its outputs.
#[inline]
pub(crate) fn note_read(address: usize) {
    COLLECTING.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut()
            && let Some(keep) = c.as_mut()
        {
            keep.push(address);
        }
    });
}

/// Runs `visit` (which reads a scope's outputs) and returns the cells it read.
pub(crate) fn collect_reads(visit: impl FnOnce()) -> Vec<usize> {
    COLLECTING.with(|c| *c.borrow_mut() = Some(Vec::new()));
    visit();
    COLLECTING
        .with(|c| c.borrow_mut().take())
        .unwrap_or_default()
}

/// An open scope: its id and the one it was opened in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenScope {
    id: u64,
    outer: u64,
}

/// The checkpoint scopes of one device.
pub(crate) struct Scopes {
    current: AtomicU64,
    next: AtomicU64,
    open: AtomicU32,
    /// The open segment's scope id (0: none).
    segment: AtomicU64,
    /// The scope id of the forward pass's first segment.
    forward: AtomicU64,
    /// The budget's ordinal of the next tensor when the program last opened a scope of its own
    /// ([`NEVER_OPENED`]: never). A program that opens scopes chooses what to recompute, and
    /// the budget's segments stay off until it has gone two learned steps without one.
    opened_at: AtomicU64,
    /// The tensors a selection drops at its next cuts, by ordinal (see
    /// [`crate::engine::StepPlan::is_chosen`]): a selection's cut looks at these only, not
    /// at every cell.
    chosen: Mutex<Vec<(u64, Weak<dyn Evictable>)>>,
    /// Chosen tensors evicted at a selection's cut together with views of their buffer, by
    /// the buffer's ordinal: the first of them the backward pass reads brings the others
    /// back with it (see [`Self::take_group`]).
    groups: Mutex<Vec<Group>>,
}

/// Tensors evicted together at a selection's cut, keyed by their buffer's ordinal.
type Group = (u64, Vec<Weak<dyn Evictable>>);

const NEVER_OPENED: u64 = u64::MAX;

impl Default for Scopes {
    fn default() -> Self {
        Self {
            current: AtomicU64::new(0),
            next: AtomicU64::new(1),
            open: AtomicU32::new(0),
            segment: AtomicU64::new(0),
            forward: AtomicU64::new(0),
            opened_at: AtomicU64::new(NEVER_OPENED),
            chosen: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
        }
    }
}

impl Scopes {
    /// The innermost open scope (0: none).
    #[inline]
    pub(crate) fn current(&self) -> u64 {
        self.current.load(Relaxed)
    }

    /// The budget's ordinal of the next tensor when the program last opened a scope of its own
    /// on this device, if it ever did.
    pub(crate) fn opened_at(&self) -> Option<u64> {
        let at = self.opened_at.load(Relaxed);
        (at != NEVER_OPENED).then_some(at)
    }

    /// Whether any scope is open.
    pub(crate) fn any_open(&self) -> bool {
        self.open.load(Relaxed) > 0
    }

    /// Opens a scope when the next tensor will have the budget's ordinal `ordinal`: tensors
    /// created until it closes are tagged with its id.
    pub(crate) fn open(&self, ordinal: u64) -> OpenScope {
        self.opened_at.store(ordinal, Relaxed);
        self.end_segment();
        let id = self.next.fetch_add(1, Relaxed);
        let outer = self.current.swap(id, Relaxed);
        self.open.fetch_add(1, Relaxed);
        OpenScope { id, outer }
    }

    /// Closes `scope`: every tensor created inside it that is still resident, is not in `keep`
    /// (the scope's outputs) and can be recomputed is evicted; under a budget whose policy
    /// keeps products, costly products stay (see `Policy::scope_keeps_products`).
    pub(crate) fn close(&self, scope: OpenScope, keep: &[usize], budget: &Budget) {
        self.current.store(scope.outer, Relaxed);
        self.open.fetch_sub(1, Relaxed);
        let keep_products = budget.limit().is_some() && budget.policy().scope_keeps_products;
        // Dropped tensors too: one still resident is kept for evicted tensors computed from
        // it (e.g. `qkv`, which the views `q`, `k`, `v` saved by autodiff share), and its
        // buffer goes only if it is evicted with them.
        for cell in budget.cells() {
            let info = cell.info();
            let address = Arc::as_ptr(&cell) as *const () as usize;
            if info.scope >= scope.id
                && !keep.contains(&address)
                && !(keep_products && is_costly_product(info.op, info.cost, info.bytes))
                && cell.status() == Status::Resident
            {
                cell.evict();
            }
        }
    }

    /// Notes a tensor a selection drops at a later cut.
    pub(crate) fn hold_chosen(&self, ordinal: u64, cell: Weak<dyn Evictable>) {
        self.chosen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((ordinal, cell));
    }

    /// Takes the tensors evicted at a selection's cut together with the tensor keyed `owner`
    /// (its buffer's ordinal), for whoever restores one of them to bring the others back from
    /// the same recomputation: restored one by one, each view would recompute the buffer
    /// anew, and hold a copy of its own.
    pub(crate) fn take_group(&self, owner: u64) -> Vec<Weak<dyn Evictable>> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        match groups.iter().position(|(key, _)| *key == owner) {
            Some(at) => groups.swap_remove(at).1,
            None => Vec::new(),
        }
    }

    /// Follows the learned step's segments: opens, cuts or closes the automatic scope the
    /// forward pass's tensors are created in. At a cut, the closing segment's resident
    /// tensors that the forward pass does not read again are evicted, to be recomputed from
    /// the kept ones when the backward pass reads them; the kept ones are marked as
    /// checkpoints (see [`crate::engine::CellInfo::mark_checkpoint`]) and forget their
    /// recipes: never recomputed, they would otherwise hold the dropped tensors they were
    /// computed from (a block's output product and its input) until the backward pass
    /// dropped them, memory the plan's simulation counts as free. A selection's cut
    /// evicts only the chosen tensors (see [`Self::hold_chosen`]) the forward pass does not
    /// read again. Ignored while a scope of the program's own is open.
    pub(crate) fn on_segment_event(&self, event: SegmentEvent, budget: &Budget) {
        if self.current.load(Relaxed) != self.segment.load(Relaxed) {
            return;
        }
        match event {
            SegmentEvent::Open { .. } => {
                self.chosen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                self.groups
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                self.end_segment();
                let id = self.begin_segment();
                self.forward.store(id, Relaxed);
            }
            SegmentEvent::Cut {
                first,
                position,
                last_read,
                selective: true,
            } => {
                // A read stamped `position` came before this cut.
                let mut chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
                let mut evicted: Vec<(u64, Weak<dyn Evictable>)> = Vec::new();
                chosen.retain(|(ordinal, cell)| {
                    let last = ordinal
                        .checked_sub(first)
                        .and_then(|at| last_read.get(at as usize));
                    let Some(cell) = cell.upgrade().filter(|_| last.is_some()) else {
                        return false;
                    };
                    if last.is_some_and(|&last| last > position) {
                        return true;
                    }
                    if cell.status() == Status::Resident && cell.evict() {
                        evicted.push((*ordinal, Arc::downgrade(&cell)));
                    }
                    false
                });
                drop(chosen);
                let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                let from = groups.len();
                for (key, cell) in evicted {
                    match groups[from..].iter_mut().find(|(k, _)| *k == key) {
                        Some((_, group)) => group.push(cell),
                        None => groups.push((key, vec![cell])),
                    }
                }
                groups.retain(|(_, group)| group.len() > 1);
            }
            SegmentEvent::Cut {
                first,
                position,
                last_read,
                selective: false,
            } => {
                let id = self.end_segment();
                let forward = self.forward.load(Relaxed);
                if id != 0 {
                    for cell in budget.cells() {
                        let info = cell.info();
                        // A read stamped `position` came before this cut.
                        let read_later = info
                            .ordinal
                            .checked_sub(first)
                            .and_then(|at| last_read.get(at as usize))
                            .is_none_or(|&last| last > position);
                        if !(forward..=id).contains(&info.scope) {
                            continue;
                        }
                        if read_later {
                            info.mark_checkpoint();
                            cell.forget_recipe();
                        } else if cell.status() == Status::Resident {
                            cell.evict();
                        }
                    }
                }
                self.begin_segment();
            }
            SegmentEvent::Close => {
                self.end_segment();
            }
        }
    }

    fn begin_segment(&self) -> u64 {
        let id = self.next.fetch_add(1, Relaxed);
        self.segment.store(id, Relaxed);
        self.current.store(id, Relaxed);
        id
    }

    /// Ends the open segment, if any; returns its id (0: none).
    fn end_segment(&self) -> u64 {
        let id = self.segment.swap(0, Relaxed);
        if id != 0 {
            let _ = self.current.compare_exchange(id, 0, Relaxed, Relaxed);
        }
        id
    }
}
