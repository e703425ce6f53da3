//! Which configurations run, in which order, under which budgets: `--configs` read, the
//! `frugal` reference put before the first budget, the order alternated per repeat, and the
//! runs themselves (each in a child process, or in this one with `--in-process`).

use super::Runner;
use super::args::Args;
use super::isolation::{clean_up, run_caught, run_in_child};
use super::record::Failure;
use crate::configs::Config;

/// The configurations `--configs` names (comma-separated), or the first unknown name's error.
pub fn select(list: &str) -> Result<Vec<&'static Config>, String> {
    list.split(',').map(|s| Config::named(s.trim())).collect()
}

/// Puts `frugal` before the first budget configuration, whose budget is a fraction of its
/// peak: moved there if asked for later, added there if not asked for (the `bool`). Nothing
/// changes with a `--reference-peak` or without a budget configuration.
pub fn with_reference(
    mut configs: Vec<&'static Config>,
    reference_peak: Option<u64>,
) -> (Vec<&'static Config>, bool) {
    let Some(first_budget) = configs
        .iter()
        .position(|c| c.budget.is_some())
        .filter(|_| reference_peak.is_none())
    else {
        return (configs, false);
    };
    match configs.iter().position(|c| c.name == "frugal") {
        Some(at) if at < first_budget => (configs, false),
        Some(at) => {
            let frugal = configs.remove(at);
            configs.insert(first_budget, frugal);
            (configs, false)
        }
        None => {
            configs.insert(first_budget, Config::named("frugal").expect("known"));
            (configs, true)
        }
    }
}

/// The order of one repeat: as given on even repeats, reversed on odd ones, to spread drift.
pub fn order(configs: &[&'static Config], repeat: usize) -> Vec<&'static Config> {
    if repeat.is_multiple_of(2) {
        configs.to_vec()
    } else {
        configs.iter().rev().copied().collect()
    }
}

/// A configuration's budget: `None` without one; `Some(None)` while no reference peak is known
/// (the frugal configuration failed); else its fraction of `reference_peak`.
pub fn budget_bytes(config: &Config, reference_peak: Option<u64>) -> Option<Option<u64>> {
    config.budget.map(|(num, den)| {
        reference_peak.map(|peak| (peak as u128 * num as u128 / den as u128) as u64)
    })
}

/// Runs `configs` `--repeats` times, printing each one's JSON line as it comes, and returns
/// the lines. The first `frugal` run that succeeds sets the reference peak of the budgets.
pub fn run_all(args: &Args, configs: &[&'static Config], run_on: Runner) -> Vec<serde_json::Value> {
    let mut lines: Vec<serde_json::Value> = Vec::new();
    let mut reference_peak: Option<u64> = args.reference_peak;
    for repeat in 0..args.repeats {
        for config in order(configs, repeat) {
            let name = config.name;
            let budget = budget_bytes(config, reference_peak);
            let line = match budget {
                Some(None) => serde_json::to_value(Failure {
                    system: "burn",
                    device: args.device,
                    config: name,
                    budget_bytes: None,
                    checkpoint_blocks: config.scopes,
                    error: "no reference peak: the frugal configuration failed".into(),
                })
                .unwrap(),
                _ if args.in_process => {
                    let mut this = args.clone();
                    this.budget_bytes = budget.flatten();
                    let line = match run_caught(config, &this, run_on) {
                        Ok(line) => serde_json::to_value(line).unwrap(),
                        Err(failure) => serde_json::to_value(failure).unwrap(),
                    };
                    clean_up(args.device);
                    line
                }
                _ => run_in_child(args.device, config, budget.flatten()),
            };
            if let Some(error) = line["error"].as_str() {
                eprintln!("configuration {name} failed: {error}");
            } else if name == "frugal" && reference_peak.is_none() {
                reference_peak = line["peak_allocated_bytes"].as_u64();
            }
            println!("{}", serde_json::to_string(&line).unwrap());
            lines.push(line);
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(configs: &[&Config]) -> Vec<&'static str> {
        configs.iter().map(|c| c.name).collect()
    }

    #[test]
    fn the_list_is_read_by_name_with_spaces_trimmed() {
        let configs = select("plain, frugal ,budget-1/3").unwrap();
        assert_eq!(names(&configs), ["plain", "frugal", "budget-1/3"]);
        let error = select("plain,nonsense,frugal").unwrap_err();
        assert!(error.contains("\"nonsense\""), "{error}");
    }

    #[test]
    fn frugal_runs_before_the_first_budget() {
        let given = |list| select(list).unwrap();
        let (moved, added) = with_reference(given("plain,budget-1/3,bf16,frugal"), None);
        assert_eq!(names(&moved), ["plain", "frugal", "budget-1/3", "bf16"]);
        assert!(!added);
        let (inserted, added) = with_reference(given("plain,budget-1/2,budget-1/4"), None);
        assert_eq!(
            names(&inserted),
            ["plain", "frugal", "budget-1/2", "budget-1/4"]
        );
        assert!(added);
        let (kept, added) = with_reference(given("frugal,plain,budget-1/3"), None);
        assert_eq!(names(&kept), ["frugal", "plain", "budget-1/3"]);
        assert!(!added);
        // A given reference peak, or no budget at all, needs no frugal run.
        let (kept, _) = with_reference(given("plain,budget-1/3"), Some(1000));
        assert_eq!(names(&kept), ["plain", "budget-1/3"]);
        let (kept, _) = with_reference(given("plain,bf16"), None);
        assert_eq!(names(&kept), ["plain", "bf16"]);
    }

    #[test]
    fn odd_repeats_run_in_reverse() {
        let configs = select("plain,frugal,bf16").unwrap();
        assert_eq!(names(&order(&configs, 0)), ["plain", "frugal", "bf16"]);
        assert_eq!(names(&order(&configs, 1)), ["bf16", "frugal", "plain"]);
        assert_eq!(names(&order(&configs, 2)), ["plain", "frugal", "bf16"]);
    }

    #[test]
    fn a_budget_is_its_fraction_of_the_reference_peak() {
        let third = Config::named("budget-1/3").unwrap();
        assert_eq!(budget_bytes(third, Some(3000)), Some(Some(1000)));
        // Rounded down, and without overflow for large peaks.
        assert_eq!(budget_bytes(third, Some(1001)), Some(Some(333)));
        let big = u64::MAX / 2;
        assert_eq!(budget_bytes(third, Some(big)), Some(Some(big / 3)));
        assert_eq!(budget_bytes(third, None), Some(None));
        let plain = Config::named("plain").unwrap();
        assert_eq!(budget_bytes(plain, Some(3000)), None);
    }
}
