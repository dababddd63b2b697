"""``signal``: the broadcast protocol with one byte per unit task.

It moves no data; it times the protocol itself (messages, ordering, waits), which
is the upper bound of what any plan with these unit tasks can reach.
"""
from __future__ import annotations

from ...errors import InvalidOptionError
from .. import cost_model
from .broadcast import Broadcast

SIGNAL_BYTES = 1


class Signal(Broadcast):
    name = "signal"
    order = 60
    packable = False
    carries_data = False

    def wire_bytes(self, nbytes):
        return SIGNAL_BYTES

    def chunks_for(self, nbytes, num_elements, rates, cluster, chunks):
        return SIGNAL_BYTES, 1

    def closed_form(self, t, hosts, devices, chunks=1):
        raise InvalidOptionError(f"transfer kind {self.name!r} moves one byte per task: it has no closed form in t")

    def phases(self, t, cluster):
        # its one byte is a flow over the chain, like a broadcast's, so signals that
        # run at once share the NICs they cross (the bound counts that byte per task)
        rates, links = self.chain(t, cluster)
        fill = cost_model.chain_time(SIGNAL_BYTES, rates, 1, cluster.latency_s) - SIGNAL_BYTES / min(rates)
        return [(fill, [(SIGNAL_BYTES, links)])]
