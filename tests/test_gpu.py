"""GPU checks (issue #15, section 5): kernels, exactness and the CLI path on CUDA, marked ``gpu``.

Every test here skips where ``torch.cuda.is_available()`` is false (CI, CPU machines), and
the multi-rank ones also where fewer than two GPUs are visible: NCCL refuses two ranks on
one GPU. Run them, with the halo levers' and gradient strategies' checks of
``tests/test_gpu_levers.py``, with ``pytest -m gpu tests/test_gpu.py tests/test_gpu_levers.py -rs``;
``benchmarks/gpu_check.sh`` runs the gpu tests, and a short benchmark, on a machine with an
NVIDIA GPU.

What is checked:

* **kernels**: the CSR aggregation (:func:`commgnn.models.graph.spmm`, forward and
  backward), the operators a rank builds from device tensors (``LocalGraph.gcn_adj`` /
  ``mean_adj``) and the sparse-input projection (``SparseRows.linear``) agree with the CPU
  to 1e-5 in float32, and with a dense float64 product;
* **exactness**: the full-graph model on CUDA (world size 1; two NCCL ranks with two GPUs)
  reproduces single-process PyG on the CPU, for GCN, GraphSAGE and GAT: logits, loss,
  gradients and the weights after three steps, in float64 (Adam, 1e-5) and float32 (SGD,
  1e-4; Adam's first steps are +-lr whatever a gradient's size, which would magnify
  float32 noise in near-zero gradients); and ``commgnn.train`` on CUDA reproduces the same
  run on the CPU (the loss of every epoch, the predictions).

Ranks run as :mod:`gpu_helpers` describes (one GPU runs a real NCCL communicator of world
size 1, and two gloo ranks sharing it; the rank functions are device-agnostic and run on
gloo on a CPU machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch_geometric.data import Data

import commgnn
from commgnn.distributed.context import DistContext, RuntimeConfig
from commgnn.distributed.events import Hooks
from commgnn.models import ModelConfig
from commgnn.models.graph import CSRPair, LocalGraph, spmm
from commgnn.models.sparse import SparseRows
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.trainers import FullGraphTrainer, TrainConfig
from gpu_helpers import GPU_MARKS, SHARED_GPU, error_text, run_ranks, to_cpu, two_gpus
from helpers import pyg_reference, small_graph, trainer_steps

pytestmark = GPU_MARKS


# ---------------------------------------------------------------- (c) kernels on CUDA
def _random_operator(n_own: int, n_src: int, nnz: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, n_own, (nnz,), generator=g)
    cols = torch.randint(0, n_src, (nnz,), generator=g)
    vals = torch.rand(nnz, generator=g, dtype=torch.float64) + 0.1
    return rows, cols, vals


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)], ids=["fp32", "fp64"])
def test_spmm_forward_and_backward_on_cuda_match_the_cpu(dtype, tol):
    """A rectangular ``[n_own, n_src]`` operator with repeated entries, as a rank builds it."""
    n_own, n_src, f = 1500, 2000, 32
    rows, cols, vals = _random_operator(n_own, n_src, 30_000, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n_src, f, generator=g, dtype=dtype)
    grad_out = torch.randn(n_own, f, generator=g, dtype=dtype)
    got = {}
    for device in ("cpu", "cuda"):
        pair = CSRPair.build(rows.to(device), cols.to(device), vals.to(dtype).to(device), (n_own, n_src))
        assert pair.a.device.type == device and pair.at.device.type == device
        xd = x.to(device).clone().requires_grad_()
        out = spmm(pair, xd)
        out.backward(grad_out.to(device))
        assert out.device.type == device and xd.grad is not None and xd.grad.device.type == device
        got[device] = (out.detach().cpu(), xd.grad.cpu())
    torch.testing.assert_close(got["cuda"][0], got["cpu"][0], atol=tol, rtol=tol, msg="forward, CUDA vs CPU")
    torch.testing.assert_close(got["cuda"][1], got["cpu"][1], atol=tol, rtol=tol, msg="backward, CUDA vs CPU")
    dense = torch.zeros(n_own, n_src, dtype=torch.float64).index_put_((rows, cols), vals, accumulate=True)
    ref_out, ref_grad = dense @ x.double(), dense.t() @ grad_out.double()
    torch.testing.assert_close(got["cuda"][0].double(), ref_out, atol=tol, rtol=tol, msg="forward vs dense fp64")
    torch.testing.assert_close(got["cuda"][1].double(), ref_grad, atol=tol, rtol=tol, msg="backward vs dense fp64")


def test_spmm_keeps_trailing_dimensions_on_cuda():
    """GAT-shaped rows ``[n, heads, C]`` are flattened and restored around the product."""
    rows, cols, vals = _random_operator(50, 80, 400, seed=2)
    x = torch.randn(80, 4, 3, generator=torch.Generator().manual_seed(3))
    outs = [spmm(CSRPair.build(rows.to(d), cols.to(d), vals.float().to(d), (50, 80)), x.to(d)).cpu()
            for d in ("cpu", "cuda")]
    assert outs[1].shape == (50, 4, 3)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_layer_operators_built_from_device_tensors_match_the_cpu():
    """``gcn_adj`` and ``mean_adj`` of a rank with halo rows, built where its tensors live."""
    data = small_graph(n=400, m=2000, f=8)
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=1))
    part = build_local_partition(data, parts, 2, 0)
    n_src = part.num_owned + part.num_halo
    assert part.num_halo > 0
    x = torch.randn(n_src, 16, generator=torch.Generator().manual_seed(0))
    for op in ("gcn_adj", "mean_adj"):
        got = []
        for device in ("cpu", "cuda"):
            graph = LocalGraph(num_own=part.num_owned, num_src=n_src, edge_index=part.edge_index.to(device),
                               in_degree=part.in_degree.to(device))
            pair = getattr(graph, op)(torch.float32)
            assert pair.a.device.type == device, (op, pair.a.device)
            xd = x.to(device).clone().requires_grad_()
            out = spmm(pair, xd)
            out.square().sum().backward()
            got.append((out.detach().cpu(), xd.grad.cpu()))
        torch.testing.assert_close(got[1][0], got[0][0], atol=1e-5, rtol=1e-5, msg=f"{op} forward")
        torch.testing.assert_close(got[1][1], got[0][1], atol=1e-5, rtol=1e-5, msg=f"{op} backward")


def test_sparse_input_projection_on_cuda_matches_the_cpu():
    """The first layer's product on the input's non-zero pattern (``SparseRows.linear``)."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(600, 300, generator=g)
    dense[torch.rand(dense.shape, generator=g) < 0.97] = 0.0
    weight = torch.randn(24, 300, generator=g)
    grad_out = torch.randn(600, 24, generator=g)
    got = []
    for device in ("cpu", "cuda"):
        pattern = SparseRows(dense.to(device))
        values = pattern.gather(dense.to(device))
        w = weight.to(device).clone().requires_grad_()
        out = pattern.linear(values, w)
        out.backward(grad_out.to(device))
        got.append((out.detach().cpu(), w.grad.cpu()))
    torch.testing.assert_close(got[1][0], got[0][0], atol=1e-5, rtol=1e-5, msg="forward")
    torch.testing.assert_close(got[1][1], got[0][1], atol=1e-5, rtol=1e-5, msg="backward")
    torch.testing.assert_close(got[1][0], dense @ weight.t(), atol=1e-4, rtol=1e-5, msg="vs dense")


