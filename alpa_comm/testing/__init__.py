"""Test utilities that ship with alpa_comm (not part of its API): stand-ins that let the
tests, and ``benchmarks/gpu_check.py``, run code paths without the hardware they need.

* ``nccl_model``: a model of NCCL's and CuPy's semantics over NumPy buffers, standing
  in for CuPy (a deadlock is reported, not hung);
* ``nccl_model_remote``: one model world served to rank processes;
* ``ungrouped_nccl``: the NCCL backend as it was, which the model catches;
* ``pipeline_transport``: the pipeline trainer's transport over NCCL, every stage host a
  thread (on the NCCL model in the tests, on GPUs in ``gpu_check``).
"""
