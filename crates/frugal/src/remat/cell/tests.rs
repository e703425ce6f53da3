//! The state machine of one cell, on NdArray, without the engine choosing: each test
//! drives the transitions itself.

use burn::backend::NdArray;
use burn_backend::ops::FloatTensorOps;

use super::*;
use crate::remat::{FloatKind, Handle, Source};
use crate::vocabulary::families::float;

/// NdArray with its default element types.
type Nd = NdArray;
type Prim = <Nd as burn_backend::BackendTypes>::FloatTensorPrimitive;

fn state() -> &'static DeviceState {
    // A device of its own, so other tests' tensors do not share its counters.
    DeviceState::of_device(&burn::backend::ndarray::NdArrayDevice::Cpu)
}

fn values(tensor: Prim) -> Vec<f32> {
    burn_std::future::block_on(Nd::float_into_data(tensor))
        .unwrap()
        .to_vec()
        .unwrap()
}

/// A kept input and a cell computing `exp` of it, with its recipe.
fn exp_cell() -> (Arc<Cell<Nd, FloatKind>>, Vec<f32>) {
    let device = Default::default();
    let input = Nd::float_from_data(burn_backend::TensorData::from([0.5f32, 1.0, -2.0]), &device);
    let exp = float::op(float::Op::float_exp);
    let kept = Source::Kept(input.clone(), Arc::new(state().charge(&input, exp)));
    let out = Nd::float_exp(input);
    let expected = values(out.clone());
    let storage = Arc::new(state().charge(&out, exp));
    let recipe = Recipe {
        run: Box::new(move || Nd::float_exp(kept.get())),
        inputs: Vec::new(),
        view_of: None,
    };
    (
        Cell::create(out, storage, Some(recipe), 1.0, Origin::OPAQUE),
        expected,
    )
}

#[test]
fn an_evicted_cell_is_recomputed_to_the_same_values_when_read() {
    let (cell, expected) = exp_cell();
    assert_eq!(cell.status(), Status::Resident);
    let before = state().budget.stats().recomputes;
    assert!(cell.evict());
    assert_eq!(cell.status(), Status::Evicted);
    assert!(cell.resident_storage().is_none());
    assert_eq!(values(cell.get()), expected);
    assert_eq!(cell.status(), Status::Resident);
    assert!(state().budget.stats().recomputes > before);
}

#[test]
fn an_offloaded_cell_comes_back_from_host_memory() {
    let (cell, expected) = exp_cell();
    let mut batch = cell.host_batch();
    assert!(cell.clone().offload_into(&mut *batch));
    assert_eq!(cell.status(), Status::Offloading);
    assert_eq!(batch.finish(), 1);
    assert_eq!(cell.status(), Status::Offloaded);
    assert_eq!(values(cell.get()), expected);
    assert_eq!(cell.status(), Status::Resident);
}

/// A batch that never reads (a panic while it fills, or a read that fails: an out-of-memory
/// reported at that read) puts its cells back, charged again, so a retried step can read them;
/// they used to stay offloading, and a read waited for them forever.
#[test]
fn an_offload_that_never_reads_leaves_the_cell_resident_and_charged() {
    let (cell, expected) = exp_cell();
    let mut batch = cell.host_batch();
    assert!(cell.clone().offload_into(&mut *batch));
    assert_eq!(cell.status(), Status::Offloading);
    assert!(cell.resident_storage().is_none());
    drop(batch);
    assert_eq!(cell.status(), Status::Resident);
    assert_eq!(cell.resident_storage().map(|s| s.bytes), Some(12));
    assert_eq!(values(cell.get()), expected);
    // The failed read's path: the batch puts its cells back before it panics (and its drop
    // then finds nothing offloading).
    let mut batch = cell.host_batch();
    assert!(cell.clone().offload_into(&mut *batch));
    cell.abort_offload();
    drop(batch);
    assert_eq!(cell.status(), Status::Resident);
    assert_eq!(values(cell.get()), expected);
}

#[test]
fn a_pinned_cell_is_neither_evicted_nor_offloaded() {
    let (cell, _) = exp_cell();
    cell.core.pins.fetch_add(1, Relaxed);
    assert!(!cell.evict());
    assert!(!cell.clone().offload_into(&mut *cell.host_batch()));
    cell.core.pins.fetch_sub(1, Relaxed);
    assert!(cell.evict());
}

#[test]
fn dropping_the_last_handle_frees_a_cell_nothing_depends_on() {
    let (cell, _) = exp_cell();
    let handle = Handle::<Prim> { cell: cell.clone() };
    drop(handle);
    assert!(cell.core.info.is_dead());
    // Its recipe reads no dropped tensor, so it keeps it: evicted rather than gone.
    assert_eq!(cell.status(), Status::Evicted);
    // A cell without a recipe has nothing to keep.
    let lone = input_cell();
    drop(Handle::<Prim> { cell: lone.clone() });
    assert_eq!(lone.status(), Status::Gone);
}

