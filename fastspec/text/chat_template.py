"""Chat templates: a model's jinja2 template rendered in a sandbox, as ``transformers`` does.

A template comes from a model file (GGUF ``tokenizer.chat_template``, an HF folder's
``tokenizer_config.json`` or ``chat_template.jinja``), so it is untrusted code. It runs in
jinja2's ``ImmutableSandboxedEnvironment`` (no ``_``-prefixed attributes, no mutation of the
values passed in) with the environment ``transformers``' ``apply_chat_template`` sets up:
``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, a ``{% generation %}`` block that just
renders its body, a ``tojson`` that does not HTML-escape, ``raise_exception``,
``strftime_now``, a ``dict`` factory and a ``namespace`` that refuses ``_``-prefixed names.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

__all__ = ["ChatTemplate", "ChatTemplateError"]


class ChatTemplateError(ValueError):
    """A chat template that does not compile, raised an error itself, or broke the sandbox."""


def _import_jinja2():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError as exc:
        raise ImportError("chat templates need the 'jinja2' package: "
                          'pip install "fastspec[gguf]"') from exc
    return jinja2


def _raise_exception(message: str):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators=None, sort_keys: bool = False) -> str:
    # jinja2's own tojson HTML-escapes <, >, & and '; templates expect plain JSON
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Dict:
    """The ``dict`` global: builds plain dicts without exposing the ``dict`` type itself."""

    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _environment():
    """The sandboxed environment (built once per process: jinja2 is imported lazily)."""
    jinja2 = _import_jinja2()
    from jinja2.ext import Extension
    from jinja2.utils import Namespace

    class GenerationBlock(Extension):
        # transformers' AssistantTracker tag: marks the assistant's text; rendering is unchanged
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body
                                          ).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    class SafeNamespace(Namespace):
        # a namespace may not hold _-prefixed names (a route to CPython internals)
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                SafeNamespace._check(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            SafeNamespace._check(name)
            Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a namespace cannot hold the _-prefixed name {name!r}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_Dict(), namespace=SafeNamespace)
    return env


_ENV = None


class ChatTemplate:
    """A compiled chat template.

    Parameters
    ----------
    source : str
        The jinja2 source.
    special_tokens : mapping of str to str, optional
        Variables every rendering gets, e.g. ``bos_token``/``eos_token`` strings.
    origin : str, default "chat template"
        Where the template came from; errors name it.

    Raises
    ------
    ChatTemplateError
        The template does not compile.
    ImportError
        jinja2 is missing.

    Examples
    --------
    >>> t = ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}")
    >>> t.render([{"role": "user", "content": "hi"}])
    'user: hi\\n'
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
                 origin: str = "chat template") -> None:
        global _ENV
        if not isinstance(source, str):
            raise TypeError(f"{origin} must be a string, got {type(source).__name__}")
        if _ENV is None:
            _ENV = _environment()
        self.source = source
        self.origin = origin
        self.special_tokens = dict(special_tokens or {})
        jinja2 = _import_jinja2()
        try:
            self._template = _ENV.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"{origin} does not compile: {exc} (line {exc.lineno})"
                                    ) from None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
               **kwargs: Any) -> str:
        """Return the text of a conversation.

        Parameters
        ----------
        messages : sequence of mapping
            The turns, e.g. ``{"role": "user", "content": "..."}``.
        add_generation_prompt : bool, default False
            End with the header of the assistant's next turn.
        **kwargs
            Further template variables (``tools``, ``documents``, ``enable_thinking``, ...);
            they override the special-token strings.

        Raises
        ------
        ChatTemplateError
            The template called ``raise_exception`` (its message is kept), tried an unsafe
            operation (sandbox), or failed otherwise (an exception its own code raised, such
            as a TypeError: a template is the file's code, not the caller's).
        """
        jinja2 = _import_jinja2()
        if isinstance(messages, (str, bytes)) or not all(
                isinstance(m, Mapping) for m in messages):
            raise TypeError("messages must be a sequence of mappings such as "
                            "{'role': 'user', 'content': '...'}")
        variables = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
        try:
            return self._template.render(messages=[dict(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt,
                                         **variables)
        except jinja2.exceptions.SecurityError as exc:
            raise ChatTemplateError(f"{self.origin} tried an operation the sandbox forbids: "
                                    f"{exc}") from None
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin} raised an error: {exc}") from None
        except Exception as exc:  # the template's own code failed (e.g. '%d' % 'text')
            raise ChatTemplateError(f"{self.origin} failed: {type(exc).__name__}: {exc}"
                                    ) from None

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} characters, origin={self.origin!r})"
