//! Collectives on two GPUs (feature `distributed`): Burn's all-reduce on `FrugalCuda`, and
//! tensors moved between GPUs, which then go through NCCL's send and receive.
//!
//! Needs two GPUs and NCCL where cudarc finds it (`libnccl.so` on the loader's path: see
//! `docs/guide/frugal-cuda.md`); with fewer GPUs each test says so and checks nothing, and
//! without NCCL it fails with the error that says what to do. Run on a machine of two GPUs:
//! `cargo test --release -p frugal-cuda --features distributed --test collectives`.
#![cfg(feature = "distributed")]

use std::sync::Mutex;

use burn_backend::distributed::{DistributedBackend, ReduceOperation};
use burn_backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn_backend::tensor::FloatTensor;
use burn_backend::{BoolStore, DType, DeviceOps, FloatDType, TensorData};
use cubecl_common::future::block_on;
use frugal_cuda::{FrugalCuda, FrugalCudaDevice};

type B = FrugalCuda;

/// The tests share one NCCL communicator (devices 0 and 1), and NCCL needs the operations on a
/// communicator issued in the same order on every device: tests running side by side would
/// interleave theirs differently on each device and wait on each other for ever.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn two_gpus() -> Option<[FrugalCudaDevice; 2]> {
    match frugal_cuda::device_count() {
        Ok(count) if count >= 2 => {
            assert!(
                frugal_cuda::nccl_available(),
                "two GPUs but no NCCL that cudarc can load: see docs/guide/frugal-cuda.md"
            );
            Some([FrugalCudaDevice::new(0), FrugalCudaDevice::new(1)])
        }
        Ok(count) => {
            eprintln!("{count} GPU(s), nothing checked: this needs two");
            None
        }
        Err(e) => {
            eprintln!("no GPU, nothing checked: {e}");
            None
        }
    }
}

/// Says which step a test has reached: a collective that waits for ever shows where it stopped
/// (run with `--nocapture`).
fn stage(what: &str) {
    eprintln!("collectives: {what}");
}

fn floats(tensor: FloatTensor<B>) -> Vec<f32> {
    block_on(B::float_into_data(tensor))
        .expect("the device answers")
        .to_vec::<f32>()
        .expect("f32 values")
}

/// Each device holds its own values and reduces them with the other's, from a thread of its
/// own as in Burn's data-parallel training (the first all-reduce over a set of devices waits
/// until every device has joined the communicator).
fn all_reduce(devices: [FrugalCudaDevice; 2], op: ReduceOperation) -> [Vec<f32>; 2] {
    let n = 1 << 20;
    let ids: Vec<_> = devices.iter().map(|d| d.id()).collect();
    std::thread::scope(|scope| {
        let threads = [0usize, 1].map(|rank| {
            let ids = ids.clone();
            let device = devices[rank];
            scope.spawn(move || {
                let values: Vec<f32> = (0..n)
                    .map(|i| ((i % 1000) as f32) * 10f32.powi(rank as i32))
                    .collect();
                let tensor = B::float_from_data(TensorData::new(values, [n]), &device);
                floats(B::all_reduce(tensor, op, ids).resolve())
            })
        });
        threads.map(|thread| thread.join().expect("the device's thread"))
    })
}

#[test]
fn an_all_reduce_gives_both_devices_the_sum_and_the_mean() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = two_gpus() else { return };
    // Device 0 holds v, device 1 holds 10 v (v below 1000): sums and means are exact in f32.
    let [sum0, sum1] = all_reduce(devices, ReduceOperation::Sum);
    let expected: Vec<f32> = (0..sum0.len())
        .map(|i| ((i % 1000) as f32) * 11.0)
        .collect();
    assert_eq!(sum0, expected);
    assert_eq!(sum1, expected);
    let [mean0, mean1] = all_reduce(devices, ReduceOperation::Mean);
    let expected: Vec<f32> = expected.iter().map(|v| v / 2.0).collect();
    assert_eq!(mean0, expected);
    assert_eq!(mean1, expected);
}

#[test]
fn tensors_of_every_kind_move_between_gpus_and_back() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some([first, second]) = two_gpus() else {
        return;
    };
    let n = 4 << 20;
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let tensor = B::float_from_data(TensorData::new(values.clone(), [n]), &first);
    // The source is dropped as it is moved. Its block must stay allocated until NCCL has sent
    // it: otherwise the tensors made next on the first device may take it and overwrite it
    // while it is being sent (a race, so this is evidence, not proof).
    stage("f32 from the first GPU to the second");
    let moved = B::float_to_device(tensor, &second);
    let overwrites: Vec<_> = (0..4)
        .map(|_| B::float_zeros([n].into(), &first, FloatDType::F32))
        .collect();
    assert_eq!(B::float_device(&moved), second);
    stage("f32 read on the second GPU");
    assert_eq!(floats(moved.clone()), values);
    stage("f32 back to the first GPU");
    let back = B::float_to_device(moved, &first);
    assert_eq!(floats(back), values);
    drop(overwrites);

    // A transposed tensor is copied into CubeCL's pitched layout before it moves (rows of
    // 1000 f32 padded): the padded region moves whole and keeps its strides.
    let rows: Vec<f32> = (0..3000).map(|i| i as f32 * 0.5).collect();
    let tensor = B::float_from_data(TensorData::new(rows.clone(), [1000, 3]), &first);
    stage("a transposed f32 from the first GPU to the second");
    let moved = B::float_to_device(B::float_transpose(tensor.clone()), &second);
    stage("the transposed f32 read on the second GPU");
    assert_eq!(floats(moved), floats(B::float_transpose(tensor)));

    // Sent as bytes: integers and booleans move too (cubecl-cuda refuses booleans).
    let ints: Vec<i32> = (0..1000).map(|i| i * 7 - 3000).collect();
    let tensor = B::int_from_data(TensorData::new(ints.clone(), [1000]), &first);
    stage("i32 from the first GPU to the second");
    let moved = B::int_to_device(tensor, &second);
    stage("i32 read on the second GPU");
    let data = block_on(B::int_into_data(moved)).expect("the device answers");
    assert_eq!(data.to_vec::<i32>().expect("i32 values"), ints);

    // Booleans as CubeCL stores them, one byte each.
    let bools: Vec<u8> = (0..1001).map(|i| u8::from(i % 3 == 0)).collect();
    let data = TensorData::from_bytes_vec(bools.clone(), [1001], DType::Bool(BoolStore::U8));
    let tensor = B::bool_from_data(data, &first);
    stage("bool from the first GPU to the second");
    let moved = B::bool_to_device(tensor, &second);
    stage("bool read on the second GPU");
    let data = block_on(B::bool_into_data(moved)).expect("the device answers");
    assert_eq!(data.as_bytes(), bools.as_slice());
}
