//! Every forwarded Backend method, run on NdArray and on Frugal<NdArray> with the same inputs:
//! the outputs must be equal bit for bit (or both runs must panic the same way).

use frugal_tests::cases;
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
use frugal_tests::compare::{self, ABS_TOL, REL_TOL, Run, SPREAD_WIDENING, Verdict};

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
    let (Ok(side), Ok(indices)) = (
        std::env::var("FRUGAL_SIDE"),
        std::env::var("FRUGAL_SIDE_CASES"),
    ) else {
        return;
    };
    let indices: Vec<usize> = indices.split(',').map(|i| i.parse().unwrap()).collect();
    frugal_tests::run_side(&cases::all(), &side, &indices);
}

/// Runs one side of the cases at `indices` in child processes, restarting after each panic,
/// crash or hang, and returns each case's run, in the order of `indices`.
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
fn side(side: &str, indices: &[usize]) -> Vec<Run> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let exe = std::env::current_exe().unwrap();
    let failed = |result: &str| Run {
        result: result.into(),
        readings: None,
    };
    let mut runs = vec![failed("crashed"); indices.len()];
    let mut next = 0;
    while next < indices.len() {
        let remaining: Vec<String> = indices[next..].iter().map(usize::to_string).collect();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "differential::side_runner",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FRUGAL_SIDE", side)
            .env("FRUGAL_SIDE_CASES", remaining.join(","))
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
                    // Not a prefix: libtest prints `test differential::side_runner ... ` before
                    // the test's own output, on the same line as the first case.
                    let Some((_, rest)) = line.split_once("CASE ") else {
                        continue;
                    };
                    let mut parts = rest.splitn(3, ' ');
                    // The child runs its cases in the order given, from `next` on; a line it
                    // left cut short by dying counts as no line.
                    let Some(at) = parts
                        .next()
                        .and_then(|index| index.parse::<usize>().ok())
                        .and_then(|index| indices[next..].iter().position(|&i| i == index))
                        .map(|offset| next + offset)
                    else {
                        continue;
                    };
                    let _name = parts.next();
                    let result = parts.next().unwrap_or_default();
                    runs[at] = match result.strip_prefix("ok ") {
                        Some(ok) => {
                            let (digest, readings) = ok.split_once(' ').unwrap_or((ok, ""));
                            Run {
                                result: format!("ok {digest}"),
                                readings: compare::decode(readings),
                            }
                        }
                        None => failed(result),
                    };
                    next = at + 1;
                    progressed = true;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // A case that hangs (e.g. a dead fusion server) is recorded as such.
                    if last_line.elapsed() > Duration::from_secs(300) {
                        let _ = child.kill();
                        runs[next] = failed("timeout");
                        next += 1;
                        progressed = true;
                        break;
                    }
                }
            }
        }
        let _ = child.wait();
        if !progressed {
            runs[next] = failed("crashed");
            next += 1;
        }
    }
    runs
}

/// How many more rounds, each like the first, run the cases that differed in the first: with
/// the first's, eight reference runs and four of the other side show whether each side repeats
/// itself, and the range the reference's values take.
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
const MORE_ROUNDS: usize = 3;

/// One round: the reference side twice and the other side once on the cases at `indices`,
/// three processes side by side (each keeps about one core busy, so they take little longer
/// than one alone).
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
fn round(reference: &str, other: &str, indices: &[usize]) -> [Vec<Run>; 3] {
    std::thread::scope(|s| {
        let first = s.spawn(|| side(reference, indices));
        let second = s.spawn(|| side(reference, indices));
        let wrapped = side(other, indices);
        [first.join().unwrap(), second.join().unwrap(), wrapped]
    })
}

