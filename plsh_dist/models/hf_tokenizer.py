"""The run's SentencePiece tokenizer as a transformers tokenizer (``AutoTokenizer``).

    import plsh_dist.models
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained("runs/quickstart/final")   # a PlshTokenizer

``PlshTokenizer`` wraps :class:`plsh_dist.data.tokenizer.Tokenizer` (the same
``tokenizer.model``), so its ids are exactly the ones training saw:
``tok(text).input_ids == Tokenizer.load(path).encode(text)`` (tested), including
the literal U+2581 rule and text that spells a special token (``"<s>"`` in
source code is text, not BOS: ``split_special_tokens`` is on). No BOS/EOS is
added (training packs documents with an EOS after each; none before). Padding is on
the left (``padding_side``), what batched ``generate`` needs of a decoder-only model.
transformers' own Llama tokenizer would convert the model to another
pre-tokenisation and give different ids on code (whitespace runs, digits).

Exports hold ``tokenizer.model`` + ``tokenizer_config.json`` naming this
class; registered for plsh_dist's model types by :mod:`plsh_dist.models.hf_config`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from transformers import PreTrainedTokenizer

from plsh_dist.models.remote_code import TOKENIZER_MODULES, add_tokenizer_auto_map, write_remote_code


class PlshTokenizer(PreTrainedTokenizer):
    """transformers tokenizer over plsh_dist's SentencePiece model (module doc)."""

    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str | None = None, **kwargs):
        from plsh_dist.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

        if vocab_file is None or not Path(vocab_file).is_file():
            raise ValueError(f"PlshTokenizer needs the run's SentencePiece model, tokenizer.model, next to "
                             f"tokenizer_config.json (got {vocab_file!r}); copy the run's [tokenizer].model_path "
                             f"there")
        self.vocab_file = str(vocab_file)
        self.plsh = Tokenizer.load(vocab_file)  # checks the special ids and byte fallback
        sp = self.plsh._sp
        self._sp = sp
        for name, i in (("unk_token", UNK_ID), ("bos_token", BOS_ID), ("eos_token", EOS_ID), ("pad_token", PAD_ID)):
            kwargs.setdefault(name, sp.id_to_piece(i))
        kwargs.setdefault("split_special_tokens", True)
        # Left, as transformers asks of a decoder-only model's batched generate(): the last column is
        # then every row's last prompt token. A right-padded forward gives the same logits per real
        # token, but generate() would continue each short row from its padding.
        kwargs.setdefault("padding_side", "left")
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return self.plsh.vocab_size

    def get_vocab(self) -> dict[str, int]:
        vocab = {self._sp.id_to_piece(i): i for i in range(self.vocab_size)}
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self._sp.id_to_piece(i) for i in self.plsh.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._sp.piece_to_id(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self._sp.id_to_piece(int(index))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.plsh.decode([self._sp.piece_to_id(t) for t in tokens])

    def _decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None,
                **kwargs) -> str:
        ids = [int(i) for i in ([token_ids] if isinstance(token_ids, int) else token_ids)]
        special = set(self.all_special_ids)
        if skip_special_tokens:
            return self.plsh.decode([i for i in ids if i not in special])
        # As transformers' own tokenizers: a special token decodes to its text ("</s>"), which tools
        # rely on (lm-evaluation-harness stops generate_until at decode(eos); an empty string would stop
        # every row after one token). SentencePiece alone decodes control pieces to nothing.
        text, run = [], []
        for i in ids + [None]:
            if i is None or i in special:
                text.append(self.plsh.decode(run))
                run = []
                if i is not None:
                    text.append(self._sp.id_to_piece(i))
            else:
                run.append(i)
        return "".join(text)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, plus ``auto_map`` in ``tokenizer_config.json`` and
        ``tokenization_plsh.py`` (:mod:`plsh_dist.models.remote_code`): the directory's tokenizer
        loads with ``trust_remote_code=True`` in a Python that never imports plsh_dist."""
        files = super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(save_directory, TOKENIZER_MODULES)
        add_tokenizer_auto_map(save_directory)
        return files

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        if not os.path.isdir(save_directory):
            raise ValueError(f"tokenizer save directory {save_directory} does not exist")
        name = (f"{filename_prefix}-" if filename_prefix else "") + "tokenizer.model"
        out = Path(save_directory) / name
        if Path(self.vocab_file).resolve() != out.resolve():
            shutil.copyfile(self.vocab_file, out)
        return (str(out),)


def save_tokenizer(model_file: str | Path, directory: str | Path) -> Path:
    """Write ``tokenizer.model`` + ``tokenizer_config.json`` (``PlshTokenizer``, with its
    ``auto_map`` and ``tokenization_plsh.py``) into ``directory``."""
    PlshTokenizer(str(model_file)).save_pretrained(str(directory))
    return Path(directory) / "tokenizer.model"
