//! `Autodiff<Frugal<NdArray>>` as the backend of a burn-train `Learner`: a small regression is
//! trained through `SupervisedTraining` (data loaders, metrics, checkpoints, validation on the
//! inner backend) and fits its data, with the ledger watching and Frugal's memory metrics in
//! its logs.

use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::AdamConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn::train::metric::LossMetric;
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use frugal::memory::Role;
use frugal::train::{MemoryMetric, RoleTracking};
use frugal::{Frugal, memory};

type B = Autodiff<Frugal<NdArray>>;

/// The tests share NdArray's one device, whose budget the second one sets: they take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Module, Debug)]
struct Regressor<B: Backend> {
    linear: Linear<B>,
}

#[derive(Clone, Debug)]
struct Item {
    x: [f32; 4],
    y: f32,
}

#[derive(Clone, Debug)]
struct Batch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
}

#[derive(Clone, Default)]
struct ItemBatcher;

impl<B: Backend> Batcher<B, Item, Batch<B>> for ItemBatcher {
    fn batch(&self, items: Vec<Item>, device: &B::Device) -> Batch<B> {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.x).collect();
        let y: Vec<f32> = items.iter().map(|i| i.y).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [n, 4]), device),
            y: Tensor::from_data(TensorData::new(y, [n, 1]), device),
        }
    }
}

impl<B: Backend> Regressor<B> {
    fn regress(&self, batch: Batch<B>) -> RegressionOutput<B> {
        let output = self.linear.forward(batch.x);
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.y)
    }
}

