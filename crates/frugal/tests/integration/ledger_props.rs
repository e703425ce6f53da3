//! Property tests of the ledger against an independent model of storage sharing: random
//! sequences of create / clone / view / compute / drop on `Frugal<NdArray>` tensors keep
//! `live_bytes` equal to the bytes of the distinct storages still referenced, `peak ≥ live`,
//! and return to the starting point when everything is dropped (no leak).
//!
//! Tests here share the CPU device's ledger, so they take a lock and measure deltas.

use std::collections::{BTreeMap, BTreeSet};

use burn::backend::NdArray;
use burn::backend::ndarray::NdArrayDevice as CpuDevice;
use burn::tensor::{Tensor, TensorData};
use frugal::{Frugal, memory};
use proptest::prelude::*;

type Wrapped = Frugal<NdArray>;

#[derive(Clone, Debug)]
enum Action {
    Create { rows: usize, cols: usize },
    Clone(usize),
    Reshape(usize),
    Transpose(usize),
    SliceRows(usize),
    Exp(usize),
    Sum(usize),
    Drop(usize),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (1usize..9, 1usize..9).prop_map(|(rows, cols)| Action::Create { rows, cols }),
        2 => any::<usize>().prop_map(Action::Clone),
        1 => any::<usize>().prop_map(Action::Reshape),
        1 => any::<usize>().prop_map(Action::Transpose),
        1 => any::<usize>().prop_map(Action::SliceRows),
        2 => any::<usize>().prop_map(Action::Exp),
        1 => any::<usize>().prop_map(Action::Sum),
        3 => any::<usize>().prop_map(Action::Drop),
    ]
}

struct Model {
    live: Vec<(Tensor<Wrapped, 2>, usize)>,
    bytes: BTreeMap<usize, u64>,
    next_id: usize,
}

impl Model {
    fn expected_bytes(&self) -> u64 {
        let ids: BTreeSet<usize> = self.live.iter().map(|(_, id)| *id).collect();
        ids.iter().map(|id| self.bytes[id]).sum()
    }

    fn expected_buffers(&self) -> u64 {
        self.live
            .iter()
            .map(|(_, id)| *id)
            .collect::<BTreeSet<_>>()
            .len() as u64
    }

    fn fresh(&mut self, tensor: Tensor<Wrapped, 2>) {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes
            .insert(id, tensor.shape().num_elements() as u64 * 4);
        self.live.push((tensor, id));
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.live.is_empty()).then(|| i % self.live.len())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn live_bytes_match_distinct_storage(actions in prop::collection::vec(action(), 1..60)) {
        let _guard = crate::serial();
        let device = CpuDevice::default();
        let base_bytes = memory::live_bytes(&device);
        let base_buffers = memory::live_tensors(&device);
        let mut model = Model { live: Vec::new(), bytes: BTreeMap::new(), next_id: 0 };
        for (step, action) in actions.iter().enumerate() {
            match *action {
                Action::Create { rows, cols } => {
                    let values: Vec<f32> = (0..rows * cols).map(|v| v as f32 * 0.25 - 1.0).collect();
                    let t = Tensor::<Wrapped, 2>::from_data(TensorData::new(values, [rows, cols]), &device);
                    model.fresh(t);
                }
                Action::Clone(i) => if let Some(i) = model.pick(i) {
                    let (t, id) = &model.live[i];
                    let entry = (t.clone(), *id);
                    model.live.push(entry);
                },
                Action::Reshape(i) => if let Some(i) = model.pick(i) {
                    let (t, id) = &model.live[i];
                    let [r, c] = t.dims();
                    let entry = (t.clone().reshape([c, r]), *id);
                    model.live.push(entry);
                },
                Action::Transpose(i) => if let Some(i) = model.pick(i) {
                    let (t, id) = &model.live[i];
                    let entry = (t.clone().transpose(), *id);
                    model.live.push(entry);
                },
                Action::SliceRows(i) => if let Some(i) = model.pick(i) {
                    let (t, id) = &model.live[i];
                    let [r, c] = t.dims();
                    let entry = (t.clone().slice([0..r.div_ceil(2), 0..c]), *id);
                    model.live.push(entry);
                },
                Action::Exp(i) => if let Some(i) = model.pick(i) {
                    let t = model.live[i].0.clone().exp();
                    model.fresh(t);
                },
                Action::Sum(i) => if let Some(i) = model.pick(i) {
                    let t = model.live[i].0.clone().sum_dim(1);
                    model.fresh(t);
                },
                Action::Drop(i) => if let Some(i) = model.pick(i) {
                    model.live.swap_remove(i);
                },
            }
            let live = memory::live_bytes(&device) - base_bytes;
            prop_assert_eq!(live, model.expected_bytes(), "after step {} ({:?})", step, action);
            prop_assert_eq!(memory::live_tensors(&device) - base_buffers, model.expected_buffers());
            prop_assert!(memory::peak_bytes(&device) >= memory::live_bytes(&device));
        }
        model.live.clear();
        prop_assert_eq!(memory::live_bytes(&device), base_bytes, "bytes leaked");
        prop_assert_eq!(memory::live_tensors(&device), base_buffers, "buffers leaked");
    }
}

