//! The per-device memory budget: when it is on, every new tensor is managed (see
//! [`crate::remat`]), and after each op the eviction policy drops tensors until live bytes are
//! back under the budget.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use serde::Serialize;

use crate::ledger::Ledger;
use crate::ops::OpId;
use crate::policy::{Action, EvictionMode, Policy};
use crate::remat::{CellDyn, Status};
use crate::report::format_bytes;

const NO_LIMIT: u64 = u64::MAX;

/// Counters of what the budget and checkpoint scopes did on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RematStats {
    /// Tensors evicted to be recomputed later (by the budget or a scope's end).
    pub evictions: u64,
    /// Bytes of those.
    pub evicted_bytes: u64,
    /// Evicted tensors recomputed when read.
    pub recomputes: u64,
    /// Bytes of those.
    pub recomputed_bytes: u64,
    /// Tensors copied to host memory.
    pub offloads: u64,
    /// Bytes of those.
    pub offloaded_bytes: u64,
    /// Offloaded tensors copied back when read.
    pub uploads: u64,
    /// Bytes of those.
    pub uploaded_bytes: u64,
    /// Bytes held in host memory now.
    pub host_bytes: u64,
    /// Highest `host_bytes`.
    pub peak_host_bytes: u64,
    /// Reads of offloaded tensors from the device, each a wait for its queue to drain (a
    /// batch of offloads shares one).
    pub offload_batches: u64,
    /// Nanoseconds spent choosing tensors to evict.
    pub search_nanos: u64,
    /// Nanoseconds spent waiting for offloads to reach host memory.
    pub offload_nanos: u64,
    /// Nanoseconds spent handing host copies back to the device (the copies themselves may
    /// run later, asynchronously).
    pub upload_nanos: u64,
    /// Tensors kept on the device in the 16-bit storage type (see
    /// [`crate::memory::set_storage_precision`]).
    pub compressions: u64,
    /// Their bytes before compression (half of it was freed).
    pub compressed_bytes: u64,
    /// Compressed tensors cast back when read.
    pub decompressions: u64,
}

impl RematStats {
    /// What happened since `start` (an earlier reading of the same device): every counter
    /// as a difference; `host_bytes` and `peak_host_bytes` as they are now.
    pub fn since(&self, start: &RematStats) -> RematStats {
        RematStats {
            evictions: self.evictions.saturating_sub(start.evictions),
            evicted_bytes: self.evicted_bytes.saturating_sub(start.evicted_bytes),
            recomputes: self.recomputes.saturating_sub(start.recomputes),
            recomputed_bytes: self.recomputed_bytes.saturating_sub(start.recomputed_bytes),
            offloads: self.offloads.saturating_sub(start.offloads),
            offloaded_bytes: self.offloaded_bytes.saturating_sub(start.offloaded_bytes),
            uploads: self.uploads.saturating_sub(start.uploads),
            uploaded_bytes: self.uploaded_bytes.saturating_sub(start.uploaded_bytes),
            host_bytes: self.host_bytes,
            peak_host_bytes: self.peak_host_bytes,
            offload_batches: self.offload_batches.saturating_sub(start.offload_batches),
            search_nanos: self.search_nanos.saturating_sub(start.search_nanos),
            offload_nanos: self.offload_nanos.saturating_sub(start.offload_nanos),
            upload_nanos: self.upload_nanos.saturating_sub(start.upload_nanos),
            compressions: self.compressions.saturating_sub(start.compressions),
            compressed_bytes: self.compressed_bytes.saturating_sub(start.compressed_bytes),
            decompressions: self.decompressions.saturating_sub(start.decompressions),
        }
    }
}

