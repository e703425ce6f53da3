//! Properties of memory budgets on `Frugal<NdArray>`:
//!
//! - random op sequences under a random budget keep `live_bytes` within it after every op,
//!   read back the same bits as plain NdArray, and leave nothing behind on the device or the
//!   host once the budget is lifted and the handles dropped;
//! - 1,000 training steps of a small MLP under half its peak do not leak;
//! - an op that consumes its input's last handle still gets the buffer (Frugal keeps no copy);
//! - the memory report mentions the budget and what it recomputed.
//!
//! All tests share the CPU device's ledger, budget and NdArray's seed, so they take a lock.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{MutexGuard, Once};

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::loss::MseLoss;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use frugal::{EvictionMode, Frugal, Policy, memory};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Plain = NdArray;
type Managed = Frugal<NdArray>;

const DEVICE: NdArrayDevice = NdArrayDevice::Cpu;
const BUDGET_PANIC: &str = "frugal: the memory budget of";

fn lock() -> MutexGuard<'static, ()> {
    let guard = crate::serial();
    // Whatever a failed test left behind must not constrain the next one.
    memory::set_budget(&DEVICE, None);
    memory::set_policy(&DEVICE, Policy::default());
    guard
}

/// Keeps the expected budget panics of the property test out of the test output.
fn quiet_budget_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if panic_message(info.payload()).starts_with(BUDGET_PANIC) {
                return;
            }
            previous(info);
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "(non-string panic)".to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Random op sequences
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Source {
    Ones,
    Random,
    FromData,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Unary {
    Exp,
    SumDim(usize),
}

#[derive(Clone, Copy, Debug)]
enum Binary {
    Add,
    Mul,
    Matmul,
}

/// One step of a sequence. Indices are taken modulo the number of held tensors; `keep: false`
/// hands the op the held handle itself (dropping it from the held list), so that the op may
/// consume the last handle of its input.
#[derive(Clone, Debug)]
enum Action {
    Create {
        source: Source,
        rows: usize,
        cols: usize,
        seed: u64,
    },
    Clone(usize),
    Unary {
        op: Unary,
        i: usize,
        keep: bool,
    },
    Binary {
        op: Binary,
        i: usize,
        j: usize,
        keep: bool,
    },
    Drop(usize),
    Read(usize),
}

fn action() -> impl Strategy<Value = Action> {
    let source = prop_oneof![
        Just(Source::Ones),
        Just(Source::Random),
        Just(Source::FromData)
    ];
    // View ops (reshape, transpose, slice) are left out: Frugal never offloads a view
    // (a host copy comes back contiguous and NdArray's reductions round differently on strided
    // data), so a view whose base cannot be recomputed cannot be evicted at all, and the
    // acceptance rule below does not model that. Known limitation, see issue 4's notes.
    let unary = prop_oneof![
        3 => Just(Unary::Exp),
        1 => (0usize..2).prop_map(Unary::SumDim),
    ];
    let binary = prop_oneof![Just(Binary::Add), Just(Binary::Mul), Just(Binary::Matmul)];
    prop_oneof![
        4 => (source, 1usize..13, 1usize..13, any::<u64>())
            .prop_map(|(source, rows, cols, seed)| Action::Create { source, rows, cols, seed }),
        1 => any::<usize>().prop_map(Action::Clone),
        5 => (unary, any::<usize>(), any::<bool>()).prop_map(|(op, i, keep)| Action::Unary { op, i, keep }),
        4 => (binary, any::<usize>(), any::<usize>(), any::<bool>())
            .prop_map(|(op, i, j, keep)| Action::Binary { op, i, j, keep }),
        2 => any::<usize>().prop_map(Action::Drop),
        2 => any::<usize>().prop_map(Action::Read),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        prop_oneof![3 => Just(EvictionMode::Auto), 1 => Just(EvictionMode::OffloadOnly)],
        prop_oneof![Just(0.5), Just(64.0)],
        prop_oneof![Just(1u32), Just(3), Just(32)],
    )
        .prop_map(|(mode, host_cost_per_byte, max_depth)| Policy {
            mode,
            host_cost_per_byte,
            max_depth,
            ..Policy::default()
        })
}

/// An action with its indices resolved against the held tensors' shapes.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Create {
        source: Source,
        dims: [usize; 2],
        seed: u64,
    },
    Clone(usize),
    Unary {
        op: Unary,
        i: usize,
        keep: bool,
    },
    /// `rhs: None`: the op uses `i` for both operands (transposed on the right for matmul).
    Binary {
        op: Binary,
        i: usize,
        rhs: Option<usize>,
        keep: bool,
    },
    Drop(usize),
    Read(usize),
}

