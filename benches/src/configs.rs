//! The peak-memory bench's named configurations: which autodiff backend, scopes, budget and
//! precision each row of its table runs with.

use gpt::MemorySettings;

/// Which autodiff backend a configuration runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// `Autodiff<B>`.
    Plain,
    /// Burn's own `Autodiff<B, BalancedCheckpointing>`.
    BurnBalanced,
    /// `Autodiff<Frugal<B>>`.
    Frugal,
}

/// A named configuration (see `--configs`), read from [`CONFIGS`] once by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Its name in `--configs`.
    pub name: &'static str,
    /// The autodiff backend it runs on.
    pub system: System,
    /// Each block in a checkpoint scope.
    pub scopes: bool,
    /// A budget of this fraction (numerator, denominator) of the `frugal` configuration's peak.
    pub budget: Option<(u64, u64)>,
    /// Matrix products in bf16 (Frugal's autocast).
    pub autocast: bool,
    /// Autocast leaves products in bf16, as PyTorch's does.
    pub low_outputs: bool,
    /// The budget may store evicted tensors in bf16.
    pub store_bf16: bool,
}

const fn frugal(name: &'static str, scopes: bool, budget: Option<(u64, u64)>) -> Config {
    Config {
        name,
        system: System::Frugal,
        scopes,
        budget,
        autocast: false,
        low_outputs: false,
        store_bf16: false,
    }
}

const fn bf16(mut config: Config, low_outputs: bool) -> Config {
    config.autocast = true;
    config.low_outputs = low_outputs;
    config
}

const fn store(mut config: Config) -> Config {
    config.store_bf16 = true;
    config
}

const THIRD: Option<(u64, u64)> = Some((1, 3));

/// Every configuration the bench knows.
pub const CONFIGS: [Config; 20] = [
    Config {
        system: System::Plain,
        ..frugal("plain", false, None)
    },
    frugal("frugal", false, None),
    frugal("frugal-scopes", true, None),
    frugal("budget-1/2", false, Some((1, 2))),
    frugal("budget-1/3", false, THIRD),
    frugal("budget-1/4", false, Some((1, 4))),
    frugal("budget-1/2-scopes", true, Some((1, 2))),
    frugal("budget-1/3-scopes", true, THIRD),
    frugal("budget-1/4-scopes", true, Some((1, 4))),
    Config {
        system: System::BurnBalanced,
        ..frugal("burn-balanced", false, None)
    },
    bf16(frugal("bf16", false, None), false),
    bf16(frugal("bf16-scopes", true, None), false),
    bf16(frugal("bf16-budget-1/3", false, THIRD), false),
    store(bf16(frugal("bf16-store-budget-1/3", false, THIRD), false)),
    store(frugal("store-budget-1/3", false, THIRD)),
    bf16(frugal("bf16-lowout", false, None), true),
    bf16(frugal("bf16-lowout-scopes", true, None), true),
    bf16(frugal("bf16-lowout-budget-1/3", false, THIRD), true),
    store(bf16(
        frugal("bf16-lowout-store-budget-1/3", false, THIRD),
        true,
    )),
    store(frugal("store-budget-1/6-scopes", true, Some((1, 6)))),
];

impl Config {
    /// The memory settings of this configuration under `budget` (the bytes of its fraction).
    pub fn memory_settings(
        &self,
        budget: Option<u64>,
        scopes_keep_products: bool,
    ) -> MemorySettings {
        let bf16 = |on: bool| on.then_some(frugal::LowPrecision::BF16);
        MemorySettings {
            budget,
            scope_keeps_products: scopes_keep_products,
            checkpoint_blocks: self.scopes,
            autocast: bf16(self.autocast),
            low_outputs: self.low_outputs,
            storage: bf16(self.store_bf16),
            ..MemorySettings::default()
        }
    }

    /// The configuration called `name`, or an error listing the known names.
    pub fn named(name: &str) -> Result<&'static Config, String> {
        CONFIGS.iter().find(|c| c.name == name).ok_or_else(|| {
            let known: Vec<_> = CONFIGS.iter().map(|c| c.name).collect();
            format!(
                "unknown configuration {name:?}; known: {}",
                known.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_is_found_by_its_name_and_means_what_it_says() {
        for config in &CONFIGS {
            assert_eq!(Config::named(config.name), Ok(config));
            let name = config.name;
            assert_eq!(config.scopes, name.ends_with("-scopes"), "{name}");
            assert_eq!(config.autocast, name.starts_with("bf16"), "{name}");
            assert_eq!(config.low_outputs, name.contains("lowout"), "{name}");
            assert_eq!(config.store_bf16, name.contains("store-"), "{name}");
            let fraction = name
                .split_once("budget-")
                .map(|(_, f)| f.trim_end_matches("-scopes"));
            let expected = fraction.map(|f| {
                let (n, d) = f.split_once('/').unwrap();
                (n.parse().unwrap(), d.parse().unwrap())
            });
            assert_eq!(config.budget, expected, "{name}");
        }
        assert_eq!(Config::named("plain").unwrap().system, System::Plain);
        assert_eq!(
            Config::named("burn-balanced").unwrap().system,
            System::BurnBalanced
        );
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let error = Config::named("budget-1/5").unwrap_err();
        assert!(error.contains("\"budget-1/5\""), "{error}");
        assert!(error.contains("budget-1/3-scopes"), "{error}");
    }
}