/// Budget state kept in each device's ledger.
pub(crate) struct Budget {
    limit: AtomicU64,
    open_scopes: AtomicU32,
    managing: AtomicBool,
    scope: AtomicU64,
    next_scope: AtomicU64,
    clock: AtomicU64,
    mode: AtomicU8,
    host_cost_bits: AtomicU64,
    max_depth: AtomicU32,
    scope_keeps_products: AtomicBool,
    registry: Mutex<Vec<Weak<dyn CellDyn>>>,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    recomputes: AtomicU64,
    recomputed_bytes: AtomicU64,
    offloads: AtomicU64,
    offloaded_bytes: AtomicU64,
    uploads: AtomicU64,
    uploaded_bytes: AtomicU64,
    host_bytes: AtomicU64,
    peak_host_bytes: AtomicU64,
    offload_batches: AtomicU64,
    search_nanos: AtomicU64,
    offload_nanos: AtomicU64,
    upload_nanos: AtomicU64,
    /// The storage type of compressed tensors: 0 none, else a [`STORE_CODES`] index + 1.
    store: AtomicU8,
    compressions: AtomicU64,
    compressed_bytes: AtomicU64,
    decompressions: AtomicU64,
}

/// Storage types for compressed tensors, by code - 1.
const STORE_CODES: [burn_backend::DType; 2] = [burn_backend::DType::BF16, burn_backend::DType::F16];

impl Default for Budget {
    fn default() -> Self {
        let policy = Policy::default();
        Self {
            limit: AtomicU64::new(NO_LIMIT),
            open_scopes: AtomicU32::new(0),
            managing: AtomicBool::new(false),
            scope: AtomicU64::new(0),
            next_scope: AtomicU64::new(1),
            clock: AtomicU64::new(0),
            mode: AtomicU8::new(policy.mode as u8),
            host_cost_bits: AtomicU64::new(policy.host_cost_per_byte.to_bits()),
            max_depth: AtomicU32::new(policy.max_depth),
            scope_keeps_products: AtomicBool::new(policy.scope_keeps_products),
            registry: Mutex::new(Vec::new()),
            evictions: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            recomputes: AtomicU64::new(0),
            recomputed_bytes: AtomicU64::new(0),
            offloads: AtomicU64::new(0),
            offloaded_bytes: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
            uploaded_bytes: AtomicU64::new(0),
            host_bytes: AtomicU64::new(0),
            peak_host_bytes: AtomicU64::new(0),
            offload_batches: AtomicU64::new(0),
            search_nanos: AtomicU64::new(0),
            offload_nanos: AtomicU64::new(0),
            upload_nanos: AtomicU64::new(0),
            store: AtomicU8::new(0),
            compressions: AtomicU64::new(0),
            compressed_bytes: AtomicU64::new(0),
            decompressions: AtomicU64::new(0),
        }
    }
}

impl Budget {
    /// Whether new tensors on this device are managed (a budget is set or a scope is open).
    #[inline]
    pub(crate) fn managing(&self) -> bool {
        self.managing.load(Relaxed)
    }

    fn update_managing(&self) {
        let on = self.limit.load(Relaxed) != NO_LIMIT || self.open_scopes.load(Relaxed) > 0;
        self.managing.store(on, Relaxed);
    }

    pub(crate) fn limit(&self) -> Option<u64> {
        let limit = self.limit.load(Relaxed);
        (limit != NO_LIMIT).then_some(limit)
    }

