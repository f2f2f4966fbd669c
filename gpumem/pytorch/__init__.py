"""gpumem inside PyTorch: the shim that makes gpumem torch's CUDA allocator.

Named so that it is never mistaken for ``torch``; nothing here imports torch
at module level.  Bottom to top:
  shim_state  the loaded shim and the settings it was created with
  shim_build  builds the C++ shim against the user's torch (cached per torch)
  release     the memory-history interface of the torch release installed in
  stats       the torch.cuda-style statistics (memory_stats, memory_summary...)
  installer   install(): settings, the shim, torch's names routed to gpumem
"""