/// Writes a line to the process's standard error past the test harness's capture: a passing
/// test's output is otherwise dropped, and which cases were compared within a tolerance rather
/// than bit for bit belongs in every log.
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Compares a reference side with a second side on every case: one [`round`] of all cases,
/// then [`MORE_ROUNDS`] of those whose three results were not one (bit for bit, or the same
/// panic). [`compare::judge`] decides from all the runs of a case: a difference that each side
/// repeats exactly fails, and so does one beyond [`compare::tolerance`] where a side varies by
/// itself (atomic float adds, or autotune picking kernels that sum in other orders in each
/// process).
#[cfg(any(feature = "wgpu", feature = "frugal-cuda"))]
fn compare_sides(reference: &str, other: &str) {
    let all = cases::all();
    let every: Vec<usize> = (0..all.len()).collect();
    let mut reference_runs: Vec<Vec<Run>> = vec![Vec::new(); all.len()];
    let mut wrapped_runs: Vec<Vec<Run>> = vec![Vec::new(); all.len()];
    let record = |reference_runs: &mut [Vec<Run>],
                  wrapped_runs: &mut [Vec<Run>],
                  indices: &[usize],
                  [first, second, wrapped]: [Vec<Run>; 3]| {
        let runs = first.into_iter().zip(second).zip(wrapped);
        for (&i, ((first, second), wrapped)) in indices.iter().zip(runs) {
            reference_runs[i].extend([first, second]);
            wrapped_runs[i].push(wrapped);
        }
    };
    let start = std::time::Instant::now();
    let runs = round(reference, other, &every);
    record(&mut reference_runs, &mut wrapped_runs, &every, runs);
    let first_round = start.elapsed().as_secs_f64();
    // Mixed failures are judged as they stand: a panic or crash repeats itself, and a hang
    // would cost minutes per run.
    let again: Vec<usize> = every
        .iter()
        .copied()
        .filter(|&i| {
            let runs = || reference_runs[i].iter().chain(&wrapped_runs[i]);
            runs().all(Run::ok) && runs().any(|run| run.result != reference_runs[i][0].result)
        })
        .collect();
    if !again.is_empty() {
        let names: Vec<&str> = again.iter().map(|&i| all[i].name).collect();
        report(&format!(
            "{reference} vs {other}: {} cases differ in the first round, {MORE_ROUNDS} more \
             rounds of them: {names:?}",
            again.len()
        ));
        for _ in 0..MORE_ROUNDS {
            let runs = round(reference, other, &again);
            record(&mut reference_runs, &mut wrapped_runs, &again, runs);
        }
    }
    let more_rounds = start.elapsed().as_secs_f64() - first_round;
    let mut differ = Vec::new();
    let mut unsupported = Vec::new();
    let mut varying = Vec::new();
    for (i, case) in all.iter().enumerate() {
        match compare::judge(reference, &reference_runs[i], other, &wrapped_runs[i]) {
            Verdict::Same if !reference_runs[i][0].ok() => unsupported.push(case.name),
            Verdict::Same => {}
            Verdict::Varies(spread) => varying.push((case.name, spread)),
            Verdict::Differ(why) => differ.push(format!("{}: {why}", case.name)),
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
        unsupported.len() + varying.len() < all.len() / 4,
        "too many cases fail or vary on {reference}: {unsupported:?} {varying:?}"
    );
    let varying_text: Vec<String> = varying
        .iter()
        .map(|(name, spread)| {
            format!(
                "{name} ({reference} runs apart by ≤ {:.1e}, {other} from them by ≤ {:.1e}, \
                 {:.0}% of the tolerance used)",
                spread.reference,
                spread.wrapped,
                100.0 * spread.used
            )
        })
        .collect();
    report(&format!(
        "{reference} vs {other}: {} of {} cases bit-identical; {} fail on both alike: \
         {unsupported:?}; {} vary between runs and agree within {SPREAD_WIDENING}·spread + \
         {ABS_TOL:e} + {REL_TOL:e}·|{reference}| beyond the {reference} runs' range: {}; \
         first round {first_round:.0} s, {} case(s) again {more_rounds:.0} s",
        all.len() - unsupported.len() - varying.len(),
        all.len(),
        unsupported.len(),
        varying.len(),
        varying_text.join("; "),
        again.len()
    ));
}

/// Every case on wgpu (Mesa's lavapipe in CI) and on Frugal<Wgpu>.
#[cfg(feature = "wgpu")]
#[test]
fn all_ops_on_wgpu() {
    let _serial = crate::serial();
    compare_sides("wgpu", "frugal-wgpu");
}

/// Every case on burn-cuda and on frugal-cuda's runtime (same kernels, another allocator):
/// needs a GPU, so it runs through the device tool, not in CI.
#[cfg(feature = "frugal-cuda")]
#[test]
fn all_ops_on_frugal_cuda() {
    let _serial = crate::serial();
    compare_sides("cuda", "frugal-cuda");
}