/// A cell computing `exp` of the managed `input`, with its recipe.
fn exp_of(input: &Arc<Cell<Nd, FloatKind>>) -> Arc<Cell<Nd, FloatKind>> {
    let exp = float::op(float::Op::float_exp);
    let out = Nd::float_exp(input.get());
    let storage = Arc::new(state().charge(&out, exp));
    let source = Source::Cell(input.clone() as Arc<dyn CellOf<Prim>>);
    let recipe = Recipe {
        run: Box::new(move || Nd::float_exp(source.get())),
        inputs: vec![input.clone() as Arc<dyn CellDyn>],
        view_of: None,
    };
    Cell::create(out, storage, Some(recipe), 1.0, Origin::OPAQUE)
}

/// A managed cell without a recipe (a block's input).
fn input_cell() -> Arc<Cell<Nd, FloatKind>> {
    let device = Default::default();
    let input = Nd::float_from_data(burn_backend::TensorData::from([1.0f32, 2.0]), &device);
    let storage = Arc::new(state().charge(&input, float::op(float::Op::float_exp)));
    Cell::create(input, storage, None, 0.0, Origin::OPAQUE)
}

#[test]
fn a_cell_that_forgets_its_recipe_lets_the_dropped_tensors_it_was_computed_from_go() {
    // a (no recipe) -> b -> c, as a block's input, a product and a segment's checkpoint.
    let a = input_cell();
    let b = exp_of(&a);
    let c = exp_of(&b);
    let expected = values(c.get());
    // b is dropped to be recomputed, then the program drops a and b: a stays on the
    // device, since recomputing b (for c) needs it.
    assert!(b.evict());
    drop(Handle::<Prim> { cell: a.clone() });
    drop(Handle::<Prim> { cell: b.clone() });
    assert_eq!(a.status(), Status::Resident);
    drop(b);
    // c will not be recomputed: without its recipe, b goes and a with it.
    c.forget_recipe();
    assert_eq!(a.status(), Status::Gone);
    assert_eq!(values(c.get()), expected);
    assert!(
        !c.evict(),
        "a cell without a recipe cannot be dropped to be recomputed"
    );
}

#[test]
fn a_tensor_consumed_while_an_evicted_one_needs_it_is_evicted_not_held() {
    // a (no recipe) -> b -> c: c is dropped to be recomputed, then the program's last read of
    // b consumes it.
    let a = input_cell();
    let b = exp_of(&a);
    let c = exp_of(&b);
    let expected = values(c.get());
    assert!(c.evict());
    let (read, keep) = b.consume();
    assert!(
        keep.is_some(),
        "the op keeps the input's charge until its outputs are charged"
    );
    drop((read, keep));
    // b held its buffer until c went; now it keeps only its recipe, which c's needs.
    assert_eq!(b.status(), Status::Evicted);
    assert_eq!(values(c.get()), expected);
    assert_eq!(a.status(), Status::Resident);
}

#[test]
fn a_packed_bernoulli_draw_comes_back_bit_for_bit_from_a_quarter_of_its_bytes() {
    let device = Default::default();
    let draw = Nd::float_random(
        [256].into(),
        burn_backend::Distribution::Bernoulli(0.7),
        &device,
        burn_std::FloatDType::F32,
    );
    let expected = values(draw.clone());
    assert!(expected.contains(&0.0) && expected.contains(&1.0));
    let random = float::op(float::Op::float_random);
    let storage = Arc::new(state().charge(&draw, random));
    let cell = Cell::<Nd, FloatKind>::create(
        draw,
        storage,
        None,
        0.0,
        Origin {
            values: Values::Binary,
            replays: false,
        },
    );
    assert_eq!(cell.info().packed, Some(256));
    let before = state().budget.stats();
    assert!(cell.pack());
    assert_eq!(cell.status(), Status::Compressed);
    match &cell.lock().state {
        State::Packed(_, storage) => assert_eq!(storage.bytes, 256),
        _ => panic!("a packed cell holds booleans"),
    }
    assert_eq!(values(cell.get()), expected);
    assert_eq!(cell.status(), Status::Resident);
    let after = state().budget.stats();
    assert!(after.packs > before.packs && after.unpacks > before.unpacks);
    // A tensor not known to hold only 0 and 1 is never packed.
    let (exp, _) = exp_cell();
    assert_eq!(exp.info().packed, None);
    assert!(!exp.pack());
    assert_eq!(exp.status(), Status::Resident);
}
