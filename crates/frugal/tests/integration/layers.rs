//! The crate's layering: every module imports only from layers below its own, so the import
//! graph has no cycle and no arrow pointing up. Parses every `crate::…` path in the sources
//! (imports, paths in code and in macros), as `tests/tests/integration/coverage.rs` in the workspace checks the
//! forwarded methods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, bottom to top: a module may import from any module of a lower layer, from
/// nothing of its own layer but itself. `lib` is the crate root, which re-exports the API.
const LAYERS: &[&[&str]] = &[
    &["catch", "units", "vocabulary"],
    &["ledger"],
    &["autocast", "engine", "runtime"],
    &["kernels", "scope"],
    &["device"],
    &["remat"],
    &["tensor"],
    &["backend"],
    &["ops"],
    &["checkpoint", "nn", "precision", "report"],
    &["accumulate", "memory", "memory_viz", "optim", "scaler"],
    &["abandoned", "fit", "micro_batching", "train"],
    &["lib"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// A folder that groups modules of their own layers (the training add-ons): a file in it is
/// the module it names (`src/training/scaler/mod.rs` -> `scaler`), and `crate::training::x`
/// refers to `x`.
const GROUPS: &[&str] = &["training"];

/// The module a source file belongs to (`src/remat/cell.rs` -> `remat`; in a group, the
/// group's member).
fn module_of(relative: &Path) -> String {
    let mut names = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = names.next().expect("a file under src");
    let name = match GROUPS.contains(&first.as_str()) {
        true => names.next().unwrap_or(first),
        false => first,
    };
    // The group's own `mod.rs` declares its members: it is the crate root's, in effect.
    match name.as_str() {
        "mod.rs" => "lib".to_string(),
        _ => name.strip_suffix(".rs").unwrap_or(&name).to_string(),
    }
}

/// Every `crate::name` referred to in `source`, outside comments, with its line number.
fn references(source: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in source.lines().enumerate() {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let mut after = &rest[at + "crate::".len()..];
            // `crate::training::scaler` refers to `scaler`.
            for group in GROUPS {
                if let Some(member) = after
                    .strip_prefix(group)
                    .and_then(|tail| tail.strip_prefix("::"))
                {
                    after = member;
                }
            }
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` imports several modules at once.
            if name.is_empty() && after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for item in group.split(',') {
                    let item = item.trim().split("::").next().unwrap_or("").trim();
                    if !item.is_empty() {
                        out.push((number + 1, item.to_string()));
                    }
                }
            } else if !name.is_empty() {
                out.push((number + 1, name));
            }
            rest = after;
        }
    }
    out
}

/// Violations of the layering among `files` (path relative to `src`, source text).
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (path, source) in files {
        let module = module_of(path);
        let Some(own) = layer_of(&module) else {
            problems.push(format!(
                "{}: module `{module}` is in no layer",
                path.display()
            ));
            continue;
        };
        for (line, target) in references(source) {
            if target == module {
                continue;
            }
            match layer_of(&target) {
                Some(layer) if layer < own => {}
                Some(layer) => problems.push(format!(
                    "{}:{line}: `{module}` (layer {own}) imports `{target}` (layer {layer}): \
                     only lower layers may be imported",
                    path.display()
                )),
                // An item the crate root re-exports (`crate::Frugal`) hides where it lives.
                None => problems.push(format!(
                    "{}:{line}: `crate::{target}` is not a module of a layer: import it from \
                     the module that defines it",
                    path.display()
                )),
            }
        }
    }
    problems
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("a readable source");
            out.push((path.strip_prefix(root).unwrap().to_path_buf(), text));
        }
    }
}

#[test]
fn every_module_imports_only_from_layers_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 30, "found only {} sources", files.len());
    let problems = violations(&files);
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
    // Every layer's module exists, so a renamed module cannot slip out of the check.
    let modules: BTreeMap<String, ()> = files.iter().map(|(p, _)| (module_of(p), ())).collect();
    for module in LAYERS.iter().flat_map(|l| l.iter()) {
        assert!(modules.contains_key(*module), "no module `{module}` in src");
    }
}

#[test]
fn the_check_finds_an_upward_import_and_a_sibling_import() {
    let planted = |path: &str, source: &str| vec![(PathBuf::from(path), source.to_string())];
    assert_eq!(
        violations(&planted("ledger/mod.rs", "use crate::ops::OpId;\n")).len(),
        1
    );
    assert_eq!(
        violations(&planted("engine/mod.rs", "x = $crate::autocast::plan();")).len(),
        1
    );
    assert_eq!(
        violations(&planted("ops/mod.rs", "use crate::{device::X, Frugal};")).len(),
        1
    );
    assert!(violations(&planted("ops/mod.rs", "use crate::{device::X, tensor};")).is_empty());
    assert!(
        violations(&planted(
            "remat/cell.rs",
            "// see crate::ops\nuse crate::vocabulary::OpId;"
        ))
        .is_empty()
    );
    // In the training group each file is the module it names.
    assert_eq!(
        violations(&planted(
            "training/scaler/mod.rs",
            "use crate::training::fit::AutoFit;"
        ))
        .len(),
        1
    );
    assert!(
        violations(&planted(
            "training/fit.rs",
            "use crate::training::scaler::GradScaler;\nuse crate::memory;"
        ))
        .is_empty()
    );
}

/// The modules `docs/architecture.md`'s layer table puts in each layer: its rows are
/// `| layer | module cell | owns | imports |`, the module cell naming modules in backticks
/// (`engine/`, `catch.rs`; `training/` is the group the add-ons live in, not a module).
fn documented_layers(table: &str) -> BTreeMap<String, usize> {
    let mut layers = BTreeMap::new();
    for row in table.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|c| c.parse::<usize>().ok()) else {
            continue;
        };
        let names = cells[2].split('`').skip(1).step_by(2);
        for name in names {
            let module = name.trim_end_matches('/').trim_end_matches(".rs");
            if !GROUPS.contains(&module) {
                layers.insert(module.to_string(), layer);
            }
        }
    }
    layers
}

#[test]
fn the_architecture_documents_every_module_in_its_layer() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let documented = documented_layers(&std::fs::read_to_string(doc).unwrap());
    let checked: BTreeMap<String, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(layer, modules)| modules.iter().map(move |m| (m.to_string(), layer)))
        .filter(|(module, _)| module != "lib")
        .collect();
    assert_eq!(
        documented, checked,
        "docs/architecture.md's layer table and this test's LAYERS differ"
    );
}
