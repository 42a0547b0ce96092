"""Hot path of one attention call: from the model's attention hook to the kernel launch.

Builds the tiny Qwen3 (``presets["tiny"]``) with one attention mode, runs one forward +
backward, and traces with ``sys.setprofile`` ('call' and 'c_call' events) the FIRST call of
the hook transformers makes (``plsh_dist.models.attention.plsh_dist_attention``, layer 0),
from its entry to the first kernel launch: a Triton launcher (``JITFunction.run``, the
interpreter's ``InterpretedFunction.run``, an ``Autotuner``/``Heuristics`` ``run``), an SDPA
(``scaled_dot_product_attention`` c_call, ``torch.ops.aten._scaled_dot_product_*``), or a
matmul-like torch op (``matmul``, ``bmm``, ``baddbmm``, ``einsum``, ``__matmul__``) called
from a frame in ``plsh_dist/ops/``. At that moment it takes the Python stack:
calls = plsh_dist frames from the hook (inclusive) to the launching frame (inclusive) - 1,
torch/transformers/triton frames between them listed but not counted; hops = those calls
that go from one plsh_dist file to another (hand-offs between modules); files on path =
distinct plsh_dist files among those frames; files touched = distinct plsh_dist files with
any Python call between the hook's entry and the launch (side trips included). When the
first launch is a side Triton kernel (hash draws, tables), a second row, "(attention kernel)",
gives the same figures up to the fused attention kernel's launch.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python tools/hot_path.py [--case NAME ...] [--json PATH]

CPU only; TRITON_INTERPRET=1 is set before torch is imported (the ``triton`` cases run the
fused kernel under Triton's interpreter, as tests/conftest.py does).
"""

from __future__ import annotations

import os
import sys

if "torch" not in sys.modules:  # run as a script: the interpreter must be chosen before torch/triton load
    os.environ.setdefault("TRITON_INTERPRET", "1")  # (imported by a test: its conftest has chosen)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import linecache  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import plsh_dist  # noqa: E402
from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets  # noqa: E402
from plsh_dist.models import attention as _attention  # noqa: E402

RULE = """counting rule:
  trace: sys.setprofile ('call' / 'c_call' events) from the entry of the first call of
    plsh_dist.models.attention.plsh_dist_attention (layer 0) to the first kernel launch:
    a Triton launcher run (JITFunction / InterpretedFunction / Autotuner / Heuristics .run),
    an SDPA (c_call scaled_dot_product_attention, torch.ops.aten._scaled_dot_product_*),
    or a matmul-like torch op (matmul, bmm, baddbmm, einsum, __matmul__) called from plsh_dist/ops/.
  calls          = plsh_dist frames on the stack, hook (incl.) .. launching frame (incl.), minus 1
                   (torch / transformers / triton frames between them are listed, marked '.', not counted)
  hops           = the calls among them that go from one plsh_dist file to another (a hand-off
                   between modules; a file's own helpers are not hops)
  files on path  = distinct plsh_dist files among those frames
  files touched  = distinct plsh_dist files with any Python call between hook entry and the launch
  when the first launch is a side Triton kernel (hash draws, tables), a second row
  "<case> (attention kernel)" measures the same figures up to the launch of a kernel of
  plsh_dist/ops/triton/kernels.py (the fused attention itself)"""

PKG_DIR = str(Path(plsh_dist.__file__).resolve().parent)
OPS_DIR = os.path.join(PKG_DIR, "ops") + os.sep
HOOK_CODE = _attention.plsh_dist_attention.__code__

MATMUL_NAMES = {"matmul", "bmm", "baddbmm", "einsum", "__matmul__", "__rmatmul__"}
ATTENTION_KERNELS = os.path.join("plsh_dist", "ops", "triton", "kernels.py")
TRITON_RUNNERS = {"JITFunction.run", "InterpretedFunction.run", "InterpretedFunction.__call__",
                  "Autotuner.run", "Heuristics.run"}

T = 64  # tokens per row

