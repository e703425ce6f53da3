//! One configuration per child process, so that no configuration inherits another's device
//! pool: the parent spawns itself with `--only NAME` (and `--budget-bytes`), reads the
//! child's JSON line back, and makes a failure line of a child that printed none. Also the
//! child's side: running one configuration with its panics caught as a failure line.

use std::process::{Command, ExitStatus};

use burn::tensor::backend::Backend;
use gpt::cli::DeviceKind;

use super::Runner;
use super::args::Args;
use super::record::{Failure, Line};
use crate::configs::Config;

/// The first line of a panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Runs one configuration in this (child) process and prints its JSON line; a panic, on this
/// thread or a backend's, is printed as a failure line and ends the process with status 1.
pub fn child(only: &Config, args: &Args, run_on: Runner) {
    match run_caught(only, args, run_on) {
        Ok(line) => println!("{}", serde_json::to_string(&line).unwrap()),
        Err(failure) => {
            println!("{}", serde_json::to_string(&failure).unwrap());
            std::process::exit(1);
        }
    }
}

/// Runs `only` on `args.device` through `run_on`, catching a panic (this thread's or a
/// backend's: the first one's message) as a failure line.
pub fn run_caught(only: &Config, args: &Args, run_on: Runner) -> Result<Line, Failure<'static>> {
    use std::sync::{Arc, Mutex};
    let first_panic = Arc::new(Mutex::new(None::<String>));
    let sink = first_panic.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        sink.lock()
            .unwrap()
            .get_or_insert_with(|| panic_text(info.payload()));
        default_hook(info);
    }));
    let outcome = std::panic::catch_unwind(|| run_on(only, args));
    // Restore the default hook (the one `take_hook` gave back) for what follows.
    drop(std::panic::take_hook());
    let error = match outcome {
        Ok(Ok(line)) => return Ok(line),
        Ok(Err(message)) => message,
        Err(payload) => first_panic
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| panic_text(payload.as_ref())),
    };
    Err(Failure {
        system: "burn",
        device: args.device,
        config: only.name,
        budget_bytes: args.budget_bytes,
        checkpoint_blocks: only.scopes,
        error,
    })
}

/// Hands the device's free memory back between in-process configurations (CubeCL's
/// `memory_cleanup`, through Burn's backend).
pub fn clean_up(device: DeviceKind) {
    // Unused in a CPU-only build, where no device has a pool.
    #[allow(dead_code)]
    fn on<B: Backend>() {
        let device = B::Device::default();
        let _ = B::sync(&device);
        B::memory_cleanup(&device);
    }
    match device {
        DeviceKind::Cpu | DeviceKind::Flex => {}
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => on::<burn::backend::Wgpu>(),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => on::<burn::backend::Cuda>(),
        #[cfg(feature = "frugal-cuda")]
        DeviceKind::FrugalCuda => on::<frugal_cuda::FrugalCuda>(),
        #[allow(unreachable_patterns)]
        _ => {}
    }
}

/// The child's command line: the parent's own flags (`parent`, without the program), then
/// the configuration to run and, for a budget configuration, its bytes.
pub fn child_args(
    parent: impl IntoIterator<Item = String>,
    name: &str,
    budget: Option<u64>,
) -> Vec<String> {
    let mut args: Vec<String> = parent.into_iter().collect();
    args.extend(["--only".to_string(), name.to_string()]);
    if let Some(bytes) = budget {
        args.extend(["--budget-bytes".to_string(), bytes.to_string()]);
    }
    args
}

/// The child's result: its last line that is a JSON object (the backends may print other
/// lines before it).
pub fn parse_child_output(stdout: &str) -> Option<serde_json::Value> {
    stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
}

/// Runs `config` in a child process of this executable, with this process's flags and
/// `budget`, and returns its line (or a failure line made from its stderr).
pub fn run_in_child(device: DeviceKind, config: &Config, budget: Option<u64>) -> serde_json::Value {
    let exe = std::env::current_exe().expect("own path");
    let out = Command::new(&exe)
        .args(child_args(std::env::args().skip(1), config.name, budget))
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match parse_child_output(&stdout) {
        Some(line) => line,
        None => failure_from_stderr(device, config, budget, out.status, &stderr),
    }
}

