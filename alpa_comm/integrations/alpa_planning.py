"""What the Alpa adapter (``alpa.py``) and the code it installs in Alpa's workers
(``alpa_worker.py``) both read, below both so that neither imports the other: the worker
module is imported by Ray in every actor process, the adapter imports it by name when it
installs the worker class."""

PLANNING_NIC_GBPS = 10.0
"""The NIC rate plans for Alpa are made at: only relative speeds matter to the load
balancer and the chunk choice."""
