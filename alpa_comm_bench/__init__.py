"""The benchmarks of alpa_comm, kept out of the library: what ``alpa-comm bench`` and
``alpa-comm simulate --suite`` run, and what their tests and the scripts under
``benchmarks/`` reuse.

It imports alpa_comm's public pieces; alpa_comm never imports it at import time (its CLI
imports a runner inside the command that needs it). Modules:

* ``result``: ``Result``, one measured row, and ``VerificationError``;
* ``shapes``: the workloads (weight-sync parameter trees, a transformer's weights by name);
* ``probes``: copy-rate probes (one copy between two hosts, or two sizes between two
  processes) that calibrate the simulator and the lower bounds;
* ``cluster_runs``: Alpa's reference suites measured on a cluster of host workers;
* ``weight_sync``: per-array vs joint vs coalesced tree resharding on that cluster;
* ``sync_processes``: weight sync between the user's own JAX processes;
* ``data_plane``: the data plane in JAX processes beside JAX's ``device_put`` and the raw rate;
* ``simulated``: the reference suites on the planner and simulator, every method side by side;
* ``acceptance``: the checks a measured run is judged by;
* ``report``, ``suite_report``: tables and files of a measured and of a simulated run.
"""
