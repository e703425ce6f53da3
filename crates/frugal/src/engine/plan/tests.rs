use super::period::{GRAM, WINDOW};
use super::record::{OpFloor, StepRecord, forward_passes};
use super::segments::{SEGMENT_SEARCH_STEP, boundaries, boundaries_near, sliding_min};
use super::simulation::Parked;
use super::*;

/// A tensor of `bytes` with `token`, made by `op` when `live` bytes were live; it cannot be
/// recomputed and shares no buffer.
fn made(token: u64, op: OpId, bytes: u64, live: u64) -> Made {
    Made {
        token,
        op,
        bytes,
        live,
        recompute: None,
        owner: None,
        cost: 0.0,
        forward: false,
        packed: None,
    }
}

/// The op of tensors whose op does not matter to a test.
const OP: OpId = OpId::new(0);

/// A step of `n` distinct tokens, each read once `gap` creations later.
fn run_steps(plan: &mut StepPlan, steps: usize, step: &[u64], gap: u64) -> Vec<u64> {
    let mut ordinals = Vec::new();
    for _ in 0..steps {
        for &token in step {
            let ordinal = plan.on_create(&made(token, OP, 4, 0));
            ordinals.push(ordinal);
            if let Some(read) = ordinal.checked_sub(gap) {
                plan.on_read(read);
            }
        }
    }
    ordinals
}

#[test]
fn a_repeated_step_is_learned_and_predicts_the_next_read() {
    let step: Vec<u64> = (0..100).map(|i| i * 7919 + 1).collect();
    let mut plan = StepPlan::default();
    run_steps(&mut plan, 1, &step, 10);
    assert_eq!(plan.figures().period, 0, "one step is not a repetition");
    run_steps(&mut plan, 2, &step, 10);
    assert_eq!(plan.figures().period, 100);
    // Reads are stamped with the next ordinal: a tensor read just after the creation
    // `gap` later is read at its ordinal + 11. The tensor with ordinal `now - 3` is
    // therefore read at `now + 8`.
    let now = plan.next_ordinal();
    assert_eq!(plan.distance(now - 3), Some(8));
}

#[test]
fn the_learned_step_tells_the_op_and_bytes_of_the_next_tensor() {
    let step: Vec<u64> = (0..100).map(|i| i * 7919 + 1).collect();
    let mut plan = StepPlan::default();
    let create = |plan: &mut StepPlan, tokens: &[u64]| {
        for (i, &token) in tokens.iter().enumerate() {
            let ordinal = plan.on_create(&made(token, OpId::new(i as u16), 100 + i as u64, 0));
            if let Some(read) = ordinal.checked_sub(10) {
                plan.on_read(read);
            }
        }
    };
    create(&mut plan, &step);
    assert_eq!(plan.next_made(), None, "no step learned yet");
    create(&mut plan, &step);
    create(&mut plan, &step);
    assert_eq!(plan.figures().period, 100);
    assert_eq!(
        plan.next_made(),
        Some((OpId::new(0), 100)),
        "the step's first tensor comes next"
    );
    create(&mut plan, &step[..4]);
    assert_eq!(plan.next_made(), Some((OpId::new(4), 104)));
}

#[test]
fn a_tensor_read_until_its_successor_is_made_outlives_the_step() {
    let step: Vec<u64> = (0..100).map(|i| i * 13 + 5).collect();
    let mut plan = StepPlan::default();
    let mut param = None;
    for _ in 0..4 {
        for (i, &token) in step.iter().enumerate() {
            // The last tensor of each step is a parameter, read at the start and near the
            // end of the next step; the others are read two creations later.
            if i == 98
                && let Some(p) = param
            {
                plan.on_read(p);
            }
            let ordinal = plan.on_create(&made(token, OP, 4, 0));
            if i == 10
                && let Some(p) = param
            {
                plan.on_read(p);
            }
            if i == 99 {
                param = Some(ordinal);
            } else if let Some(read) = ordinal.checked_sub(2) {
                plan.on_read(read);
            }
        }
    }
    assert_eq!(plan.figures().period, 100);
    assert!(plan.outlives_step(param.unwrap()));
    assert!(!plan.outlives_step(plan.next_ordinal() - 3));
}

#[test]
fn a_repeating_layer_inside_the_step_gives_way_to_the_whole_step() {
    // Twelve identical layers, then a head: the layer repeats inside a step.
    let layer: Vec<u64> = (0..40).map(|i| i + 1000).collect();
    let mut step: Vec<u64> = layer.iter().cycle().take(40 * 12).copied().collect();
    step.extend((0..50).map(|i| i + 5000));
    let mut plan = StepPlan::default();
    run_steps(&mut plan, 3, &step, 5);
    assert_eq!(plan.figures().period, step.len() as u64);
}

#[test]
fn a_changed_step_stops_predictions_and_learns_again() {
    let a: Vec<u64> = (0..80).map(|i| i + 1).collect();
    let b: Vec<u64> = (0..120).map(|i| i * 3 + 100_000).collect();
    let mut plan = StepPlan::default();
    run_steps(&mut plan, 3, &a, 4);
    assert_eq!(plan.figures().period, 80);
    run_steps(&mut plan, 1, &b[..GRAM as usize], 4);
    assert_eq!(plan.figures().period, 0, "the match broke");
    assert_eq!(plan.distance(plan.next_ordinal() - 1), None);
    run_steps(&mut plan, 3, &b, 4);
    assert_eq!(plan.figures().period, 120);
    assert!(plan.figures().replans >= 1);
}

