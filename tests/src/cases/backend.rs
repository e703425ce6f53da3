//! Differential cases for the `Backend` methods themselves and for `TransactionOps`.

use burn::tensor::DType;
use burn::tensor::ops::TransactionPrimitive;

use crate::*;

crate::cases! {
    ad_enabled(device) {
        vec![Out::value(B::ad_enabled(device))]
    }
    memory_persistent_allocations(device) {
        let out = B::memory_persistent_allocations(device, 3, |x| {
            rf::<B>(float::<B>(&[x, 2], 1, device))
        });
        vec![out]
    }
    memory_cleanup(device) {
        let keep = float::<B>(&[8, 8], 1, device);
        B::memory_cleanup(device);
        vec![rf::<B>(keep)]
    }
    name(device) {
        // Frugal names itself `frugal<inner>`; compare the inner part.
        let name = B::name(device);
        vec![Out::value(name.trim_start_matches("frugal<").trim_end_matches('>').to_string())]
    }
    seed(device) {
        B::seed(device, 7);
        let a = B::float_random(shape(&[4, 4]), UNIFORM, device, float_dtype::<B>(device));
        B::seed(device, 7);
        let b = B::float_random(shape(&[4, 4]), UNIFORM, device, float_dtype::<B>(device));
        vec![rf::<B>(a), rf::<B>(b)]
    }
    sync(device) {
        let a = float::<B>(&[3, 3], 2, device);
        vec![Out::value(B::sync(device).is_ok()), rf::<B>(a)]
    }
    staging(device) {
        let mut data = vec![float_data(&[4], 3), float_data(&[2, 2], 4)];
        B::staging(data.iter_mut(), device);
        data.into_iter().map(|d| rf::<B>(B::float_from_data(d, device))).collect()
    }
    supports_dtype(device) {
        [DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8]
            .into_iter()
            .map(|dtype| Out::value(B::supports_dtype(device, dtype)))
            .collect()
    }
    dtype_usage(device) {
        [DType::F32, DType::BF16, DType::I64]
            .into_iter()
            .map(|dtype| Out::value(B::dtype_usage(device, dtype)))
            .collect()
    }
    device_count(device) {
        vec![Out::value(B::device_count(0))]
    }
    tr_execute(device) {
        let transaction = TransactionPrimitive::<B>::new(
            vec![float::<B>(&[2, 3], 1, device)],
            vec![quantized::<B>(&[4, 4], 2, device)],
            vec![int::<B>(&[5], -3, 3, 3, device)],
            vec![boolean::<B>(&[2, 2], 4, device)],
        );
        let data = burn::tensor::read_sync(B::tr_execute(transaction)).expect("transaction");
        data.read_floats
            .into_iter()
            .chain(data.read_qfloats)
            .chain(data.read_ints)
            .chain(data.read_bools)
            .map(Out::data)
            .collect()
    }
}
