"""The device as torch's allocator sees it through the driver, with the
memory a CUDA context holds charged as on a real GPU (the simulator's
GPUMEM_SIM_CONTEXT_MEMORY): what mem_get_info reports, and two halves of
the device not fitting (pytorch's test_out_of_memory_retry)."""

from harness import GiB, MiB, empty, raises, settle, torch_mod

MEMORY = "4GiB"
CONTEXT = 300 * MiB
VARIANTS = {"": {"GPUMEM_SIM_CONTEXT_MEMORY": str(CONTEXT)}}


def check_the_context_holds_device_memory():
    torch = torch_mod()
    torch.ones(1, device="cuda")
    settle()
    free, total = torch.cuda.mem_get_info()
    assert total == 4 * GiB == torch.cuda.get_device_properties(0).total_memory
    assert free == total - CONTEXT - torch.cuda.memory_reserved()


def check_two_halves_of_the_device_do_not_fit():
    torch = torch_mod()
    settle()
    total = torch.cuda.get_device_properties(0).total_memory
    a = empty(total // 2)
    raises(RuntimeError, lambda: empty(total // 2), match="Tried to allocate")
    del a
    b = empty(total // 2)
    del b
    torch.cuda.empty_cache()


def check_oom_message_counts_the_context_out():
    torch = torch_mod()
    settle()
    e = raises(torch.OutOfMemoryError, lambda: empty(4 * GiB - 200 * MiB))
    assert "of which 3.71 GiB is free" in str(e), str(e)


def check_oom_message_counts_the_context_in_this_process():
    # NVML's figure for this process is the context and the allocator's
    # segments (1 GiB + 300 MiB): the same under either allocator
    torch = torch_mod()
    settle()
    keep = empty(GiB)
    e = raises(torch.OutOfMemoryError, lambda: empty(4 * GiB))
    assert ("is free. Including non-PyTorch memory, this process has 1.29 GiB memory in use. "
            "Of the allocated memory 1024.00 MiB is allocated by PyTorch") in str(e), str(e)
    del keep