#[test]
fn memory_stays_bounded_over_many_steps() {
    let step: Vec<u64> = (0..200).map(|i| i + 1).collect();
    let mut plan = StepPlan::default();
    run_steps(&mut plan, 1000, &step, 3);
    assert_eq!(plan.figures().period, 200);
    let bound = (WINDOW + WINDOW / 4 + 1) as usize;
    assert!(plan.tokens.len() <= bound, "{}", plan.tokens.len());
    assert!(plan.reads.len() <= bound, "{}", plan.reads.len());
}

/// A toy training step: `layers` layers of `width` tensors of 100 bytes each in the
/// forward pass (each read by the next, and once more by the backward pass), the backward
/// pass in reverse, then one new 10-byte parameter per layer replacing the old one. Every
/// tensor is dropped after its last read. Returns the segment events of each step, by
/// position in the step.
fn training_steps(
    plan: &mut StepPlan,
    steps: usize,
    layers: usize,
    width: usize,
    limit: Option<u64>,
) -> Vec<Vec<(usize, SegmentEvent)>> {
    training_steps_with_state(plan, steps, layers, width, limit, 0, &mut Vec::new())
}

/// As [`training_steps`], with optimizer state: after each layer's new parameter, a new
/// state tensor of `state_bytes` (if not 0) replacing the old one, which only this tail of
/// the step reads. The ordinals of the state tensors are pushed to `states`.
fn training_steps_with_state(
    plan: &mut StepPlan,
    steps: usize,
    layers: usize,
    width: usize,
    limit: Option<u64>,
    state_bytes: u64,
    states: &mut Vec<u64>,
) -> Vec<Vec<(usize, SegmentEvent)>> {
    let steps = vec![StepNoise::default(); steps];
    training_steps_under(plan, &steps, layers, width, limit, state_bytes, states)
}

/// One step of [`training_steps_under`]: what the budget did, and what its forward tensors
/// cost to recompute.
#[derive(Clone, Copy, Default)]
struct StepNoise {
    /// Eviction rounds the budget needed, noted at the step's end.
    pressure: u64,
    /// Bytes live on the device beside the step's own for the whole step (the runtime's
    /// or another tensor's), which the record sees in its live bytes.
    other_live: u64,
    /// What recomputing each forward tensor alone costs per byte (`None`: it cannot be).
    forward_cost: Option<f64>,
}

/// Records one step's creations in the plan, with the segment events they bring and their
/// positions in the step.
struct StepRecorder {
    limit: Option<u64>,
    /// See [`StepNoise::forward_cost`].
    forward_cost: Option<f64>,
    events: Vec<(usize, SegmentEvent)>,
    position: usize,
}

impl StepRecorder {
    fn new(limit: Option<u64>) -> Self {
        Self {
            limit,
            forward_cost: None,
            events: Vec::new(),
            position: 0,
        }
    }

    /// A new tensor of `bytes` with `token`, `live` bytes live after it.
    fn create(&mut self, plan: &mut StepPlan, token: u64, bytes: u64, live: &mut u64) -> u64 {
        self.create_made(plan, made(token, OP, bytes, *live + bytes), live)
    }

    /// As [`Self::create`], a forward tensor recomputed at [`Self::forward_cost`].
    fn create_forward(
        &mut self,
        plan: &mut StepPlan,
        token: u64,
        bytes: u64,
        live: &mut u64,
    ) -> u64 {
        let mut tensor = made(token, OP, bytes, *live + bytes);
        tensor.recompute = self.forward_cost.map(|per_byte| per_byte * bytes as f64);
        self.create_made(plan, tensor, live)
    }

    fn create_made(&mut self, plan: &mut StepPlan, tensor: Made, live: &mut u64) -> u64 {
        *live += tensor.bytes;
        let ordinal = plan.on_create(&tensor);
        if let Some(event) = plan.segment_event(ordinal, self.limit) {
            self.events.push((self.position, event));
        }
        self.position += 1;
        ordinal
    }
}

/// One forward pass over `params.len()` layers of `width` chained tensors of 100 bytes (a
/// layer's first reading its parameter) and the backward pass in reverse; with
/// `weight_grads`, each layer's weight gradient (10 bytes) made, or summed into, after its
/// tensors. Returns the chain's last gradient, still held.
fn forward_and_backward(
    plan: &mut StepPlan,
    step: &mut StepRecorder,
    params: &[Option<u64>],
    width: usize,
    live: &mut u64,
    mut weight_grads: Option<&mut [Option<u64>]>,
) -> Option<u64> {
    let layers = params.len();
    let mut saved = vec![Vec::new(); layers];
    let mut previous: Option<u64> = None;
    for (layer, kept) in saved.iter_mut().enumerate() {
        for j in 0..width {
            if let Some(p) = previous {
                plan.on_read(p);
            }
            if j == 0
                && let Some(p) = params[layer]
            {
                plan.on_read(p);
            }
            let t = step.create_forward(plan, (layer * width + j) as u64 + 1, 100, live);
            kept.push(t);
            previous = Some(t);
        }
    }
    let mut grad: Option<u64> = None;
    for layer in (0..layers).rev() {
        for (j, &t) in saved[layer].iter().enumerate().rev() {
            plan.on_read(t);
            if let Some(g) = grad {
                plan.on_read(g);
                plan.on_drop(g);
                *live -= 100;
            }
            plan.on_drop(t);
            *live -= 100;
            let token = (10_000 + layer * width + j) as u64;
            grad = Some(step.create(plan, token, 100, live));
        }
        if let Some(weight_grads) = weight_grads.as_deref_mut() {
            let token = match weight_grads[layer] {
                Some(old) => {
                    plan.on_read(old);
                    plan.on_drop(old);
                    *live -= 10;
                    50_000
                }
                None => 40_000,
            };
            weight_grads[layer] = Some(step.create(plan, token, 10, live));
        }
    }
    grad
}

