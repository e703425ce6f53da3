//! burn-collective's local mode (an all-reduce between threads of one process, on any
//! backend, done with the backend's own ops) on `Frugal<Flex>`: what a hand-written
//! data-parallel loop uses where the backend has no collectives of its own. The reduced
//! tensors are Frugal's, charged to the ledger and freed with them.

use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_collective::{
    CollectiveConfig, PeerId, ReduceOperation, all_reduce, finish_collective, register,
};
use frugal::{Frugal, memory};

type B = Frugal<Flex>;

fn peer(id: u32, peers: usize, op: ReduceOperation) -> Vec<f32> {
    let device = FlexDevice;
    let config = CollectiveConfig::default().with_num_devices(peers);
    register::<B>(PeerId(id), device, config).expect("registered");
    let values: Vec<f32> = (0..6).map(|i| (id as f32 + 1.0) * i as f32).collect();
    let tensor = Tensor::<B, 1>::from_data(TensorData::new(values, [6]), &device);
    let reduced =
        all_reduce::<B>(PeerId(id), tensor.into_primitive().tensor(), op).expect("all-reduced");
    let reduced = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(reduced));
    let values = reduced.into_data().to_vec::<f32>().unwrap();
    finish_collective::<B>(PeerId(id)).expect("finished");
    values
}

#[test]
fn peers_on_threads_all_reduce_frugal_tensors_and_the_ledger_keeps_count() {
    let device = FlexDevice;
    let live_before = memory::live_bytes(&device);
    let peers = 3;
    let results: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..peers as u32)
            .map(|id| scope.spawn(move || peer(id, peers, ReduceOperation::Mean)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Peer p holds (p + 1) * i: the mean over peers 1, 2, 3 is 2 * i.
    let expected: Vec<f32> = (0..6).map(|i| 2.0 * i as f32).collect();
    for result in &results {
        assert_eq!(result, &expected);
    }
    assert!(
        memory::peak_bytes(&device) >= (peers * 6 * 4) as u64,
        "the peers' tensors were charged"
    );
    assert_eq!(
        memory::live_bytes(&device),
        live_before,
        "every tensor the collective made was freed with its handle"
    );
}
