"""The planner's attention cost, SP traffic, layout checks, advice and command line.

- query-key pairs: exact for fixed blocks (counted from the hash's buckets),
  and the PLSH expectations (per sample, one pass) against the mean over
  hash seeds of the pairs the real blocks hold;
- SP traffic: per layer, the halo the planner reports is the brute-force
  need computed from the buckets of that layer's real hash seed;
- layouts the trainer refuses are refused with its messages;
- ``launchers/plan.py``: report, table, exit code 2.
"""

from __future__ import annotations

import pytest
import torch

from plsh_dist.config import check_world_size, load_config
from plsh_dist.distributed.sp_chunks import check_sp_divisible
from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.models import AttentionConfig
from plsh_dist.models.runtime import hash_seed
from plsh_dist.plan import plan_run
from plsh_dist.plan.advice import advise
from plsh_dist.plan.attention_cost import attention_cost
from plsh_dist.plan.halo_traffic import sp_traffic

torch.set_num_threads(1)
CFG_32K = "configs/qwen3_0.6b_32k_plsh_sp4.toml"


def _causal_block_pairs(buckets: torch.Tensor) -> float:
    """sum over blocks of L (L + 1) / 2 for one (sample, head)'s buckets."""
    sizes = torch.unique_consecutive(buckets, return_counts=True)[1].double()
    return float((sizes * (sizes + 1) / 2).sum())


def test_fixed_block_pairs_are_exact():
    cost = attention_cost(AttentionConfig(bias="fixed_blocks"), 4, "cpu", torch.float32)
    T = 1000
    buckets = FixedBlocks(alibi_slopes(4).reciprocal()).buckets(torch.arange(T))  # (1, H, T)
    assert cost.pairs_per_head(T) == [_causal_block_pairs(buckets[0, h]) for h in range(4)]


@pytest.mark.parametrize("method", ["per_sample", "onepass"])
def test_plsh_pair_expectation_matches_the_real_blocks(method):
    # One pitch per (sample, head) for the whole sequence: pair counts vary ~70% between draws,
    # so 400 hash seeds (standard error of the mean ~1.8%) and a 6% tolerance.
    s, T, sigma = 4, 1000, 10.0
    cost = attention_cost(AttentionConfig(bias="plsh", sigma=sigma, num_samples=s, method=method), 2, "cpu",
                          torch.float32)
    expected = cost.pairs_per_head(T)[0]
    draws = []
    for seed in range(400):
        buckets = PositionalLSH(sigma, s, seed).buckets(torch.arange(T))[:, 0]  # (s, T)
        if method == "per_sample":
            draws.append(sum(_causal_block_pairs(buckets[t]) for t in range(s)))
        else:  # keys sharing the query's block in at least one sample
            same = torch.zeros(T, T, dtype=torch.bool)
            for t in range(s):
                same |= buckets[t][:, None] == buckets[t][None, :]
            draws.append(float(torch.tril(same).sum()))
    assert sum(draws) / len(draws) == pytest.approx(expected, rel=0.06)


def test_truncated_pairs_and_halo_follow_each_heads_window():
    """Truncated ALiBi: head h attends min(i + 1, w_h) keys, w_h = ceil(c sigma_h) (sigma 4..256 at
    c = 1.5: 6, 24, 96, 384); the SP halo is the widest window's."""
    attn = AttentionConfig(bias="truncated", truncate_c=1.5)
    cost = attention_cost(attn, 4, "cpu", torch.float32)
    assert cost.setup.head_windows == (6, 24, 96, 384) and cost.setup.window == 384
    T = 1000
    i = torch.arange(T)
    assert cost.pairs_per_head(T) == [float(torch.clamp(i + 1, max=w).sum()) for w in (6, 24, 96, 384)]
    traffic = sp_traffic(cost, attn, run_seed=0, layers=2, sp=4, tokens=512, batch=1, q_heads=4, kv_heads=2,
                         head_dim=32, b=2)
    assert len(traffic) == 2 and traffic[0].recv_tokens_max == 383 * 2  # 383 positions before, both kv heads


