//! Our f32 → f16 cast against Burn's own `Tensor::cast` on wgpu, bit for bit.
#![cfg(feature = "wgpu")]

use crate::common::*;
use burn::{
    backend::Wgpu,
    tensor::{DType, Tensor, TensorData},
};
use frugal_kernels::{FloatDtype, cast_f16_to_f32, cast_f32_to_f16};
use half::f16;

#[test]
fn f32_to_f16_matches_burns_cast_bit_for_bit() {
    let device = burn::backend::wgpu::WgpuDevice::default();
    let client = client();
    let mut input = awkward_f32();
    input.extend(spread_f32(10_007 - input.len(), 3));
    for len in [input.len(), 1_024, 5, 1] {
        let values = &input[..len];
        let tensor = Tensor::<Wgpu, 1>::from_data(TensorData::new(values.to_vec(), [len]), &device);
        let burn_bits: Vec<u16> = tensor
            .cast(DType::F16)
            .into_data()
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f16::to_bits)
            .collect();
        let handle = upload_f32(&client, values);
        let ours = read_u16(
            &client,
            &cast_f32_to_f16(&client, &handle, len).unwrap(),
            len,
        );
        assert_bits16(
            &ours,
            &burn_bits,
            f16_is_nan,
            &format!("ours vs burn, len {len}"),
        );
        // And both agree with `half` (so the comparison is not vacuous).
        let half_bits: Vec<u16> = values.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        assert_bits16(&burn_bits, &half_bits, f16_is_nan, "burn vs half");
    }
}

#[test]
fn f16_to_f32_matches_burns_cast_bit_for_bit() {
    let device = burn::backend::wgpu::WgpuDevice::default();
    let client = client();
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let tensor = Tensor::<Wgpu, 1>::from_data(
        TensorData::new(all.clone(), [all.len()]),
        (&device, DType::F16),
    );
    assert_eq!(tensor.dtype(), DType::F16);
    let burn_values = tensor.cast(DType::F32).into_data().to_vec::<f32>().unwrap();
    let bits: Vec<u16> = all.iter().map(|h| h.to_bits()).collect();
    let handle = upload_u16(&client, &bits);
    let ours = read_f32(
        &client,
        &cast_f16_to_f32(&client, &handle, bits.len()).unwrap(),
        bits.len(),
    );
    assert_bits32(&ours, &burn_values, "f16->f32 ours vs burn");
    assert!(FloatDtype::F16.is_supported(&client));
}
