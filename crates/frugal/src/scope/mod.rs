//! Layer 3, checkpoint scopes: which scope new tensors belong to, and what closing one
//! evicts. The public entry, [`crate::checkpoint`], sits in the API layer.
//!
//! Owns: the scope ids of one device and the thread's list of a closing scope's outputs.
//! Imports: `engine`, `op`.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::engine::{Budget, Status};
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
}

impl Default for Scopes {
    fn default() -> Self {
        Self {
            current: AtomicU64::new(0),
            next: AtomicU64::new(1),
            open: AtomicU32::new(0),
        }
    }
}

impl Scopes {
    /// The innermost open scope (0: none).
    #[inline]
    pub(crate) fn current(&self) -> u64 {
        self.current.load(Relaxed)
    }

    /// Whether any scope is open.
    pub(crate) fn any_open(&self) -> bool {
        self.open.load(Relaxed) > 0
    }

    /// Opens a scope: tensors created until it closes are tagged with its id.
    pub(crate) fn open(&self) -> OpenScope {
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
}
