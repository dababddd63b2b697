"""What tests (and ``benchmarks/gpu_check.py``) use to run code paths this machine has no
hardware for: ``nccl_model``, a model of NCCL's semantics standing in for CuPy."""