fn resolve(action: &Action, dims: &[[usize; 2]]) -> Option<Plan> {
    let pick = |i: usize| (!dims.is_empty()).then(|| i % dims.len());
    Some(match *action {
        Action::Create {
            source,
            rows,
            cols,
            seed,
        } => Plan::Create {
            source,
            dims: [rows, cols],
            seed,
        },
        Action::Clone(i) => Plan::Clone(pick(i)?),
        Action::Unary { op, i, keep } => Plan::Unary {
            op,
            i: pick(i)?,
            keep,
        },
        Action::Binary { op, i, j, keep } => {
            let (i, j) = (pick(i)?, pick(j)?);
            let fits = match op {
                Binary::Add | Binary::Mul => dims[i] == dims[j],
                Binary::Matmul => dims[i][1] == dims[j][0],
            };
            Plan::Binary {
                op,
                i,
                rhs: fits.then_some(j),
                keep,
            }
        }
        Action::Drop(i) => Plan::Drop(pick(i)?),
        Action::Read(i) => Plan::Read(pick(i)?),
    })
}

fn host_values(dims: [usize; 2], seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let values: Vec<f32> = (0..dims[0] * dims[1])
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    TensorData::new(values, dims)
}

/// Runs one planned step on backend `B`; returns the data of a read.
fn execute<B: Backend<Device = NdArrayDevice>>(
    held: &mut Vec<Tensor<B, 2>>,
    plan: Plan,
) -> Option<TensorData> {
    let take = |held: &mut Vec<Tensor<B, 2>>, i: usize, keep: bool| {
        if keep {
            held[i].clone()
        } else {
            held.remove(i)
        }
    };
    match plan {
        Plan::Create { source, dims, seed } => {
            let t = match source {
                Source::Ones => Tensor::ones(dims, &DEVICE),
                Source::Random => {
                    B::seed(&DEVICE, seed);
                    Tensor::random(dims, Distribution::Uniform(-2.0, 2.0), &DEVICE)
                }
                Source::FromData => Tensor::from_data(host_values(dims, seed), &DEVICE),
            };
            held.push(t);
        }
        Plan::Clone(i) => held.push(held[i].clone()),
        Plan::Unary { op, i, keep } => {
            let t = take(held, i, keep);
            let out = match op {
                Unary::Exp => t.exp(),
                Unary::SumDim(dim) => t.sum_dim(dim),
            };
            held.push(out);
        }
        Plan::Binary { op, i, rhs, keep } => {
            let rhs = rhs.map(|j| held[j].clone());
            let lhs = take(held, i, keep);
            let rhs = rhs.unwrap_or_else(|| match op {
                Binary::Matmul => lhs.clone().transpose(),
                Binary::Add | Binary::Mul => lhs.clone(),
            });
            let out = match op {
                Binary::Add => lhs.add(rhs),
                Binary::Mul => lhs.mul(rhs),
                Binary::Matmul => lhs.matmul(rhs),
            };
            held.push(out);
        }
        Plan::Drop(i) => {
            held.remove(i);
        }
        Plan::Read(i) => return Some(held[i].clone().into_data()),
    }
    None
}

/// One held handle as the model sees it: its shape and the buffer it points into (views
/// share their input's).
#[derive(Clone, Copy)]
struct Held {
    dims: [usize; 2],
    buffer: usize,
}

/// The held tensors as buffers, to bound what one op needs and what no eviction can free.
#[derive(Default)]
struct Buffers {
    held: Vec<Held>,
    /// Bytes of each buffer, and whether a view of it was ever taken.
    buffers: Vec<(u64, bool)>,
}

impl Buffers {
    fn dims(&self) -> Vec<[usize; 2]> {
        self.held.iter().map(|h| h.dims).collect()
    }

    fn fresh(&mut self, dims: [usize; 2]) -> u64 {
        let bytes = (dims[0] * dims[1] * 4) as u64;
        self.buffers.push((bytes, false));
        self.held.push(Held {
            dims,
            buffer: self.buffers.len() - 1,
        });
        bytes
    }

    fn bytes(&self, held: Held) -> u64 {
        self.buffers[held.buffer].0
    }

    /// Bytes of the buffers a view was ever taken of. Frugal only evicts a buffer that one
    /// tensor holds, and a tensor and its view share one, whether the program holds them or
    /// Frugal keeps them (dropped by the program) to recompute an evicted tensor from: such
    /// a buffer may stay whatever the budget. An upper bound: a restored view gets a buffer
    /// of its own, and a buffer nobody holds any more is gone.
    fn pinned(&self) -> u64 {
        self.buffers.iter().filter(|b| b.1).map(|b| b.0).sum()
    }

