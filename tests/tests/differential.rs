//! Every forwarded Backend method, run on NdArray and on Frugal<NdArray> with the same inputs:
//! the outputs must be equal bit for bit (or both runs must panic the same way).

use frugal_tests::cases;

fn check(name: &str, cases: Vec<frugal_tests::Case>) {
    let unsupported = frugal_tests::check_cases(&cases);
    if !unsupported.is_empty() {
        eprintln!("{name}: NdArray panics (and so does Frugal, identically) in {unsupported:?}");
    }
}

#[test]
fn backend_and_transaction_methods() {
    check("backend", cases::backend::cases());
}

#[test]
fn float_ops() {
    check("float", cases::float::cases());
}

#[test]
fn int_ops() {
    check("int", cases::int::cases());
}

#[test]
fn bool_ops() {
    check("bool", cases::bool::cases());
}

#[test]
fn quantized_ops() {
    check("quantized", cases::qtensor::cases());
}

#[test]
fn module_ops() {
    check("module", cases::module::cases());
}

#[test]
fn activation_ops() {
    check("activation", cases::activation::cases());
}

#[cfg(feature = "wgpu")]
#[test]
fn all_ops_on_wgpu() {
    let unsupported = frugal_tests::check_cases_wgpu(&cases::all());
    eprintln!("wgpu: {} cases panic on Wgpu and Frugal<Wgpu> alike: {unsupported:?}", unsupported.len());
}
