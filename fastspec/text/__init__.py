"""Text: the byte tokenizer, Hugging Face tokenizers, the corpus of the embedded models.

Lives here: ``tokenizer`` (ByteTokenizer, StreamDecoder, the Tokenizer protocol),
``hf_tokenizer`` (tokenizer.json through the ``tokenizers`` library), ``corpus``.

May import: :mod:`fastspec.kernels`, :mod:`fastspec.formats`. Nothing above it.
"""
