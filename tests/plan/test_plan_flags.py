"""``launchers/plan.py``'s flags: bad values exit 2 naming the flag and a valid value; on CPU the
plan counts on the machine's memory, shared by the ranks on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.plan import machine
from plsh_dist.plan.machine import MachineMemory, machine_memory
from tests.train.conftest import base_overrides, tiny_data  # noqa: F401  (tiny_data: a fixture)
from tests.train.launcher_runs import empty_config, launcher_env

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "launchers" / "plan.py"
CONFIG = "configs/debug.toml"


@pytest.mark.parametrize("flags, message", [
    (["--seq-len", "0"], "argument --seq-len: '0': a sequence length is at least 1 token; e.g. --seq-len 32k"),
    (["--seq-len", "8k,0"], "argument --seq-len: '0'"),
    (["--seq-len", "abc"], "argument --seq-len: 'abc' is not a token count; write e.g. 32768, 32k or 1M"),
    (["--sp-size", "0"], "argument --sp-size: 0 is not >= 1; e.g. --sp-size 4"),
    (["--world-size", "-2"], "argument --world-size: -2 is not >= 1"),
    (["--gpu-memory-gib", "-5"], "argument --gpu-memory-gib: '-5' is not a memory size > 0; e.g. --gpu-memory-gib 80"),
    (["--gpu-memory-gib", "inf"], "argument --gpu-memory-gib: 'inf' is not a memory size > 0"),
    (["--gpu-memory-gb", "0"], "argument --gpu-memory-gb: '0' is not a memory size > 0"),
    (["--device", "cpu", "--cpu-memory-gib", "abc"], "argument --cpu-memory-gib: 'abc' is not a number of GiB"),
    (["--device", "cpu", "--gpu-memory-gib", "80"], "with --device cpu the ranks of a machine share its memory: "
                                                    "give --cpu-memory-gib"),
    (["--cpu-memory-gib", "64"], "--cpu-memory-gib and --nodes are for --device cpu"),
    (["--device", "cpu", "--world-size", "3", "--nodes", "2"], "--nodes 2 does not divide --world-size 3"),
])
def test_bad_flags_exit_2_naming_the_flag(flags, message):
    done = subprocess.run([sys.executable, str(PLAN), "--config", CONFIG, *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_cpu_ranks_share_the_machines_memory(monkeypatch, capsys):
    """The debug run peaks at ~1.9 GiB per rank: one rank fits a 4 GiB machine, two sharing it do not."""
    from launchers.plan import main

    monkeypatch.setattr(machine, "machine_memory",
                        lambda: MachineMemory(available=4 * 2**30, total=5 * 2**30, source="MemAvailable (test)"))
    assert main(["--config", CONFIG, "--device", "cpu", "--world-size", "1"]) == 0
    one = capsys.readouterr().out
    assert "CPU memory: 4.00 GiB per machine (MemAvailable (test); 5.00 GiB in all), shared by its 1 rank(s): " \
           "4.00 GiB per rank" in one
    assert "FITS: peak" in one and "of 4.00 GiB CPU memory (its share of the machine)" in one
    assert main(["--config", CONFIG, "--device", "cpu", "--world-size", "2"]) == 0
    two = capsys.readouterr().out
    assert "shared by its 2 rank(s): 2.00 GiB per rank" in two
    assert "DOES NOT FIT" in two and "> 90% of 2.00 GiB CPU memory (its share of the machine)" in two
    # Two machines of 4 GiB, one rank each: fits again; --cpu-memory-gib replaces this machine's figure.
    assert main(["--config", CONFIG, "--device", "cpu", "--world-size", "2", "--nodes", "2"]) == 0
    assert "FITS: peak" in capsys.readouterr().out
    assert main(["--config", CONFIG, "--device", "cpu", "--world-size", "2", "--cpu-memory-gib", "64"]) == 0
    assert "CPU memory: 64.00 GiB per machine (--cpu-memory-gib), shared by its 2 rank(s): 32.00 GiB per rank" \
           in capsys.readouterr().out


def test_machine_memory_reads_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684084 kB\nMemFree:        20561956 kB\nMemAvailable:   22362364 kB\n")
    shm = tmp_path / "shm"
    shm.mkdir()
    mem = machine_memory(meminfo, shm)
    assert (mem.available, mem.total) == (22362364 * 1024, 24684084 * 1024)
    assert mem.source == f"MemAvailable in {meminfo}"
    for rank in range(2):  # buffers an old DeepSpeed CPU launch left: the report names them and the fix
        (shm / f"deepspeed_allreduce_buffer_0_127.0.0.1_29500_{rank}").write_bytes(b"\0" * 2**20)
    (shm / "unrelated").write_bytes(b"\0" * 2**20)
    assert machine_memory(meminfo, shm).source == (
        f"MemAvailable in {meminfo}; 2 DeepSpeed all-reduce buffer(s) in {shm} hold 0.00 GiB of it: "
        f"rm {shm}/deepspeed_allreduce_buffer_* while no CPU launch runs")
    fallback = machine_memory(tmp_path / "absent")  # no /proc/meminfo: the physical memory
    assert fallback.available == fallback.total > 0 and "SC_PHYS_PAGES" in fallback.source


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"dir"
            for p in sorted(directory.rglob("*"))}


def test_measure_runs_in_a_scratch_directory(tiny_data, tmp_path):
    """``--measure`` with the config's out_dir a used run (resume auto): the run is neither resumed nor
    moved aside, nothing appears under the working directory's runs/, and no profiler line is printed."""
    from tests.train.test_refusals_launcher import _checkpoint_of

    used = tmp_path / "runs" / "used"
    overrides = base_overrides(tiny_data, used, "--checkpoint.resume=auto")
    _checkpoint_of(overrides, used, step=2)
    before = _snapshot(tmp_path / "runs")
    config = empty_config(tmp_path)
    done = subprocess.run([sys.executable, str(PLAN), "--config", str(config), "--device", "cpu", "--world-size", "1",
                           "--measure", *overrides], cwd=tmp_path, env=launcher_env(), capture_output=True, text=True,
                          timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "measured peak (two real steps, live torch CPU bytes, in a scratch directory)" in done.stdout
    assert "Traceback" not in text and "USDT" not in text, text[-3000:]
    assert _snapshot(tmp_path / "runs") == before  # runs/ holds the used run alone, byte for byte


def test_a_measurement_a_bucket_above_the_estimate_is_repeated(monkeypatch, capsys):
    """The spurious extra DeepSpeed bucket seen now and then: the lower of two measurements is printed."""
    import plsh_dist.data

    from launchers.plan import main
    from plsh_dist.train import peak_measure

    measurements = iter([int(3.760 * 2**30), int(1.898 * 2**30)])
    monkeypatch.setattr(plsh_dist.data, "prepare_data", lambda data, tokenizer: None)
    monkeypatch.setattr(peak_measure, "measure_cpu_peak", lambda cfg: next(measurements))
    assert main(["--config", CONFIG, "--device", "cpu", "--world-size", "1", "--measure"]) == 0
    out = capsys.readouterr().out
    assert "1.898 GiB; estimate 1.901 GiB (+0.2%) (lower of two measurements; the first gave 3.760 GiB)" in out