    /// Applies `plan`, returning the bytes its inputs and output occupy together.
    fn apply(&mut self, plan: Plan) -> u64 {
        let take = |held: &mut Vec<Held>, i: usize, keep: bool| {
            if keep { held[i] } else { held.remove(i) }
        };
        match plan {
            Plan::Create { dims, .. } => self.fresh(dims),
            Plan::Clone(i) => {
                self.held.push(self.held[i]);
                0
            }
            Plan::Unary { op, i, keep } => {
                let input = take(&mut self.held, i, keep);
                let [rows, cols] = input.dims;
                let bytes = self.bytes(input);
                match op {
                    Unary::Exp => bytes + self.fresh([rows, cols]),
                    Unary::SumDim(0) => bytes + self.fresh([1, cols]),
                    Unary::SumDim(_) => bytes + self.fresh([rows, 1]),
                }
            }
            Plan::Binary { op, i, rhs, keep } => {
                let rhs = rhs.map(|j| self.held[j]);
                let lhs = take(&mut self.held, i, keep);
                let (rhs_dims, rhs_buffer) = rhs
                    .map_or(([lhs.dims[1], lhs.dims[0]], lhs.buffer), |r| {
                        (r.dims, r.buffer)
                    });
                let mut inputs = self.bytes(lhs);
                if rhs_buffer != lhs.buffer {
                    inputs += self.buffers[rhs_buffer].0;
                }
                let out = match op {
                    Binary::Add | Binary::Mul => lhs.dims,
                    Binary::Matmul => [lhs.dims[0], rhs_dims[1]],
                };
                inputs + self.fresh(out)
            }
            Plan::Drop(i) => {
                self.held.remove(i);
                0
            }
            Plan::Read(i) => self.bytes(self.held[i]),
        }
    }
}

fn bits(data: &TensorData) -> (Vec<usize>, Vec<u32>) {
    (
        data.shape.to_vec(),
        data.iter::<f32>().map(f32::to_bits).collect(),
    )
}

/// A planned step: the bytes of its inputs and output, and of the buffers no eviction can
/// free once it has run (see [`Buffers::pinned`]).
struct Step {
    plan: Plan,
    need: u64,
    pinned: u64,
}