# ---------------------------------------------------------------- (a) exact parity on CUDA
MODELS = ("gcn", "sage", "gat")
STEPS = 3
PARITY_TOL = {"float64": 1e-5, "float32": 1e-4}


def _parity_cfgs(name: str, dtype: str) -> tuple[ModelConfig, TrainConfig]:
    opt = "adam" if dtype == "float64" else "sgd"
    return (ModelConfig(name=name, layers=3, hidden=8, heads=2, dropout=0.0),
            TrainConfig(dtype=dtype, optimizer=opt, lr=0.01 if opt == "adam" else 0.1, momentum=0.9,
                        epochs=STEPS, patience=0))


def reference(data: Data, name: str, dtype: str) -> dict:
    """Single-process PyG in float64 on the CPU, with the trainer's own optimiser settings:
    initial state, logits, loss and gradients of step 1, and the weights after STEPS."""
    return pyg_reference(data, *_parity_cfgs(name, dtype), STEPS)


def parity_fn(ctx: DistContext, data: Data, parts: torch.Tensor, refs: dict) -> dict:
    """For each dtype and model: step 1's logits, loss and gradients, and the weights after
    STEPS (or the error it raised, so that one failing model does not hide the others)."""
    results: dict[str, dict[str, Any]] = {}
    for dtype in refs:
        results[dtype] = {}
        for name in MODELS:
            try:
                mcfg, tcfg = _parity_cfgs(name, dtype)
                part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
                trainer = FullGraphTrainer(ctx, part, mcfg, tcfg, Hooks())
                res = trainer_steps(ctx, trainer, refs[dtype][name]["state"], STEPS)
                results[dtype][name] = {
                    "ids": part.global_ids, **res,
                    "devices": sorted({str(trainer.x.device), str(res["logits"].device),
                                       *(str(p.device) for p in trainer.model.parameters())})}
            except Exception as exc:
                results[dtype][name] = {"error": error_text(exc)}
    return results