/// As [`training_steps_with_state`], one step per entry of `steps`.
fn training_steps_under(
    plan: &mut StepPlan,
    steps: &[StepNoise],
    layers: usize,
    width: usize,
    limit: Option<u64>,
    state_bytes: u64,
    states: &mut Vec<u64>,
) -> Vec<Vec<(usize, SegmentEvent)>> {
    let mut live = 0u64;
    let mut state: Vec<Option<u64>> = vec![None; layers];
    let mut params: Vec<Option<u64>> = vec![None; layers];
    let mut all = Vec::new();
    for noise in steps {
        live += noise.other_live;
        let mut step = StepRecorder::new(limit);
        step.forward_cost = noise.forward_cost;
        let grad = forward_and_backward(plan, &mut step, &params, width, &mut live, None);
        for (param, state) in params.iter_mut().zip(&mut state) {
            if let Some(s) = *state {
                plan.on_read(s);
                plan.on_drop(s);
                live -= state_bytes;
            }
            if let Some(p) = *param {
                plan.on_read(p);
                plan.on_drop(p);
                live -= 10;
            }
            *param = Some(step.create(plan, 20_000, 10, &mut live));
            if state_bytes > 0 {
                let s = step.create(plan, 30_000, state_bytes, &mut live);
                states.push(s);
                *state = Some(s);
            }
        }
        if let Some(g) = grad {
            plan.on_drop(g);
            live -= 100;
        }
        for _ in 0..noise.pressure {
            plan.note_pressure();
        }
        live -= noise.other_live;
        all.push(step.events);
    }
    all
}

#[test]
fn a_forward_pass_over_the_budget_is_cut_into_the_same_segments_every_step() {
    let (layers, width) = (8, 10);
    let mut plan = StepPlan::default();
    let steps = training_steps(&mut plan, 6, layers, width, Some(4_000));
    assert_eq!(plan.figures().period, (2 * layers * width + layers) as u64);
    let figures = plan.figures();
    assert!(figures.segments >= 2, "{figures:?}");
    let last = &steps[5];
    assert_eq!(
        last.first(),
        Some(&(0, SegmentEvent::Open { park: Vec::new() })),
        "{last:?}"
    );
    assert_eq!(
        last.last(),
        Some(&(layers * width, SegmentEvent::Close)),
        "the forward pass ends at the step's peak: {last:?}"
    );
    let cuts: Vec<usize> = last
        .iter()
        .filter(|(_, e)| matches!(e, SegmentEvent::Cut { .. }))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(cuts.len() as u64, figures.segments - 1);
    // The same cuts in the step before.
    let before: Vec<usize> = steps[4]
        .iter()
        .filter(|(_, e)| matches!(e, SegmentEvent::Cut { .. }))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(cuts, before);
    // Each segment keeps at most the bytes the cuts aim at, and at least half of them.
    let mut bounds = vec![0];
    bounds.extend(&cuts);
    for pair in bounds.windows(2) {
        let bytes = (pair[1] - pair[0]) as u64 * 100;
        assert!(bytes <= figures.segment_bytes, "{bytes} {figures:?}");
        assert!(2 * bytes >= figures.segment_bytes, "{bytes} {figures:?}");
    }
    // A cut evicts what the forward pass read before it, but keeps its checkpoints and
    // what the next op reads.
    let Some((
        at,
        SegmentEvent::Cut {
            position,
            last_read,
            ..
        },
    )) = last
        .iter()
        .find(|(_, e)| matches!(e, SegmentEvent::Cut { .. }))
    else {
        unreachable!()
    };
    assert_eq!(*position as usize, *at);
    // In this chain each tensor is read only by the next op (and the backward pass): the
    // one before the cut was read by the op that made the cut's tensor, which will be
    // recomputed from it, so it is the segment's checkpoint; the one before that is
    // evicted.
    assert_eq!(last_read[at - 1], u64::MAX);
    assert_eq!(last_read[at - 2], *position - 1);
}

#[test]
fn smaller_segments_that_evict_no_less_give_way_to_the_very_cuts_before_them() {
    let (layers, width, limit) = (8, 10, 4_000);
    let cuts_of = |events: &[(usize, SegmentEvent)]| -> Vec<usize> {
        let cuts = events
            .iter()
            .filter(|(_, e)| matches!(e, SegmentEvent::Cut { .. }));
        cuts.map(|(at, _)| *at).collect()
    };
    // Without pressure: the step under the first segments.
    let quiet = training_steps(&mut StepPlan::default(), 8, layers, width, Some(limit));
    let first = quiet.iter().position(|e| !e.is_empty()).unwrap();
    // The budget evicts in that step, so the segments shrink; under the smaller ones it
    // evicts more, with more bytes live beside the step: back to the first cuts, not to
    // cuts made anew from the newer record.
    let mut noise = vec![StepNoise::default(); first + 5];
    noise[first].pressure = 3;
    noise[first + 1] = StepNoise {
        pressure: 5,
        other_live: 600,
        ..StepNoise::default()
    };
    let mut plan = StepPlan::default();
    let steps = training_steps_under(
        &mut plan,
        &noise,
        layers,
        width,
        Some(limit),
        0,
        &mut Vec::new(),
    );
    let (before, smaller) = (cuts_of(&steps[first]), cuts_of(&steps[first + 1]));
    assert!(smaller.len() > before.len(), "{before:?} {smaller:?}");
    for later in &steps[first + 2..] {
        assert_eq!(cuts_of(later), before);
    }
}

