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
    let _serial = crate::serial();
    check("backend", cases::backend::cases());
}

#[test]
fn float_ops() {
    let _serial = crate::serial();
    check("float", cases::float::cases());
}

#[test]
fn int_ops() {
    let _serial = crate::serial();
    check("int", cases::int::cases());
}

#[test]
fn bool_ops() {
    let _serial = crate::serial();
    check("bool", cases::bool::cases());
}

#[test]
fn quantized_ops() {
    let _serial = crate::serial();
    check("quantized", cases::qtensor::cases());
}

#[test]
fn module_ops() {
    let _serial = crate::serial();
    check("module", cases::module::cases());
}

#[test]
fn activation_ops() {
    let _serial = crate::serial();
    check("activation", cases::activation::cases());
}

/// Child-process entry for the device tests below; does nothing unless one of them starts it.
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
#[test]
#[ignore = "helper process of all_ops_on_wgpu and all_ops_on_frugal_cuda"]
fn side_runner() {
    let (Ok(side), Ok(from)) = (
        std::env::var("FRUGAL_SIDE"),
        std::env::var("FRUGAL_SIDE_FROM"),
    ) else {
        return;
    };
    frugal_tests::run_side(&cases::all(), &side, from.parse().unwrap());
}

/// Runs one side of every case in child processes, restarting after each panic, and returns
/// each case's result line (`ok <digest>` or `panic <message>`).
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
fn side(side: &str, count: usize) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let exe = std::env::current_exe().unwrap();
    let mut results = vec![String::new(); count];
    let mut next = 0;
    while next < count {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "differential::side_runner",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FRUGAL_SIDE", side)
            .env("FRUGAL_SIDE_FROM", next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("test binary starts");
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut last_line = Instant::now();
        let mut progressed = false;
        loop {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(line) => {
                    last_line = Instant::now();
                    if let Some(rest) = line.strip_prefix("CASE ") {
                        let mut parts = rest.splitn(3, ' ');
                        let index: usize = parts.next().unwrap().parse().unwrap();
                        let _name = parts.next();
                        results[index] = parts.next().unwrap_or_default().to_string();
                        next = index + 1;
                        progressed = true;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // A case that hangs (e.g. a dead fusion server) is recorded as such.
                    if last_line.elapsed() > Duration::from_secs(300) {
                        let _ = child.kill();
                        results[next] = "timeout".into();
                        next += 1;
                        progressed = true;
                        break;
                    }
                }
            }
        }
        let _ = child.wait();
        if !progressed {
            results[next] = "crashed".into();
            next += 1;
        }
    }
    results
}

/// Compares a reference side (run twice) with a second side on every case: same digests of the
/// outputs, or the same panic message. A case whose two reference runs differ (or listed in
/// `vary`) is nondeterministic on the reference itself (e.g. atomic float adds in a backward
/// kernel), so for it the second side must only succeed or fail as the reference does.
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
fn compare_sides(reference: &str, other: &str, vary: &[&str]) {
    let all = cases::all();
    // Three processes at a time: each keeps about one core busy, so side by side they take
    // little longer than one alone.
    let (inner, again, wrapped) = std::thread::scope(|s| {
        let inner = s.spawn(|| side(reference, all.len()));
        let again = s.spawn(|| side(reference, all.len()));
        let wrapped = side(other, all.len());
        (inner.join().unwrap(), again.join().unwrap(), wrapped)
    });
    let mut differ = Vec::new();
    let mut unsupported = Vec::new();
    let mut nondeterministic = Vec::new();
    for (i, case) in all.iter().enumerate() {
        let ok = |r: &str| r.starts_with("ok");
        let varies = inner[i] != again[i] || vary.contains(&case.name);
        if varies && ok(&inner[i]) && ok(&again[i]) {
            nondeterministic.push(case.name);
            if !ok(&wrapped[i]) {
                differ.push(format!(
                    "{}: {reference} ok / {other} {:?}",
                    case.name, wrapped[i]
                ));
            }
        } else if inner[i] != wrapped[i] {
            differ.push(format!(
                "{}: {reference} {:?} / {other} {:?}",
                case.name, inner[i], wrapped[i]
            ));
        } else if !ok(&inner[i]) {
            unsupported.push(case.name);
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} cases differ between {reference} and {other}:\n{}",
        differ.len(),
        all.len(),
        differ.join("\n")
    );
    assert!(
        unsupported.len() + nondeterministic.len() < all.len() / 4,
        "too many cases fail or vary on {reference}: {unsupported:?} {nondeterministic:?}"
    );
    eprintln!(
        "{reference} vs {other}: {} of {} cases bit-identical; {} fail on both alike: \
         {unsupported:?}; {} vary between runs of {reference} itself: {nondeterministic:?}",
        all.len() - unsupported.len() - nondeterministic.len(),
        all.len(),
        unsupported.len(),
        nondeterministic.len()
    );
}

/// Every case on wgpu (Mesa's lavapipe in CI) and on Frugal<Wgpu>. Two runs can agree by
/// chance, so the cases seen to vary are always treated as varying: atomic float adds, and the
/// ops burn-cubecl autotunes among kernels that sum in different orders (each process picks
/// by timing, so three processes side by side need not pick alike): `conv2d_x_backward`, and
/// the transposed convolutions (direct or col2im).
#[cfg(feature = "wgpu")]
#[test]
fn all_ops_on_wgpu() {
    let _serial = crate::serial();
    compare_sides(
        "wgpu",
        "frugal-wgpu",
        &[
            "float_scatter_nd",
            "deform_conv2d_backward",
            "conv2d_x_backward",
            "conv_transpose1d",
            "conv_transpose2d",
        ],
    );
}

/// Every case on burn-cuda and on frugal-cuda's runtime (same kernels, another allocator):
/// needs a GPU, so it runs through the device tool, not in CI. The device cases return the
/// device itself, whose name differs (`Cuda(0)` / `FrugalCuda(0)`), so for them both sides
/// only have to succeed.
#[cfg(feature = "frugal-cuda")]
#[test]
fn all_ops_on_frugal_cuda() {
    let _serial = crate::serial();
    compare_sides(
        "cuda",
        "frugal-cuda",
        &[
            "float_device",
            "float_to_device",
            "int_device",
            "int_to_device",
        ],
    );
}