def check_parity(ref: dict, per_rank: list[dict], dtype: str, name: str, device: str = "cuda") -> None:
    """``ref``: :func:`reference` of ``name``; ``per_rank``: each rank's :func:`parity_fn`."""
    tol = PARITY_TOL[dtype]
    got = [res[dtype][name] for res in per_rank]
    logits = torch.full_like(ref["logits"], float("nan"))
    for res in got:
        assert "error" not in res, f"{name}, {dtype}: {res.get('error')}"
        assert all(d.startswith(device) for d in res["devices"]), (name, res["devices"])
        logits[res["ids"]] = res["logits"].double()
    torch.testing.assert_close(logits, ref["logits"], atol=tol, rtol=0, msg=f"{name} logits")
    assert abs(got[0]["loss"] - ref["loss"]) < tol, (name, got[0]["loss"], ref["loss"])
    for res in got:  # every rank holds the full gradient after the sync
        for n, g in ref["grads"].items():
            torch.testing.assert_close(res["grads"][n].double(), g, atol=tol, rtol=0, msg=f"{name} grad {n}")
        for n, w in ref["final"].items():
            torch.testing.assert_close(res["final"][n].double(), w, atol=tol, rtol=0,
                                       msg=f"{name} weights {n} after {STEPS} steps")


@pytest.fixture(scope="module")
def parity_graph():
    data = small_graph(n=60, m=240, f=12)  # 12 -> 8 -> 8 -> 3, as tests/test_parity.py
    return data, {dtype: {name: reference(data, name, dtype) for name in MODELS} for dtype in PARITY_TOL}


@pytest.fixture(scope="module")
def parity_one_gpu(parity_graph):
    data, refs = parity_graph
    parts = torch.zeros(data.num_nodes, dtype=torch.long)
    return [to_cpu(parity_fn(DistContext.single("cuda"), data, parts, refs))]


@pytest.fixture(scope="module")
def parity_two_gpus(parity_graph, tmp_path_factory):
    data, refs = parity_graph
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=1))
    per_rank = run_ranks(parity_fn, 2, tmp_path_factory.mktemp("parity-two"), data, parts, refs)
    assert all(len(r["float64"]["gcn"].get("ids", [0])) > 0 for r in per_rank)
    return per_rank


@pytest.fixture(scope="module")
def parity_shared_gpu(parity_graph, tmp_path_factory):
    data, refs = parity_graph
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random", seed=1))
    return run_ranks(parity_fn, 2, tmp_path_factory.mktemp("parity-shared"), data, parts, refs, **SHARED_GPU)


PARITY_IDS = [(dtype, name) for dtype in PARITY_TOL for name in MODELS]


@pytest.mark.parametrize("dtype,name", PARITY_IDS, ids=[f"{d}-{n}" for d, n in PARITY_IDS])
def test_full_graph_model_on_one_gpu_equals_pyg_on_the_cpu(parity_graph, parity_one_gpu, dtype, name):
    check_parity(parity_graph[1][dtype][name], parity_one_gpu, dtype, name)


@two_gpus
@pytest.mark.parametrize("dtype,name", PARITY_IDS, ids=[f"{d}-{n}" for d, n in PARITY_IDS])
def test_full_graph_model_on_two_nccl_ranks_equals_pyg_on_the_cpu(parity_graph, parity_two_gpus, dtype, name):
    check_parity(parity_graph[1][dtype][name], parity_two_gpus, dtype, name)


@pytest.mark.parametrize("dtype,name", PARITY_IDS, ids=[f"{d}-{n}" for d, n in PARITY_IDS])
def test_full_graph_model_on_two_gloo_ranks_sharing_one_gpu_equals_pyg_on_the_cpu(parity_graph, parity_shared_gpu,
                                                                                  dtype, name):
    check_parity(parity_graph[1][dtype][name], parity_shared_gpu, dtype, name)


def _api_train(data: Data, model: str, device: str, parts: int, out: Path, backend: str = "nccl") -> commgnn.TrainResult:
    from commgnn.runner.config import RunConfig

    runtime = RuntimeConfig(parts=parts, device=device, backend=backend if device == "cuda" else "gloo", threads=2)
    res = commgnn.train(data, model=model, parts=parts, config=RunConfig(runtime=runtime), epochs=8, hidden=16,
                        layers=2, dropout=0.0, optimizer="sgd", lr=0.05, patience=0, quiet=True, out=out)
    assert res is not None
    return res


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("parts,backend", [(1, "nccl"), pytest.param(2, "nccl", marks=two_gpus), (2, "gloo")],
                         ids=["1-nccl", "2-nccl", "2-gloo-one-gpu"])
