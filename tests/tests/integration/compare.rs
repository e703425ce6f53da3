//! The judgement of a case's runs ([`frugal_tests::compare`]), on synthetic runs: the
//! mechanism that keeps the device tests from failing by chance, tested without a device and
//! without waiting for chance. (Here rather than beside the mechanism: frugal-tests' library is
//! not built as a test harness.)

use burn::tensor::DType;
use frugal_tests::compare::{self, ABS_TOL, REL_TOL, Reading, Run, Verdict};

/// A successful run whose one output is an f32 tensor of `values`.
fn run(values: &[f64]) -> Run {
    let readings = vec![
        Reading::Exact(7),
        Reading::Floats {
            dtype: DType::F32,
            shape: vec![values.len()],
            values: values.to_vec(),
        },
    ];
    let result = format!("ok {:016x}", compare::digest(&compare::encode(&readings)));
    Run {
        result,
        readings: Some(readings),
    }
}

fn judge(reference: &[Run], wrapped: &[Run]) -> Verdict {
    compare::judge("plain", reference, "frugal", wrapped)
}

const A: [f64; 3] = [1.0, -0.5, 3.0];
/// `A` with its last value one f32 ulp up, as a sum in another order gives.
const A_REORDERED: [f64; 3] = [1.0, -0.5, 3.0 + 2.0 * f32::EPSILON as f64];

#[test]
fn all_alike_is_the_same() {
    assert_eq!(judge(&[run(&A), run(&A)], &[run(&A)]), Verdict::Same);
    let panic = Run {
        result: "panic not supported".into(),
        readings: None,
    };
    assert_eq!(
        judge(&[panic.clone(), panic.clone()], &[panic]),
        Verdict::Same
    );
}

#[test]
fn agreeing_reference_and_a_differing_wrapped_side_fail() {
    let verdict = judge(&vec![run(&A); 8], &vec![run(&A_REORDERED); 4]);
    assert!(
        matches!(&verdict, Verdict::Differ(why) if why.contains("repeats itself")),
        "{verdict:?}"
    );
}

#[test]
fn a_wrapped_side_that_varies_by_itself_is_judged_by_tolerance() {
    // One Frugal run of four summed in another order, the reference never did.
    let wrapped = [run(&A_REORDERED), run(&A), run(&A), run(&A)];
    assert!(matches!(
        judge(&vec![run(&A); 8], &wrapped),
        Verdict::Varies(_)
    ));
    let wrapped = [run(&[1.0, -0.5, 3.1]), run(&A), run(&A), run(&A)];
    assert!(matches!(
        judge(&vec![run(&A); 8], &wrapped),
        Verdict::Differ(_)
    ));
}

#[test]
fn varying_reference_and_a_wrapped_side_within_tolerance_pass() {
    let reference = [run(&A), run(&A_REORDERED), run(&A)];
    // Outside the reference's range, but by less than the tolerance.
    let near = [1.0, -0.5, 3.0 + 3.0 * REL_TOL / 2.0];
    let Verdict::Varies(spread) = judge(&reference, &[run(&near)]) else {
        panic!("within tolerance");
    };
    assert!(spread.reference > 0.0 && spread.used > 0.0 && spread.used <= 1.0);
}

#[test]
fn varying_reference_and_a_wrapped_side_far_outside_fail() {
    let reference = [run(&A), run(&A_REORDERED), run(&A)];
    for far in [
        [1.0, -0.5, 3.01],
        [1.0, -0.5 + 10.0 * ABS_TOL, 3.0],
        [1.0, f64::NAN, 3.0],
    ] {
        let verdict = judge(&reference, &[run(&far)]);
        assert!(
            matches!(&verdict, Verdict::Differ(why) if why.contains("element")),
            "{verdict:?}"
        );
    }
}

#[test]
fn outputs_other_than_floats_must_agree_exactly() {
    let reference = [run(&A), run(&A_REORDERED)];
    let mut wrapped = run(&A);
    wrapped.readings.as_mut().unwrap()[0] = Reading::Exact(8);
    wrapped.result = "ok 0000000000000001".into();
    assert!(matches!(judge(&reference, &[wrapped]), Verdict::Differ(_)));
}

#[test]
fn a_failure_beside_success_fails() {
    let crashed = Run {
        result: "crashed".into(),
        readings: None,
    };
    let reference = [run(&A), run(&A_REORDERED)];
    assert!(matches!(judge(&reference, &[crashed]), Verdict::Differ(_)));
}

#[test]
fn readings_cross_the_process_boundary_intact() {
    let readings = vec![
        Reading::Floats {
            dtype: DType::BF16,
            shape: vec![2, 3],
            values: vec![0.1, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1e-40, -7.5e30],
        },
        Reading::Exact(u64::MAX),
        Reading::Floats {
            dtype: DType::F32,
            shape: vec![2, 0],
            values: vec![],
        },
        Reading::Floats {
            dtype: DType::F16,
            shape: vec![],
            values: vec![2.5],
        },
    ];
    let decoded = compare::decode(&compare::encode(&readings)).unwrap();
    assert_eq!(decoded, readings);
    let Reading::Floats { values, .. } = &decoded[0] else {
        unreachable!()
    };
    assert!(values[1].is_sign_negative());
    assert_eq!(compare::decode(&compare::encode(&[])), Some(vec![]));
    let nan = compare::decode(&compare::encode(&[Reading::Floats {
        dtype: DType::F64,
        shape: vec![1],
        values: vec![f64::NAN],
    }]));
    assert!(matches!(&nan.unwrap()[0], Reading::Floats { values, .. } if values[0].is_nan()));
    assert_eq!(compare::decode("F32:2:1e0"), None, "a line cut short");
}
