//! Machine-checked coverage of Burn's Backend methods.
//!
//! 1. The methods Frugal forwards are exactly the methods of Burn 0.21's op traits and
//!    `Backend`, read from burn-backend's own source (so a method with a default body that
//!    Frugal forgot would show up here, even though it compiles).
//! 2. Running every differential case on `Frugal<NdArray>` calls every forwarded method at
//!    least once; which case covers which method is written to `tests/coverage.txt`, and the
//!    committed file must match (`FRUGAL_BLESS=1` rewrites it).
//!
//! The test holds `crate::serial`, so that the process-wide call counters it reads count only
//! its own calls.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use frugal::ops::{call_counts, forwarded_methods};
use frugal_tests::{CpuDevice, Wrapped, cases, run_seeded};

/// burn-backend's source directory, found through `cargo metadata`.
fn burn_backend_src() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "cargo metadata failed");
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let package = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "burn-backend")
        .expect("burn-backend is a dependency");
    Path::new(package["manifest_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .join("src")
}

/// Methods declared at the top level of `pub trait NAME<...>` blocks in a Rust source file.
fn trait_methods(source: &str, wanted: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = source.as_bytes();
    let mut search = 0;
    while let Some(found) = source[search..].find("pub trait ") {
        let start = search + found + "pub trait ".len();
        let name: String = source[start..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let open = start + source[start..].find('{').unwrap();
        let mut depth = 0usize;
        let mut i = open;
        let mut line_start = true;
        loop {
            match bytes[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            if depth == 1 && line_start {
                let rest = source[i..].trim_start_matches([' ', '\t']);
                let rest = rest.strip_prefix("async ").unwrap_or(rest);
                if let Some(sig) = rest.strip_prefix("fn ") {
                    let method: String = sig
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if wanted.contains(&name.as_str()) {
                        out.push((name.clone(), method));
                    }
                }
            }
            line_start = bytes[i] == b'\n';
            i += 1;
        }
        search = i;
    }
    out
}

fn burn_methods() -> BTreeSet<(String, String)> {
    let src = burn_backend_src();
    let files = [
        "backend/base.rs",
        "backend/ops/tensor.rs",
        "backend/ops/int_tensor.rs",
        "backend/ops/bool_tensor.rs",
        "backend/ops/qtensor.rs",
        "backend/ops/modules/base.rs",
        "backend/ops/activation.rs",
        "backend/ops/transaction.rs",
    ];
    let traits = [
        "Backend",
        "FloatTensorOps",
        "IntTensorOps",
        "BoolTensorOps",
        "QTensorOps",
        "ModuleOps",
        "ActivationOps",
        "TransactionOps",
    ];
    files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(src.join(file)).expect("burn-backend source");
            trait_methods(&text, &traits)
        })
        .collect()
}

#[test]
fn every_backend_method_is_forwarded_and_covered() {
    let _serial = crate::serial();
    let burn: BTreeSet<(String, String)> = burn_methods();
    let ours: BTreeSet<(String, String)> = forwarded_methods()
        .into_iter()
        .map(|(t, m)| (t.to_string(), m.to_string()))
        .collect();
    assert!(
        burn.len() > 400,
        "parsed only {} methods from burn-backend",
        burn.len()
    );
    let missing: Vec<_> = burn.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&burn).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "Frugal's forwarded methods differ from Burn's traits.\nnot forwarded: {missing:?}\nnot in Burn: {extra:?}"
    );

    // Run every case on Frugal and note which methods each one calls.
    let device = CpuDevice::default();
    let mut covered_by: BTreeMap<(String, String), String> = BTreeMap::new();
    let counts = |()| -> Vec<u64> { call_counts().into_iter().map(|(_, _, n)| n).collect() };
    let methods = forwarded_methods();
    let all = cases::all();
    let case_names: BTreeSet<&str> = all.iter().map(|c| c.name).collect();
    for case in &all {
        let before = counts(());
        let _ = run_seeded::<_, Wrapped>(case.wrapped, &device);
        let after = counts(());
        for (i, (family, method)) in methods.iter().enumerate() {
            if after[i] > before[i] {
                let key = (family.to_string(), method.to_string());
                // Prefer the case written for the method over one that merely calls it.
                let own = case.name == *method;
                match covered_by.get(&key) {
                    Some(existing) if existing == method || !own => {}
                    _ => {
                        covered_by.insert(key, case.name.to_string());
                    }
                }
            }
        }
    }

    let uncovered: Vec<_> = ours
        .iter()
        .filter(|k| !covered_by.contains_key(*k))
        .collect();
    let without_own_case: Vec<_> = ours
        .iter()
        .filter(|(_, m)| !case_names.contains(m.as_str()))
        .collect();

    let mut table = String::from(
        "# Burn 0.21 Backend methods forwarded by Frugal, and the differential case that covers each.\n\
         # Generated by tests/tests/integration/coverage.rs; rewrite with FRUGAL_BLESS=1.\n",
    );
    for ((family, method), case) in &covered_by {
        table.push_str(&format!("{family}::{method} {case}\n"));
    }
    table.push_str(&format!(
        "# {} of {} methods covered\n",
        covered_by.len(),
        ours.len()
    ));

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("coverage.txt");
    if std::env::var_os("FRUGAL_BLESS").is_some() {
        std::fs::write(&path, &table).unwrap();
    }
    assert!(
        uncovered.is_empty(),
        "{} methods are never called by any case: {uncovered:?}",
        uncovered.len()
    );
    assert!(
        without_own_case.is_empty(),
        "{} methods have no case of their own name: {without_own_case:?}",
        without_own_case.len()
    );
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed, table,
        "tests/coverage.txt is out of date; run with FRUGAL_BLESS=1 to rewrite it"
    );
    println!(
        "{} of {} Backend methods covered",
        covered_by.len(),
        ours.len()
    );
}