impl<B: AutodiffBackend> TrainStep for Regressor<B> {
    type Input = Batch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Batch<B>) -> TrainOutput<RegressionOutput<B>> {
        let item = self.regress(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Regressor<B> {
    type Input = Batch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Batch<B>) -> RegressionOutput<B> {
        self.regress(batch)
    }
}

fn data() -> Vec<Item> {
    (0..256)
        .map(|i| {
            let f = i as f32;
            let x = [
                (f * 0.37).sin(),
                (f * 0.11).cos(),
                (f * 0.05) % 1.0,
                (f * 0.73).sin(),
            ];
            let y = 2.0 * x[0] - x[1] + 0.5 * x[2] + 3.0 * x[3] + 1.0;
            Item { x, y }
        })
        .collect()
}

/// The training loader (batches of 32, shuffled with `seed`) and the validation loader.
#[allow(clippy::type_complexity)]
fn loaders(
    seed: u64,
) -> (
    std::sync::Arc<dyn burn::data::dataloader::DataLoader<B, Batch<B>>>,
    std::sync::Arc<
        dyn burn::data::dataloader::DataLoader<
                <B as AutodiffBackend>::InnerBackend,
                Batch<<B as AutodiffBackend>::InnerBackend>,
            >,
    >,
) {
    let train = DataLoaderBuilder::new(ItemBatcher)
        .batch_size(32)
        .shuffle(seed)
        .build(InMemDataset::new(data()));
    let valid = DataLoaderBuilder::new(ItemBatcher)
        .batch_size(64)
        .build(InMemDataset::new(data()));
    (train, valid)
}

fn mse<B: Backend>(model: &Regressor<B>, device: &B::Device) -> f32 {
    let batch = ItemBatcher.batch(data(), device);
    model.regress(batch).loss.into_scalar().elem::<f32>()
}

#[test]
fn learner_trains_on_frugal() {
    let _turn = one_at_a_time();
    let device = Default::default();
    <B as Backend>::seed(&device, 1);
    let model: Regressor<B> = Regressor {
        linear: LinearConfig::new(4, 1).init(&device),
    };
    let before = mse(&model.valid(), &device);
    let (train, valid) = loaders(3);
    let dir = std::env::temp_dir().join(format!("frugal-learner-{}", std::process::id()));
    let result = SupervisedTraining::new(&dir, train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_train_numeric(MemoryMetric::live(device))
        .metric_train_numeric(MemoryMetric::peak(device))
        .metric_train_numeric(MemoryMetric::role_live(device, Role::Parameter))
        .metric_train_numeric(MemoryMetric::role_live(device, Role::OptimizerState))
        .metric_train_numeric(MemoryMetric::role_peak(device, Role::Parameter))
        .metric_train_numeric(MemoryMetric::role_peak(device, Role::OptimizerState))
        .metric_train_numeric(MemoryMetric::role_peak(device, Role::Gradient))
        .metric_valid_numeric(LossMetric::new())
        .num_epochs(30)
        .launch(Learner::new(
            model,
            RoleTracking::new(AdamConfig::new().init()),
            5e-2,
        ));
    let after = mse(&result.model, &device);
    // The metrics' logs: one value per iteration, in GB, the peak never below the live.
    let logged = |figure: &str| -> Vec<f64> {
        // burn-train names a metric's log after it, spaces as underscores.
        let name = format!("Frugal memory {figure} ({device:?})").replace(' ', "_");
        let file = dir.join("train/epoch-1").join(format!("{name}.log"));
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .lines()
            .map(|line| line.parse().unwrap())
            .collect()
    };
    let (live, peak) = (logged("live"), logged("peak"));
    let bytes = |gb: &f64| (gb * 1e9).round() as u64;
    // The regressor's 5 parameters are 20 bytes; Adam's two moments 40; every gradient is
    // live at the optimizer step.
    let parameters = logged("live parameters");
    let state = logged("live optimizer state");
    let peaks = ["parameters", "optimizer state", "gradients"]
        .map(|role| logged(&format!("peak {role}")).iter().map(bytes).max());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(parameters.last().map(bytes), Some(20), "{parameters:?}");
    assert_eq!(state.last().map(bytes), Some(40), "{state:?}");
    // At the step, new parameters and moments are made while the old are still held.
    let [Some(parameters), Some(state), Some(gradients)] = peaks else {
        panic!("no peaks logged: {peaks:?}");
    };
    assert!(
        (20..=40).contains(&parameters),
        "peak parameters {parameters}"
    );
    assert!(state >= 40, "peak optimizer state {state}");
    assert_eq!(gradients, 20, "peak gradients");
    assert!(!live.is_empty() && live.len() == peak.len());
    assert!(live.iter().all(|&gb| gb > 0.0), "{live:?}");
    assert!(
        live.iter().zip(&peak).all(|(l, p)| l <= p),
        "{live:?} {peak:?}"
    );
    assert!(
        after < before / 20.0,
        "the learner did not fit: mse {before} -> {after}"
    );
    assert!(memory::peak_bytes(&device) > 0, "the ledger saw no tensors");
}

/// burn-train's `MultiDevice` strategy runs a worker thread per device and gathers the
/// gradients on the first. NdArray has one device, so both workers train on it, side by side
/// on one Frugal state, under a budget: Frugal must take ops from two threads at once (no step
/// waits on another's lock) and the ledger must stay exact.
#[test]
fn learner_trains_with_two_workers_under_a_budget() {
    use burn::train::{ExecutionStrategy, MultiDeviceOptim};
    let _turn = one_at_a_time();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    <B as Backend>::seed(&device, 2);
    let model: Regressor<B> = Regressor {
        linear: LinearConfig::new(4, 1).init(&device),
    };
    let before = mse(&model.valid(), &device);
    let (train, valid) = loaders(5);
    let dir = std::env::temp_dir().join(format!("frugal-learner-multi-{}", std::process::id()));
    memory::reset_peak(&device);
    // Room for both workers' batches, parameters, gradients and moments, and not always for
    // everything two interleaved steps make.
    let budget = 3 * 1024;
    memory::set_budget(&device, Some(budget));
    let result = SupervisedTraining::new(&dir, train, valid)
        .metric_train_numeric(LossMetric::new())
        .with_training_strategy(
            ExecutionStrategy::multi(vec![device, device], MultiDeviceOptim::OptimMainDevice)
                .into(),
        )
        .num_epochs(30)
        .launch(Learner::new(model, AdamConfig::new().init(), 5e-2));
    let peak = memory::peak_bytes(&device);
    let stats = memory::remat_stats(&device);
    memory::set_budget(&device, None);
    let after = mse(&result.model, &device);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        after < before / 20.0,
        "two workers did not fit: mse {before} -> {after}"
    );
    // Each thread makes room before its op without a lock shared with the other (a per-op
    // lock would serialise the workers): two ops landing at once may each have counted on the
    // same free bytes. The overshoot is bounded by one op's output, at most a batch (512 B).
    assert!(
        peak <= budget + 512,
        "peak {peak} B over the {budget} B budget by more than one op's output"
    );
    // Every tensor was a managed cell, made and read by two threads; whether the budget also
    // had to evict depends on how the workers interleave.
    assert!(stats.replans > 0, "the budget never saw a step: {stats:?}");
}