/// The steps of `actions` (those that apply to nothing are left out), and the buffers held
/// at the end.
fn plan(actions: &[Action]) -> (Vec<Step>, Buffers) {
    let mut buffers = Buffers::default();
    let steps = actions
        .iter()
        .filter_map(|action| {
            let plan = resolve(action, &buffers.dims())?;
            let need = buffers.apply(plan);
            let pinned = buffers.pinned();
            Some(Step { plan, need, pinned })
        })
        .collect();
    (steps, buffers)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_budget_and_every_bit(
        actions in prop::collection::vec(action(), 1..40),
        fraction in 0u64..=1000,
        policy in policy(),
    ) {
        let _serial = lock();
        quiet_budget_panics();
        let (plans, end) = plan(&actions);
        let base = memory::live_bytes(&DEVICE);
        let host_base = memory::remat_stats(&DEVICE).host_bytes;

        // Unconstrained, to find the peak.
        memory::reset_peak(&DEVICE);
        let mut held = Vec::new();
        for step in &plans {
            execute::<Managed>(&mut held, step.plan);
        }
        drop(held);
        let peak = memory::peak_bytes(&DEVICE) - base;
        prop_assert_eq!(memory::live_bytes(&DEVICE), base);

        // Between half the largest op's inputs and output and the unconstrained peak, more
        // often near the former, so that some cases panic and must leave nothing behind. (From
        // three times the largest op, as first planned, most sequences of this length never
        // go over the budget.)
        let largest = plans.iter().map(|s| s.need).max().unwrap_or(0);
        let low = (largest / 2).min(peak);
        let budget = base + low + (peak - low) * fraction * fraction / 1_000_000;
        let stats_before = memory::remat_stats(&DEVICE);
        memory::set_policy(&DEVICE, policy);
        memory::set_budget(&DEVICE, Some(budget));

        let mut plain: Vec<Tensor<Plain, 2>> = Vec::new();
        let mut managed: Vec<Tensor<Managed, 2>> = Vec::new();
        let mut failure = None;
        for (step, &Step { plan, need, pinned }) in plans.iter().enumerate() {
            let expected = execute::<Plain>(&mut plain, plan);
            match catch_unwind(AssertUnwindSafe(|| execute::<Managed>(&mut managed, plan))) {
                Ok(got) => {
                    let live = memory::live_bytes(&DEVICE);
                    if live > budget {
                        failure = Some(format!(
                            "step {step} {plan:?}: live {live} over the budget {budget}"
                        ));
                        break;
                    }
                    if let (Some(expected), Some(got)) = (expected, got)
                        && bits(&expected) != bits(&got)
                    {
                        failure = Some(format!("step {step} {plan:?}: read back differs"));
                        break;
                    }
                }
                Err(payload) => {
                    let message = panic_message(&*payload);
                    // Accepted only if the op's inputs and output, with the buffers that
                    // tensors and their views share, did not fit.
                    if !message.starts_with(BUDGET_PANIC) || budget - base >= need + pinned {
                        failure = Some(format!(
                            "step {step} {plan:?} (needs {need} B, shared buffers {pinned} B, \
                             budget {} B over a base of {base} B) panicked: {message}",
                            budget - base
                        ));
                    }
                    // The managed side lost track of the sequence: stop here.
                    plain.clear();
                    managed.clear();
                    break;
                }
            }
        }
        // Every tensor still held reads back the same, restored under the budget.
        if failure.is_none() && !plain.is_empty() {
            for (i, (p, m)) in plain.iter().zip(&managed).enumerate() {
                let expected = bits(&p.clone().into_data());
                match catch_unwind(AssertUnwindSafe(|| bits(&m.clone().into_data()))) {
                    Ok(got) if got != expected => {
                        failure = Some(format!("held tensor {i} differs at the end"));
                    }
                    Ok(_) if memory::live_bytes(&DEVICE) > budget => {
                        failure = Some(format!("reading held tensor {i} broke the budget"));
                    }
                    Ok(_) => continue,
                    Err(payload) => {
                        let message = panic_message(&*payload);
                        let need = end.bytes(end.held[i]) + end.pinned();
                        if !message.starts_with(BUDGET_PANIC) || budget - base >= need {
                            failure = Some(format!(
                                "reading held tensor {i} at the end (needs {need} B with \
                                 shared buffers) panicked: {message}"
                            ));
                        }
                    }
                }
                break;
            }
        }
        let stats = memory::remat_stats(&DEVICE);
        memory::set_budget(&DEVICE, None);
        memory::set_policy(&DEVICE, Policy::default());
        drop(managed);
        drop(plain);
        if let Some(failure) = failure {
            return Err(TestCaseError::fail(format!(
                "{failure}\npolicy {policy:?}, budget {budget}, peak {peak}, largest op {largest}\n\
                 stats before {stats_before:?}\nafter {stats:?}"
            )));
        }
        prop_assert_eq!(memory::live_bytes(&DEVICE), base, "device bytes leaked");
        prop_assert_eq!(memory::remat_stats(&DEVICE).host_bytes, host_base, "host bytes leaked");
    }
}

// ---------------------------------------------------------------------------------------------
// Leaks over a long training run
// ---------------------------------------------------------------------------------------------

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(16, 32).init(device),
            out: LinearConfig::new(32, 4).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.out.forward(relu(self.hidden.forward(x)))
    }
}

type Trained = Autodiff<Managed>;

/// One SGD step on batch `index` (8 rows), returning the new model.
fn mlp_step(
    model: Mlp<Trained>,
    optim: &mut impl Optimizer<Mlp<Trained>, Trained>,
    index: usize,
) -> Mlp<Trained> {
    let x = Tensor::<Trained, 2>::from_data(host_values([8, 16], index as u64 % 16), &DEVICE);
    let y = Tensor::<Trained, 2>::from_data(host_values([8, 4], 100 + index as u64 % 16), &DEVICE);
    let loss = MseLoss::new().forward(model.forward(x), y, burn::nn::loss::Reduction::Mean);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    optim.step(1e-2, model, grads)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    live_bytes: u64,
    live_tensors: u64,
    host_bytes: u64,
}

fn sample() -> Sample {
    Sample {
        live_bytes: memory::live_bytes(&DEVICE),
        live_tensors: memory::live_tensors(&DEVICE),
        host_bytes: memory::remat_stats(&DEVICE).host_bytes,
    }
}

