"""Build the halo exchange a :class:`~commgnn.comm.config.HaloConfig` describes.

Levers wrap in a fixed order, outermost first, because each acts on what the next one
sees: staleness decides *whether* a row travels, sampling *which* rows (and scales them
before they are encoded), quantization *how* they are encoded, and the all-to-all moves
the bytes::

    Pipelined | SkipUnchanged ( Sampled ( Quantized | AdaptiveQuantized ( AllToAllHalo )))
"""

from __future__ import annotations


from commgnn.comm.config import BitsConfig, CommConfig, HaloConfig
from commgnn.comm.grad.allreduce import AllReduceSync
from commgnn.comm.grad_sync import GradSync
from commgnn.comm.halo.adaptive import AdaptiveQuantized
from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.exchange import RowExchange
from commgnn.comm.halo.maxk_rows import MaxKRows
from commgnn.comm.halo.pipelined import Pipelined
from commgnn.comm.halo.protocol import HaloPlan
from commgnn.comm.halo.quantized import Quantized
from commgnn.comm.halo.sampled import Sampled
from commgnn.comm.halo.skip import SkipUnchanged
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


def build_halo(ctx: DistContext, plan: HaloPlan, hooks: Hooks, cfg: HaloConfig, *, num_layers: int,
               seed: int, maxk: tuple[int, set[int]] | None = None) -> RowExchange:
    """The composed training-time exchange (evaluation always uses a plain AllToAllHalo)."""
    st = cfg.staleness
    pipelined = st.mode == "pipeline" and ctx.is_distributed
    if pipelined:
        # Background exchanges get their own communicator (every rank creates it, in the
        # same order); the meter books their time, reported from the background thread, as
        # overlap, and Pipelined times what the training thread waits for them as comm.
        group = ctx.new_group()
        ex: RowExchange = AllToAllHalo(ctx, plan, hooks, group=group)
    else:
        ex = AllToAllHalo(ctx, plan, hooks)
    rank_seed = seed * 1_000_003 + ctx.rank
    if cfg.bits == "adaptive":
        ex = AdaptiveQuantized(ex, ctx=ctx, hooks=hooks, num_layers=num_layers,
                               budget_bytes=cfg.budget_mb * 1e6 if cfg.budget_mb is not None else None,
                               budget_s=cfg.budget_s, every=cfg.adapt_every, seed=rank_seed)
    elif isinstance(cfg.bits, BitsConfig) and cfg.bits != BitsConfig():
        ex = Quantized(ex, forward_bits=cfg.bits.forward, backward_bits=cfg.bits.backward, seed=rank_seed)
    if maxk is not None and maxk[1] and ctx.is_distributed:
        # above the quantizer: sparse layers go as (index, value) payloads it passes through;
        # an adaptive quantizer below encodes their values at its per-peer widths instead
        k, layers = maxk
        fb, bb = (cfg.bits.forward, cfg.bits.backward) if isinstance(cfg.bits, BitsConfig) else (32, 32)
        ex = MaxKRows(ex, k=k, sparse_layers=layers, forward_bits=fb, backward_bits=bb, seed=rank_seed + 29)
    if cfg.sample_rate < 1.0:
        ex = Sampled(ex, rate=cfg.sample_rate, seed=seed, rank=ctx.rank)
    if pipelined:
        ex = Pipelined(ex, smoothing=st.smoothing, hooks=hooks, max_error=st.max_error, ctx=ctx)
    elif st.mode == "skip":
        ex = SkipUnchanged(ex, threshold=st.threshold, max_age=st.max_age,
                           residual_bits=st.residual_bits, seed=rank_seed + 17)
    return ex


def build_grad_sync(ctx: DistContext, hooks: Hooks, cfg: CommConfig, *, seed: int) -> GradSync:
    """The gradient strategy of ``[comm.grad]``, or gossip when ``[comm.gossip]`` is set."""
    if cfg.gossip is not None:
        from commgnn.comm.gossip.dpsgd import DPSGD, DPSGDAdaptThenCombine
        from commgnn.comm.gossip.pushsum import PushSum
        from commgnn.comm.gossip.tracking import AdaptThenCombineTracking, GradientTracking

        cls = {"dpsgd": DPSGD, "dpsgd-atc": DPSGDAdaptThenCombine, "pushsum": PushSum, "tracking": GradientTracking,
               "tracking-atc": AdaptThenCombineTracking}[cfg.gossip.method]
        gossip = cls(ctx, hooks, cfg.gossip.topology)
        if cfg.gossip.average_every:
            from commgnn.comm.gossip.global_average import PeriodicGlobalAverage

            gossip = PeriodicGlobalAverage(gossip, ctx, hooks, every=cfg.gossip.average_every)
        if cfg.gossip.momentum:
            from commgnn.comm.gossip.quasi_global import QuasiGlobalMomentum

            gossip = QuasiGlobalMomentum(gossip, beta=cfg.gossip.momentum)
        return gossip
    g = cfg.grad
    if g.strategy == "allreduce":
        return AllReduceSync(ctx, hooks)
    if g.strategy in ("fp16", "bf16", "powersgd", "localsgd"):
        from commgnn.comm.grad.ddp_hooks import DDPHookSync

        return DDPHookSync(ctx, hooks, strategy=g.strategy, rank=g.rank, start_iter=g.start_iter, period=g.period,
                           half=g.half, prescale=g.prescale_on)
    if g.strategy == "topk":
        from commgnn.comm.grad.topk import TopKSync

        return TopKSync(ctx, hooks, ratio=g.ratio, warmup_steps=g.warmup_steps, warmup_density=g.warmup_density,
                        momentum=g.momentum, clip_norm=g.clip_norm, seed=seed)
    if g.strategy == "cltk":
        from commgnn.comm.grad.cltk import CyclicTopKSync

        return CyclicTopKSync(ctx, hooks, ratio=g.ratio, half=g.half, momentum=g.momentum, seed=seed)
    if g.strategy == "qsgd":
        from commgnn.comm.grad.qsgd import QSGDSync

        return QSGDSync(ctx, hooks, levels=g.levels, bucket=g.bucket, error_feedback=g.error_feedback, seed=seed)
    from commgnn.comm.grad.signsgd import SignSGDSync

    return SignSGDSync(ctx, hooks, seed=seed)
