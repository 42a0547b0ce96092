"""tools/hot_path.py measures something: the first hook call's chain starts at the hook and
reaches a kernel launch through at least one call inside the package."""

from tools.hot_path import trace_case


def test_alibi_chain_starts_at_the_hook_and_reaches_a_launch():
    (result,) = trace_case("alibi")
    chain = result["chain"]
    assert chain[0] == dict(frame="plsh_dist/models/attention.py:plsh_dist_attention", counted=True)
    assert result["launch"] is not None, "no kernel launch recognised"
    assert result["hops"] >= 1
    assert result["files_on_path"] >= 1
    assert result["files_touched"] >= result["files_on_path"]
    counted = [c["frame"] for c in chain if c["counted"]]
    assert counted[-1].startswith("plsh_dist/ops/"), counted  # launched from the ops, not from the hook's file
