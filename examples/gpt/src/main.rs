//! `gpt`: trains the GPT of `model.rs` on `Autodiff<Frugal<B>>` and reports its memory.
//!
//! The default configuration is small and runs on the CPU in a few minutes; `--device cuda`
//! (built with `--features cuda`) runs the same code on a GPU.

use clap::Parser;
use gpt::run::{TrainArgs, train_on_device};

fn main() {
    // Warnings a user cannot act on (a dependency's) stay hidden unless RUST_LOG asks, e.g.
    // `RUST_LOG=frugal=debug,frugal_cuda=debug` for the budget's and allocator's decisions.
    gpt::logging::init();
    let args = TrainArgs::parse();
    let result = train_on_device(&args);
    if let Err(message) = result {
        if let Some(restart) = gpt::run::take_restart() {
            eprintln!("{message}");
            std::process::exit(go_on_in_a_new_process(restart));
        }
        eprintln!("error: {message}");
        if gpt::run::device_stopped_in_this_process() {
            use std::io::Write;
            let _ = std::io::stderr().flush();
            let _ = std::io::stdout().flush();
            // SAFETY: ends the process at once; everything worth keeping (checkpoints, the
            // message) is already written and flushed.
            unsafe { libc::_exit(2) };
        }
        std::process::exit(2);
    }
}

/// Runs this program again in place of this process, with the same flags and `--accumulate`
/// and `--resume` as `restart` asks; returns only if that cannot be done (its exit status).
fn go_on_in_a_new_process(restart: gpt::run::Restart) -> i32 {
    let mut flags: Vec<String> = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        match flag.as_str() {
            "--resume" => {}
            "--accumulate" => {
                given.next();
            }
            f if f.starts_with("--accumulate=") => {}
            _ => flags.push(flag),
        }
    }
    flags.extend(["--accumulate".to_string(), restart.accumulate.to_string()]);
    if restart.resume {
        flags.push("--resume".to_string());
    }
    let exe = std::env::current_exe().expect("the running program has a path");
    let mut command = std::process::Command::new(exe);
    command.args(&flags);
    // Replace this process rather than wait beside it: the GPU memory it holds goes back to the
    // driver only when it ends, and the next run sizes itself from what is free.
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = command.exec();
        eprintln!("error: cannot start gpt again: {e}");
        2
    }
    #[cfg(not(unix))]
    match command.status() {
        Ok(status) => status.code().unwrap_or(1),
        Err(e) => {
            eprintln!("error: cannot start gpt again: {e}");
            2
        }
    }
}
