//! Compressed storage, the budget's third eviction action, on Flex (bf16 and f16 on the CPU):
//! a tensor that cannot be recomputed is compressed rather than offloaded and reads back as
//! exactly its rounded value; under a budget that forces many evictions, live bytes stay
//! within the budget after every op and results stay within the storage type's rounding;
//! with compression off nothing is compressed and results are exact; backends without 16-bit
//! types are refused by name.

use burn::backend::{Flex, NdArray};
use burn::tensor::{DType, Tensor, TensorData};
use frugal::Frugal;
use frugal::memory;
use frugal::precision::LowPrecision;

type F = Frugal<Flex>;

/// Clears the budget and storage type however the test ends.
struct Reset;
impl Drop for Reset {
    fn drop(&mut self) {
        let device = Default::default();
        memory::set_budget(&device, None);
        memory::set_storage_precision::<Flex>(&device, None).unwrap();
    }
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn floats(t: TensorData) -> Vec<f32> {
    t.convert::<f32>().to_vec::<f32>().unwrap()
}

#[test]
fn an_upload_is_compressed_not_offloaded_and_reads_back_rounded() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = Default::default();
    for low in [LowPrecision::BF16, LowPrecision::F16] {
        let data = TensorData::new(values(64 * 1024, 1), [256, 256]);
        let rounded = floats(
            Tensor::<Flex, 2>::from_data(data.clone(), &device)
                .cast(low.dtype())
                .cast(DType::F32)
                .into_data(),
        );
        memory::set_storage_precision::<Flex>(&device, Some(low)).unwrap();
        assert_eq!(memory::storage_precision(&device), Some(low));
        memory::set_budget(&device, Some(100 * 1024 * 1024));
        let start = memory::remat_stats(&device);
        let t = Tensor::<F, 2>::from_data(data, &device);
        // The budget drops below the tensor's 256 KiB: it must go somewhere.
        let before = memory::live_bytes(&device);
        memory::set_budget(&device, Some(before - 100 * 1024));
        let stats = memory::remat_stats(&device).since(&start);
        assert_eq!(stats.compressions, 1, "{low:?}: {stats:?}");
        assert_eq!(
            stats.offloads, 0,
            "{low:?}: compression is preferred to offload"
        );
        assert_eq!(stats.compressed_bytes, 256 * 1024);
        assert_eq!(
            memory::live_bytes(&device),
            before - 128 * 1024,
            "half is freed"
        );
        memory::set_budget(&device, None);
        let back = floats(t.into_data());
        let same = back
            .iter()
            .zip(&rounded)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{low:?}: a compressed tensor reads back as its rounded value"
        );
        assert_eq!(memory::remat_stats(&device).since(&start).decompressions, 1);
    }
}

#[test]
fn without_compression_the_same_tensor_is_offloaded_exactly() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = Default::default();
    let data = TensorData::new(values(64 * 1024, 2), [256, 256]);
    let exact = floats(data.clone());
    memory::set_budget(&device, Some(100 * 1024 * 1024));
    let start = memory::remat_stats(&device);
    let t = Tensor::<F, 2>::from_data(data, &device);
    memory::set_budget(&device, Some(memory::live_bytes(&device) - 100 * 1024));
    let stats = memory::remat_stats(&device).since(&start);
    assert_eq!((stats.compressions, stats.offloads), (0, 1));
    memory::set_budget(&device, None);
    assert_eq!(floats(t.into_data()), exact);
}

