"""tools/hot_path.py measures something (the first hook call's chain starts at the hook and
reaches a kernel launch through at least one call inside the package), and every call's hot path
stays within issue 43's bound."""

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


def test_every_call_reaches_its_attention_kernel_within_five_files_and_five_hops():
    """Issue 43's bound on the hot path, held for every bias, method, backend and packed documents:
    at most 5 package files on the stack from the hook to the attention kernel's launch, and at most
    5 calls from one file into another. (Where the first launch is a side kernel, the hash draws or
    the tables, the row measured is the one up to the attention kernel.)"""
    from tools.hot_path import CASES

    for case in CASES:
        result = trace_case(case)[-1]  # the attention kernel's row
        assert result["launch"] is not None, case
        assert result["files_on_path"] <= 5, (case, result["path_files"])
        assert result["file_hops"] <= 5, (case, [c["frame"] for c in result["chain"] if c["counted"]])
