"""Memory history around a torch.compile'd model:
_record_memory_history(context="all", compile_context=True) names the
compiled region ("Torch-Compiled Region: i/j") on each trace entry made
inside it, "N/A" elsewhere; without compile_context every entry says "N/A".

One small model, compiled once per run (tens of seconds): slow tier.
"""

from harness import Skip, recording, settle, torch_mod, trace

FAST = ()

_compiled = None


def _model():
    global _compiled
    torch = torch_mod()
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 8):
        raise Skip("torch's allocator has compile contexts from 2.8")
    if _compiled is None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8)).cuda()
        _compiled = (torch.compile(model), torch.randn(16, 64, device="cuda"))
        _compiled[0](_compiled[1])             # compiled here, outside the recording
    return _compiled


def _alloc_contexts(**kw) -> list:
    cm, x = _model()
    settle()
    with recording(context="all", **kw):
        out = cm(x)                            # inside the compiled region
        loss = out.sum()                       # outside it
        snap = torch_mod().cuda.memory._snapshot()
    del out, loss
    return [e["compile_context"] for e in trace(snap) if e["action"] == "alloc"]


def check_compile_context_names_the_region():
    got = _alloc_contexts(compile_context=True)
    inside = [c for c in got if c != "N/A"]
    assert inside and all(c.startswith("Torch-Compiled Region: ") for c in inside), got
    assert len(set(inside)) == 1, got          # one region, one name
    # the region's allocations first, then the sum's, outside it
    assert got == inside + ["N/A"] * (len(got) - len(inside)), got
    assert got[-1] == "N/A", got


def check_without_compile_context_every_entry_says_na():
    got = _alloc_contexts()
    assert got and set(got) == {"N/A"}, got