#[test]
fn only_steps_begun_under_cuts_that_stopped_adapting_are_settled() {
    let (layers, width, limit) = (8, 10, 4_000);
    let mut fits = StepPlan::default();
    training_steps(&mut fits, 6, layers, width, Some(1 << 30));
    assert_eq!(
        fits.figures().settled_steps,
        0,
        "no cuts, nothing to settle"
    );
    let quiet = training_steps(&mut StepPlan::default(), 8, layers, width, Some(limit));
    let first = quiet.iter().position(|e| !e.is_empty()).unwrap();
    // The budget evicts in the first two steps under cuts: the cuts shrink at the start of
    // the next step, go back at the start of the one after, and stay from then on.
    let total = first + 6;
    let mut noise = vec![StepNoise::default(); total];
    noise[first].pressure = 3;
    noise[first + 1] = StepNoise {
        pressure: 5,
        other_live: 600,
        ..StepNoise::default()
    };
    let mut plan = StepPlan::default();
    training_steps_under(
        &mut plan,
        &noise,
        layers,
        width,
        Some(limit),
        0,
        &mut Vec::new(),
    );
    let figures = plan.figures();
    assert_eq!(figures.planned_steps, (total - first) as u64);
    assert_eq!(figures.settled_steps, (total - first - 2) as u64);
}

#[test]
fn a_step_that_fits_or_no_budget_gets_no_segments() {
    let mut plan = StepPlan::default();
    let steps = training_steps(&mut plan, 5, 8, 10, Some(1 << 30));
    assert!(steps.iter().all(|events| events.is_empty()));
    assert_eq!(plan.figures().segments, 0);
    let mut plan = StepPlan::default();
    let steps = training_steps(&mut plan, 5, 8, 10, None);
    assert!(steps.iter().all(|events| events.is_empty()));
}

#[test]
fn segments_follow_a_changed_step() {
    let mut plan = StepPlan::default();
    training_steps(&mut plan, 5, 8, 10, Some(4_000));
    let before = plan.figures();
    assert!(before.segments > 0);
    // Wider layers: the step changes, the segments go, and come back cut for it.
    let steps = training_steps(&mut plan, 6, 8, 14, Some(5_000));
    let after = plan.figures();
    assert_eq!(after.period, 2 * 8 * 14 + 8);
    assert!(after.segments > 0, "{after:?}");
    assert_eq!(
        steps[5].first(),
        Some(&(0, SegmentEvent::Open { park: Vec::new() }))
    );
    assert_eq!(steps[5].last(), Some(&(8 * 14, SegmentEvent::Close)));
}

#[test]
fn the_simulated_step_drops_a_closed_segment_until_its_first_backward_read() {
    // A forward chain of four 10-byte tensors, each read by the next and once by the
    // backward pass (in reverse), then four backward tensors.
    let record = StepRecord {
        period: 8,
        first: 0,
        end: 4,
        passes: vec![0],
        base_live: 10,
        live: Vec::new(),
        bytes: vec![10; 8],
        reads: vec![
            vec![1, 7],
            vec![2, 6],
            vec![3, 5],
            vec![4],
            vec![5],
            vec![6],
            vec![7],
            vec![],
        ],
        shared: vec![false; 8],
        cost_per_byte: vec![f32::INFINITY; 8],
        ops: vec![OP; 8],
        replayable: vec![true; 8],
        packed: vec![None; 8],
    };
    // Held from creation to last read, inclusive: five tensors at positions 4 and 5.
    assert_eq!(record.simulate(&[0], &[], Parked::NONE), 50);
    // A cut at 2: the second tensor is read by the op that makes the third, which begins
    // the next segment, so it is a checkpoint; the first is evicted from position 3 until
    // the backward pass reads it, at 7.
    let cuts = [0, 2];
    let last_read = record.last_reads(&cuts);
    assert_eq!(last_read, vec![1, u64::MAX, 3, 0]);
    assert_eq!(record.simulate(&cuts, &last_read, Parked::NONE), 40);
    // A random draw in the closed segment cannot be recomputed: the cut leaves it.
    let mut drawn = record.clone();
    drawn.replayable[0] = false;
    assert_eq!(drawn.simulate(&cuts, &last_read, Parked::NONE), 50);
    // A draw of only 0 and 1 (dropout's mask) is packed instead, from the cut until it is
    // read again: 10 bytes in 2.
    drawn.packed[0] = Some(2);
    assert_eq!(drawn.simulate(&cuts, &last_read, Parked::NONE), 42);
    // Read across the cut as well, the first tensor is a checkpoint too and stays.
    let mut reads = record.reads.clone();
    reads[0] = vec![1, 3, 7];
    let record = StepRecord { reads, ..record };
    let last_read = record.last_reads(&cuts);
    assert_eq!(last_read[..2], [u64::MAX, u64::MAX]);
    assert_eq!(record.simulate(&cuts, &last_read, Parked::NONE), 50);
}

#[test]
fn the_simulated_step_holds_a_dropped_checkpoint_until_the_segment_after_it_comes_back() {
    // A forward chain of five 10-byte tensors cut into three segments at 2 and 4. The
    // second (1) is read only by the third (2), which begins the second segment: a
    // checkpoint the program drops at once. The backward pass (5..) reads the third at 8.
    let record = StepRecord {
        period: 10,
        first: 0,
        end: 5,
        passes: vec![0],
        base_live: 0,
        live: Vec::new(),
        bytes: vec![10; 10],
        reads: vec![
            vec![1, 9],
            vec![2],
            vec![3, 8],
            vec![4, 7],
            vec![5],
            vec![6],
            vec![7],
            vec![8],
            vec![9],
            vec![],
        ],
        shared: vec![false; 10],
        cost_per_byte: vec![f32::INFINITY; 10],
        ops: vec![OP; 10],
        replayable: vec![true; 10],
        packed: vec![None; 10],
    };
    let cuts = [0, 2, 4];
    let last_read = record.last_reads(&cuts);
    assert_eq!(last_read[1], u64::MAX);
    let curve = record.simulate_curve(&cuts, &last_read, Parked::NONE);
    // The curve counts from the step's start (the first tensor, read again at its end).
    // The third tensor is evicted from position 5 until 8, when the backward pass
    // recomputes it from the checkpoint, which is held from its creation until then
    // (dropped at its last read, position 2, it would leave 10 bytes less at 3 to 8).
    assert_eq!(curve, vec![0, 10, 20, 20, 30, 30, 30, 30, 30, 20]);
    assert_eq!(record.simulate(&cuts, &last_read, Parked::NONE), 30);
}

