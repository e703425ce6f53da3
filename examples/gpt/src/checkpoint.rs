//! Training checkpoints: model, optimizer and run state in `DIR/step-NNNNNNNN/`, written
//! atomically; finding the newest, loading it, and resuming a run from it.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, BurnRecord, FullPrecisionSettings, Record, Recorder};
use burn::tensor::backend::Backend;
use frugal::{GradScaler, GradScalerState};
use serde::{Deserialize, Serialize};

use crate::Ad;
use crate::cli::TrainArgs;
use crate::model::Gpt;
use crate::report::StepLog;
use crate::train::{GptOptimizer, OptimizerKind};
use clap::ValueEnum;

/// What a checkpoint holds besides the model and optimizer records.
#[derive(Debug, Serialize, Deserialize)]
struct TrainState {
    /// Steps done; the next step to run.
    next_step: u64,
    seed: u64,
    layers: usize,
    d_model: usize,
    heads: usize,
    seq: usize,
    /// The log so far, so a resumed run's log is the whole run's.
    log: Vec<StepLog>,
    /// The loss scaler's state, with `--loss-scale`.
    #[serde(default)]
    grad_scaler: Option<GradScalerState>,
    /// The optimizer whose record the checkpoint holds.
    #[serde(default)]
    optimizer: OptimizerKind,
}

/// Writes `contents` to a temporary file beside `path` and renames it over `path`, so a crash
/// never leaves a half-written file.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename to {}: {e}", path.display()))
}

/// The one record format of checkpoints: Burn's binary files, f32 kept exact.
fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::new()
}

/// A checkpoint read into host memory, ready to be encoded and written by any thread: the
/// device is read once, at a step boundary, and the slow part (encoding the records and
/// writing the files) can go on beside the next steps.
pub struct Snapshot {
    root: PathBuf,
    next_step: u64,
    records: WriteRecords,
    state: String,
}

/// Encodes the model and optimizer records into a folder, as `recorder()` writes them.
type WriteRecords = Box<dyn FnOnce(&Path) -> Result<(), String> + Send>;

/// A record's tensors read into host memory, in the item `recorder()` encodes.
fn host_item<B: Backend, R: Record<Ad<B>>>(
    record: R,
) -> BurnRecord<R::Item<FullPrecisionSettings>, Ad<B>> {
    BurnRecord::new::<BinFileRecorder<FullPrecisionSettings>>(record.into_item())
}

/// Reads model, optimizer and run state into a [`Snapshot`] (the caller's thread waits for the
/// device reads, not for their encoding, which `recorder()` does when the snapshot is written).
pub fn snapshot<B: Backend>(
    args: &TrainArgs,
    model: &Gpt<Ad<B>>,
    optim: &GptOptimizer<Ad<B>>,
    scaler: Option<&GradScaler>,
    next_step: u64,
    log: &[StepLog],
) -> Snapshot {
    let model_item = host_item::<B, _>(model.clone().into_record());
    let optimizer_item = host_item::<B, _>(optim.to_record());
    let records = Box::new(move |dir: &Path| {
        Recorder::<Ad<B>>::save_item(&recorder(), model_item, dir.join("model"))
            .map_err(|e| format!("saving the model: {e}"))?;
        Recorder::<Ad<B>>::save_item(&recorder(), optimizer_item, dir.join("optimizer"))
            .map_err(|e| format!("saving the optimizer: {e}"))
    });
    let state = TrainState {
        next_step,
        seed: args.seed,
        layers: args.layers(),
        d_model: args.d_model(),
        heads: args.heads(),
        seq: args.seq(),
        log: log.to_vec(),
        grad_scaler: scaler.map(GradScaler::state),
        optimizer: optim.kind(),
    };
    Snapshot {
        root: args.checkpoints(),
        next_step,
        records,
        state: serde_json::to_string_pretty(&state).unwrap(),
    }
}

impl Snapshot {
    /// The step a run resumed from this snapshot runs first.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Writes the snapshot into `DIR/step-NNNNNNNN`: into a temporary folder first, renamed
    /// into place, so an interrupted write never shadows the previous checkpoint.
    pub fn write(self) -> Result<PathBuf, String> {
        let final_dir = self.root.join(format!("step-{:08}", self.next_step));
        let tmp_dir = self.root.join(format!(".step-{:08}.tmp", self.next_step));
        let io = |e: std::io::Error| format!("checkpoint {}: {e}", tmp_dir.display());
        if tmp_dir.exists() {
            std::fs::remove_dir_all(&tmp_dir).map_err(io)?;
        }
        std::fs::create_dir_all(&tmp_dir).map_err(io)?;
        (self.records)(&tmp_dir)?;
        std::fs::write(tmp_dir.join("state.json"), &self.state).map_err(io)?;
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(io)?;
        }
        std::fs::rename(&tmp_dir, &final_dir).map_err(io)?;
        Ok(final_dir)
    }
}

