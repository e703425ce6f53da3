//! One configuration's run in this process: the model built on the configuration's backend,
//! the steps timed and probed, and its [`Line`].

use std::time::Instant;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::tensor::backend::{AutodiffBackend, Backend};
use frugal::memory;
use frugal::{Frugal, RematStats};
use gpt::GptConfig;
use gpt::cli::{LossKind, NormKind};
use gpt::data::random_tokens;
use gpt::train::{self, Phase};

use super::args::Args;
use super::probes::{
    DriverInStep, KernelsInStep, allocator_figures, allocator_trace, driver_calls, kernel_loads,
    record_allocator_history, reset_allocator_peaks,
};
use super::record::{Line, PhasePoint};
use crate::configs::{Config, System};
use crate::median;

/// Runs `config` on `B` (plain Burn, Burn's balanced checkpointing or Frugal, as the
/// configuration says) with the flags of `args`; what a [`super::Runner`] calls per device.
pub fn run_named<B: Backend>(config: &Config, args: &Args) -> Line {
    let budget = config.budget.map(|_| {
        args.budget_bytes
            .expect("the parent passes --budget-bytes to budget configurations")
    });
    match config.system {
        System::Plain => run::<Autodiff<B>>(config, args, false, None),
        System::BurnBalanced => {
            run::<Autodiff<B, BalancedCheckpointing>>(config, args, false, None)
        }
        System::Frugal => run::<Autodiff<Frugal<B>>>(config, args, true, budget),
    }
}

