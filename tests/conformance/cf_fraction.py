"""set_per_process_memory_fraction / get_per_process_memory_fraction: the
argument checks, what reads back (0.0 and 1.0 included), the limit enforced
against reserved memory, the "allowed" part of the OOM message, and the
garbage collector that a fraction enables (garbage_collection_threshold)."""

import random
import struct

from harness import (GiB, MiB, at_least, empty, fraction, raises, settings, settle, stat,
                     this_process_uses, torch_mod)

MEMORY = "4GiB"


def check_argument_checks():
    torch = torch_mod()
    raises(TypeError, lambda: torch.cuda.set_per_process_memory_fraction(1), match="Invalid type")
    raises(ValueError, lambda: torch.cuda.set_per_process_memory_fraction(-0.1),
           match="Invalid fraction value")
    raises(ValueError, lambda: torch.cuda.set_per_process_memory_fraction(2.0),
           match="Invalid fraction value")
    assert torch.cuda.get_per_process_memory_fraction() == 1.0


def check_reads_back_what_was_set():
    torch = torch_mod()
    init = torch.cuda.get_per_process_memory_fraction()
    torch.cuda.set_per_process_memory_fraction(1.0)
    assert torch.cuda.get_per_process_memory_fraction() == 1.0
    torch.cuda.set_per_process_memory_fraction(0.0)
    assert torch.cuda.get_per_process_memory_fraction() == 0.0
    rng = random.Random(5)
    for _ in range(5):
        # float32 values, as torch's own test draws them with torch.rand
        v = struct.unpack("f", struct.pack("f", rng.random()))[0]
        torch.cuda.set_per_process_memory_fraction(v)
        assert torch.cuda.get_per_process_memory_fraction() == v
    torch.cuda.set_per_process_memory_fraction(init)
    assert torch.cuda.get_per_process_memory_fraction() == init
    x = torch.ones(16, device="cuda")           # the restored fraction lets it through
    del x


def check_limit_is_enforced():
    torch = torch_mod()
    settle()
    t = torch.zeros(1024, device="cuda")
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    with fraction(0.5):
        ok = empty(int(total * 0.499) - torch.cuda.max_memory_reserved())
        del ok
        torch.cuda.empty_cache()
        raises(RuntimeError, lambda: empty(int(total * 0.5)), match="out of memory")
    big = empty(int(total * 0.6))               # the limit is gone with the fraction
    del big, t


def check_zero_fraction_refuses_everything():
    torch = torch_mod()
    settle()
    with fraction(0.0):
        assert torch.cuda.get_per_process_memory_fraction() == 0.0
        e = raises(torch.OutOfMemoryError, lambda: torch.empty(1, device="cuda"))
        assert "Tried to allocate 2.00 MiB." in str(e)
        # the process sentence (NVML: the context alone) comes before the limit
        free, total = torch.cuda.mem_get_info()
        want = f"is free. {this_process_uses(total - free)}0 bytes allowed; Of the allocated"
        assert want in str(e), str(e)
    x = torch.empty(1, device="cuda")
    del x


def check_message_names_the_limit_only_when_one_is_set():
    torch = torch_mod()
    settle()
    with fraction(0.5):
        e = raises(torch.OutOfMemoryError, lambda: empty(3 * GiB))
        free, total = torch.cuda.mem_get_info()
        want = f"is free. {this_process_uses(total - free)}2.00 GiB allowed; Of the allocated"
        assert want in str(e), str(e)
    with fraction(1.0):
        e = raises(torch.OutOfMemoryError, lambda: empty(5 * GiB))
        if at_least("2.10"):                     # 1.0 is no limit at all
            assert "allowed;" not in str(e), str(e)
        else:  # a fraction set names its limit, 1.0 too (2.6.0; 2.10.0 does not)
            free, total = torch.cuda.mem_get_info()
            want = f"is free. {this_process_uses(total - free)}4.00 GiB allowed; Of the allocated"
            assert want in str(e), str(e)


def check_observer_sees_the_limit():
    torch = torch_mod()
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(
        lambda dev, alloc, allowed, free: seen.append((dev, alloc, allowed)))
    with fraction(0.25):
        raises(torch.OutOfMemoryError, lambda: empty(2 * GiB))
    assert seen[-1] == (0, 2 * GiB, GiB), seen


def check_limit_counts_cached_memory():
    # the limit applies to reserved memory: cached blocks are released first
    torch = torch_mod()
    settle()
    a = empty(600 * MiB)
    del a                                        # 600 MiB cached
    with fraction(0.25):                         # 1 GiB allowed
        b = empty(700 * MiB)                     # fits only once the cache is given back
        assert torch.cuda.memory_reserved() == 700 * MiB
        del b


def check_garbage_collection_threshold_frees_old_blocks():
    torch = torch_mod()
    settle()
    with settings("garbage_collection_threshold:0.5"), fraction(0.25):
        # 1 GiB allowed; the collector keeps reserved memory under 512 MiB
        # by freeing cached blocks before asking the device for more
        a = empty(300 * MiB)
        b = empty(300 * MiB)
        del a, b
        assert torch.cuda.memory_reserved() == 600 * MiB
        c = empty(400 * MiB)
        assert torch.cuda.memory_reserved() <= 700 * MiB
        assert stat("num_device_free") >= 1
        del c


def check_fraction_per_device_index():
    torch = torch_mod()
    torch.cuda.set_per_process_memory_fraction(0.75, 0)
    try:
        assert torch.cuda.get_per_process_memory_fraction(0) == 0.75
        assert torch.cuda.get_per_process_memory_fraction("cuda:0") == 0.75
        assert torch.cuda.get_per_process_memory_fraction(torch.device("cuda", 0)) == 0.75
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
