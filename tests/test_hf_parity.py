"""Logit parity with Hugging Face transformers (needs the [hf] extra; skipped without it)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fastspec as fs  # noqa: E402
from fastspec.model import Transformer  # noqa: E402

pytestmark = pytest.mark.hf

TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6)

CASES = {
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, rope_theta=500.0)),
    "llama-tied-mha": ("LlamaConfig", "LlamaForCausalLM",
                       dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen2-gqa": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "qwen3-gqa": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=1, head_dim=24)),
}


def hf_model(case):
    cfg_name, model_name, extra = CASES[case]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_name)(**TINY, **extra)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # the default init is tiny; make every weight matter
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids[None])).logits[0].double().numpy()


@pytest.fixture(params=sorted(CASES))
def case(request):
    return request.param


IDS = np.random.default_rng(0).integers(0, TINY["vocab_size"], 64)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_load_matches_transformers(tmp_path, case, backend, dtype):
    model = hf_model(case)
    model.save_pretrained(tmp_path)
    ours = Transformer.load(tmp_path, dtype=dtype)
    assert ours.config.n_kv_heads == model.config.num_key_value_heads
    ref = hf_logits(model, IDS)
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4, rtol=0)
    cache = ours.new_cache()  # and decoding token by token after a prompt
    ours.forward(IDS[:40], cache)
    steps = np.concatenate([ours.forward(IDS[i:i + 1], cache).logits for i in range(40, 64)])
    np.testing.assert_allclose(steps, ref[40:], atol=1e-4, rtol=0)


def test_bf16_checkpoint_loads(tmp_path):
    model = hf_model("qwen3-gqa").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    ours = Transformer.load(tmp_path)
    # The bf16 weights computed in float32 (reloaded: .float() would keep RoPE's inv_freq
    # buffer rounded to bf16).
    back = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ref = hf_logits(back, IDS)
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4, rtol=0)


def test_export_runs_in_transformers(tmp_path, case):
    model = hf_model(case)
    model.save_pretrained(tmp_path / "hf")
    ours = Transformer.load(tmp_path / "hf", dtype="float64")
    ours.save(tmp_path / "out")
    cls = getattr(transformers, CASES[case][1])
    back = cls.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(hf_logits(back, IDS), ours.forward(IDS).logits, atol=1e-4, rtol=0)


def test_random_fastspec_model_exports(tmp_path):
    ours = Transformer.random(fs.ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4,
                                             n_kv_heads=2, ffn_dim=48, max_seq_len=80,
                                             qk_norm=True, tie_embeddings=False))
    ours.save(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = IDS % 50
    np.testing.assert_allclose(hf_logits(back, ids), ours.forward(ids).logits, atol=1e-4, rtol=0)
