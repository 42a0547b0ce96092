"""The CPU image, run as a user runs it: no network, the image's own user, its own environment.

``make image-check`` (docker/image_check.sh) builds the image with buildah and
runs this module with ``PLSH_IMAGE`` (the image name), ``PLSH_BUILDAH`` (the
buildah command with its storage flags) and ``PLSH_NETNS`` (a network
namespace with only its loopback up: no network, but a rendezvous on
127.0.0.1 works; buildah's ``--network none`` leaves the loopback down).
Without them every test skips, naming ``make image-check``.

One working container from the image, in this order:

- who runs: uid 1000 (``plsh``), in /workspace/plsh_dist, the venv on PATH,
  no route anywhere;
- the debug training (4 steps of a 6-step schedule, a checkpoint every 2, the export);
- a resume to 6 steps from the last checkpoint;
- an evaluation of the export under two attention modes;
- ``from_pretrained`` of the export with transformers' Auto classes;
- the HEALTHCHECK: the image's own command passes;
- the entry command: ``bash`` (no ENTRYPOINT) gives that shell.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

pytestmark = pytest.mark.image

IMAGE = os.environ.get("PLSH_IMAGE")
BUILDAH = shlex.split(os.environ.get("PLSH_BUILDAH", "buildah"))
NETNS = os.environ.get("PLSH_NETNS")
RUNTIME = os.environ.get("PLSH_RUNTIME", "/usr/sbin/runc")
RUN_TIMEOUT_S = 600
OUT = "runs/image"
CONFIG = "configs/debug.toml"


@pytest.fixture(scope="module")
def container():
    if not IMAGE or not NETNS:
        pytest.skip("no image to check: run `make image-check` (builds it, then runs these tests in it)")
    name = subprocess.run([*BUILDAH, "from", IMAGE], capture_output=True, text=True, check=True,
                          timeout=300).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run([*BUILDAH, "rm", name], capture_output=True, timeout=300)


def run(container: str, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` in the container as its configured user, with no network but loopback."""
    cmd = [*BUILDAH, "run", "--runtime", RUNTIME, "--network", f"ns:{NETNS}", container, "--", *argv]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def image_config() -> dict:
    res = subprocess.run([*BUILDAH, "inspect", "--type", "image", IMAGE], capture_output=True, text=True,
                         check=True, timeout=300)
    return json.loads(res.stdout)


def test_runs_as_the_images_user_without_network(container):
    out = ok(run(container, ["sh", "-c", "id -u; id -un; pwd; command -v python; command -v deepspeed; "
                                                "echo $DS_ACCELERATOR"]))
    assert out.split() == ["1000", "plsh", "/workspace/plsh_dist", "/opt/venv/bin/python", "/opt/venv/bin/deepspeed",
                           "cpu"]
    probe = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 443), timeout=3)\n"
             "except OSError as e:\n    print('no network:', e)\n")
    assert "no network:" in ok(run(container, ["python", "-c", probe]))
    versions = ok(run(container, ["python", "-c", "import torch, deepspeed; print(torch.__version__, "
                                  "torch.version.cuda, deepspeed.__version__)"]))
    assert versions.split()[:2] == ["2.13.0+cpu", "None"]


def test_debug_training(container):
    res = run(container, ["python", "launchers/pretrain.py", "--config", CONFIG, f"--run.out_dir={OUT}",
                          "--run.max_steps=4", "--optim.decay_end=6", "--checkpoint.every_steps=2",
                          "--checkpoint.export_safetensors=true"])
    ok(res)
    metrics = ok(run(container, ["cat", f"{OUT}/metrics.jsonl"]))
    steps = [r["step"] for r in map(json.loads, metrics.splitlines()) if "loss" in r]
    assert steps == [1, 2, 3, 4]
    listing = ok(run(container, ["ls", f"{OUT}/checkpoints", f"{OUT}/final"]))
    assert "step_00000004" in listing and "model.safetensors" in listing and "config.json" in listing


def test_resume(container):
    res = ok(run(container, ["python", "launchers/pretrain.py", "--config", CONFIG, f"--run.out_dir={OUT}",
                             "--run.max_steps=6", "--optim.decay_end=6", "--checkpoint.every_steps=2",
                             "--checkpoint.resume=auto",
                             "--checkpoint.export_safetensors=true"]))
    assert "4 -> 6 (resumed from" in res, res[-2000:]
    metrics = ok(run(container, ["cat", f"{OUT}/metrics.jsonl"]))
    assert [r["step"] for r in map(json.loads, metrics.splitlines()) if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_evaluation(container):
    ok(run(container, ["python", "launchers/evaluate.py", "--checkpoint", f"{OUT}/final", "--lengths", "128,256",
                       "--modes", "plsh:s=4,alibi", "--out", f"{OUT}/eval"]))
    assert ok(run(container, ["ls", f"{OUT}/eval"])).split(), "the evaluation wrote nothing"


def test_from_pretrained_of_the_export(container):
    code = (f"from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained('{OUT}/final', trust_remote_code=True)\n"
            f"tok = AutoTokenizer.from_pretrained('{OUT}/final', trust_remote_code=True)\n"
            "batch = tok('def main(', return_tensors='pt')\n"
            "logits = model(**batch).logits\n"
            "assert logits.isfinite().all()\n"
            "print(type(model).__name__, tuple(logits.shape))\n")
    out = ok(run(container, ["python", "-c", code]))
    assert out.split()[0].endswith("ForCausalLM"), out


def test_healthcheck_as_documented(container):
    config = image_config()
    health = config["Docker"]["config"]["Healthcheck"]
    assert health["Test"] == ["CMD", "python", "-c", "import torch, deepspeed, plsh_dist.train"]
    assert health["Interval"] == 5 * 60 * 10**9 and health["Retries"] == 3
    ok(run(container, health["Test"][1:]))


def test_entry_command_as_documented(container):
    config = image_config()["Docker"]["config"]
    assert not config.get("Entrypoint") and config["Cmd"] == ["bash"] and config["User"] == "1000"
    out = ok(run(container, config["Cmd"], stdin="id -un; pwd; python -c 'import plsh_dist; print(\"imports\")'\n"))
    assert out.split() == ["plsh", "/workspace/plsh_dist", "imports"]
