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

/// Child-process entry for `all_ops_on_wgpu`; does nothing unless that test starts it.
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "helper process of all_ops_on_wgpu"]
fn wgpu_side_runner() {
    let (Ok(side), Ok(from)) = (
        std::env::var("FRUGAL_WGPU_SIDE"),
        std::env::var("FRUGAL_WGPU_FROM"),
    ) else {
        return;
    };
    frugal_tests::run_wgpu_side(&cases::all(), side == "wrapped", from.parse().unwrap());
}

/// Runs one side of every case on wgpu in child processes, restarting after each panic, and
/// returns each case's result line (`ok <digest>` or `panic <message>`).
#[cfg(feature = "wgpu")]
fn wgpu_side(side: &str, count: usize) -> Vec<String> {
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
                "wgpu_side_runner",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FRUGAL_WGPU_SIDE", side)
            .env("FRUGAL_WGPU_FROM", next.to_string())
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
        let started = Instant::now();
        let mut progressed = false;
        loop {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(line) => {
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
                    if started.elapsed() > Duration::from_secs(300) {
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

/// Every case on wgpu (Mesa's lavapipe in CI) and on Frugal<Wgpu>: same digests of the
/// outputs, or the same panic message. The inner side runs twice: a case whose two inner runs
/// differ is nondeterministic on wgpu itself (e.g. atomic float adds in a backward kernel), so
/// for it Frugal must only succeed or fail as the inner backend does. Two runs can agree by
/// chance, so the cases seen to vary (atomic float adds) are always treated that way.
#[cfg(feature = "wgpu")]
const VARY_ON_WGPU: &[&str] = &["float_scatter_nd", "deform_conv2d_backward"];

#[cfg(feature = "wgpu")]
#[test]
fn all_ops_on_wgpu() {
    let all = cases::all();
    let inner = wgpu_side("inner", all.len());
    let again = wgpu_side("inner", all.len());
    let wrapped = wgpu_side("wrapped", all.len());
    let mut differ = Vec::new();
    let mut unsupported = Vec::new();
    let mut nondeterministic = Vec::new();
    for (i, case) in all.iter().enumerate() {
        let ok = |r: &str| r.starts_with("ok");
        let varies = inner[i] != again[i] || VARY_ON_WGPU.contains(&case.name);
        if varies && ok(&inner[i]) && ok(&again[i]) {
            nondeterministic.push(case.name);
            if !ok(&wrapped[i]) {
                differ.push(format!("{}: wgpu ok / frugal {:?}", case.name, wrapped[i]));
            }
        } else if inner[i] != wrapped[i] {
            differ.push(format!(
                "{}: wgpu {:?} / frugal {:?}",
                case.name, inner[i], wrapped[i]
            ));
        } else if !ok(&inner[i]) {
            unsupported.push(case.name);
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} cases differ between Wgpu and Frugal<Wgpu>:\n{}",
        differ.len(),
        all.len(),
        differ.join("\n")
    );
    assert!(
        unsupported.len() + nondeterministic.len() < all.len() / 4,
        "too many cases fail or vary on wgpu: {unsupported:?} {nondeterministic:?}"
    );
    eprintln!(
        "wgpu: {} of {} cases bit-identical; {} fail on Wgpu and Frugal<Wgpu> alike: {unsupported:?}; \
         {} vary between runs of Wgpu itself: {nondeterministic:?}",
        all.len() - unsupported.len() - nondeterministic.len(),
        all.len(),
        unsupported.len(),
        nondeterministic.len()
    );
}