#[test]
fn a_thousand_steps_under_half_the_peak_do_not_leak() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    let base_tensors = memory::live_tensors(&DEVICE);
    let host_base = memory::remat_stats(&DEVICE).host_bytes;

    // The unconstrained peak of a few steps, model and optimizer included.
    memory::reset_peak(&DEVICE);
    {
        Trained::seed(&DEVICE, 3);
        let mut model = Mlp::<Trained>::new(&DEVICE);
        let mut optim = SgdConfig::new().init::<Trained, Mlp<Trained>>();
        for step in 0..10 {
            model = mlp_step(model, &mut optim, step);
        }
    }
    let peak = memory::peak_bytes(&DEVICE) - base;
    assert_eq!(memory::live_bytes(&DEVICE), base);

    let budget = base + peak / 2;
    let before = memory::remat_stats(&DEVICE);
    memory::set_budget(&DEVICE, Some(budget));
    Trained::seed(&DEVICE, 3);
    let mut model = Mlp::<Trained>::new(&DEVICE);
    let parameters = 4 * model.num_params() as u64;
    let mut optim = SgdConfig::new().init::<Trained, Mlp<Trained>>();
    let mut samples = Vec::new();
    let start = std::time::Instant::now();
    let mut elapsed = Vec::new();
    for step in 0..1000 {
        model = mlp_step(model, &mut optim, step);
        let s = sample();
        assert!(s.live_bytes <= budget, "step {step}: {s:?} over {budget}");
        samples.push(s);
        if step % 100 == 99 {
            elapsed.push(start.elapsed());
        }
    }
    let after = memory::remat_stats(&DEVICE);
    let (at_10, at_1000) = (samples[9], samples[999]);
    eprintln!(
        "budget {budget} (peak {peak}), parameters {parameters} B; step 10 {at_10:?}, step \
         1000 {at_1000:?}; {:?}; time at every 100th step {elapsed:?}",
        frugal::RematStats {
            evictions: after.evictions - before.evictions,
            recomputes: after.recomputes - before.recomputes,
            offloads: after.offloads - before.offloads,
            uploads: after.uploads - before.uploads,
            ..after
        }
    );
    // Between steps only the parameters are left, on the device or offloaded: which ones the
    // budget offloaded varies from step to step (the 16×32 weight is on the host after most
    // steps, on the device after some), so device and host bytes each vary, their sum not.
    for (step, s) in samples.iter().enumerate().skip(9) {
        assert_eq!(
            s.live_bytes - base + s.host_bytes - host_base,
            parameters,
            "step {}: {s:?}",
            step + 1
        );
        // Four parameter tensors, some of them perhaps offloaded.
        assert!(
            s.live_tensors - base_tensors <= 4,
            "step {}: {s:?}",
            step + 1
        );
    }
    assert_eq!(
        at_1000.live_bytes + at_1000.host_bytes,
        at_10.live_bytes + at_10.host_bytes
    );
    let host_most = samples[9..].iter().map(|s| s.host_bytes).max().unwrap();
    assert!(
        host_most - host_base <= parameters,
        "host bytes grew to {host_most}"
    );
    assert!(after.recomputes > before.recomputes, "{after:?}");

    memory::set_budget(&DEVICE, None);
    drop(model);
    drop(optim);
    assert_eq!(memory::live_bytes(&DEVICE), base);
    assert_eq!(memory::remat_stats(&DEVICE).host_bytes, host_base);
}

// ---------------------------------------------------------------------------------------------
// In-place ops
// ---------------------------------------------------------------------------------------------

const SIDE: usize = 64;
const BYTES: u64 = (SIDE * SIDE * 4) as u64;

/// Found by the random sequences in CI: `p.matmul(p.transpose())` was taken for a strided
/// tensor (an input view of its shape) and so never offloaded; once `p` was consumed it could
/// not be recomputed either, and reading it back failed a budget it fits in.
#[test]
fn a_product_with_a_transposed_input_can_be_offloaded() {
    let _serial = lock();
    quiet_budget_panics();
    let base = memory::live_bytes(&DEVICE);
    let square = 9 * 9 * 4;
    let values = host_values([9, 1], 7);
    memory::set_policy(
        &DEVICE,
        Policy {
            mode: EvictionMode::OffloadOnly,
            ..Policy::default()
        },
    );
    memory::set_budget(&DEVICE, Some(base + 2 * square));
    let run = |x: Tensor<Managed, 2>| {
        let p = x.clone().matmul(x.transpose());
        let q = p.clone().matmul(p.clone().transpose());
        // Consumes `p`'s last handle: its buffer becomes `e`'s.
        let e = p.exp();
        (q, e)
    };
    let (q, e) = run(Tensor::from_data(values.clone(), &DEVICE));
    let x = Tensor::<Plain, 2>::from_data(values, &DEVICE);
    let p = x.clone().matmul(x.transpose());
    let expected = [p.clone().matmul(p.clone().transpose()), p.exp()];
    // Room for one of the two products only: each read must offload the other.
    memory::set_budget(&DEVICE, Some(base + square));
    for _ in 0..2 {
        for (got, expected) in [&q, &e].into_iter().zip(&expected) {
            let read = catch_unwind(AssertUnwindSafe(|| got.clone().into_data()));
            let read = read.unwrap_or_else(|payload| panic!("{}", panic_message(&*payload)));
            assert_eq!(bits(&read), bits(&expected.clone().into_data()));
            assert!(memory::live_bytes(&DEVICE) <= base + square);
        }
    }
    memory::set_budget(&DEVICE, None);
    memory::set_policy(&DEVICE, Policy::default());
    drop((q, e));
    assert_eq!(memory::live_bytes(&DEVICE), base);
}

