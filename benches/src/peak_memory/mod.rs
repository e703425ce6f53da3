//! The `peak-memory` bench as a library: the reference GPT training step (the twin of
//! `shared/anchors/torch_gpt.py`) under named configurations, one child process each so that
//! no configuration inherits another's device pool. Prints one JSON line per configuration
//! with torch_gpt.py's fields, then a table.
//!
//! Figures:
//! - `peak_allocated_bytes`: Frugal's peak live tensor bytes over the timed steps (absent for
//!   plain Burn, which has no ledger).
//! - `peak_reserved_bytes`: the highest reserved bytes of the CubeCL pool seen at the phase
//!   boundaries of each step (start, after forward, after backward, after the optimizer),
//!   after a sync; a lower bound of the true peak, since CubeCL keeps no peak counter.
//! - `step_ms_median`, `tokens_per_s`: over the steps after warm-up (the last step, whose
//!   phases are probed with syncs, left out); `step_ms`: every step, warm-up included.
//! - `ledger_vs_pool`: for Frugal, the ledger's live bytes beside the pool's `bytes_in_use` at
//!   each phase boundary of the last step.
//! - `budget_bytes`, `checkpoint_blocks`: the configuration's memory budget and scopes.
//! - `evictions`, `recomputes`, `offloads`, `offload_batches`, `search_nanos`, `offload_nanos`,
//!   ... (the fields of `frugal::RematStats`): what Frugal's budget and scopes did over the
//!   measured steps (absent without Frugal).
//!
//! The budgets (`budget-1/3` etc.) are fractions of the `frugal` configuration's
//! `peak_allocated_bytes` in the same invocation, which is run first (added if not asked for).
//! A configuration that fails (e.g. a budget too small for one op) gives a line with `error`,
//! the first line of its panic message, and a failed row in the table; the others still run.
//!
//! One file per role: [`args`] (the command line), [`schedule`] (which configurations run, in
//! which order, under which budgets), [`isolation`] (a child process per configuration),
//! [`run`] (one configuration's steps), [`probes`] (frugal-cuda's driver, kernels and
//! allocator), [`record`] (the JSON lines) and [`report`] (the table and chart).

pub mod args;
pub mod isolation;
pub mod probes;
pub mod record;
pub mod report;
pub mod run;
pub mod schedule;

use gpt::run::BUILT;

pub use args::Args;
pub use record::Line;
pub use run::run_named;

use crate::configs::Config;

/// Runs one configuration on the device `--device` names: `Err` with the refusal when this
/// build lacks it. The binary supplies it, so that the backends (this build's features) are
/// instantiated there once, not again in this library's test harness.
pub type Runner = fn(&Config, &Args) -> Result<Line, String>;

/// Prints `error: {message}` and ends the process with status 2, as for a bad flag.
fn refuse(message: impl std::fmt::Display) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2);
}

/// What `peak-memory` does with `args`: run the one configuration of `--only` (a child), or
/// every configuration of `--configs` then print the table and the chart (the parent). Ends
/// the process with status 2 for bad flags and 1 when a run failed.
pub fn main(args: &Args, run_on: Runner) {
    if let Err(e) = args.check_steps() {
        refuse(e);
    }
    let configs = schedule::select(&args.configs).unwrap_or_else(|e| refuse(e));
    if let Some(only) = &args.only {
        let config = Config::named(only).unwrap_or_else(|e| refuse(format!("--only: {e}")));
        isolation::child(config, args, run_on);
        return;
    }
    if let Err(e) = args.check_parent(BUILT) {
        refuse(e);
    }

    // Parent: one child process per configuration and repeat. The budgets need frugal's peak
    // first: run frugal before the first budget configuration, adding it if not asked for.
    let (configs, added) = schedule::with_reference(configs, args.reference_peak);
    if added {
        eprintln!("note: running frugal too, as the reference peak for the budgets");
    }
    let mut lines = schedule::run_all(args, &configs, run_on);
    if let Some(path) = &args.torch {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| refuse(format!("cannot read --torch {}: {e}", path.display())));
        lines.extend(report::torch_lines(&text));
    }
    print!("{}", report::table(&lines));
    if let Some(path) = &args.chart {
        let title = report::chart_title(&args.shape());
        match crate::chart::peak_memory(&title, &report::chart_bars(&lines), path) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    // Every configuration has run and is in the table; the status still says if any failed.
    let failed = lines.iter().filter(|l| !l["error"].is_null()).count();
    if failed > 0 {
        eprintln!("{failed} of {} runs failed", lines.len());
        std::process::exit(1);
    }
}