#[test]
fn a_selection_drops_the_cheapest_tensor_held_across_the_peak() {
    // Forward: x (0) -> a (1, cheap) -> b (2, a product of a) -> c (3) -> d (4); the
    // backward pass (5..) reads b at 6, a at 7, x at 8.
    let record = |costs: [f32; 2]| StepRecord {
        period: 9,
        first: 0,
        end: 5,
        passes: vec![0],
        base_live: 0,
        live: Vec::new(),
        bytes: vec![10, 40, 40, 10, 10, 10, 10, 10, 10],
        reads: vec![
            vec![1, 8],
            vec![2, 7],
            vec![3, 6],
            vec![4],
            vec![5],
            vec![6],
            vec![7],
            vec![8],
            vec![],
        ],
        shared: vec![false; 9],
        cost_per_byte: [f32::INFINITY, costs[0], costs[1]]
            .into_iter()
            .chain([f32::INFINITY; 6])
            .collect(),
        ops: vec![OP; 9],
        replayable: vec![true; 9],
        packed: vec![None; 9],
    };
    // Held from the step's start: 100 bytes at positions 4 to 6 (all of x, a, b).
    let cheap_a = record([2.0, 20.0]);
    assert_eq!(
        cheap_a.select(100, 100, 0, Parked::NONE).map(|s| s.count),
        Some(0)
    );
    let chosen = cheap_a.select(95, 95, 0, Parked::NONE).expect("a fits");
    assert_eq!((chosen.count, chosen.bytes, chosen.peak), (1, 40, 90));
    // `a` goes as `c` is made, after `b` (made at 2) read it; back when the backward
    // pass reads it.
    assert_eq!(chosen.cuts, vec![0, 3]);
    assert_eq!(chosen.last_read[1], 2);
    assert!(
        chosen
            .last_read
            .iter()
            .enumerate()
            .all(|(i, &l)| i == 1 || l == u64::MAX)
    );
    // Position 3 still holds x, a, b and c: nothing held across it can be dropped
    // before it, and `b` may not go beside `a`, its dropped input.
    assert!(cheap_a.select(85, 85, 0, Parked::NONE).is_none());
    // Short of the aim but within the ceiling, the choice that got lowest is taken.
    let short = cheap_a
        .select(85, 90, 0, Parked::NONE)
        .expect("within the ceiling");
    assert_eq!((short.count, short.peak), (1, 90));
    // A cheaper `b` is no help: it goes only as `d` is made (position 4, the peak's
    // first position), so `a` goes all the same.
    let cheap_b = record([30.0, 2.0]);
    let chosen = cheap_b.select(95, 95, 0, Parked::NONE).expect("a fits");
    assert_eq!(chosen.cuts, vec![0, 3]);
    assert_eq!((chosen.last_read[1], chosen.last_read[2]), (2, u64::MAX));
    // Too small to be worth an op.
    assert!(cheap_a.select(95, 95, 41, Parked::NONE).is_none());
    // Optimizer state parked across the peak lowers it by its bytes; back before the
    // peak (position 3, once `a` is chosen) it does not.
    let across = Parked {
        bytes: 10,
        until: 9,
    };
    let parked = cheap_a
        .select(85, 85, 0, across)
        .expect("fits with 10 B away");
    assert_eq!((parked.count, parked.peak), (1, 80));
    let before = Parked {
        bytes: 10,
        until: 3,
    };
    assert!(cheap_a.select(85, 85, 0, before).is_none());
}

#[test]
fn the_segments_are_the_largest_whose_simulated_step_fits() {
    // 80 forward tensors of 100 bytes under a budget of 4,000: segments of the whole
    // room (39 tensors) would bring 3,900 bytes back at once beside the gradients and
    // parameters; the next share (31 tensors) fits.
    let (layers, width) = (8, 10);
    let mut plan = StepPlan::default();
    training_steps(&mut plan, 6, layers, width, Some(4_000));
    let figures = plan.figures();
    assert!(figures.segments >= 2, "{figures:?}");
    assert!(figures.estimated_peak <= 4_000, "{figures:?}");
    assert!(figures.estimated_peak > 3_000, "{figures:?}");
    assert_eq!(plan.segment_share, SEGMENT_SHARE * SEGMENT_SEARCH_STEP);
}