#: name -> (AttentionConfig fields, packed documents?)
CASES: dict[str, tuple[dict, bool]] = {
    "none": (dict(bias="none", rope=True), False),
    "alibi": (dict(bias="alibi"), False),
    "window": (dict(bias="window", window=16), False),
    "truncated": (dict(bias="truncated"), False),
    "plsh": (dict(bias="plsh", num_samples=4), False),
    "fixed_blocks": (dict(bias="fixed_blocks"), False),
    "plsh/triton": (dict(bias="plsh", num_samples=4, backend="triton"), False),
    "fixed_blocks/triton": (dict(bias="fixed_blocks", backend="triton"), False),
    "plsh/per_sample": (dict(bias="plsh", num_samples=4, method="per_sample"), False),
    "plsh/onepass": (dict(bias="plsh", num_samples=4, method="onepass"), False),
    "plsh/packed": (dict(bias="plsh", num_samples=4), True),
    "alibi/packed": (dict(bias="alibi"), True),
}


def _in_pkg(filename: str) -> bool:
    return filename.startswith(PKG_DIR + os.sep)


def _short(filename: str) -> str:
    if _in_pkg(filename):
        return "plsh_dist/" + os.path.relpath(filename, PKG_DIR)
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _where(frame) -> str:
    code = frame.f_code
    return f"{_short(code.co_filename)}:{code.co_qualname}"


class Tracer:
    """The profile function: waits for the hook, then records until the first launch."""

    def __init__(self) -> None:
        self.hook_frame = None
        self.done = False
        self.touched: list[str] = []  # plsh_dist files, first-call order
        self.launches: list[dict] = []  # the first launch; then, if it was a side Triton kernel, the attention's

    def __call__(self, frame, event, arg):
        if self.done:
            return
        if self.hook_frame is None:
            if event == "call" and frame.f_code is HOOK_CODE:
                self.hook_frame = frame
                self._touch(frame)
            return
        if event == "call":
            self._touch(frame)
            code = frame.f_code
            name = code.co_qualname
            fname = code.co_filename
            if name in TRITON_RUNNERS and f"{os.sep}triton{os.sep}runtime{os.sep}" in fname:
                fn = getattr(frame.f_locals.get("self"), "fn", None)
                while fn is not None and not hasattr(fn, "__code__"):  # an autotuner's / heuristics' fn
                    fn = getattr(fn, "fn", None)
                kernel = getattr(fn, "__name__", "?")
                attention = fn is not None and fn.__code__.co_filename.endswith(ATTENTION_KERNELS)
                self._launch(frame, f"triton {name} (kernel {kernel})", caller=frame.f_back, attention=attention)
            elif name in ("OpOverloadPacket.__call__", "OpOverload.__call__") and fname.endswith(
                    os.path.join("torch", "_ops.py")):
                op = str(frame.f_locals.get("self", ""))
                if "scaled_dot_product" in op:
                    self._launch(frame, f"torch.ops {op}", caller=frame.f_back)
            elif code.co_name in MATMUL_NAMES and f"{os.sep}torch{os.sep}" in fname \
                    and frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(OPS_DIR):
                self._launch(frame, f"torch {name} ({_short(fname)})", caller=frame.f_back)
        elif event == "c_call":
            name = getattr(arg, "__name__", "")
            if name == "scaled_dot_product_attention":
                self._launch(frame, "c_call torch.nn.functional.scaled_dot_product_attention", caller=frame)
            elif name in MATMUL_NAMES and frame.f_code.co_filename.startswith(OPS_DIR):
                owner = "Tensor" if isinstance(getattr(arg, "__self__", None), torch.Tensor) else "torch"
                self._launch(frame, f"c_call {owner}.{name}", caller=frame)
        elif event == "return" and frame is self.hook_frame:
            self.done = True  # the hook returned without a launch the rule recognises

    def _touch(self, frame) -> None:
        f = frame.f_code.co_filename
        if _in_pkg(f):
            short = _short(f)
            if short not in self.touched:
                self.touched.append(short)

    def _launch(self, frame, what: str, caller, attention: bool = True) -> None:
        if self.launches and not attention:
            return  # after a side Triton kernel: waiting for the attention kernel itself
        stack = []
        f = frame
        while f is not None:
            stack.append(f)
            if f is self.hook_frame:
                break
            f = f.f_back
        stack.reverse()
        caller = next((f for f in reversed(stack) if _in_pkg(f.f_code.co_filename)), caller)  # the launching frame
        self.launches.append(dict(
            what=what, line=f"{_short(caller.f_code.co_filename)}:{caller.f_lineno}",
            source=linecache.getline(caller.f_code.co_filename, caller.f_lineno).strip(),
            stack=[(_where(s), _in_pkg(s.f_code.co_filename)) for s in stack], touched=list(self.touched)))
        self.done = attention


