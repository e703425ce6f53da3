//! The remedies for running out of memory that Frugal offers a training loop: gradient
//! accumulation and auto-fit. One test binary, one device at a time: auto-fit reads the
//! device's peak, which another test's tensors would disturb.

mod accumulation;
mod auto_fit;

/// Held by every test here while it uses the NdArray device.
static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes the device for one test (a failed test's poisoned lock is taken all the same).
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    DEVICE.lock().unwrap_or_else(|e| e.into_inner())
}