/// Saves model, optimizer and state into `DIR/step-NNNNNNNN` now (see [`Snapshot::write`]).
pub fn save_checkpoint<B: Backend>(
    args: &TrainArgs,
    model: &Gpt<Ad<B>>,
    optim: &GptOptimizer<Ad<B>>,
    scaler: Option<&GradScaler>,
    next_step: u64,
    log: &[StepLog],
) -> Result<PathBuf, String> {
    snapshot::<B>(args, model, optim, scaler, next_step, log).write()
}

/// The step a checkpoint folder (`step-NNNNNNNN`) was written after.
pub fn checkpoint_step(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix("step-")?
        .parse()
        .ok()
}

/// The checkpoint with the highest step in `root`, ignoring unfinished ones.
pub fn latest_checkpoint(root: &Path) -> Result<Option<PathBuf>, String> {
    if !root.exists() {
        return Ok(None);
    }
    let entries =
        std::fs::read_dir(root).map_err(|e| format!("reading {}: {e}", root.display()))?;
    Ok(entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
                && p.join("state.json").exists()
        })
        .max())
}

type Loaded<B> = (Gpt<Ad<B>>, GptOptimizer<Ad<B>>, TrainState);

/// Loads the checkpoint in `dir` into `model` and `optim`, with its run state.
fn load_checkpoint<B: Backend>(
    dir: &Path,
    model: Gpt<Ad<B>>,
    optim: GptOptimizer<Ad<B>>,
    device: &B::Device,
) -> Result<Loaded<B>, String> {
    let state: TrainState = serde_json::from_str(
        &std::fs::read_to_string(dir.join("state.json"))
            .map_err(|e| format!("reading {}: {e}", dir.display()))?,
    )
    .map_err(|e| format!("{}/state.json: {e}", dir.display()))?;
    if state.optimizer != optim.kind() {
        return Err(format!(
            "checkpoint {} was made with --optimizer {}; resume with it",
            dir.display(),
            state
                .optimizer
                .to_possible_value()
                .map_or(String::new(), |v| v.get_name().to_string())
        ));
    }
    let model = model
        .load_file(dir.join("model"), &recorder(), device)
        .map_err(|e| format!("loading the model from {}: {e}", dir.display()))?;
    let record = recorder()
        .load(dir.join("optimizer"), device)
        .map_err(|e| format!("loading the optimizer from {}: {e}", dir.display()))?;
    Ok((model, optim.load_record(record), state))
}

/// A run continued from a checkpoint: the loaded model and optimizer, the step to run next and
/// the log so far.
pub struct Resumed<B: Backend> {
    /// The model, as saved.
    pub model: Gpt<Ad<B>>,
    /// The optimizer, as saved.
    pub optim: GptOptimizer<Ad<B>>,
    /// The next step to run.
    pub first: u64,
    /// The steps done before, so that the resumed run's log is the whole run's.
    pub log: Vec<StepLog>,
}

/// Continues from the newest checkpoint in the checkpoint folder, loading into `model`, `optim`
/// and `scaler`. Refuses a checkpoint made with another model shape, seed or `--loss-scale`
/// choice, or none at all.
pub fn resume<B: Backend>(
    args: &TrainArgs,
    model: Gpt<Ad<B>>,
    optim: GptOptimizer<Ad<B>>,
    scaler: &mut Option<GradScaler>,
    device: &B::Device,
) -> Result<Resumed<B>, String> {
    let Some(dir) = latest_checkpoint(&args.checkpoints())? else {
        return Err(format!(
            "--resume: no checkpoint in {}",
            args.checkpoints().display()
        ));
    };
    let (model, optim, state) = load_checkpoint::<B>(&dir, model, optim, device)?;
    if (
        state.layers,
        state.d_model,
        state.heads,
        state.seq,
        state.seed,
    ) != (
        args.layers(),
        args.d_model(),
        args.heads(),
        args.seq(),
        args.seed,
    ) {
        return Err(format!(
            "checkpoint {} was made with --layers {} --d-model {} --heads {} --seq {} --seed {}; \
             resume with the same values",
            dir.display(),
            state.layers,
            state.d_model,
            state.heads,
            state.seq,
            state.seed
        ));
    }
    match (state.grad_scaler, args.loss_scale) {
        (Some(saved), true) => {
            *scaler = Some(
                GradScaler::from_state(saved)
                    .map_err(|e| format!("checkpoint {}: loss scaler: {e}", dir.display()))?,
            );
        }
        (None, false) => {}
        (saved, _) => {
            return Err(format!(
                "checkpoint {} was made {} --loss-scale; resume {} it",
                dir.display(),
                if saved.is_some() { "with" } else { "without" },
                if saved.is_some() { "with" } else { "without" },
            ));
        }
    }
    if !args.quiet {
        println!(
            "resuming from {} at step {}",
            dir.display(),
            state.next_step
        );
    }
    Ok(Resumed {
        model,
        optim,
        first: state.next_step,
        log: state.log,
    })
}