#[test]
fn consuming_the_last_handle_keeps_no_copy_of_the_input() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    // A tensor made before the budget: unmanaged.
    let unmanaged = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE);
    memory::set_budget(&DEVICE, Some(base + 64 * BYTES));
    let made = [
        ("unmanaged ones", unmanaged),
        ("ones", Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE)),
        (
            "from_data",
            Tensor::from_data(host_values([SIDE, SIDE], 1), &DEVICE),
        ),
        (
            "random",
            Tensor::random([SIDE, SIDE], Distribution::Default, &DEVICE),
        ),
        (
            "an op's output",
            Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE).exp(),
        ),
    ];
    // The temporary ones of the last case is gone.
    assert_eq!(memory::live_bytes(&DEVICE) - base, 5 * BYTES);
    let mut ys = Vec::new();
    for (label, x) in made {
        let live = memory::live_bytes(&DEVICE);
        let y = x.exp();
        assert_eq!(
            memory::live_bytes(&DEVICE),
            live,
            "{label}: x.exp() with x's only handle kept x's buffer"
        );
        ys.push(y);
    }
    assert_eq!(memory::live_bytes(&DEVICE) - base, 5 * BYTES);
    drop(ys);
    assert_eq!(memory::live_bytes(&DEVICE), base);

    // Keeping x: both are live.
    let x = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE);
    let y = x.clone().exp();
    assert_eq!(memory::live_bytes(&DEVICE) - base, 2 * BYTES);
    drop(x);
    // x's only use now is y's recomputation, and ones can be made again: x's buffer goes.
    assert_eq!(memory::live_bytes(&DEVICE) - base, BYTES);
    drop(y);
    memory::set_budget(&DEVICE, None);
    assert_eq!(memory::live_bytes(&DEVICE), base);
}

#[test]
fn a_dropped_tensor_an_evicted_one_reads_is_evicted_too() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    memory::set_budget(&DEVICE, Some(base + 64 * BYTES));
    let x = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE);
    let a = x.clone().exp();
    let b = a.clone().sin();
    // Consumes `b`'s last handle: `b` keeps its recipe (its input `a` is live), so `a` is now
    // read by an evicted tensor.
    let c = b.cos();
    assert_eq!(memory::live_bytes(&DEVICE) - base, 3 * BYTES);
    drop(a);
    // `a` can itself be recomputed from `x`: evicted, not kept on the device for `b`.
    assert_eq!(memory::live_bytes(&DEVICE) - base, 2 * BYTES);
    // Room for `x` and one more: reading `c` back after its eviction recomputes `a`, `b`, `c`.
    memory::set_budget(&DEVICE, Some(base + 2 * BYTES + BYTES / 2));
    let d = x.clone().tanh();
    assert!(memory::live_bytes(&DEVICE) - base <= 2 * BYTES + BYTES / 2);
    let ones = Tensor::<Plain, 2>::ones([SIDE, SIDE], &DEVICE);
    let expected = ones.clone().exp().sin().cos();
    assert_eq!(bits(&c.into_data()), bits(&expected.into_data()));
    assert_eq!(bits(&d.into_data()), bits(&ones.tanh().into_data()));
    drop(x);
    memory::set_budget(&DEVICE, None);
    assert_eq!(memory::live_bytes(&DEVICE), base);
}

#[test]
fn a_tensor_computed_outside_a_scope_from_its_tensors_holds_none_of_them() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    memory::set_budget(&DEVICE, Some(base + 64 * BYTES));
    let x = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE);
    // As autodiff does, the program holds tensors of the block for the backward pass.
    let mut saved = Vec::new();
    let out = frugal::checkpoint(&DEVICE, || {
        let e = x.clone().exp();
        saved.push(e.clone().sin());
        saved.push(e.clone());
        e.cos()
    });
    assert_eq!(memory::live_bytes(&DEVICE) - base, 2 * BYTES);
    let (e, d) = (saved.pop().unwrap(), saved.pop().unwrap());
    // The "backward pass": a gradient read from `d` (restoring `e` and `d`), held to the end
    // as a weight's gradient is; then `d` goes, and an op consumes `e`.
    let g = d.clone().mul_scalar(3.0);
    drop(d);
    let r = e.tanh();
    // `x`, `out`, `g` and `r`. Were `g` recomputable from `d`, `d` would keep its recipe and
    // `e` would have stayed on the device for it.
    assert_eq!(memory::live_bytes(&DEVICE) - base, 4 * BYTES);
    let ones = Tensor::<Plain, 2>::ones([SIDE, SIDE], &DEVICE);
    let expected = [
        bits(&ones.clone().exp().sin().mul_scalar(3.0).into_data()),
        bits(&ones.clone().exp().tanh().into_data()),
        bits(&ones.exp().cos().into_data()),
    ];
    let read = [
        bits(&g.into_data()),
        bits(&r.into_data()),
        bits(&out.into_data()),
    ];
    assert_eq!(read, expected);
    drop(x);
    memory::set_budget(&DEVICE, None);
    assert_eq!(memory::live_bytes(&DEVICE), base);
}

