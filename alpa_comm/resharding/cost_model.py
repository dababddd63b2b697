"""Closed-form time of the communication patterns a plan is built from.

All times are seconds; rates are bytes/second (``inf`` allowed for an ideal
intra-host link); ``lat`` is paid once per message. With ``lat = 0`` and an
ideal intra-host link these reduce to the paper's formulas, where t is the time
of one slice copy through one NIC and A x B the receiving hosts x devices:

=================  ==================  ==================================
strategy           paper               here
=================  ==================  ==================================
send_recv          A*B*t               A*B point-to-point sends
local_allgather    A*t                 A sends, then intra-host all-gather
global_allgather   2t                  scatter (t) + ring all-gather
                                       ((N-1)/N * t, N = A*B; the paper
                                       rounds (N-1)/N up to 1; with A = 1
                                       the ring stays inside the host)
broadcast          t + (A-1)t/K        K-chunk pipelined chain
=================  ==================  ==================================

Each transfer kind (``kinds/``) states its paper formula as ``closed_form``.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

MAX_AUTO_CHUNKS = 512
"""At most this many chunks per chain: a transfer's chunk messages use tags below the
executor's ring tags (512 of the 1,024 tags each transfer has)."""
MIN_CHUNK_BYTES = 16 * 1024
PIPELINED_GAP_SHARE = 0.25
"""What a chunk costs on a hop beyond its bytes, as a share of the message latency, when it
follows other chunks already posted on the same stream (``pipelined_gap``): the latency
itself is paid once per hop, by the first chunk, and later chunks overlap it. Measured on
the emulated cluster (gloo over veth, 400 Mbit/s, 350 us a message): a chain's time grew
by 60-100 us a chunk between 64 and 512 chunks of 32 MiB (2x2 and 4x2 receivers), a
quarter of the message latency."""


def chunk_gap(cluster) -> float:
    """Per-chunk cost of a chunk behind others on a stream in flight on ``cluster``: its
    ``chunk_gap_s`` where the transport declared one, else ``pipelined_gap`` of its
    message latency."""
    gap = cluster.chunk_gap_s
    return pipelined_gap(cluster.latency_s) if gap is None else float(gap)


def pipelined_gap(lat: float) -> float:
    """Per-chunk cost of a chunk that follows others on a stream already in flight
    (``PIPELINED_GAP_SHARE`` of the message latency ``lat``)."""
    return PIPELINED_GAP_SHARE * lat


def p2p_time(nbytes: float, rate: float, lat: float) -> float:
    """One message of ``nbytes`` over one stream."""
    return lat + nbytes / rate


def chain_time(nbytes: float, hop_rates: Sequence[float], chunks: int, lat: float,
               gap: float | None = None) -> float:
    """Chunk-pipelined chain broadcast: every hop forwards chunk k while taking chunk k+1.

    The first chunk crosses every hop once, paying ``lat`` on each; the other K-1 chunks
    follow at the pace of the slowest hop, each paying ``gap`` there (a chunk posted
    behind others on a stream in flight; None: ``lat``, every chunk a message of its own).
    """
    if not hop_rates:
        return 0.0
    c = nbytes / chunks
    g = lat if gap is None else gap
    return sum(lat + c / r for r in hop_rates) + (chunks - 1) * (g + c / min(hop_rates))


def ring_allgather_time(nbytes: float, ring_rates: Sequence[float], lat: float) -> float:
    """Ring all-gather of ``nbytes`` held as N equal parts by N members.

    N-1 steps; in each, every member passes one part (nbytes/N) to its
    successor, so a step lasts as long as the slowest ring edge takes a part.
    """
    n = len(ring_rates)
    if n <= 1:
        return 0.0
    part = nbytes / n
    return (n - 1) * (lat + part / min(ring_rates))


@functools.lru_cache(maxsize=4096)
def _best_chunks(nbytes: int, hop_rates: tuple[float, ...], lat: float, limit: int, gap: float | None) -> int:
    g = lat if gap is None else gap
    if g <= 0:
        return limit
    slow = min(hop_rates)
    # chain_time = (fill) + (K - 1) gap + t + sum over the other hops of t_i / K, so
    # K* = sqrt(sum_i t_i / gap) (t_i: the whole tensor through hop i, the slowest one
    # left out); search its neighbourhood and the powers of two against the exact model.
    others = sum(nbytes / r for r in hop_rates) - nbytes / slow
    k_star = int(math.sqrt(max(others, 0.0) / g))
    options = {1, limit, max(1, min(limit, k_star)), max(1, min(limit, k_star + 1))}
    options.update(min(limit, 2 ** i) for i in range(limit.bit_length()))
    return min(sorted(options), key=lambda k: (chain_time(nbytes, hop_rates, k, lat, gap), k))


def auto_chunks(nbytes: int, hop_rates: Sequence[float], lat: float, max_chunks: int | None = None,
                gap: float | None = None) -> int:
    """Chunk count K minimizing ``chain_time`` for this chain.

    More chunks shorten the fill of an H-hop pipeline (the sum over the hops but the
    slowest of t_i/K) but each costs one more ``gap`` (None: ``lat``) on the slowest hop;
    chunks are kept at least ``MIN_CHUNK_BYTES`` large and at most ``MAX_AUTO_CHUNKS``
    many (``max_chunks``: fewer).
    """
    if len(hop_rates) <= 1:
        return 1
    limit = max(1, min(MAX_AUTO_CHUNKS, nbytes // MIN_CHUNK_BYTES))
    if max_chunks is not None:
        limit = max(1, min(limit, max_chunks))
    return _best_chunks(int(nbytes), tuple(hop_rates), float(lat), limit, None if gap is None else float(gap))
