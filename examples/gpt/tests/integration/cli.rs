//! `gpt --help` as a user reads it: a description, every flag under a heading and explained,
//! `--model` presets that single flags override, positive flags that still take their older
//! negative spellings, and `--store`'s default among its values. In-process through clap, so
//! nothing trains.

use clap::{CommandFactory, Parser, ValueEnum};
use gpt::cli::{DeviceKind, HELP_HEADINGS, ModelPreset, ModelShape, Precision, TrainArgs};

fn parse(flags: &[&str]) -> TrainArgs {
    TrainArgs::try_parse_from(std::iter::once("gpt").chain(flags.iter().copied()))
        .unwrap_or_else(|e| panic!("gpt {flags:?}: {e}"))
}

fn shape(layers: usize, d_model: usize, heads: usize, seq: usize, batch: usize) -> ModelShape {
    ModelShape {
        layers,
        d_model,
        heads,
        seq,
        batch,
    }
}

#[test]
fn help_has_a_description_and_every_heading_and_every_flag_is_explained() {
    let mut command = TrainArgs::command();
    let help = command.render_long_help().to_string();
    assert!(
        help.starts_with("Train a GPT-style model"),
        "no description first:\n{help}"
    );
    for heading in HELP_HEADINGS {
        assert!(
            help.lines().any(|line| line == format!("{heading}:")),
            "no heading {heading:?} in:\n{help}"
        );
    }
    let short = command.render_help().to_string();
    assert!(short.lines().count() < help.lines().count());
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let text = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|t| t.to_string())
            .unwrap_or_default();
        assert!(!text.trim().is_empty(), "--{id} has no help text");
        if arg.is_hide_set() || matches!(id, "help" | "version") {
            continue;
        }
        let heading = arg.get_help_heading();
        assert!(
            heading.is_some_and(|h| HELP_HEADINGS.contains(&h)),
            "--{id} is under {heading:?}, not one of {HELP_HEADINGS:?}"
        );
        let long = arg.get_long().expect("every flag is a long one");
        assert!(
            help.contains(&format!("--{long}")),
            "--{long} not shown:\n{help}"
        );
    }
}

#[test]
fn model_presets_resolve_and_single_flags_override_them() {
    // Today's defaults: the CPU's main job keeps its model, batch and losses.
    assert_eq!(parse(&[]).shape(), shape(2, 64, 4, 64, 16));
    assert_eq!(parse(&["--model", "tiny"]).shape(), shape(2, 64, 4, 64, 16));
    assert_eq!(
        parse(&["--model", "reference"]).shape(),
        shape(12, 768, 12, 512, 8)
    );
    assert_eq!(
        parse(&["--model", "1b"]).shape(),
        shape(24, 2048, 16, 1024, 64)
    );
    let small = ModelPreset::Small.shape();
    assert!(small.layers > 2 && small.layers < 12 && small.d_model > 64);
    // A single flag changes its own value only, wherever it stands.
    let args = parse(&["--layers", "2", "--model", "1b", "--batch", "4"]);
    assert_eq!(args.shape(), shape(2, 2048, 16, 1024, 4));
    assert_eq!(
        (
            args.layers(),
            args.d_model(),
            args.heads(),
            args.seq(),
            args.batch()
        ),
        (2, 2048, 16, 1024, 4)
    );
    assert_eq!(
        parse(&["--d-model", "32", "--heads", "2", "--seq", "8"]).shape(),
        shape(2, 32, 2, 8, 16)
    );
    // Checks run on the resolved values.
    let err = parse(&["--model", "reference", "--heads", "7"])
        .validate()
        .unwrap_err();
    assert!(
        err.contains("--heads 7") && err.contains("--d-model 768"),
        "{err}"
    );
    assert!(TrainArgs::try_parse_from(["gpt", "--model", "huge"]).is_err());
}

#[test]
fn each_preset_says_its_size_in_the_help() {
    for preset in ModelPreset::value_variants() {
        let value = preset.to_possible_value().unwrap();
        let help = value.get_help().map(|h| h.to_string()).unwrap_or_default();
        let s = preset.shape();
        let says = format!(
            "{} layers, d-model {}, {} heads, seq {}, batch {}",
            s.layers, s.d_model, s.heads, s.seq, s.batch
        );
        assert!(
            help.starts_with(&says),
            "--model {}: {help:?} does not start with {says:?}",
            value.get_name()
        );
    }
}

#[test]
fn positive_flags_default_on_and_the_older_negative_spellings_still_work() {
    let default = parse(&[]);
    assert!(default.recovers() && default.cuts_segments() && default.fuses());
    for (flags, off) in [
        (&["--recover", "false"][..], "recover"),
        (&["--no-recover"], "recover"),
        (&["--segments", "false"], "segments"),
        (&["--no-segments"], "segments"),
        (&["--fusion", "false"], "fusion"),
        (&["--no-fusion"], "fusion"),
    ] {
        let args = parse(flags);
        let state = [
            ("recover", args.recovers()),
            ("segments", args.cuts_segments()),
            ("fusion", args.fuses()),
        ];
        for (name, on) in state {
            assert_eq!(on, name != off, "{flags:?}: {name}");
        }
    }
    assert!(TrainArgs::try_parse_from(["gpt", "--recover", "true", "--no-recover"]).is_err());
    // The negative spellings are not advertised.
    let help = TrainArgs::command().render_long_help().to_string();
    assert!(!help.contains("--no-"), "{help}");
    // --fusion false picks frugal-cuda's unfused backend: other devices refuse it.
    let err = parse(&["--fusion", "false"]).validate().unwrap_err();
    assert!(
        err.contains("--device frugal-cuda") && err.contains("not cpu"),
        "{err}"
    );
}

#[test]
fn store_shows_the_values_it_takes_and_defaults_to_none() {
    let command = TrainArgs::command();
    let store = command
        .get_arguments()
        .find(|a| a.get_id() == "store")
        .unwrap();
    let values: Vec<String> = store
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_string())
        .collect();
    assert_eq!(values, ["none", "bf16", "f16"]);
    let defaults: Vec<_> = store
        .get_default_values()
        .iter()
        .map(|v| v.to_str())
        .collect();
    assert_eq!(defaults, [Some("none")]);
    assert_eq!(parse(&[]).store, Precision::F32);
    assert_eq!(parse(&["--store", "bf16"]).store, Precision::Bf16);
    assert_eq!(parse(&["--store", "none"]).store, Precision::F32);
    assert!(TrainArgs::try_parse_from(["gpt", "--store", "f32"]).is_err());
}

#[test]
fn one_device_list_whose_names_are_the_flag_values() {
    for device in DeviceKind::value_variants() {
        let value = device.to_possible_value().unwrap();
        assert_eq!(value.get_name(), device.name());
        assert_eq!(
            serde_json::to_value(device).unwrap(),
            serde_json::Value::from(device.name())
        );
    }
    let err = DeviceKind::Wgpu.refused("peak-memory", &[DeviceKind::Cpu, DeviceKind::Flex]);
    assert!(
        err.starts_with("--device wgpu: this build of peak-memory runs on cpu, flex")
            && err.contains("--features wgpu"),
        "{err}"
    );
}
