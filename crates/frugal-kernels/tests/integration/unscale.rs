//! The fused unscale + non-finite check over many gradient buffers (wgpu or CUDA).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use cubecl::server::Handle;
use frugal_kernels::{
    FoundInf, KernelError, unscale_and_check, unscale_and_check_into, unscale_group_size,
    vector_size_for,
};

/// Buffer lengths of a small model's gradients: empty, single, odd, vector multiples, and two
/// big enough that the grid-stride loop takes a second turn (one pass covers at most 4096 cubes
/// × 256 units, times the vector width).
const GRAD_LENS: [usize; 14] = [
    768, 0, 1, 3, 4, 5, 4_099, 1_024, 50_257, 7, 8, 4_194_312, 2_048, 1_048_579,
];

struct Grads {
    host: Vec<Vec<f32>>,
    handles: Vec<Handle>,
}

fn make_grads(
    client: &cubecl::client::ComputeClient<R>,
    plant: Option<(usize, usize, f32)>,
) -> Grads {
    let mut host: Vec<Vec<f32>> = GRAD_LENS
        .iter()
        .enumerate()
        .map(|(i, &len)| grads_f32(len, i as u64 + 11))
        .collect();
    if let Some((buffer, index, value)) = plant {
        host[buffer][index] = value;
    }
    let handles = host.iter().map(|g| upload_f32(client, g)).collect();
    Grads { host, handles }
}

fn refs(grads: &Grads) -> Vec<(&Handle, usize)> {
    grads
        .handles
        .iter()
        .zip(&grads.host)
        .map(|(h, g)| (h, g.len()))
        .collect()
}

fn assert_unscaled(client: &cubecl::client::ComputeClient<R>, grads: &Grads, inv_scale: f32) {
    for (i, (handle, host)) in grads.handles.iter().zip(&grads.host).enumerate() {
        let actual = read_f32(client, handle, host.len());
        let expected: Vec<f32> = host.iter().map(|&g| g * inv_scale).collect();
        assert_bits32(
            &actual,
            &expected,
            &format!("grads[{i}] (len {})", host.len()),
        );
    }
}

#[test]
fn clean_gradients_are_unscaled_and_the_flag_stays_clear() {
    let client = client();
    for inv_scale in [1.0 / 65536.0, 0.3f32] {
        let grads = make_grads(&client, None);
        let found = unscale_and_check(&client, &refs(&grads), inv_scale).unwrap();
        assert!(
            !found.read(&client).unwrap(),
            "no inf/NaN planted, inv_scale {inv_scale}"
        );
        assert_unscaled(&client, &grads, inv_scale);
    }
}

#[test]
fn a_planted_non_finite_raises_the_flag_and_everything_is_still_unscaled() {
    let client = client();
    // (buffer, index, value): the last element of an odd-length buffer, the middle of a
    // vectorised one, the far end of the big buffer (reached only on a later grid-stride turn),
    // a single-element buffer.
    let plants = [
        (6, 4_098, f32::INFINITY),
        (8, 25_000, f32::NAN),
        (11, 4_194_311, f32::NEG_INFINITY),
        (13, 1_048_578, f32::NAN),
        (2, 0, f32::INFINITY),
    ];
    for plant in plants {
        let grads = make_grads(&client, Some(plant));
        let inv_scale = 1.0 / 1024.0;
        let found = unscale_and_check(&client, &refs(&grads), inv_scale).unwrap();
        assert!(found.read(&client).unwrap(), "planted {plant:?} not found");
        assert_unscaled(&client, &grads, inv_scale);
    }
}

#[test]
fn few_launches_for_many_buffers() {
    let client = client();
    // 60 buffers: 30 with a length divisible by every vector width, 30 odd.
    let host: Vec<Vec<f32>> = (0..60)
        .map(|i| grads_f32(if i % 2 == 0 { 64 * (i + 1) } else { 61 * i + 1 }, i as u64))
        .collect();
    let handles: Vec<Handle> = host.iter().map(|g| upload_f32(&client, g)).collect();
    let grads: Vec<(&Handle, usize)> = handles
        .iter()
        .zip(&host)
        .map(|(h, g)| (h, g.len()))
        .collect();
    let found = FoundInf::new(&client);
    let launches = unscale_and_check_into(&client, &grads, 0.5, &found).unwrap();
    let group = unscale_group_size(&client);
    let mut sizes: Vec<usize> = grads
        .iter()
        .map(|(_, len)| vector_size_for(&client, *len, 4))
        .collect();
    sizes.sort();
    sizes.dedup();
    let bound: usize = sizes
        .iter()
        .map(|&v| {
            grads
                .iter()
                .filter(|(_, len)| vector_size_for(&client, *len, 4) == v)
                .count()
                .div_ceil(group)
        })
        .sum();
    assert_eq!(
        launches, bound,
        "group size {group}, vector sizes {sizes:?}"
    );
    assert!(
        launches < grads.len() / 2,
        "{launches} launches for {} buffers",
        grads.len()
    );
    assert!(!found.read(&client).unwrap());
    for (handle, host) in handles.iter().zip(&host) {
        let expected: Vec<f32> = host.iter().map(|g| g * 0.5).collect();
        assert_bits32(
            &read_f32(&client, handle, host.len()),
            &expected,
            "many buffers",
        );
    }
}

#[test]
fn a_shared_flag_accumulates_over_calls() {
    let client = client();
    let clean = upload_f32(&client, &[1.0, 2.0, 3.0]);
    let dirty = upload_f32(&client, &[1.0, f32::NAN, 3.0, 4.0]);
    let found = FoundInf::new(&client);
    unscale_and_check_into(&client, &[(&clean, 3)], 0.5, &found).unwrap();
    assert!(!found.read(&client).unwrap());
    unscale_and_check_into(&client, &[(&dirty, 4)], 0.5, &found).unwrap();
    assert!(found.read(&client).unwrap());
    // A later clean call does not clear it.
    unscale_and_check_into(&client, &[(&clean, 3)], 0.5, &found).unwrap();
    assert!(found.read(&client).unwrap());
    assert_eq!(read_f32(&client, &clean, 3), [0.25, 0.5, 0.75]);
}

#[test]
fn overflow_of_the_product_counts_as_non_finite() {
    let client = client();
    let big = upload_f32(&client, &[3e38, 1.0]);
    let found = unscale_and_check(&client, &[(&big, 2)], 2.0).unwrap();
    assert!(found.read(&client).unwrap());
}

#[test]
fn empty_input_and_invalid_arguments() {
    let client = client();
    let found = unscale_and_check(&client, &[], 0.5).unwrap();
    assert!(!found.read(&client).unwrap());
    let handle = upload_f32(&client, &[1.0, 2.0]);
    for bad in [0.0f32, -0.5, f32::NAN, f32::INFINITY] {
        let err = unscale_and_check(&client, &[(&handle, 2)], bad).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::InvalidScale {
                    what: "inv_scale",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // A too-small buffer anywhere in the list is rejected before anything runs.
    let err = unscale_and_check(&client, &[(&handle, 2), (&handle, 3)], 0.5).unwrap_err();
    assert_eq!(
        err,
        KernelError::BufferTooSmall {
            what: "grads[1]".into(),
            len: 3,
            needed_bytes: 12,
            actual_bytes: 8
        }
    );
    assert_eq!(
        read_f32(&client, &handle, 2),
        [1.0, 2.0],
        "nothing was launched"
    );
}
