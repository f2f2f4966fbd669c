"""One training step on this interpreter's torch release, side by side:
``python -m gpumem.sim`` with torch's own allocator and ``gpumem simulate``
(gpumem installed) give the same peak allocated and reserved memory, and
torch.cuda.memory_stats() and a snapshot work under both.

It runs on whatever torch this Python has: 2.14.1 in the full suite, 2.6.0
(CUDA 12.4) in the oldest-release CI step (.ci/torch26), or any
supported release (benchmarks/torch_matrix.py); the simulator preloads the
fake libraries of that torch's CUDA major version.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sim_helpers import needs_torch
from torch_helpers import _env, built_shim, last_json

STEP = textwrap.dedent('''
    import json, torch
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 256), torch.nn.TransformerEncoder(layer, 2),
                                torch.nn.Linear(256, 1000)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 1000, (8, 128), device="cuda")
    for _ in range(2):  # the second step runs with AdamW's state allocated
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    snap = torch.cuda.memory._snapshot()
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    import sys
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "gpumem": "gpumem" in sys.modules and sys.modules["gpumem"].is_installed(),
                      "allocated": torch.cuda.max_memory_allocated(),
                      "reserved": torch.cuda.max_memory_reserved(),
                      "stats": [stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]],
                      "segments": len(snap["segments"]), "blocks": blocks}))
''')


@needs_torch
@pytest.mark.slow
def test_a_training_step_peaks_the_same_under_gpumem_simulate(tmp_path):
    built_shim()
    script = tmp_path / "step.py"
    script.write_text(STEP)
    env = _env()
    torch_run = subprocess.run([sys.executable, "-m", "gpumem.sim", "--", sys.executable,
                                str(script)], capture_output=True, text=True, env=env,
                               timeout=900, cwd=tmp_path)
    assert torch_run.returncode == 0, torch_run.stderr[-3000:]
    theirs = last_json(torch_run.stdout)
    ours_run = subprocess.run([sys.executable, "-m", "gpumem", "simulate", "--json",
                               "--out", str(tmp_path / "out"), "--", sys.executable, str(script)],
                              capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert ours_run.returncode == 0, ours_run.stderr[-3000:]
    out = ours_run.stdout
    start = out.index("{")  # the script's line, then simulate's report (indented JSON)
    ours = json.loads(out[start:out.index("\n", start)])
    report = json.loads(out[out.index("\n{", start) + 1:])
    assert not theirs["gpumem"] and ours["gpumem"], (theirs, ours)
    assert ours["torch"] == theirs["torch"]
    for who in (theirs, ours):
        assert who["stats"] == [who["allocated"], who["reserved"]], who
        assert who["segments"] > 0 and who["blocks"] > who["segments"], who
    assert [ours["allocated"], ours["reserved"]] == [theirs["allocated"], theirs["reserved"]], (
        f"torch {theirs['torch']}: torch's allocator {theirs}, gpumem {ours}")
    row = report["per_device"][0]
    assert [row["peak_allocated"], row["peak_reserved"]] == [ours["allocated"], ours["reserved"]]
    assert (tmp_path / "out" / "snapshot.pickle").is_file()
    print(json.dumps({"torch": theirs["torch"], "cuda": theirs["cuda"],
                      "peaks_torch": [theirs["allocated"], theirs["reserved"]],
                      "peaks_gpumem": [ours["allocated"], ours["reserved"]]}))