#[test]
fn optimizer_state_is_parked_only_when_no_segments_fit_without_it() {
    let (layers, width) = (8, 10);
    // 3,200 bytes of optimizer state: under 8,000 the segments fit beside it, under
    // 4,000 they do not, and the plan parks some of it for the forward and backward
    // passes.
    let mut plan = StepPlan::default();
    let mut states = Vec::new();
    training_steps_with_state(&mut plan, 6, layers, width, Some(8_000), 400, &mut states);
    let roomy = plan.figures();
    assert!(roomy.segments >= 2, "{roomy:?}");
    assert_eq!(roomy.parked_bytes, 0, "{roomy:?}");

    let mut plan = StepPlan::default();
    let mut states = Vec::new();
    let steps =
        training_steps_with_state(&mut plan, 6, layers, width, Some(4_000), 400, &mut states);
    let tight = plan.figures();
    assert!(tight.parked_bytes > 0, "{tight:?}");
    assert!(
        tight.parked_bytes < 8 * 400,
        "the fewest bytes that fit: {tight:?}"
    );
    assert!(tight.estimated_peak <= 4_000, "{tight:?}");
    // The forward pass's start (here the newest state tensor, after which the step's own
    // tensors are all gone) names state the step before made that the next step reads
    // only in its optimizer tail: the same number of tensors every step, and the layers
    // read last.
    let opens: Vec<&Vec<u64>> = steps[4..]
        .iter()
        .flatten()
        .filter_map(|(_, event)| match event {
            SegmentEvent::Open { park } => Some(park),
            _ => None,
        })
        .collect();
    assert_eq!(opens.len(), 2, "{steps:?}");
    assert_eq!(opens[0].len(), opens[1].len());
    assert_eq!(opens[0].len() as u64 * 400, tight.parked_bytes);
    for park in opens {
        assert!(
            park.iter().all(|ordinal| states.contains(ordinal)),
            "{park:?}"
        );
        let newest = states
            .iter()
            .position(|s| *s > park[park.len() - 1])
            .unwrap();
        let layers_parked: Vec<usize> = park
            .iter()
            .map(|ordinal| states.iter().position(|s| s == ordinal).unwrap() % layers)
            .collect();
        // Ascending ordinals, the layers just before the newest state's.
        let last = newest % layers;
        assert_eq!(
            layers_parked,
            (last - park.len()..last).collect::<Vec<_>>(),
            "{park:?}"
        );
    }
}

#[test]
fn optimizer_state_is_parked_where_its_copies_cost_less_than_the_recomputation_they_save() {
    // 80 forward tensors of 100 bytes and 3,200 bytes of optimizer state under a budget of
    // 4,000: a selection fits without parking. Parking costs the state's copies to host
    // memory and back whatever the forward tensors cost; each byte parked is a byte fewer
    // to drop and recompute.
    let (layers, width, limit) = (8, 10, 4_000);
    let plan_at = |forward_cost: f64| {
        let mut plan = StepPlan::default();
        let noise = StepNoise {
            forward_cost: Some(forward_cost),
            ..StepNoise::default()
        };
        let steps = vec![noise; 6];
        training_steps_under(
            &mut plan,
            &steps,
            layers,
            width,
            Some(limit),
            400,
            &mut Vec::new(),
        );
        plan.figures()
    };
    // Cheap to recompute: nothing parked.
    let cheap = plan_at(1.0);
    assert!(cheap.selected_bytes > 0, "{cheap:?}");
    assert_eq!(cheap.parked_bytes, 0, "{cheap:?}");
    assert!(cheap.estimated_peak <= limit, "{cheap:?}");
    // Costly to recompute (products): state parked, fewer bytes recomputed.
    let costly = plan_at(1_000.0);
    assert!(costly.parked_bytes > 0, "{costly:?}");
    assert!(costly.selected_bytes > 0, "{costly:?}");
    assert!(
        costly.selected_bytes < cheap.selected_bytes,
        "{cheap:?} {costly:?}"
    );
    assert!(costly.estimated_peak <= limit, "{costly:?}");
}

/// Steps that accumulate gradients over `micro_batches` forward and backward passes of a
/// chain of `layers * width` tensors of 100 bytes, each layer's weight gradient (10 bytes)
/// summed across them, then an optimizer tail replacing each layer's parameter.
fn accumulated_steps(
    plan: &mut StepPlan,
    steps: usize,
    micro_batches: usize,
    (layers, width): (usize, usize),
    limit: Option<u64>,
) -> Vec<Vec<(usize, SegmentEvent)>> {
    let mut live = 0u64;
    let mut params: Vec<Option<u64>> = vec![None; layers];
    let mut all = Vec::new();
    for _ in 0..steps {
        let mut step = StepRecorder::new(limit);
        let mut weight_grads: Vec<Option<u64>> = vec![None; layers];
        for _ in 0..micro_batches {
            let grad = forward_and_backward(
                plan,
                &mut step,
                &params,
                width,
                &mut live,
                Some(&mut weight_grads),
            );
            if let Some(g) = grad {
                plan.on_drop(g);
                live -= 100;
            }
        }
        for (param, weight_grad) in params.iter_mut().zip(&weight_grads) {
            if let Some(g) = *weight_grad {
                plan.on_read(g);
                plan.on_drop(g);
                live -= 10;
            }
            if let Some(p) = *param {
                plan.on_read(p);
                plan.on_drop(p);
                live -= 10;
            }
            *param = Some(step.create(plan, 20_000, 10, &mut live));
        }
        all.push(step.events);
    }
    all
}

#[test]
fn a_step_that_accumulates_micro_batches_is_cut_the_same_in_every_forward_pass() {
    let (layers, width) = (8, 10);
    let mut plan = StepPlan::default();
    let steps = accumulated_steps(&mut plan, 8, 2, (layers, width), Some(4_000));
    let forward = (layers * width) as u64;
    let segments = plan.segments.as_ref().expect("cut under the budget");
    assert_eq!(segments.end, forward);
    assert_eq!(segments.passes.len(), 2, "{:?}", segments.passes);
    assert!(segments.cuts.len() >= 2, "{:?}", segments.cuts);
    let figures = plan.figures();
    assert!(figures.estimated_peak <= 4_000, "{figures:?}");
    // Each micro-batch's forward pass opens, cuts at the same places and closes.
    let last = &steps[7];
    let opens: Vec<usize> = last
        .iter()
        .filter(|(_, event)| matches!(event, SegmentEvent::Open { .. }))
        .map(|&(at, _)| at)
        .collect();
    assert_eq!(opens.len(), 2, "{last:?}");
    let cuts_from = |open: usize| -> Vec<u64> {
        last.iter()
            .filter_map(|(at, event)| match event {
                SegmentEvent::Cut { position, .. } if *at > open && *at < open + 1_000 => {
                    Some((*at - open) as u64).filter(|&from| from == *position)
                }
                _ => None,
            })
            .take(segments.cuts.len() - 1)
            .collect()
    };
    assert_eq!(cuts_from(opens[0]), segments.cuts[1..].to_vec(), "{last:?}");
    assert_eq!(cuts_from(opens[1]), segments.cuts[1..].to_vec(), "{last:?}");
    let closes = last
        .iter()
        .filter(|(_, event)| *event == SegmentEvent::Close)
        .count();
    assert_eq!(closes, 2, "{last:?}");
}

