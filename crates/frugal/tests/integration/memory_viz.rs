//! The memory_viz file of a recorded training step: Python's `pickle` loads it, its fields
//! are the ones PyTorch's viewer reads, and replaying its allocations and frees gives the
//! ledger's live bytes after every event. It holds `crate::serial`, so that no other test's
//! tensors share the device's ledger while it records.

use std::process::Command;

use burn::backend::Autodiff;
use burn::backend::ndarray::{NdArray, NdArrayDevice};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;
use frugal::Frugal;
use frugal::memory::{self, EventKind};

type B = Autodiff<Frugal<NdArray>>;

#[derive(Module, Debug)]
struct Net<B: burn::tensor::backend::Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

#[test]
fn a_recorded_step_loads_in_python_and_replays_the_ledgers_live_bytes() {
    let _serial = crate::serial();
    let device = NdArrayDevice::Cpu;
    assert_eq!(
        memory::live_bytes(&device),
        0,
        "recording starts on an empty device"
    );
    memory::record_timeline(&device, 1 << 16);
    let net = Net::<B> {
        a: LinearConfig::new(16, 32).init(&device),
        b: LinearConfig::new(32, 4).init(&device),
    };
    let mut optim = AdamWConfig::new().init::<B, Net<B>>();
    let mut net = net;
    for step in 0..2 {
        memory::mark(&device, &format!("step {step} forward"));
        let x = Tensor::<B, 2>::ones([8, 16], &device);
        let loss = net.b.forward(net.a.forward(x).tanh()).powi_scalar(2).mean();
        memory::mark(&device, "backward");
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        memory::mark(&device, "optimizer");
        net = optim.step(1e-3, net, grads);
    }
    let snapshot = memory::snapshot(&device);
    assert_eq!(snapshot.dropped_events, 0);
    let expected: Vec<u64> = snapshot
        .events
        .iter()
        .filter(|e| e.kind != EventKind::Mark)
        .map(|e| e.live_bytes)
        .collect();
    assert!(expected.len() > 20, "{} events", expected.len());
    let dir = std::env::temp_dir().join(format!("frugal-memory-viz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("step.pickle");
    snapshot.write_memory_viz(&path).unwrap();

    let script = r#"
import json, pickle, sys
f = pickle.load(open(sys.argv[1], "rb"))
assert set(f) == {"segments", "device_traces"}, f.keys()
(trace,) = f["device_traces"]
live, curve, sizes = 0, [], {}
for t in trace:
    assert set(t) >= {"action", "addr", "size", "stream", "frames"}, t
    assert all(set(fr) == {"filename", "line", "name"} for fr in t["frames"]), t
    if t["action"] == "alloc":
        assert t["addr"] not in sizes
        sizes[t["addr"]] = t["size"]
        live += t["size"]
    else:
        assert t["action"] == "free_completed", t
        assert sizes.pop(t["addr"]) == t["size"]
        live -= t["size"]
    curve.append(live)
for s in f["segments"]:
    assert set(s) >= {"device", "address", "total_size", "stream", "segment_type",
                      "allocated_size", "active_size", "blocks"}, s
    assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    assert s["blocks"][0]["address"] == s["address"]
    assert s["address"] in sizes
live_blocks = sum(b["requested_size"] for s in f["segments"] for b in s["blocks"])
phases = sorted({t["frames"][0]["name"].split(" (")[-1] for t in trace if "(" in t["frames"][0]["name"]})
print(json.dumps({"curve": curve, "live_blocks": live_blocks, "phases": phases}))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let curve: Vec<u64> = result["curve"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        curve, expected,
        "the file's live bytes against the ledger's"
    );
    assert_eq!(
        result["live_blocks"].as_u64(),
        Some(memory::live_bytes(&device)),
        "segments hold what is live at the end"
    );
    let phases = result["phases"].to_string();
    assert!(
        phases.contains("backward)") && phases.contains("optimizer)"),
        "{phases}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
