"""A federation's state between two rounds, as plain data: what a checkpoint holds.

:func:`federation_state` gathers everything the rounds after round ``r`` depend on, on this
rank: the global parameters (each client's own for ``local``), every random generator's
state (participation draws, each client's training, evaluation and DP noise generators,
the server's noise generator, and torch's global generator), the byte tally, the DP
accountant and adaptive clip, every uplink codec's error-feedback residual, shared scale
and clamped count, the gate's transcript and budgets, the best evaluation so far and the
evaluation rows. :func:`load_federation_state` puts it back, so that the rounds after a
resume draw, send and count exactly what an uninterrupted run would have.

The state holds only tensors, numbers, strings, booleans, None, lists and dicts: it is
written with ``torch.save`` and read back with ``torch.load(..., weights_only=True)``,
which refuses anything else (a checkpoint may come from a stranger).

Without ``dp.reproducible_noise`` the DP noise comes from secret seeds; their generators'
states are in the checkpoint, so whoever reads a checkpoint can regenerate the noise of
the rounds after it: keep a DP run's checkpoints as private as the data.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from commgnn.errors import UserError

# ``fed`` below is a :class:`~commgnn.federated.engine.Federation`, typed ``Any`` because the
# engine imports this module (a type-only import back would make a circle).


FORMAT = 1
"""Version of the state layout (a checkpoint of another layout is refused)."""


def _codec_state(codec: Any) -> dict[str, Any]:
    """One codec's residual (its own ``state_dict``) and its quantiser's scale and count."""
    quant = getattr(codec, "quant", codec)
    out: dict[str, Any] = {"state": dict(codec.state_dict())}
    for key in ("clip", "scale", "clamped"):
        if hasattr(quant, key):
            out[key] = getattr(quant, key)
    return out


def _load_codec(codec: Any, state: Mapping[str, Any]) -> None:
    codec.load_state_dict(state["state"])
    quant = getattr(codec, "quant", codec)
    for key, kind in (("clip", float), ("scale", float), ("clamped", int)):
        if key in state:
            setattr(quant, key, kind(state[key]))


def _gens(gens: Mapping[int, torch.Generator]) -> dict[int, Tensor]:
    return {int(c): g.get_state() for c, g in gens.items()}


def _load_gens(gens: Mapping[int, torch.Generator], states: Mapping[int, Tensor], what: str) -> None:
    if set(gens) != {int(c) for c in states}:
        raise UserError(f"the checkpoint's {what} generators are for clients {sorted(states)}, "
                        f"this rank hosts {sorted(gens)}")
    for c, g in gens.items():
        g.set_state(states[c])


def federation_state(fed: Any, *, round_done: int, params: Tensor | dict[int, Tensor],
                     best: dict[str, Any], curve: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """This rank's state after round ``round_done`` (see the module docstring)."""
    t = fed.tally
    state: dict[str, Any] = {
        "format": FORMAT, "round": int(round_done), "rank": fed.t.rank, "world": fed.t.world,
        "params": params.clone() if isinstance(params, Tensor) else {int(c): p.clone() for c, p in params.items()},
        "best": {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in best.items()},
        "curve": [dict(row) for row in curve], "wall_s": float(wall_s),
        "torch_rng": torch.get_rng_state(),
        "gen": fed.gen.get_state(), "noise_gen": fed.noise_gen.get_state(),
        "cgen": _gens(fed.cgen), "eval_gen": _gens(fed.eval_gen),
        "tally": {"uplink": t.uplink, "downlink": t.downlink, "embeddings": t.embeddings,
                  "payload_uplink": t.payload_uplink, "evaluation": t.evaluation, "secagg_s": t.secagg_s,
                  "train_s": t.train_s, "by_client": {int(c): int(n) for c, n in t.by_client.items()}},
        "codecs": {int(c): _codec_state(codec) for c, codec in fed.codecs.items()},
        "decoder": _codec_state(fed.decoder),
        "gate": fed.gate.state_dict(),
        "accountant": fed.accountant.state_dict() if fed.accountant is not None else None,
        "adaptive": fed.adaptive.state_dict() if fed.adaptive is not None else None,
        "sigma": float(fed.sigma),
    }
    if not fed.cfg.dp.reproducible_noise:  # secret-seeded generators of their own
        state["dp_gen"] = _gens(fed.dp_gen)
        state["dp_server_gen"] = fed.dp_server_gen.get_state()
    return state


def load_federation_state(fed: Any, state: Mapping[str, Any]) -> tuple[
        int, Tensor | dict[int, Tensor], dict[str, Any], list[dict[str, Any]], float]:
    """Put ``state`` (from :func:`federation_state`, on the same rank of as many ranks) back
    into ``fed``; returns ``(rounds done, params, best, curve, wall seconds so far)``.
    Raises :class:`~commgnn.errors.UserError` when the state does not fit this federation."""
    try:
        if state.get("format") != FORMAT:
            raise UserError(f"checkpoint layout {state.get('format')!r} is not this version's ({FORMAT})")
        if (state["rank"], state["world"]) != (fed.t.rank, fed.t.world):
            raise UserError(f"the checkpoint was written by rank {state['rank']} of {state['world']}, "
                            f"this is rank {fed.t.rank} of {fed.t.world}")
        params = state["params"]
        expected = (fed.dim,)
        for p in params.values() if isinstance(params, dict) else [params]:
            if tuple(p.shape) != expected:
                raise UserError(f"the checkpoint's parameters have shape {tuple(p.shape)}, "
                                f"this model has {expected}")
        torch.set_rng_state(state["torch_rng"])
        fed.gen.set_state(state["gen"])
        fed.noise_gen.set_state(state["noise_gen"])
        _load_gens(fed.cgen, state["cgen"], "training")
        _load_gens(fed.eval_gen, state["eval_gen"], "evaluation")
        if not fed.cfg.dp.reproducible_noise:
            _load_gens(fed.dp_gen, state["dp_gen"], "DP noise")
            fed.dp_server_gen.set_state(state["dp_server_gen"])
        for key, value in state["tally"].items():
            if key == "by_client":
                fed.tally.by_client = {int(c): int(n) for c, n in value.items()}
            else:
                setattr(fed.tally, key, type(getattr(fed.tally, key))(value))
        if set(fed.codecs) != {int(c) for c in state["codecs"]}:
            raise UserError("the checkpoint's uplink codecs are for other clients than this rank hosts")
        for c, codec in fed.codecs.items():
            _load_codec(codec, state["codecs"][c])
        _load_codec(fed.decoder, state["decoder"])
        fed.gate.load_state_dict(state["gate"])
        if (state["accountant"] is None) != (fed.accountant is None) or \
                (state["adaptive"] is None) != (fed.adaptive is None):
            raise UserError("the checkpoint's DP settings differ from this run's")
        if fed.accountant is not None:
            fed.accountant.load_state_dict(state["accountant"])
        if fed.adaptive is not None:
            fed.adaptive.load_state_dict(state["adaptive"])
        fed.sigma = float(state["sigma"])  # the noise the run was calibrated with
        best = dict(state["best"])
        return int(state["round"]), params, best, [dict(r) for r in state["curve"]], float(state["wall_s"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise UserError(f"the checkpoint does not fit this federated run ({type(exc).__name__}: {exc})") from None
