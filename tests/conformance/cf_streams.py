"""record_stream and cross-stream reuse.  The simulated GPU runs with events
that complete only when synchronised (EVENTS = "never"), as a busy device
would: a block freed while another stream may still use it must not be
handed out until that stream's work is known to be done."""

from harness import MiB, blocks, empty, settle, stat, torch_mod

EVENTS = "never"
MEMORY = "2GiB"


def check_record_stream_delays_reuse():
    torch = torch_mod()
    settle()
    side = torch.cuda.Stream()
    t = torch.FloatTensor([1, 2, 3, 4]).pin_memory()
    ptr = []

    def copy_on_side_stream():
        with torch.cuda.stream(side):
            tmp = t.cuda(non_blocking=True)
            ptr.append(tmp.data_ptr())
        torch.cuda.current_stream().wait_stream(side)
        tmp.record_stream(torch.cuda.current_stream())
        result.copy_(tmp)

    result = torch.cuda.FloatTensor(t.size())
    copy_on_side_stream()                       # tmp is freed here, its use still pending
    with torch.cuda.stream(side):
        tmp2 = torch.cuda.FloatTensor(t.size())
        assert tmp2.data_ptr() != ptr[0], "allocation reused too soon"
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(side):
        tmp3 = torch.cuda.FloatTensor(t.size())
        assert tmp3.data_ptr() == ptr[0], "allocation not reused"
    del tmp2, tmp3


def check_record_stream_on_a_shifted_view():
    torch = torch_mod()
    settle()
    alloc_stream = torch.cuda.Stream()
    with torch.cuda.stream(alloc_stream):
        base = torch.cuda.FloatTensor([10, 10])
    view = base[1:]
    assert view.storage_offset() > 0
    record_stream = torch.cuda.Stream()
    view.record_stream(record_stream)
    ptr = base.data_ptr()
    del base, view
    alloc_stream.synchronize()                  # not the stream that used it
    with torch.cuda.stream(alloc_stream):
        again = torch.cuda.FloatTensor([10, 10])
    assert again.data_ptr() != ptr
    record_stream.synchronize()


def _freed_while_used_on_a_side_stream(nbytes: int):
    """(the side stream, the address) of a block freed while a use recorded
    on the side stream is pending."""
    torch = torch_mod()
    settle()
    side = torch.cuda.Stream()
    x = empty(nbytes)
    x.record_stream(side)
    return side, x.data_ptr()


def check_pending_block_in_snapshot_and_stats():
    torch = torch_mod()
    side, ptr = _freed_while_used_on_a_side_stream(4 * MiB)
    states = [b["state"] for b in blocks(torch.cuda.memory._snapshot()) if b["address"] == ptr]
    assert states == ["active_pending_free"], states
    assert stat("allocated_bytes.all.current") == 0
    assert stat("active_bytes.all.current") == 4 * MiB   # active until the event completes
    side.synchronize()
    torch.cuda.empty_cache()
    assert stat("active_bytes.all.current") == 0


def check_same_stream_use_needs_no_event():
    torch = torch_mod()
    settle()
    x = empty(4 * MiB)
    x.record_stream(torch.cuda.current_stream())  # the allocation stream: nothing to wait for
    ptr = x.data_ptr()
    del x
    y = empty(4 * MiB)
    assert y.data_ptr() == ptr


def check_empty_cache_waits_for_pending_frees():
    torch = torch_mod()
    settle()
    side = torch.cuda.Stream()
    x = empty(30 * MiB)
    x.record_stream(side)
    del x
    syncs = stat("num_sync_all_streams")
    torch.cuda.empty_cache()                    # synchronises the events, then frees
    assert stat("num_sync_all_streams") == syncs + 1
    assert torch.cuda.memory_reserved() == 0
    assert stat("active_bytes.all.current") == 0


def check_out_of_memory_retry_frees_pending_blocks():
    # blocks whose reuse is delayed by record_stream are freed by the retry
    # that an out-of-memory triggers (pytorch issue 19219)
    torch = torch_mod()
    settle()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = torch.zeros(40 * MiB, device="cuda")
    for _ in range(30):                         # 30 x 160 MiB on a 2 GiB device
        x = torch.empty(40 * MiB, device="cuda")
        with torch.cuda.stream(side):
            y += x
        x.record_stream(side)
        del x
    assert stat("num_ooms") == 0
    del y
    torch.cuda.empty_cache()


def check_wait_stream_does_not_complete_events():
    torch = torch_mod()
    side, ptr = _freed_while_used_on_a_side_stream(4 * MiB)
    torch.cuda.current_stream().wait_stream(side)  # orders later work; the event is still pending
    y = empty(4 * MiB)
    assert y.data_ptr() != ptr
    torch.cuda.synchronize()
    z = empty(4 * MiB)
    assert z.data_ptr() == ptr