#[test]
fn under_a_budget_a_scope_can_leave_its_costly_products() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    let product = 16 * 16 * 4;
    let run = |keep: bool| {
        memory::set_policy(
            &DEVICE,
            Policy {
                scope_keeps_products: keep,
                ..Policy::default()
            },
        );
        memory::set_budget(&DEVICE, Some(base + 64 * BYTES));
        let x = Tensor::<Managed, 2>::from_data(host_values([16, 512], 3), &DEVICE);
        let w = Tensor::<Managed, 2>::from_data(host_values([512, 16], 4), &DEVICE);
        // `h`, a product contracting 512 values per output, is still held when the scope
        // ends (as autodiff holds what the backward pass reads).
        let mut saved = Vec::new();
        let y = frugal::checkpoint(&DEVICE, || {
            let h = x.clone().matmul(w.clone());
            saved.push(h.clone());
            h.exp().sum()
        });
        let live = memory::live_bytes(&DEVICE) - base;
        let read = [bits(&saved[0].clone().into_data()), bits(&y.into_data())];
        drop((x, w, saved));
        memory::set_budget(&DEVICE, None);
        memory::set_policy(&DEVICE, Policy::default());
        assert_eq!(memory::live_bytes(&DEVICE), base);
        (live, read)
    };
    let (live_evicted, read_evicted) = run(false);
    let (live_kept, read_kept) = run(true);
    assert_eq!(live_kept, live_evicted + product);
    let x = Tensor::<Plain, 2>::from_data(host_values([16, 512], 3), &DEVICE);
    let h = x.matmul(Tensor::from_data(host_values([512, 16], 4), &DEVICE));
    let expected = [
        bits(&h.clone().into_data()),
        bits(&h.exp().sum().into_data()),
    ];
    assert_eq!(read_evicted, expected);
    assert_eq!(read_kept, expected);
}

#[test]
fn evicted_inputs_consumed_by_ops_read_back_exactly() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    let before = memory::remat_stats(&DEVICE);
    // Room for three 64×64 buffers, so making a fourth evicts the least valuable.
    memory::set_budget(&DEVICE, Some(base + 3 * BYTES + BYTES / 2));
    let x = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE).exp();
    let a = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE).sin();
    let b = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE).cos();
    let c = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE).tanh();
    assert!(memory::live_bytes(&DEVICE) - base <= 3 * BYTES + BYTES / 2);
    let stats = memory::remat_stats(&DEVICE);
    assert!(stats.evictions > before.evictions, "{stats:?}");
    let y = x.exp();
    let z = a + b + c;
    let expected = Tensor::<Plain, 2>::ones([SIDE, SIDE], &DEVICE).exp().exp();
    assert_eq!(bits(&y.into_data()), bits(&expected.into_data()));
    let expected = Tensor::<Plain, 2>::ones([SIDE, SIDE], &DEVICE);
    let expected = expected.clone().sin() + expected.clone().cos() + expected.tanh();
    assert_eq!(bits(&z.into_data()), bits(&expected.into_data()));
    memory::set_budget(&DEVICE, None);
    assert_eq!(memory::live_bytes(&DEVICE), base);
    assert_eq!(memory::remat_stats(&DEVICE).host_bytes, before.host_bytes);
}

// ---------------------------------------------------------------------------------------------
// Cases found by the property test
// ---------------------------------------------------------------------------------------------

/// 8×5 values whose row sums round differently by summation order.
fn awkward_values() -> TensorData {
    let values: Vec<f32> = (0..40)
        .map(|i| ((i * 37 % 11) as f32).sin() * 1.3)
        .collect();
    TensorData::new(values, [8, 5])
}

