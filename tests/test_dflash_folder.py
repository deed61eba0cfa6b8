"""DFlash drafters as z-lab folders (config.json + model.safetensors), NumPy only: round trip
and every refusal names the file and the field."""
import json
import shutil

import numpy as np
import pytest

import fastspec as fs
from fastspec.formats.hf_folder import read_safetensors, write_safetensors

V = 64


def _target(seed=0, **kw):
    cfg = fs.ModelConfig(**{**dict(vocab_size=V, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                                   ffn_dim=48, max_seq_len=64, qk_norm=True), **kw})
    return fs.Transformer.random(cfg, seed=seed)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zlab") / "drafter"
    target = _target()
    model = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, n_layers=2, tap_layers=(0, 1),
                                                  mask_token_id=V - 1), target, seed=3)
    model.save(folder)
    return target, model, folder


def _copy(saved, tmp_path, edit=None, edit_dc=None):
    folder = tmp_path / "d"
    shutil.copytree(saved[2], folder)
    cfg = json.loads((folder / "config.json").read_text())
    if edit:
        edit(cfg)
    if edit_dc:
        edit_dc(cfg["dflash_config"])
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_round_trip(saved, backend):
    target, model, folder = saved
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": V - 1}
    assert cfg["num_target_layers"] == 3 and cfg["block_size"] == 4
    back = fs.DFlashModel.load(folder, target)
    assert back.config == model.config.replace(last_tap_normed=True)  # taps 0, 1: no effect
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k], v)
    out = target.forward(np.arange(7), hidden_layers=(0, 1))
    np.testing.assert_array_equal(back.block_logits(out.hidden, [3, V - 1, V - 1]),
                                  model.block_logits(out.hidden, [3, V - 1, V - 1]))


def test_npz_still_round_trips(saved, tmp_path):
    target, model, _ = saved
    model.save(tmp_path / "d.npz")
    assert fs.DFlashModel.load(tmp_path / "d.npz", target).config == model.config


def test_embedded_drafter_loads_unchanged():
    bundle = fs.pretrained.load()
    c = bundle.dflash.config
    assert not c.last_tap_normed and c.input_embedding_scale == 1.0
    assert "last_tap_normed" not in c.to_dict()  # the npz keys older versions read


@pytest.mark.parametrize("edit, edit_dc, err, match", [
    (lambda c: c.pop("dflash_config"), None, ValueError,
     r"config.json: missing field dflash_config"),
    (None, lambda d: d.pop("target_layer_ids"), ValueError,
     r"config.json: missing field dflash_config.target_layer_ids"),
    (None, lambda d: d.pop("mask_token_id"), ValueError,
     r"config.json: dflash_config: missing field mask_token_id"),
    (None, lambda d: d.update(target_layer_ids=[0, 3]), ValueError,
     r"config.json: dflash_config.target_layer_ids = \[0, 3\] must be distinct layer "
     r"indices in \[0, 3\)"),
    (None, lambda d: d.update(mask_token_id=V), ValueError,
     r"dflash_config.mask_token_id = 64 is outside the target vocabulary"),
    (lambda c: c.update(vocab_size=V + 1), None, ValueError,
     r"config.json: vocab_size = 65, but the target has 64"),
    (lambda c: c.update(hidden_size=48), None, ValueError,
     r"config.json: hidden_size = 48, but the target has 32"),
    (lambda c: c.update(num_target_layers=36), None, ValueError,
     r"config.json: num_target_layers = 36, but the target has 3 layers"),
    (lambda c: c.update(architectures=["DFlash2DraftModel"]), None, ValueError,
     r"config.json: a DFlash 2 drafter .* not supported"),
    (None, lambda d: d.update(selector_rank=8), ValueError, r"DFlash 2 drafter"),
    (lambda c: c.update(block_size=32), None, ValueError, r"config.json: block_size = 32"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 2), None, ValueError,
     r"sliding-window"),
    (None, lambda d: d.update(input_embedding_scale=2.0), NotImplementedError,
     r"input_embedding_scale = 2.0 is not supported"),
    (None, lambda d: d.update(final_logit_softcapping="x"), ValueError,
     r"final_logit_softcapping must be a number"),
])
def test_bad_config_names_file_and_field(saved, tmp_path, edit, edit_dc, err, match):
    folder = _copy(saved, tmp_path, edit, edit_dc)
    with pytest.raises(err, match=match):
        fs.DFlashModel.load(folder, saved[0])


def test_drafter_for_another_target_is_refused(saved):
    """Same shape, other weights: the stored fingerprint tells them apart."""
    with pytest.raises(ValueError, match=r"config.json: fastspec_target.embed_projections .* "
                                         r"built for another target"):
        fs.DFlashModel.load(saved[2], _target(seed=1))


def test_fingerprint_survives_float16_weights(saved):
    target = _target()
    fp16 = fs.Transformer(target.config.replace(weight_dtype="float16"),
                          target.embed.astype(np.float16).astype(np.float32),
                          target.layers, target.head, target.final_norm)
    fs.DFlashModel.load(saved[2], fp16)


def test_unexpected_and_missing_tensors(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    sd = read_safetensors(folder / "model.safetensors")
    write_safetensors(folder / "model.safetensors",
                      {**sd, "candidate_selector.hidden_projection.weight": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"unexpected tensors \['candidate_selector"):
        fs.DFlashModel.load(folder, saved[0])
    del sd["layers.1.mlp.up_proj.weight"]
    write_safetensors(folder / "model.safetensors", sd)
    with pytest.raises(ValueError, match=r"missing tensors \['layers.1.mlp.up_proj.weight'\]"):
        fs.DFlashModel.load(folder, saved[0])


def test_formats_it_cannot_express_are_refused(tmp_path):
    target = _target(qk_norm=False)
    model = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, mask_token_id=V - 1), target)
    with pytest.raises(ValueError, match="qk_norm=True"):
        model.save(tmp_path / "a")
    model = fs.DFlashModel.random(fs.DFlashConfig(block_size=4, tap_layers=(0, 2),
                                                  mask_token_id=V - 1), _target())
    with pytest.raises(ValueError, match="before its final norm"):
        model.save(tmp_path / "b")


def test_npz_drafter_for_another_target_is_refused(saved, tmp_path):
    target, model, _ = saved
    model.save(tmp_path / "d.npz")
    with pytest.raises(ValueError, match=r"d.npz: fastspec_target.embed_projections .* another "
                                         r"target"):
        fs.DFlashModel.load(tmp_path / "d.npz", _target(seed=1))
    other = fs.Transformer.random(target.config.replace(n_layers=4), seed=0)
    with pytest.raises(ValueError, match=r"fastspec_target.num_hidden_layers = 3, but the target "
                                         r"has 4"):
        fs.DFlashModel.load(tmp_path / "d.npz", other)
