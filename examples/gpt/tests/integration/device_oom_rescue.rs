//! On a GPU, through frugal-cuda without fusion: when the allocator cannot grow past its cap,
//! the budget's out-of-memory handler drops tensors it can recompute from inside the
//! allocation, the allocation is retried, and the work completes with the same values, the
//! cap kept. A rescue frees only tensors that no queued kernel still reads, so the test waits
//! for the device after each op. Built only with `--features frugal-cuda`; run on the GPU machine
//! (`docs/runs/2026-11-24-h100-oom-handler-rescue-2/`). Without a GPU it says so and checks nothing.
#![cfg(feature = "frugal-cuda")]

use burn::tensor::Tensor;

type B = frugal::Frugal<frugal_cuda::FrugalCudaUnfused>;

const MIB: u64 = 1 << 20;

#[test]
fn an_allocation_past_the_cap_is_rescued_by_dropping_recomputable_tensors() {
    let _serial = crate::serial();
    let device = frugal_cuda::FrugalCudaDevice::default();
    if let Err(e) = frugal_cuda::check_device(&device) {
        eprintln!("no GPU, nothing checked: {e}");
        return;
    }
    frugal_cuda::set_memory_cap(&device, Some(512 * MIB)).expect("a cap above what is reserved");
    // 64 MiB of f32 each.
    let n = (16 * MIB) as usize;
    let ones = Tensor::<B, 1>::ones([n], &device);
    // A budget far above the cap: the budget alone never evicts here, the handler must.
    frugal::memory::set_budget(&device, Some(8 << 30));
    // Sixteen live results of 64 MiB each (1 GiB) under a cap of 512 MiB. The device runs
    // work asynchronously, and a kernel queued but not yet run holds its inputs: a rescue can
    // free only tensors no queued work reads. So wait for the device after each op, as a
    // training loop does when it reads its loss.
    let sync = || <B as burn::tensor::backend::Backend>::sync(&device).expect("the device answers");
    let held: Vec<Tensor<B, 1>> = (0..16)
        .map(|i| {
            let t = ones.clone() * (i as f32 + 2.0) + 1.0;
            sync();
            t
        })
        .collect();
    let sum = held.iter().fold(ones.clone(), |sum, t| {
        let sum = sum + t.clone();
        sync();
        sum
    });
    let values = sum.into_data().to_vec::<f32>().expect("f32 values");
    let expected = 1.0 + (0..16).map(|i| i as f32 + 3.0).sum::<f32>();
    assert_eq!(values.len(), n);
    assert!(
        values.iter().all(|&v| v == expected),
        "{} != {expected}",
        values[0]
    );
    let stats = frugal::memory::remat_stats(&device);
    let report = frugal_cuda::memory_report(&device);
    eprintln!(
        "handler calls {}, rescues {}, dropped {} B, recomputed {} B; reserved {} B, peak \
         reserved {} B, registry failures {}",
        report.stats.oom_handler_calls,
        stats.allocation_rescues,
        stats.rescued_bytes,
        stats.recomputed_bytes,
        report.stats.reserved_bytes,
        report.stats.peak_reserved_bytes,
        report.registry.failures
    );
    assert!(stats.allocation_rescues >= 1 && stats.rescued_bytes >= 64 * MIB);
    assert!(
        stats.recomputed_bytes >= 64 * MIB,
        "the dropped tensors were read again"
    );
    assert_eq!(report.registry.failures, 0, "no allocation failed");
    assert!(report.stats.peak_reserved_bytes <= 512 * MIB);
    // The handler goes with the budget.
    frugal::memory::set_budget(&device, None);
    drop(held);
}