def test_sp_traffic_is_the_need_of_each_layers_real_hash():
    cfg = load_config(None, ["--model.preset=tiny", "--data.seq_len=2048", "--parallel.sp_size=4",
                             "--attention.num_samples=3", "--run.seed=5", "--data.micro_batch_size=2"])
    attn = cfg.attention
    cost = attention_cost(attn, 4, "cuda", torch.bfloat16)
    traffic = sp_traffic(cost, attn, run_seed=5, layers=2, sp=4, tokens=512, batch=2, q_heads=4, kv_heads=2,
                         head_dim=32, b=2)
    T, P, Tl, g = 2048, 4, 512, 2
    for layer in range(2):
        lsh = PositionalLSH(alibi_slopes(4).reciprocal(), 3, hash_seed(5, 0, 0, layer))
        buckets = lsh.buckets(torch.arange(T))  # (s, Hq, T)
        recv = []
        for r in range(P):
            c0, c1 = r * Tl, (r + 1) * Tl
            count = 0
            for kv in range(2):
                need = torch.zeros(T, dtype=torch.bool)
                for t in range(3):
                    for hq in range(kv * g, kv * g + g):
                        need |= torch.isin(buckets[t, hq], buckets[t, hq, c0:c1])
                need[c0:] = False  # causal: only earlier positions, outside the chunk
                count += int(need.sum())
            recv.append(count)
        assert traffic[layer].recv_tokens_max == max(recv)
        assert traffic[layer].forward_bytes_max == max(recv) * 2 * 32 * 2 * 2  # rows x D x bf16 x (K, V)
    assert traffic[0].recv_tokens_max != traffic[1].recv_tokens_max  # fresh masks per layer


def test_refused_layouts_give_the_trainers_messages():
    with pytest.raises(ValueError) as planner:  # the config's own check, as launchers/plan.py loads it
        plan_run(load_config(CFG_32K, ["--data.seq_len=32000", "--parallel.sp_size=3"]), world_size=6)
    with pytest.raises(ValueError) as config_check:
        check_sp_divisible(32000, 3)
    assert str(planner.value) == str(config_check.value)
    cfg = load_config(CFG_32K, [])
    with pytest.raises(ValueError) as planner:
        plan_run(cfg, world_size=6)
    with pytest.raises(ValueError) as config_check:
        check_world_size(6, 4)
    assert str(planner.value) == str(config_check.value)


def test_advice_lowers_the_peak_until_it_fits():
    cfg = load_config("configs/qwen3_0.6b_8k_plsh_s10.toml", ["--data.seq_len=262144"])
    plan = plan_run(cfg, world_size=8)
    budget = 80 * 2**30
    assert plan.memory.peak > budget
    advice = advise(cfg, plan, budget, world_size=8)
    assert advice.fits and advice.plan.memory.peak < 0.9 * budget
    assert "--memory.activation_checkpointing=true" in advice.changes
    assert any(c.startswith("--parallel.sp_size=") for c in advice.changes)


def test_launcher_prints_the_plan_and_refuses_bad_layouts(capsys):
    from launchers.plan import main

    assert main(["--config", CFG_32K]) == 0
    out = capsys.readouterr().out
    assert "PEAK" in out and "FITS" in out and "SP traffic per layer" in out and "FLOPs per optimizer step" in out
    assert main(["--config", CFG_32K, "--seq-len", "8k,32k", "--gpu-memory-gib", "80"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| config |") and len(table) == 4
    assert main(["--config", CFG_32K, "--sp-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "[data].seq_len=32768 is not divisible by [parallel].sp_size=3" in err


def test_gpu_memory_is_read_as_gib_under_either_flag_name(capsys):
    """--gpu-memory-gib N means N x 2^30 bytes; the old --gpu-memory-gb is the same, with a one-line note."""
    from launchers.plan import main

    assert main(["--config", CFG_32K, "--gpu-memory-gib", "40"]) == 0
    new = capsys.readouterr()
    assert "of 40.00 GiB GPU" in new.out and new.err == ""
    assert main(["--config", CFG_32K, "--gpu-memory-gb", "40"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out
    assert old.err.count("\n") == 1 and "--gpu-memory-gib" in old.err and "read as GiB" in old.err