/// The failure line for a child that printed none (killed, aborted): the first line of its
/// panic message from stderr, else its exit status.
pub fn failure_from_stderr(
    device: DeviceKind,
    config: &Config,
    budget: Option<u64>,
    status: ExitStatus,
    stderr: &str,
) -> serde_json::Value {
    let mut lines = stderr.lines();
    let panic = lines
        .by_ref()
        .find(|l| l.starts_with("thread '") && l.contains("panicked at"))
        .map(|l| {
            // `thread 'main' panicked at src/x.rs:1:2:` then the message on the next line
            // (older toolchains: `... panicked at 'message', src/x.rs:1:2`).
            match l.split_once("panicked at '") {
                Some((_, rest)) => rest.rsplit_once("', ").map_or(rest, |(m, _)| m).to_string(),
                None => lines.next().unwrap_or_default().to_string(),
            }
        });
    let failure = Failure {
        system: "burn",
        device,
        config: config.name,
        budget_bytes: budget,
        checkpoint_blocks: config.scopes,
        error: panic.unwrap_or_else(|| format!("the child process ended with {status}")),
    };
    serde_json::to_value(&failure).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_child_gets_the_parent_s_flags_and_its_configuration() {
        let parent = strings(&["--device", "cpu", "--configs", "plain,budget-1/3"]);
        assert_eq!(
            child_args(parent.clone(), "plain", None),
            strings(&[
                "--device",
                "cpu",
                "--configs",
                "plain,budget-1/3",
                "--only",
                "plain"
            ])
        );
        let budget = child_args(parent, "budget-1/3", Some(12345));
        assert_eq!(
            budget[4..],
            strings(&["--only", "budget-1/3", "--budget-bytes", "12345"])[..]
        );
    }

    #[test]
    fn the_child_s_line_is_its_last_json_object() {
        let stdout = concat!(
            "compiling...\n{\"config\":\"old\"}\nnote: done\n",
            "{\"config\":\"plain\",\"peak_allocated_bytes\":7}\n"
        );
        let line = parse_child_output(stdout).unwrap();
        assert_eq!(line["config"], "plain");
        assert_eq!(line["peak_allocated_bytes"], 7);
        assert!(parse_child_output("no json here\n").is_none());
        // A cut-off line is no result: the failure comes from stderr instead.
        assert!(parse_child_output("{\"config\":\"pl").is_none());
    }

    #[cfg(unix)]
    fn exit_status(code: i32) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        ExitStatus::from_raw(code << 8)
    }

    #[cfg(unix)]
    #[test]
    fn a_silent_child_s_failure_is_its_panic_or_its_status() {
        let config = Config::named("budget-1/3-scopes").unwrap();
        let stderr =
            "step 0 took 1 ms\nthread 'main' panicked at src/x.rs:1:2:\nout of memory: 5 B\nmore\n";
        let line = failure_from_stderr(DeviceKind::Cpu, config, Some(9), exit_status(101), stderr);
        assert_eq!(line["error"], "out of memory: 5 B");
        assert_eq!(line["config"], "budget-1/3-scopes");
        assert_eq!(line["device"], "cpu");
        assert_eq!(line["budget_bytes"], 9);
        assert_eq!(line["checkpoint_blocks"], true);
        assert_eq!(line["system"], "burn");

        let old = "thread 'main' panicked at 'too small', src/x.rs:1:2\n";
        let line = failure_from_stderr(DeviceKind::Cpu, config, None, exit_status(101), old);
        assert_eq!(line["error"], "too small");
        assert!(line["budget_bytes"].is_null());

        let line = failure_from_stderr(DeviceKind::Cpu, config, None, exit_status(3), "killed\n");
        assert_eq!(line["error"], "the child process ended with exit status: 3");
    }

    #[test]
    fn a_caught_panic_is_a_failure_line_with_its_first_line() {
        fn panics(_: &Config, _: &Args) -> Result<Line, String> {
            panic!("budget too small\nsecond line")
        }
        fn refuses(_: &Config, _: &Args) -> Result<Line, String> {
            Err("--device wgpu: not built".into())
        }
        use clap::Parser;
        let args = Args::try_parse_from(["peak-memory", "--budget-bytes", "42"]).unwrap();
        let config = Config::named("frugal-scopes").unwrap();
        let failure = run_caught(config, &args, panics).unwrap_err();
        assert_eq!(failure.error, "budget too small");
        assert_eq!(
            (failure.config, failure.budget_bytes),
            ("frugal-scopes", Some(42))
        );
        assert!(failure.checkpoint_blocks);
        let failure = run_caught(config, &args, refuses).unwrap_err();
        assert_eq!(failure.error, "--device wgpu: not built");
    }
}