#[test]
fn many_products_stay_within_budget_and_rounding() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = Default::default();
    let n = 192;
    let x_data = TensorData::new(values(n * n, 3), [n, n]);
    let ws: Vec<TensorData> = (0..12)
        .map(|i| TensorData::new(values(n * n, 10 + i), [n, n]))
        .collect();
    let expected: Vec<Vec<f32>> = ws
        .iter()
        .map(|w| {
            let x = Tensor::<Flex, 2>::from_data(x_data.clone(), &device);
            floats(
                (x.clone()
                    .matmul(Tensor::from_data(w.clone(), &device))
                    .tanh()
                    * x)
                    .into_data(),
            )
        })
        .collect();

    let bytes = (n * n * 4) as u64;
    let budget = memory::live_bytes(&device) + 8 * bytes;
    memory::set_storage_precision::<Flex>(&device, Some(LowPrecision::BF16)).unwrap();
    memory::set_budget(&device, Some(budget));
    let start = memory::remat_stats(&device);
    let x = Tensor::<F, 2>::from_data(x_data, &device);
    let mut held = Vec::new();
    for w in &ws {
        let w = Tensor::<F, 2>::from_data(w.clone(), &device);
        held.push(x.clone().matmul(w).tanh() * x.clone());
        assert!(
            memory::live_bytes(&device) <= budget,
            "live bytes over the budget"
        );
    }
    let stats = memory::remat_stats(&device).since(&start);
    assert!(stats.compressions > 0, "{stats:?}");
    for (got, want) in held.into_iter().zip(&expected) {
        let got = floats(got.into_data());
        assert!(
            memory::live_bytes(&device) <= budget,
            "live bytes over the budget on reads"
        );
        for (g, w) in got.iter().zip(want) {
            // Inputs and results may each have been rounded to bf16 (8 bits of mantissa) once;
            // products of n terms of size ~1 then differ by a few parts in 2^8 of their scale.
            assert!((g - w).abs() <= 0.05 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}

#[test]
fn backends_without_16_bit_types_are_refused() {
    let err =
        memory::set_storage_precision::<NdArray>(&Default::default(), Some(LowPrecision::F16))
            .unwrap_err()
            .to_string();
    assert!(err.contains("F16") && err.contains("ndarray"), "{err}");
    assert_eq!(
        memory::storage_precision(&burn::backend::ndarray::NdArrayDevice::Cpu),
        None
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Step {
        /// Upload a new 32×32 tensor.
        Upload(u64),
        /// `held[a] · held[b]`, scaled down to keep values near 1.
        MatMul(usize, usize),
        /// `held[a] + held[b]`.
        Add(usize, usize),
        /// `tanh(held[a])`.
        Tanh(usize),
        /// Read `held[a]` and compare with its f32 shadow.
        Read(usize),
        /// Drop `held[a]`.
        Drop(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            2 => any::<u64>().prop_map(Step::Upload),
            3 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Step::MatMul(a, b)),
            2 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Step::Add(a, b)),
            2 => any::<usize>().prop_map(Step::Tanh),
            2 => any::<usize>().prop_map(Step::Read),
            2 => any::<usize>().prop_map(Step::Drop),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// With compression on, after every op live bytes are within the budget, reads stay
        /// within bf16's rounding of the exact values, and dropping everything returns live
        /// and host bytes to where they were.
        #[test]
        fn budget_kept_and_nothing_leaks_with_compression(
            steps in proptest::collection::vec(step(), 1..60),
            budget_tensors in 3u64..8,
            f16 in any::<bool>(),
        ) {
            let _turn = crate::serial();
            let _reset = Reset;
            let device = Default::default();
            let low = if f16 { LowPrecision::F16 } else { LowPrecision::BF16 };
            let n = 32;
            let bytes = (n * n * 4) as u64;
            let base = memory::live_bytes(&device);
            let host_base = memory::remat_stats(&device).host_bytes;
            let budget = base + budget_tensors * bytes;
            memory::set_storage_precision::<Flex>(&device, Some(low)).unwrap();
            memory::set_budget(&device, Some(budget));
            let mut held: Vec<(Tensor<F, 2>, Tensor<Flex, 2>)> = Vec::new();
            for step in steps {
                let pick = |i: usize| i % held.len().max(1);
                match step {
                    Step::Upload(seed) => {
                        let data = TensorData::new(values(n * n, seed), [n, n]);
                        held.push((
                            Tensor::from_data(data.clone(), &device),
                            Tensor::from_data(data, &device),
                        ));
                    }
                    _ if held.is_empty() => continue,
                    Step::MatMul(a, b) => {
                        let (a, b) = (&held[pick(a)], &held[pick(b)]);
                        let scale = 1.0 / n as f32;
                        held.push((
                            a.0.clone().matmul(b.0.clone()) * scale,
                            a.1.clone().matmul(b.1.clone()) * scale,
                        ));
                    }
                    Step::Add(a, b) => {
                        let (a, b) = (&held[pick(a)], &held[pick(b)]);
                        held.push((a.0.clone() + b.0.clone(), a.1.clone() + b.1.clone()));
                    }
                    Step::Tanh(a) => {
                        let a = &held[pick(a)];
                        held.push((a.0.clone().tanh(), a.1.clone().tanh()));
                    }
                    Step::Read(a) => {
                        let (got, want) = &held[pick(a)];
                        let got = floats(got.clone().into_data());
                        let want = floats(want.clone().into_data());
                        for (g, w) in got.iter().zip(&want) {
                            // Each value may pass through a few roundings to 8 (bf16) or 11
                            // (f16) bits of mantissa along its chain of ops.
                            prop_assert!((g - w).abs() <= 0.06 * w.abs().max(1.0), "{} vs {}", g, w);
                        }
                    }
                    Step::Drop(a) => {
                        let at = pick(a);
                        held.remove(at);
                    }
                }
                prop_assert!(
                    memory::live_bytes(&device) <= budget,
                    "live {} over budget {}", memory::live_bytes(&device), budget
                );
            }
            drop(held);
            prop_assert_eq!(memory::live_bytes(&device), base, "device bytes leaked");
            prop_assert_eq!(memory::remat_stats(&device).host_bytes, host_base, "host bytes leaked");
        }
    }
}
