//! Layer 3, checkpoint scopes: which of the program's own scopes new tensors belong to, and
//! what closing one evicts. The public entry, [`crate::checkpoint()`], sits in the API layer;
//! the segments the step plan cuts the forward pass into are the engine's
//! ([`crate::engine`]'s `cuts.rs`), and share the scope ids handed out there.
//!
//! Owns: the open scopes of one device and the thread's list of a closing scope's outputs.
//! Imports: `engine`, `vocabulary`.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::engine::{Budget, Status};
use crate::vocabulary::cost::is_costly_product;

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
    /// The innermost open scope of the program's own (0: none).
    current: AtomicU64,
    open: AtomicU32,
    /// The budget's ordinal of the next tensor when the program last opened a scope of its own
    /// ([`NEVER_OPENED`]: never). A program that opens scopes chooses what to recompute, and
    /// the budget's segments stay off until it has gone two learned steps without one.
    opened_at: AtomicU64,
}

const NEVER_OPENED: u64 = u64::MAX;

impl Default for Scopes {
    fn default() -> Self {
        Self {
            current: AtomicU64::new(0),
            open: AtomicU32::new(0),
            opened_at: AtomicU64::new(NEVER_OPENED),
        }
    }
}

impl Scopes {
    /// The scope a new tensor belongs to: the innermost of the program's own, else the
    /// forward pass's open segment (0: none).
    #[inline]
    pub(crate) fn current(&self, budget: &Budget) -> u64 {
        match self.current.load(Relaxed) {
            0 => budget.segment_scope(),
            id => id,
        }
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
    pub(crate) fn open(&self, ordinal: u64, budget: &Budget) -> OpenScope {
        self.opened_at.store(ordinal, Relaxed);
        budget.end_segment();
        let id = budget.new_scope_id();
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
}
