"""Text: the byte tokenizer, Hugging Face and GGUF tokenizers, chat templates, the corpus of
the embedded models.

Lives here: ``tokenizer`` (ByteTokenizer, StreamDecoder, the Tokenizer protocol),
``hf_tokenizer`` (HFTokenizer: tokenizer.json or GGUF metadata through the ``tokenizers``
library), ``gguf_tokenizer`` (a GGUF file's tokenizer rebuilt), ``chat_template`` (sandboxed
jinja2 chat templates), ``corpus``.

May import: :mod:`fastspec.kernels`, :mod:`fastspec.formats`. Nothing above it.
"""