#[test]
fn peak_resets_to_live_and_tracks_the_high_water_mark() {
    let _guard = crate::serial();
    let device = CpuDevice::default();
    memory::reset_peak(&device);
    let start = memory::live_bytes(&device);
    assert_eq!(memory::peak_bytes(&device), start);
    let big = Tensor::<Wrapped, 2>::ones([64, 64], &device);
    let high = memory::live_bytes(&device);
    assert_eq!(high - start, 64 * 64 * 4);
    drop(big);
    assert_eq!(memory::live_bytes(&device), start);
    assert_eq!(memory::peak_bytes(&device), high);
    memory::reset_peak(&device);
    assert_eq!(memory::peak_bytes(&device), start);
}

#[test]
fn timeline_events_account_for_every_byte() {
    let _guard = crate::serial();
    let device = CpuDevice::default();
    memory::record_timeline(&device, 1000);
    let start = memory::live_bytes(&device);
    let a = Tensor::<Wrapped, 2>::ones([8, 8], &device);
    memory::mark(&device, "compute");
    let b = a.clone().matmul(a.clone()).exp();
    drop(a);
    let snapshot = memory::snapshot(&device);
    memory::record_timeline(&device, 0);
    let mut delta: i64 = 0;
    for event in &snapshot.events {
        match event.kind {
            memory::EventKind::Alloc => delta += event.bytes as i64,
            memory::EventKind::Free => delta -= event.bytes as i64,
            memory::EventKind::Mark => assert_eq!(event.op, "compute"),
        }
    }
    assert_eq!(start as i64 + delta, memory::live_bytes(&device) as i64);
    let last = snapshot.events.last().unwrap();
    assert_eq!(last.live_bytes, memory::live_bytes(&device));
    assert!(
        snapshot
            .events
            .iter()
            .any(|e| e.op == "float_matmul" && e.shape == vec![8, 8])
    );
    let json: serde_json::Value = serde_json::from_str(&snapshot.to_json()).unwrap();
    assert!(json["events"].as_array().unwrap().len() >= 4);
    drop(b);
}

#[test]
fn holders_at_peak_replay_the_timeline() {
    let _guard = crate::serial();
    let device = CpuDevice::default();
    let before = Tensor::<Wrapped, 2>::ones([4, 4], &device);
    memory::record_timeline(&device, 1000);
    let base = memory::live_bytes(&device);
    let a = Tensor::<Wrapped, 2>::ones([16, 8], &device);
    memory::mark(&device, "compute");
    // The peak: `a` (512 B), the product (1 KiB) and its exp (1 KiB) live together.
    let product = a.clone().matmul(a.clone().transpose());
    let exp = product.clone().exp();
    drop((product, exp));
    // Later, less at once: `a` and one 512 B sum.
    let sum = a.clone() + a.clone();
    drop(sum);
    let snapshot = memory::snapshot(&device);
    memory::record_timeline(&device, 0);
    let peak = snapshot.holders_at_peak().expect("a complete timeline");
    assert_eq!(peak.live_bytes, base + 512 + 1024 + 1024);
    assert_eq!(peak.after_mark.as_deref(), Some("compute"));
    assert_eq!(peak.before_recording_bytes, base);
    let bytes = |op: &str| {
        peak.holders
            .iter()
            .find(|h| h.op == op)
            .map(|h| (h.bytes, h.tensors))
    };
    assert_eq!(bytes("float_matmul"), Some((1024, 1)));
    assert_eq!(bytes("float_exp"), Some((1024, 1)));
    assert_eq!(bytes("float_add"), None, "allocated after the peak");
    assert_eq!(peak.holders[0].bytes, 1024);
    drop((a, before));

    // A timeline that lost events cannot be replayed.
    memory::record_timeline(&device, 2);
    for _ in 0..4 {
        let _ = Tensor::<Wrapped, 1>::ones([4], &device) + 1.0;
    }
    let snapshot = memory::snapshot(&device);
    memory::record_timeline(&device, 0);
    assert!(snapshot.holders_at_peak().is_none());
}

#[test]
fn timeline_is_bounded() {
    let _guard = crate::serial();
    let device = CpuDevice::default();
    memory::record_timeline(&device, 5);
    for _ in 0..20 {
        let _ = Tensor::<Wrapped, 1>::ones([4], &device) + 1.0;
    }
    let snapshot = memory::snapshot(&device);
    memory::record_timeline(&device, 0);
    assert_eq!(snapshot.events.len(), 5);
    assert!(snapshot.dropped_events > 0);
}

#[test]
fn report_names_the_biggest_holder() {
    let _guard = crate::serial();
    let device = CpuDevice::default();
    let a = Tensor::<Wrapped, 2>::ones([300, 100], &device);
    let b = a.clone().matmul(a.clone().transpose());
    let report = memory::report(&device);
    let top = &report.holders[0];
    assert_eq!(top.op, "float_matmul");
    assert_eq!(top.bytes, 300 * 300 * 4);
    let text = report.to_string();
    assert!(text.contains("float_matmul"), "{text}");
    assert!(text.contains("Frugal memory summary"));
    drop((a, b));
}