#[test]
fn forward_passes_are_found_from_the_peak_back_to_the_first_micro_batch() {
    // Two micro-batches: a forward pass of four tensors (tokens 1..=4) climbing to 40,
    // its backward pass (tokens 9) falling to 10 (a gradient held), then the second.
    let held = [10, 20, 30, 40, 30, 20, 10, 20, 30, 40, 50];
    let tokens = [1, 2, 3, 4, 9, 9, 9, 1, 2, 3, 4];
    let passes = forward_passes(11, |at| held[at as usize], |at| tokens[at as usize]);
    assert_eq!(passes, (vec![0, 7], 4));
    // One forward pass: from its start to the peak.
    let single = forward_passes(4, |at| held[at as usize], |at| tokens[at as usize]);
    assert_eq!(single, (vec![0], 4));
    // A dip within the forward pass that repeats no earlier tokens is not a pass.
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    let passes = forward_passes(11, |at| held[at as usize], |at| tokens[at as usize]);
    assert_eq!(passes, (vec![0], 11));
}

#[test]
fn a_selection_recomputes_a_tensor_through_the_inputs_the_program_drops() {
    // Forward: x (0, held to the end) -> s (1, read only by m) -> m (2, read only by p) ->
    // p (3, read by a and by the backward pass at 9) -> a (4) -> b (5) -> c (6), as
    // `softmax(mask_fill(q·kᵀ))` written out; the backward pass (7..) reads a at 8, p at 9.
    let record = |s_cost: f32| StepRecord {
        period: 12,
        first: 0,
        end: 7,
        passes: vec![0],
        base_live: 0,
        live: Vec::new(),
        bytes: vec![10, 20, 20, 40, 40, 40, 10, 10, 10, 10, 10, 10],
        reads: vec![
            vec![1, 11],
            vec![2],
            vec![3],
            vec![4, 9],
            vec![5, 8],
            vec![6, 7],
            vec![7],
            vec![8],
            vec![9],
            vec![10],
            vec![11],
            vec![],
        ],
        shared: vec![false; 12],
        cost_per_byte: [f32::INFINITY, s_cost, 1.0, 1.0, 10.0, 10.0]
            .into_iter()
            .chain([f32::INFINITY; 6])
            .collect(),
        ops: vec![OP; 12],
        replayable: vec![true; 12],
        packed: vec![None; 12],
    };
    // Counted from the step's start (x's bytes are in `base_live`): the peak, 140 B at 7,
    // holds p; p's input m and m's input s are gone by the time the backward pass reads
    // p, so p is dropped with both and all three are recomputed at 9, held there beside p
    // (100 B). The peak left is at 5 (120 B), before p goes.
    let chained = record(1.0)
        .select(110, 120, 0, Parked::NONE)
        .expect("p with its chain fits the ceiling");
    assert_eq!((chained.count, chained.bytes, chained.peak), (1, 40, 120));
    assert_eq!(chained.cuts, vec![0, 5]);
    assert_eq!(chained.last_read[..4], [u64::MAX, 2, 3, 4]);
    assert!(chained.last_read[4..].iter().all(|&l| l == u64::MAX));
    // An input that cannot be recomputed (a view, a random draw) ends the chain: only a
    // can go, which leaves 130 B at 6.
    assert!(
        record(f32::INFINITY)
            .select(110, 120, 0, Parked::NONE)
            .is_none()
    );
}

#[test]
fn a_selection_packs_a_random_draw_of_zeros_and_ones_it_cannot_recompute() {
    // A forward pass of an input (0, counted in `base_live`) and four 40-byte tensors, each
    // read by the next and by the backward pass (5..10) in reverse. The first (1) is a
    // dropout mask: a Bernoulli draw, never recomputed, 10 bytes packed; the others cannot be
    // recomputed either. At 5, the last is read while the backward pass's first is made:
    // 161 B.
    let record = StepRecord {
        period: 10,
        first: 0,
        end: 5,
        passes: vec![0],
        base_live: 0,
        live: vec![0; 10],
        bytes: vec![1, 40, 40, 40, 40, 1, 1, 1, 1, 1],
        reads: vec![
            vec![1, 9],
            vec![2, 8],
            vec![3, 7],
            vec![4, 6],
            vec![5],
            vec![6],
            vec![7],
            vec![8],
            vec![9],
            vec![],
        ],
        shared: vec![false; 10],
        cost_per_byte: vec![f32::INFINITY; 10],
        ops: vec![OP; 10],
        replayable: [true, false].into_iter().chain([true; 8]).collect(),
        packed: [None, Some(10)].into_iter().chain([None; 8]).collect(),
    };
    assert_eq!(record.simulate(&[0], &[], Parked::NONE), 161);
    // Packed after its last forward read (2), as the next tensor is made, until the backward
    // pass reads it at 8: the peak loses 30 bytes.
    let packed = record
        .select(140, 140, 0, Parked::NONE)
        .expect("packing the mask fits");
    assert_eq!((packed.count, packed.packed, packed.peak), (1, 1, 131));
    assert_eq!(packed.cuts, vec![0, 3]);
    assert_eq!(packed.last_read[1], 2);
    assert_eq!(
        record.simulate(&packed.cuts, &packed.last_read, Parked::NONE),
        131
    );
    // Without the packed size there is nothing to choose.
    let mut unpackable = record.clone();
    unpackable.packed[1] = None;
    assert!(unpackable.select(140, 140, 0, Parked::NONE).is_none());
}