/// Runs `config` on `A`; `ledger` when `A` is Frugal's, under `budget` if given.
pub fn run<A: AutodiffBackend>(
    config: &Config,
    args: &Args,
    ledger: bool,
    budget: Option<u64>,
) -> Line {
    let name = config.name;
    let device = A::Device::default();
    frugal::kernels::set_mode(args.kernels.mode());
    frugal::kernels::set_products(args.products.products());
    frugal::kernels::set_attention_path(args.attention_path.choice());
    if ledger && args.trace.is_some() {
        memory::record_timeline(&device, 1 << 22);
    }
    if let Some(path) = &args.allocator_trace {
        allocator_trace(&device, path, true);
    }
    let kernels_before = frugal::kernels::stats();
    let kept_casts_before = frugal::precision::kept_casts_reused(&device);
    let shape = args.shape();
    let gpt = GptConfig::new(
        args.vocab,
        shape.seq,
        shape.d_model,
        shape.heads,
        shape.layers,
    )
    .with_fused_attention(args.fused_attention())
    .with_fused_norm(args.norm == NormKind::Fused)
    .with_fused_loss(args.loss == LossKind::Fused);
    let mut settings = config.memory_settings(budget, args.scopes_keep_products);
    settings.no_plan = args.no_plan;
    settings.recast = args.recast;
    settings.no_segments = !args.cuts_segments();
    let checkpoint_blocks = settings.checkpoint_blocks;
    let _settings = settings
        .apply::<A>(&device)
        .unwrap_or_else(|e| panic!("{}", e.precision_error()));
    if let (Some(limit), true) = (args.growth_limit, budget.is_some())
        && !memory::set_growth_limit(&device, Some(limit))
    {
        eprintln!("note: --growth-limit applies to frugal-cuda only; ignored on {name}");
    }
    if let Some(max_depth) = args.max_depth {
        memory::set_policy(
            &device,
            frugal::Policy {
                max_depth,
                ..memory::policy(&device)
            },
        );
    }
    A::seed(&device, 0);
    let mut model = gpt.init::<A>(&device);
    let mut optim = train::optimizer::<A>(args.optimizer);
    let mut times = Vec::new();
    let mut every_step_ms = Vec::new();
    let mut losses = Vec::new();
    let mut peak_reserved: Option<u64> = None;
    let mut points = Vec::new();
    let mut remat_start = RematStats::default();
    let on_frugal_cuda = allocator_figures(&device).is_some();
    let mut kernels_per_step = on_frugal_cuda.then(Vec::new);
    let mut driver_per_step = on_frugal_cuda.then(Vec::new);
    let mut kernel_profile = None;
    for step in 0..args.steps {
        let data = random_tokens(0, step as u64, shape.batch, shape.seq, args.vocab);
        if args.profile_kernels && step == args.warmup {
            gpt::kernel_profile::start(&device);
        }
        // The last step is probed (a sync at each phase): left out of the profile.
        if args.profile_kernels && step + 1 == args.steps {
            kernel_profile = gpt::kernel_profile::finish(&device, &every_step_ms[args.warmup..]);
            if let Some(profile) = &kernel_profile {
                eprint!("{name}: {profile}");
            }
        }
        if step == args.warmup {
            if ledger && (args.peak_holders || args.memory_viz.is_some()) && args.trace.is_none() {
                memory::record_timeline(&device, 1 << 24);
            }
            // An --allocator-trace recording runs from the start: restarting it would cut it.
            if ledger && args.memory_viz.is_some() && args.allocator_trace.is_none() {
                record_allocator_history(&device, true);
            }
            memory::reset_peak(&device);
            reset_allocator_peaks(&device);
            remat_start = memory::remat_stats(&device);
        }
        A::sync(&device).expect("sync");
        let timed = step >= args.warmup;
        let loads_before = kernel_loads(on_frugal_cuda);
        let driver_before = driver_calls(&device);
        let remat_before = memory::remat_stats(&device);
        let started = Instant::now();
        let on_phase = |phase: Phase| {
            // The update begins right where the backward pass ended: nothing to read there.
            if phase == Phase::Update {
                return;
            }
            if ledger && (args.peak_holders || args.memory_viz.is_some()) {
                memory::mark(&device, phase.label());
            }
            // Only the last step is probed: a sync at each phase would slow the others.
            if step + 1 == args.steps {
                A::sync(&device).expect("sync");
                let pool = memory::pool_usage(&device);
                if let Some(pool) = pool {
                    peak_reserved = Some(peak_reserved.unwrap_or(0).max(pool.bytes_reserved));
                }
                points.push(PhasePoint {
                    step,
                    phase: format!("{phase:?}"),
                    ledger_live_bytes: ledger.then(|| memory::live_bytes(&device)),
                    pool_in_use_bytes: pool.map(|p| p.bytes_in_use),
                    pool_reserved_bytes: pool.map(|p| p.bytes_reserved),
                });
            }
        };
        let (next, loss) = train::step_with(
            model,
            &mut optim,
            data,
            1e-4,
            &device,
            checkpoint_blocks,
            on_phase,
        );
        A::sync(&device).expect("sync");
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        model = next;
        losses.push(loss);
        every_step_ms.push(elapsed);
        let kernels = kernel_loads(on_frugal_cuda)
            .zip(loads_before)
            .map(|(after, before)| after.since(&before));
        let driver = driver_calls(&device)
            .zip(driver_before)
            .map(|(after, before)| after.since(&before));
        let budget = memory::remat_stats(&device).since(&remat_before);
        // On stderr as it happens, so a run cut short by a time limit still shows its pace.
        eprintln!(
            "{}",
            step_line(name, step, elapsed, kernels, &budget, driver)
        );
        if let (Some(all), Some(d)) = (driver_per_step.as_mut(), driver) {
            all.push(d);
        }
        if let (Some(all), Some(k)) = (kernels_per_step.as_mut(), kernels) {
            all.push(k);
        }
        if timed && step + 1 != args.steps {
            times.push(elapsed);
        }
        if let Some(pool) = memory::pool_usage(&device) {
            peak_reserved = Some(peak_reserved.unwrap_or(0).max(pool.bytes_reserved));
        }
    }
    if let (true, Some(path)) = (ledger, &args.trace) {
        write_trace(&memory::snapshot(&device), path);
    }
    if let (true, Some(path)) = (ledger, &args.memory_viz) {
        let path = path.with_extension(format!(
            "{}.{}",
            name.replace('/', "_"),
            path.extension()
                .and_then(|e| e.to_str())
                .unwrap_or("pickle")
        ));
        memory::snapshot(&device)
            .write_memory_viz(&path)
            .unwrap_or_else(|e| panic!("cannot write --memory-viz {}: {e}", path.display()));
        eprintln!("{name}: wrote {}", path.display());
        if args.allocator_trace.is_none() {
            record_allocator_history(&device, false);
        }
    }
    // After the memory_viz snapshot, which copies the allocator trace this takes.
    if let Some(path) = &args.allocator_trace {
        allocator_trace(&device, path, false);
    }
    let peak_holders = (ledger && args.peak_holders)
        .then(|| memory::snapshot(&device).holders_at_peak())
        .flatten();
    if let Some(peak) = &peak_holders {
        eprintln!(
            "{name}: at the peak of {} B (after {:?}; {} B allocated before recording):",
            peak.live_bytes, peak.after_mark, peak.before_recording_bytes
        );
        for holder in peak.holders.iter().take(16) {
            eprintln!(
                "  {:>14} B in {:>5}  {}",
                holder.bytes, holder.tensors, holder.op
            );
        }
    }
    let step_ms = median(&mut times);
    let remat = ledger.then(|| memory::remat_stats(&device).since(&remat_start));
    Line {
        system: "burn",
        device: A::name(&device),
        config: name.to_string(),
        batch: shape.batch,
        seq: shape.seq,
        layers: shape.layers,
        d: shape.d_model,
        heads: shape.heads,
        vocab: args.vocab,
        parameters: gpt.parameters(),
        peak_allocated_bytes: ledger.then(|| memory::peak_bytes(&device)),
        peak_reserved_bytes: peak_reserved,
        step_ms_median: step_ms,
        step_ms: every_step_ms,
        tokens_per_s: (shape.batch * shape.seq) as f64 / (step_ms / 1e3),
        losses,
        kernels: format!("{:?}", args.kernels).to_lowercase(),
        kernel_casts: frugal::kernels::stats().casts - kernels_before.casts,
        kept_casts_reused: frugal::precision::kept_casts_reused(&device) - kept_casts_before,
        fused_attention: args.fused_attention(),
        attention_kernel_passes: frugal::kernels::stats().attention_forwards
            + frugal::kernels::stats().attention_backwards
            - kernels_before.attention_forwards
            - kernels_before.attention_backwards,
        fused_norm: args.norm == NormKind::Fused,
        fused_loss: args.loss == LossKind::Fused,
        layer_norm_kernel_passes: frugal::kernels::stats().layer_norm_forwards
            + frugal::kernels::stats().layer_norm_backwards
            - kernels_before.layer_norm_forwards
            - kernels_before.layer_norm_backwards,
        attention_path: format!("{:?}", args.attention_path).to_lowercase(),
        attention_product_passes: frugal::kernels::stats().attention_product_forwards
            + frugal::kernels::stats().attention_product_backwards
            - kernels_before.attention_product_forwards
            - kernels_before.attention_product_backwards,
        products: format!("{:?}", args.products).to_lowercase(),
        blas_products: frugal::kernels::stats().blas_products - kernels_before.blas_products,
        optimizer: format!("{:?}", args.optimizer).to_lowercase(),
        adamw8bit_kernel_updates: frugal::kernels::stats().adamw8bit_launches
            - kernels_before.adamw8bit_launches,
        adamw_kernel_updates: frugal::kernels::stats().adamw_launches
            - kernels_before.adamw_launches,
        model_state_bytes: ledger.then(|| memory::live_bytes(&device)),
        ledger_vs_pool: points,
        budget_bytes: budget,
        peak_holders,
        kernel_profile,
        checkpoint_blocks,
        remat,
        allocator: allocator_figures(&device),
        kernels_per_step,
        driver_per_step,
    }
}