#[test]
#[ignore = "known: a tensor restored from the host is contiguous, and NdArray's sum_dim rounds \
            differently on the strided original (see issue 4's notes)"]
fn a_strided_view_reads_the_same_after_host_offload() {
    // On NdArray a transposed tensor is a strided view, and `sum_dim` rounds differently on
    // it than on a contiguous copy of the same values. Offloading the view must bring it back
    // with the layout it had (or the op must see the same values in the same order).
    let _serial = lock();
    let layouts_differ = {
        let t = Tensor::<Plain, 2>::from_data(awkward_values(), &DEVICE).transpose();
        let copy = Tensor::<Plain, 2>::from_data(t.clone().into_data(), &DEVICE);
        bits(&t.sum_dim(1).into_data()) != bits(&copy.sum_dim(1).into_data())
    };
    assert!(
        layouts_differ,
        "the case no longer shows anything on NdArray"
    );
    let expected = Tensor::<Plain, 2>::from_data(awkward_values(), &DEVICE)
        .transpose()
        .sum_dim(1)
        .into_data();

    let base = memory::live_bytes(&DEVICE);
    let before = memory::remat_stats(&DEVICE);
    memory::set_policy(
        &DEVICE,
        Policy {
            mode: EvictionMode::OffloadOnly,
            ..Policy::default()
        },
    );
    // Room for one 8×5 tensor (160 B), not two.
    memory::set_budget(&DEVICE, Some(base + 200));
    let t = Tensor::<Managed, 2>::from_data(awkward_values(), &DEVICE).transpose();
    let other = Tensor::<Managed, 2>::ones([8, 5], &DEVICE);
    let offloads = memory::remat_stats(&DEVICE).offloads - before.offloads;
    let got = t.sum_dim(1).into_data();
    drop(other);
    memory::set_budget(&DEVICE, None);
    memory::set_policy(&DEVICE, Policy::default());
    assert_eq!(offloads, 1, "the transposed view was not offloaded");
    assert_eq!(
        bits(&got),
        bits(&expected),
        "sum_dim of an offloaded and restored transposed view"
    );
}

#[test]
fn tensors_sharing_a_buffer_can_still_be_offloaded() {
    // Four random 64×64 tensors, each with a reshaped view: the program holds 4 buffers of
    // 16 KiB, and every op needs at most one. A budget of three buffers (three times the
    // largest op) is kept by evicting a view (recomputed from its tensor when read) and
    // offloading the tensor it leaves alone on its buffer; both read back bit for bit.
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    let start = memory::remat_stats(&DEVICE);
    memory::set_budget(&DEVICE, Some(base + 3 * BYTES));
    let result = catch_unwind(|| {
        let mut held = Vec::new();
        for _ in 0..4 {
            let x = Tensor::<Managed, 2>::random([SIDE, SIDE], Distribution::Default, &DEVICE);
            let values = bits(&x.clone().reshape([SIDE * SIDE]).into_data());
            let view = x.clone().reshape([SIDE * SIDE]);
            held.push((x, view, values));
        }
        let live = memory::live_bytes(&DEVICE);
        let stats = memory::remat_stats(&DEVICE).since(&start);
        assert!(stats.offloads > 0, "{stats:?}");
        // Every tensor and view reads back as drawn (the views recomputed from their tensor).
        for (x, view, values) in &held {
            assert_eq!(&bits(&view.clone().into_data()), values);
            assert_eq!(&bits(&x.clone().reshape([SIDE * SIDE]).into_data()), values);
        }
        live
    });
    memory::set_budget(&DEVICE, None);
    let live = result.unwrap_or_else(|payload| panic!("{}", panic_message(&*payload)));
    assert!(live <= base + 3 * BYTES);
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

#[test]
fn the_report_shows_the_budget_and_recomputation() {
    let _serial = lock();
    let base = memory::live_bytes(&DEVICE);
    let before = memory::remat_stats(&DEVICE);
    memory::set_budget(&DEVICE, Some(base + 2 * BYTES + BYTES / 2));
    let x = Tensor::<Managed, 2>::ones([SIDE, SIDE], &DEVICE);
    let ys: Vec<_> = (0..4).map(|_| x.clone().exp()).collect();
    let expected = Tensor::<Plain, 2>::ones([SIDE, SIDE], &DEVICE)
        .exp()
        .into_data();
    for y in &ys {
        // Read back, recomputed where the budget evicted it.
        assert_eq!(bits(&y.clone().into_data()), bits(&expected));
    }
    let stats = memory::remat_stats(&DEVICE);
    assert!(stats.recomputes > before.recomputes, "{stats:?}");
    let text = memory::report(&DEVICE).to_string();
    drop((x, ys));
    memory::set_budget(&DEVICE, None);
    assert!(text.contains("Live tensor bytes"), "{text}");
    let lower = text.to_lowercase();
    let lines = |word: &str| lower.lines().filter(|l| l.contains(word)).count();
    assert!(
        lines("budget") > 0,
        "the report does not mention the budget:\n{text}"
    );
    assert!(
        lines("recompute") > 0,
        "the report does not mention recomputation:\n{text}"
    );
}