#[test]
fn a_packed_mask_and_the_product_that_reads_it_are_both_chosen() {
    // x (0, in `base_live`) times a dropout mask M (1: 40 B, 10 B packed) is P (2: 40 B,
    // recomputable from x and M); then Q, S and R (3, 4, 5: 10, 10 and 80 B) that nothing
    // recomputes. The backward pass (6..11) reads P at 8 and M at 9. At 5: 170 B.
    let record = StepRecord {
        period: 11,
        first: 0,
        end: 6,
        passes: vec![0],
        base_live: 0,
        live: vec![0; 11],
        bytes: vec![1, 40, 40, 10, 10, 80, 1, 1, 1, 1, 1],
        reads: vec![
            vec![2, 10],
            vec![2, 9],
            vec![3, 8],
            vec![4],
            vec![5],
            vec![6],
            vec![7],
            vec![8],
            vec![9],
            vec![10],
            vec![],
        ],
        shared: vec![false; 11],
        cost_per_byte: [f32::INFINITY, f32::INFINITY, 1.0]
            .into_iter()
            .chain([f32::INFINITY; 8])
            .collect(),
        ops: vec![OP; 11],
        replayable: [true, false].into_iter().chain([true; 9]).collect(),
        packed: [None, Some(10)].into_iter().chain([None; 9]).collect(),
    };
    assert_eq!(record.simulate(&[0], &[], Parked::NONE), 170);
    // P is dropped from 5 to 8 (130 B at 5); its recomputation reads M, which is still packed
    // from 4 to 8, when that recomputation unpacks it: 100 B at 5.
    let both = record
        .select(100, 100, 0, Parked::NONE)
        .expect("P and the packed mask fit");
    assert_eq!((both.count, both.packed, both.peak), (2, 1, 100));
    assert_eq!(both.cuts, vec![0, 3, 4]);
    assert_eq!(both.last_read[1..3], [2, 3]);
}

#[test]
fn the_least_in_a_sliding_window_is_the_least_of_its_values() {
    let values: Vec<i64> = (0..200).map(|i| (i * 7919 % 101) as i64 - 30).collect();
    for (before, after) in [(0, 0), (1, 1), (3, 0), (0, 16), (250, 7), (7, 250)] {
        let naive: Vec<i64> = (0..values.len())
            .map(|i| {
                let (from, to) = (i.saturating_sub(before), (i + after).min(values.len() - 1));
                *values[from..=to].iter().min().unwrap()
            })
            .collect();
        assert_eq!(
            sliding_min(&values, before, after),
            naive,
            "{before} before, {after} after"
        );
    }
    assert!(sliding_min(&[], 3, 3).is_empty());
}

#[test]
fn every_stage_of_a_network_that_shrinks_its_activations_has_boundaries() {
    // Three stages of four blocks of ten positions, as a ResNet's: the residual stream alone
    // crosses a block's boundary, twice as much inside a block; each stage's activations are
    // half the last stage's.
    let mut crossing = Vec::new();
    for stage in 0..3 {
        let stream = 400 >> stage;
        for _ in 0..4 {
            crossing.push(stream);
            crossing.extend([2 * stream; 9]);
        }
    }
    let end = crossing.len() as u64;
    let at = |boundary: Vec<bool>| -> Vec<usize> {
        (1..boundary.len()).filter(|&p| boundary[p]).collect()
    };
    let blocks: Vec<usize> = (1..12).map(|block| 10 * block).collect();
    assert_eq!(
        at(boundaries_near(&crossing, end)),
        blocks,
        "boundaries between every two blocks, in every stage"
    );
    assert_eq!(
        at(boundaries(&crossing, end)),
        blocks[7..],
        "where the fewest cross, the smallest stage's alone"
    );
    // A stack of equal blocks: the same boundaries as the fewest anywhere gives.
    let equal: Vec<i64> = (0..12)
        .flat_map(|_| [100].into_iter().chain([200; 9]))
        .collect();
    assert_eq!(at(boundaries_near(&equal, end)), blocks);
    assert_eq!(at(boundaries(&equal, end)), blocks);
}

#[test]
fn the_op_floor_is_the_most_one_op_holds_for_its_inputs_and_output() {
    // Six positions: the op at 3 reads 0 and 1 (twice) and the view 2 of 1's buffer; the
    // op at 5 makes an optimizer moment the same op reads in the next step.
    let record = StepRecord {
        period: 6,
        first: 0,
        end: 3,
        passes: vec![0],
        base_live: 0,
        live: Vec::new(),
        bytes: vec![10, 20, 20, 40, 8, 8],
        reads: vec![
            vec![1, 3],
            vec![2, 3, 4],
            vec![3],
            vec![4],
            vec![],
            vec![11],
        ],
        shared: vec![false, false, true, false, false, false],
        cost_per_byte: vec![1.0; 6],
        ops: (0..6).map(OpId::new).collect(),
        replayable: vec![true; 6],
        packed: vec![None; 6],
    };
    // At 3: its 40 bytes, 10 and 20 (the view's buffer counted once).
    assert_eq!(
        record.op_floor(),
        Some(OpFloor {
            bytes: 70,
            op: OpId::new(3)
        })
    );
    // A larger moment: its op holds the one it read and the one it makes.
    let mut bytes = record.bytes.clone();
    bytes[5] = 40;
    let record = StepRecord { bytes, ..record };
    assert_eq!(
        record.op_floor(),
        Some(OpFloor {
            bytes: 80,
            op: OpId::new(5)
        })
    );
}