/// Writes the allocations and frees of `snapshot`'s timeline as `a <id> <bytes>` and
/// `f <id>` lines (ids are the ledger's allocation numbers).
pub fn write_trace(snapshot: &frugal::memory::Snapshot, path: &std::path::Path) {
    use std::fmt::Write as _;
    assert_eq!(
        snapshot.dropped_events, 0,
        "the timeline was too short for the whole run"
    );
    let mut text = String::new();
    for event in &snapshot.events {
        match event.kind {
            frugal::memory::EventKind::Alloc => {
                writeln!(text, "a {} {}", event.alloc_seq, event.bytes).unwrap()
            }
            frugal::memory::EventKind::Free => writeln!(text, "f {}", event.alloc_seq).unwrap(),
            frugal::memory::EventKind::Mark => {}
        }
    }
    std::fs::write(path, text)
        .unwrap_or_else(|e| panic!("cannot write the trace to {}: {e}", path.display()));
}

/// The line a step prints on stderr as it ends: its time, the kernels it made ready, what the
/// budget did in it and what the allocator asked of the driver, where there are such.
pub fn step_line(
    name: &str,
    step: usize,
    elapsed: f64,
    kernels: Option<KernelsInStep>,
    budget: &RematStats,
    driver: Option<DriverInStep>,
) -> String {
    let mut line = format!("{name}: step {step} took {elapsed:.1} ms");
    if let Some(k) = kernels {
        line += &format!(
            " ({} kernels compiled, {:.1} ms of compile threads' time, {:.1} ms waited; {} \
             loaded from disk; {:.1} ms loading)",
            k.compiled, k.compile_ms, k.wait_ms, k.from_disk, k.load_ms
        );
    }
    if budget.evictions + budget.offloads > 0 {
        line += &format!(
            "; budget: {} evicted, {} recomputed, {} offloaded, {} room rounds",
            budget.evictions, budget.recomputes, budget.offloads, budget.room_rounds
        );
    }
    if let Some(d) = driver {
        line += &format!(
            "; allocator: {} misses, {} maps of {} MiB in {:.1} ms, {} unmaps of {} MiB in \
             {:.1} ms, {} waits in {:.1} ms",
            d.misses,
            d.maps,
            d.mapped_bytes >> 20,
            d.maps_ms,
            d.unmaps,
            d.unmapped_bytes >> 20,
            d.unmaps_ms,
            d.waits,
            d.waits_ms
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_s_line_names_only_what_happened() {
        let quiet = RematStats::default();
        assert_eq!(
            step_line("plain", 3, 12.345, None, &quiet, None),
            "plain: step 3 took 12.3 ms"
        );
        let budget = RematStats {
            evictions: 4,
            recomputes: 2,
            room_rounds: 1,
            ..RematStats::default()
        };
        let kernels = KernelsInStep {
            compiled: 5,
            from_disk: 6,
            compile_ms: 1.24,
            load_ms: 0.5,
            nvrtc_ms: 1.0,
            wait_ms: 0.81,
        };
        let driver = DriverInStep {
            misses: 7,
            maps: 1,
            mapped_bytes: 3 << 20,
            maps_ms: 0.31,
            ..DriverInStep::default()
        };
        assert_eq!(
            step_line("budget-1/3", 0, 1.0, Some(kernels), &budget, Some(driver)),
            "budget-1/3: step 0 took 1.0 ms (5 kernels compiled, 1.2 ms of compile threads' \
             time, 0.8 ms waited; 6 loaded from disk; 0.5 ms loading); budget: 4 evicted, 2 recomputed, 0 offloaded, 1 room rounds; \
             allocator: 7 misses, 1 maps of 3 MiB in 0.3 ms, 0 unmaps of 0 MiB in 0.0 ms, \
             0 waits in 0.0 ms"
        );
    }
}