def trace_case(name: str, num_layers: int = 1) -> list[dict]:
    """Trace case ``name`` of :data:`CASES`: its figures and chain, one dict per launch: the
    first launch (the rule's figure); when that is a side Triton kernel (tables, hashing), also
    the attention kernel's own launch, as ``"<name> (attention kernel)"``."""
    fields, packed = CASES[name]
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=num_layers)
    model = build_model(cfg, AttentionConfig(**fields), AttentionRuntime(run_seed=1))
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    if packed:  # two documents in one row: positions restart at 0
        position_ids = torch.cat([torch.arange(40), torch.arange(T - 40)])[None]
    else:
        position_ids = torch.arange(T)[None]
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        out = model(ids, position_ids=position_ids, labels=ids)
    finally:
        sys.setprofile(None)
    out.loss.backward()
    if tracer.hook_frame is None:
        raise RuntimeError(f"{name}: the hook plsh_dist_attention was never called")
    if not tracer.launches:
        return [dict(case=name, config=fields, packed=packed, launch=None, chain=[], hops=None, file_hops=None,
                     files_on_path=None, path_files=[], touched=tracer.touched, files_touched=len(tracer.touched))]
    results = []
    for i, launch in enumerate(tracer.launches):
        stack, touched = launch.pop("stack"), launch.pop("touched")
        pkg = [w for w, mine in stack if mine]
        files = [w.rsplit(":", 1)[0] for w in pkg]
        on_path = list(dict.fromkeys(files))
        results.append(dict(case=name if i == 0 else f"{name} (attention kernel)", config=fields, packed=packed,
                            launch=launch, chain=[dict(frame=w, counted=mine) for w, mine in stack],
                            hops=len(pkg) - 1, file_hops=sum(a != b for a, b in zip(files, files[1:])),
                            files_on_path=len(on_path), path_files=on_path,
                            touched=touched, files_touched=len(touched)))
    return results


def report(results: list[dict]) -> str:
    lines = [RULE, ""]
    for r in results:
        lines.append(f"== {r['case']}  {r['config']}{'  packed documents' if r['packed'] else ''}")
        for c in r["chain"]:
            lines.append(f"  {'*' if c['counted'] else '.'} {c['frame']}")
        if r["launch"] is None:
            lines.append("  !! no kernel launch recognised before the hook returned")
        else:
            lines.append(f"  -> {r['launch']['what']}")
            lines.append(f"     at {r['launch']['line']}: {r['launch']['source']}")
        lines.append(f"  touched: {', '.join(r['touched'])}")
        lines.append("")
    w = max(len(r["case"]) for r in results)
    lines.append(f"{'case':<{w}} | calls | hops between files | files on path | files touched")
    lines.append(f"{'-' * w}-|-------|-------------------|---------------|--------------")
    for r in results:
        lines.append(f"{r['case']:<{w}} | {str(r['hops']):>5} | {str(r['file_hops']):>17} | "
                     f"{str(r['files_on_path']):>13} | {r['files_touched']:>13}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=list(CASES), help="cases to run (default: all)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results = [r for name in (args.case or CASES) for r in trace_case(name)]
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(dict(rule=RULE, results=results), indent=1) + "\n")
    return 0 if all(r["hops"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
