"""``gpumem doctor``: checking a machine (not named doctor: gpumem.doctor is
the public function).  Bottom to top:
  cudadriver  the CUDA driver API through ctypes (probe, Driver)
  selftest    the driver backend exercised on one GPU
  doctor      the checks and their report
"""