    pub(crate) fn set_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(NO_LIMIT), Relaxed);
        self.update_managing();
    }

    pub(crate) fn policy(&self) -> Policy {
        Policy {
            mode: match self.mode.load(Relaxed) {
                1 => EvictionMode::RecomputeOnly,
                2 => EvictionMode::OffloadOnly,
                _ => EvictionMode::Auto,
            },
            host_cost_per_byte: f64::from_bits(self.host_cost_bits.load(Relaxed)),
            max_depth: self.max_depth.load(Relaxed),
            scope_keeps_products: self.scope_keeps_products.load(Relaxed),
        }
    }

    pub(crate) fn set_policy(&self, policy: Policy) {
        self.mode.store(policy.mode as u8, Relaxed);
        self.host_cost_bits
            .store(policy.host_cost_per_byte.to_bits(), Relaxed);
        self.max_depth.store(policy.max_depth, Relaxed);
        self.scope_keeps_products
            .store(policy.scope_keeps_products, Relaxed);
    }

    /// The type f32 tensors are compressed to, if compression is on.
    pub(crate) fn storage_dtype(&self) -> Option<burn_backend::DType> {
        match self.store.load(Relaxed) {
            0 => None,
            code => Some(STORE_CODES[code as usize - 1]),
        }
    }

    pub(crate) fn set_storage_dtype(&self, dtype: Option<burn_backend::DType>) {
        let code = dtype.map_or(0, |d| {
            STORE_CODES
                .iter()
                .position(|s| *s == d)
                .expect("checked by the caller") as u8
                + 1
        });
        self.store.store(code, Relaxed);
    }

    /// A logical clock, advanced by every use of a managed tensor.
    pub(crate) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Relaxed)
    }

    pub(crate) fn current_scope(&self) -> u64 {
        self.scope.load(Relaxed)
    }

    pub(crate) fn register(&self, cell: Weak<dyn CellDyn>) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Amortised clean-up of cells that are gone, so the registry stays proportional to
        // the live ones.
        if registry.len() >= 1024 && registry.len().is_power_of_two() {
            registry.retain(|cell| cell.strong_count() > 0);
        }
        registry.push(cell);
    }

    /// The resident cells of each buffer that several cells share, for the buffers whose every
    /// holder is a cell (no tensor outside the budget's view also points into them).
    fn shared_buffers(&self) -> Vec<Vec<Arc<dyn CellDyn>>> {
        let mut groups: std::collections::HashMap<usize, (usize, Vec<Arc<dyn CellDyn>>)> =
            Default::default();
        for cell in self.cells() {
            if let Some((storage, holders)) = cell.storage_holders()
                && holders > 1
            {
                groups
                    .entry(storage)
                    .or_insert((holders, Vec::new()))
                    .1
                    .push(cell);
            }
        }
        groups
            .into_values()
            .filter(|(holders, cells)| *holders == cells.len())
            .map(|(_, cells)| cells)
            .collect()
    }

    /// The cheapest of `groups` (see [`Self::shared_buffers`]) whose cells can all be
    /// recomputed, taken out of the list.
    fn shared_group(
        groups: &mut Vec<Vec<Arc<dyn CellDyn>>>,
        now: u64,
        policy: &Policy,
    ) -> Option<Vec<Arc<dyn CellDyn>>> {
        let (index, _) = groups
            .iter()
            .enumerate()
            .filter_map(|(index, cells)| {
                let mut score = 0.0;
                for cell in cells {
                    let candidate = cell.candidate(now, policy, true)?;
                    (candidate.action == Action::Recompute).then_some(())?;
                    score += candidate.score;
                }
                Some((index, score))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        Some(groups.swap_remove(index))
    }

    /// The cheapest of `groups` held by one tensor that can be offloaded (not strided, not
    /// recomputable) and by views of it that can all be recomputed: the views, and the tensor,
    /// taken out of the list.
    fn offloadable_group(
        groups: &mut Vec<Vec<Arc<dyn CellDyn>>>,
        now: u64,
        policy: &Policy,
    ) -> Option<OffloadableGroup> {
        if policy.mode == EvictionMode::RecomputeOnly {
            return None;
        }
        let (index, _, root) = groups
            .iter()
            .enumerate()
            .filter_map(|(index, cells)| {
                let mut root = None;
                let mut score = 0.0;
                for (at, cell) in cells.iter().enumerate() {
                    match cell.candidate(now, policy, true) {
                        Some(c) if c.action == Action::Recompute && cell.core().strided => {
                            score += c.score;
                        }
                        _ if root.is_none() && !cell.core().strided => root = Some(at),
                        _ => return None,
                    }
                }
                let root = root?;
                score += policy.host_cost_per_byte;
                Some((index, score, root))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let mut views = groups.swap_remove(index);
        let root = views.swap_remove(root);
        Some(OffloadableGroup { views, root })
    }

    /// About sqrt(n) + 32 registered cells chosen at random (all of them when few).
    fn sample(&self, seed: u64) -> Vec<Arc<dyn CellDyn>> {
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let n = registry.len();
        let k = (n as f64).sqrt() as usize + 32;
        if n <= k {
            return registry.iter().filter_map(Weak::upgrade).collect();
        }
        let mut state = seed | 1;
        (0..k)
            .filter_map(|_| {
                // xorshift64: cheap, and good enough to spread the sample.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                registry[(state % n as u64) as usize].upgrade()
            })
            .collect()
    }

    fn cells(&self) -> Vec<Arc<dyn CellDyn>> {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|cell| cell.strong_count() > 0);
        registry.iter().filter_map(Weak::upgrade).collect()
    }

    pub(crate) fn count_eviction(&self, bytes: u64) {
        self.evictions.fetch_add(1, Relaxed);
        self.evicted_bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn count_recompute(&self, bytes: u64) {
        self.recomputes.fetch_add(1, Relaxed);
        self.recomputed_bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn count_offload(&self, bytes: u64) {
        self.offloads.fetch_add(1, Relaxed);
        self.offloaded_bytes.fetch_add(bytes, Relaxed);
        let host = self.host_bytes.fetch_add(bytes, Relaxed) + bytes;
        self.peak_host_bytes.fetch_max(host, Relaxed);
    }

    pub(crate) fn count_upload(&self, bytes: u64) {
        self.uploads.fetch_add(1, Relaxed);
        self.uploaded_bytes.fetch_add(bytes, Relaxed);
        self.host_release(bytes);
    }

    pub(crate) fn count_compress(&self, bytes: u64) {
        self.compressions.fetch_add(1, Relaxed);
        self.compressed_bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn count_decompress(&self, _bytes: u64) {
        self.decompressions.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_upload_time(&self, elapsed: std::time::Duration) {
        self.upload_nanos
            .fetch_add(elapsed.as_nanos() as u64, Relaxed);
    }

    pub(crate) fn host_release(&self, bytes: u64) {
        self.host_bytes.fetch_sub(bytes, Relaxed);
    }

    pub(crate) fn stats(&self) -> RematStats {
        RematStats {
            evictions: self.evictions.load(Relaxed),
            evicted_bytes: self.evicted_bytes.load(Relaxed),
            recomputes: self.recomputes.load(Relaxed),
            recomputed_bytes: self.recomputed_bytes.load(Relaxed),
            offloads: self.offloads.load(Relaxed),
            offloaded_bytes: self.offloaded_bytes.load(Relaxed),
            uploads: self.uploads.load(Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Relaxed),
            host_bytes: self.host_bytes.load(Relaxed),
            peak_host_bytes: self.peak_host_bytes.load(Relaxed),
            offload_batches: self.offload_batches.load(Relaxed),
            search_nanos: self.search_nanos.load(Relaxed),
            offload_nanos: self.offload_nanos.load(Relaxed),
            upload_nanos: self.upload_nanos.load(Relaxed),
            compressions: self.compressions.load(Relaxed),
            compressed_bytes: self.compressed_bytes.load(Relaxed),
            decompressions: self.decompressions.load(Relaxed),
        }
    }

    /// Opens a checkpoint scope: tensors created until it closes are tagged with its id.
    pub(crate) fn open_scope(&self) -> (u64, u64) {
        let id = self.next_scope.fetch_add(1, Relaxed);
        let outer = self.scope.swap(id, Relaxed);
        self.open_scopes.fetch_add(1, Relaxed);
        self.update_managing();
        (id, outer)
    }

    /// Closes scope `id`: every tensor created inside it that the program still holds, is not
    /// in `keep` (the scope's outputs) and can be recomputed is evicted; under a budget whose
    /// policy says so, products stay (see [`Policy::scope_keeps_products`]).
    pub(crate) fn close_scope(&self, (id, outer): (u64, u64), keep: &[usize]) {
        self.scope.store(outer, Relaxed);
        self.open_scopes.fetch_sub(1, Relaxed);
        self.update_managing();
        let keep_products = self.limit().is_some() && self.scope_keeps_products.load(Relaxed);
        // Dropped tensors too: one still resident is kept for evicted tensors computed from
        // it (e.g. `qkv`, which the views `q`, `k`, `v` saved by autodiff share), and its
        // buffer goes only if it is evicted with them.
        for cell in self.cells() {
            let core = cell.core();
            let address = Arc::as_ptr(&cell) as *const () as usize;
            if core.scope >= id
                && !keep.contains(&address)
                && !(keep_products
                    && crate::policy::is_product(core.op.name())
                    && core.cost >= crate::policy::KEEP_COST_PER_BYTE * core.bytes as f64)
                && cell.status() == Status::Resident
            {
                cell.evict();
            }
        }
    }

    /// Evicts tensors until live bytes are within the limit. `op` just ran and needed `needed`
    /// bytes for its inputs and output; if nothing more can be evicted, this panics with the
    /// figures (Burn ops have no error channel).
    pub(crate) fn enforce(&self, ledger: &Ledger, op: Option<OpId>, needed: u64) {
        let Some(limit) = self.limit() else { return };
        if ledger.live_bytes() <= limit {
            return;
        }
        self.evict_down(ledger, limit);
        let live = ledger.live_bytes();
        if live > limit {
            let holders = ledger
                .holders()
                .into_iter()
                .take(5)
                .map(|(op, bytes, n)| format!("{} {} in {n}", op.name(), format_bytes(bytes)))
                .collect::<Vec<_>>()
                .join(", ");
            let after = op.map_or("changing the budget".to_string(), |op| {
                op.name().to_string()
            });
            panic!(
                "frugal: the memory budget of {} on {} cannot be kept after {after}: {} are live \
                 and nothing more can be evicted (the op's inputs, output and the tensors it \
                 restored take {}). Biggest holders: {holders}. Raise the budget (accepted: at \
                 least the largest op's inputs and output plus what cannot be recomputed or \
                 offloaded).",
                format_bytes(limit),
                ledger.label,
                format_bytes(live),
                format_bytes(needed),
            );
        }
    }

    /// Evicts what it can towards the limit without failing: used between the restores of a
    /// chain, where the op that asked for them has not finished.
    pub(crate) fn relieve(&self, ledger: &Ledger) {
        if let Some(limit) = self.limit()
            && ledger.live_bytes() > limit
        {
            self.evict_down(ledger, limit);
        }
    }

    fn evict_down(&self, ledger: &Ledger, limit: u64) {
        let started = std::time::Instant::now();
        let now = self.clock.load(Relaxed);
        let policy = self.policy();
        // Evict a little below the limit, so the next few ops do not each search again.
        let target = limit - limit / 16;
        let best = |cells: Vec<Arc<dyn CellDyn>>| {
            cells
                .into_iter()
                .filter_map(|cell| Some((cell.candidate(now, &policy, false)?, cell)))
                .min_by(|a, b| {
                    let (a, b) = (a.0.rank(), b.0.rank());
                    a.0.cmp(&b.0).then(a.1.total_cmp(&b.1))
                })
        };
        // As DTR does, score a random sample of about sqrt(n) tensors per eviction rather
        // than all n, as long as the sample holds one to recompute.
        let mut round = 0u64;
        let mut failures = 0;
        while ledger.live_bytes() > target && failures < 8 {
            round += 1;
            match best(self.sample(now ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15))) {
                Some((candidate, cell)) if candidate.action != Action::Offload => {
                    match apply(candidate.action, &cell) {
                        true => failures = 0,
                        // Another thread may be using the cell; try others a few times.
                        false => failures += 1,
                    }
                }
                _ => break,
            }
        }
        let waited = if ledger.live_bytes() > target {
            self.evict_from_all(ledger, target, now, &policy)
        } else {
            0
        };
        let elapsed = started.elapsed().as_nanos() as u64;
        self.search_nanos
            .fetch_add(elapsed.saturating_sub(waited), Relaxed);
    }

    /// The slow path of [`Self::evict_down`], when the sample has nothing to recompute: one
    /// scan of every tensor, then recomputable tensors in order of score, then buffers
    /// shared by several recomputable tensors, then offloads, all read in one batch. Returns
    /// the nanoseconds spent waiting for that read.
    fn evict_from_all(&self, ledger: &Ledger, target: u64, now: u64, policy: &Policy) -> u64 {
        let mut ranked: Vec<_> = self
            .cells()
            .into_iter()
            .filter_map(|cell| Some((cell.candidate(now, policy, false)?, cell)))
            .collect();
        ranked.sort_by(|a, b| {
            let (a, b) = (a.0.rank(), b.0.rank());
            a.0.cmp(&b.0).then(a.1.total_cmp(&b.1))
        });
        let (on_device, offload): (Vec<_>, Vec<_>) = ranked
            .into_iter()
            .partition(|(candidate, _)| candidate.action != Action::Offload);
        for (candidate, cell) in on_device {
            if ledger.live_bytes() <= target {
                return 0;
            }
            apply(candidate.action, &cell);
        }
        // A tensor and its views share a buffer that no single eviction frees. The groups
        // are found once: evicting one group leaves the others' holders as they were.
        let mut groups = self.shared_buffers();
        while ledger.live_bytes() > target
            && let Some(group) = Self::shared_group(&mut groups, now, policy)
        {
            // Every cell of the group must go for the buffer to be freed: no short circuit.
            if group.iter().filter(|cell| cell.evict()).count() == 0 {
                break;
            }
        }
        let mut batch: Option<Box<dyn crate::remat::HostBatch>> = None;
        for (_, cell) in offload {
            if ledger.live_bytes() <= target {
                break;
            }
            batch.get_or_insert_with(|| cell.host_batch()).add(&cell);
        }
        // A buffer shared by a tensor that can only be offloaded and views of it: once the
        // views are evicted (recomputed from the tensor when read), the tensor is alone on its
        // buffer and can be offloaded.
        while ledger.live_bytes() > target
            && let Some(OffloadableGroup { views, root }) =
                Self::offloadable_group(&mut groups, now, policy)
        {
            if !views.iter().all(|view| view.evict()) {
                break;
            }
            if !batch.get_or_insert_with(|| root.host_batch()).add(&root) {
                break;
            }
        }
        let Some(batch) = batch else { return 0 };
        let started = std::time::Instant::now();
        if batch.finish() == 0 {
            return 0;
        }
        let waited = started.elapsed().as_nanos() as u64;
        self.offload_batches.fetch_add(1, Relaxed);
        self.offload_nanos.fetch_add(waited, Relaxed);
        waited
    }
}

/// A buffer held by one tensor that can be offloaded and by recomputable views of it.
struct OffloadableGroup {
    views: Vec<Arc<dyn CellDyn>>,
    root: Arc<dyn CellDyn>,
}

/// Carries out an eviction that needs no wait for the device: recompute later, or compress.
fn apply(action: Action, cell: &Arc<dyn CellDyn>) -> bool {
    match action {
        Action::Compress => cell.compress(),
        _ => cell.evict(),
    }
}

/// Error from [`parse_bytes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseBytesError {
    input: String,
}

impl std::fmt::Display for ParseBytesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid byte size {:?}: expected a positive number with an optional unit \
             B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), \
             e.g. 2GiB or 1.5GB, between 1 B and 2^64 - 1 B",
            self.input
        )
    }
}

impl std::error::Error for ParseBytesError {}

/// Parses a byte size such as `2GiB`, `1.5 GB`, `800MB` or `123456`.
pub fn parse_bytes(input: &str) -> Result<u64, ParseBytesError> {
    let error = || ParseBytesError {
        input: input.to_string(),
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| error())?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(error()),
    };
    let bytes = (number * scale).round();
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(error());
    }
    Ok(bytes as u64)
}