@pytest.mark.parametrize("model", ["sage", "gat"])  # GAT aggregates without the CSR kernel
@pytest.mark.timeout(240)
def test_commgnn_train_on_cuda_reproduces_the_cpu_run(tmp_path, model, parts, backend):
    """The whole CLI path (launch, rank loop, meter, export) on CUDA, against the CPU; under
    gloo both ranks share GPU 0 (``runtime.backend = "gloo"``)."""
    g = small_graph(n=120, m=500, f=6, c=3, seed=1)
    data = Data(x=g.x, edge_index=g.edge_index, y=g.y, train_mask=g.train_mask, val_mask=g.val_mask,
                test_mask=g.test_mask)
    gpu = _api_train(data, model, "cuda", parts, tmp_path / "cuda", backend)
    cpu = _api_train(data, model, "cpu", parts, tmp_path / "cpu")
    gpu_losses, cpu_losses = _losses(gpu.run_dir), _losses(cpu.run_dir)
    assert len(gpu_losses) == len(cpu_losses) == 8
    assert all(torch.isfinite(torch.tensor(gpu_losses)))
    torch.testing.assert_close(torch.tensor(gpu_losses), torch.tensor(cpu_losses), atol=1e-4, rtol=1e-4)
    assert gpu.predictions.shape == (120, 3) and gpu.predictions.device.type == "cpu"
    # the allocator's peak is recorded per rank on CUDA (the model and graph live there), not on the CPU
    assert cpu.summary["peak_device_mb_by_rank"] is None
    assert len(gpu.summary["peak_device_mb_by_rank"]) == parts and min(gpu.summary["peak_device_mb_by_rank"]) > 0
    if gpu.summary["best_epoch"] == cpu.summary["best_epoch"]:  # a near-tie could pick another epoch
        torch.testing.assert_close(gpu.predictions, cpu.predictions, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- the link calibration on GPU ranks
def calibrate_fn(ctx: DistContext) -> dict:
    """``commgnn calibrate``'s microbenchmark on these ranks (device buffers under NCCL, host
    buffers under gloo), or the error it raised."""
    from commgnn.netmodel.calibrate import calibrate

    try:
        m = calibrate(ctx, 2, sizes=(1_000, 100_000, 1_000_000), a2a_sizes=(10_000, 1_000_000))
    except Exception as exc:
        return {"error": error_text(exc)}
    return {"device": str(ctx.device), "one_way_s": m.fits["intra"]["one_way_s"],
            "a2a_s": m.fits["all_to_all"]["measured_s"], "beta_s": m.intra.beta_s}


@pytest.mark.parametrize("mode", [pytest.param("nccl", marks=two_gpus), "gloo-one-gpu"])
@pytest.mark.timeout(180)
def test_calibration_runs_on_gpu_ranks(tmp_path, mode):
    """Two ranks on GPUs measure their link (under NCCL with device buffers: host buffers
    there would be refused), and every rank gets rank 0's figures. Times are not compared
    across sizes: on a busy loopback a 1 MB round trip can take as long as a 1 kB one."""
    kw = {"backend": "nccl"} if mode == "nccl" else dict(SHARED_GPU)
    got = run_ranks(calibrate_fn, 2, tmp_path, **kw)
    for r in got:
        assert "error" not in r, r["error"]
        assert r["device"].startswith("cuda")
        assert len(r["one_way_s"]) == 3 and all(0 < t < 10 for t in r["one_way_s"]), r
        assert len(r["a2a_s"]) == 2 and all(0 < t < 10 for t in r["a2a_s"]) and r["beta_s"] > 0, r
    assert got[0]["one_way_s"] == got[1]["one_way_s"]


# ---------------------------------------------------------------- gossip's point-to-point on GPU ranks
def peers_fn(ctx: DistContext) -> dict:
    """Each of two ranks sends its device tensor to the other (as a gossip round does)."""
    from commgnn.comm.gossip.base import exchange_with_peers

    t = torch.arange(6, dtype=torch.float32, device=ctx.device) + 10 * ctx.rank
    other = 1 - ctx.rank
    try:
        got = exchange_with_peers(ctx, Hooks(), t, [other], [other])[other]
    except Exception as exc:
        return {"error": error_text(exc)}
    return {"device": str(got.device), "got": got}


@pytest.mark.parametrize("mode", [pytest.param("nccl", marks=two_gpus), "gloo-one-gpu"])
@pytest.mark.timeout(120)
def test_gossip_point_to_point_moves_device_tensors(tmp_path, mode):
    """Under gloo (whose send and recv read host memory) the tensor travels as a host copy
    and comes back on the rank's GPU; under NCCL it travels as it is."""
    kw = {"backend": "nccl"} if mode == "nccl" else dict(SHARED_GPU)
    for rank, r in enumerate(run_ranks(peers_fn, 2, tmp_path, **kw)):
        assert "error" not in r, r["error"]
        assert r["device"].startswith("cuda"), r
        torch.testing.assert_close(r["got"], torch.arange(6, dtype=torch.float32) + 10 * (1 - rank))
