"""Configuration of the data pipeline: documented dataclasses, checked on creation.

Two sections, each handed only to its own component: ``TokenizerConfig``
(what model, trained from what) and ``DataConfig`` (where documents come
from, how they are packed and batched). Parallel layout (dp/sp rank and size)
is not configuration: the launcher passes it at run time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from plsh_dist.config_check import check_field_types

# Values shown in type errors for the fields that default to None.
_DATA_EXAMPLES = {
    "train_files": ["data/train/*.txt"], "val_files": ["data/val/*.txt"], "dataset_name": "HuggingFaceFW/fineweb-edu",
    "dataset_config": "sample-10BT", "val_split": "validation", "hf_cache_dir": "hf_cache", "corpus_max_files": 100,
    "data_files": ["data/train/*.jsonl"],
    "sources": [{"name": "code", "train_files": ["data/code/*.jsonl"], "weight": 0.7}],
}

#: The keys of one ``[[data.sources]]`` table, with whether each is required.
SOURCE_KEYS = {"name": True, "train_files": True, "weight": True, "val_files": False}

#: ``datasets`` builders that read files (``load_dataset("json", data_files=...)``): without
#: ``data_files`` they would read whatever the working directory holds.
FILE_BUILDERS = ("arrow", "csv", "json", "pandas", "parquet", "text", "webdataset", "xml")


@dataclass
class TokenizerConfig:
    """SentencePiece tokenizer: loaded from ``model_path``, trained there if missing."""

    model_path: str = "data_cache/tokenizer/stdlib_bpe8k.model"
    """The ``.model`` file. If it does not exist it is trained from the training data."""
    vocab_size: int = 8192
    """Pieces when training (>= 300: 4 special ids + 256 byte pieces + merges). An existing
    model_path file is used as it is: set to another size than the file's, it is refused."""
    input_sentence_size: int = 20_000
    """Line chunks (~4 KB) sampled for training; bounds training time (figures: results/tokenizer/README.md)."""
    seed: int = 0
    """Seed of the chunk sampling; the same seed and data give the same model."""

    def __post_init__(self):
        check_field_types(self, "tokenizer")
        if not self.model_path.endswith(".model"):
            raise ValueError(f"TokenizerConfig.model_path must end in .model, got {self.model_path!r}")
        if self.vocab_size < 300:
            raise ValueError(f"TokenizerConfig.vocab_size must be >= 300, got {self.vocab_size}")
        if self.input_sentence_size < 1:
            raise ValueError(f"TokenizerConfig.input_sentence_size must be >= 1, got {self.input_sentence_size}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DataConfig:
    """Documents, packing and batching.

    Sources, in order of precedence: ``train_files`` (local paths/globs), else
    ``dataset_name`` (anything ``datasets.load_dataset`` accepts), else the
    embedded corpus (the running Python's standard library sources, written
    to ``corpus_dir``).
    """

    train_files: list[str] | None = None
    """Local training files or globs (text: one document per file; .jsonl/.json; .parquet)."""
    val_files: list[str] | None = None
    """Local validation files or globs; None = no validation set (unless a dataset/corpus provides one)."""
    sources: list[dict] | None = None
    """A weighted mixture of sources instead of ``train_files``: one ``[[data.sources]]`` table each,
    with ``name``, ``train_files`` (local files or globs), ``weight`` (> 0; the mix is the weights'
    shares, exact over every 1024 sequences) and optionally ``val_files``. Each source has its own
    token cache and its own shuffled stream; which source each sequence comes from is drawn from
    ``seed``, so a run resumes exactly at any step (plsh_dist/data/mixture.py)."""
    dataset_name: str | None = None
    """A ``datasets.load_dataset`` name (needs network or a local HF cache), or a directory written by
    ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read with ``load_from_disk``; a ``Dataset`` is
    the split ``train``). Ignored if train_files is set."""
    dataset_config: str | None = None
    """Second argument of ``load_dataset`` (the subset name), if the dataset has several."""
    data_files: list[str] | None = None
    """``data_files`` of ``load_dataset``: the files (or globs) a file builder ``dataset_name`` reads
    (``json``, ``csv``, ``parquet``, ``text``, ...: ``FILE_BUILDERS``), its split ``train``; required
    for those, which would otherwise read the working directory. Local files can also go in
    ``train_files`` / ``val_files`` (the builder then follows each file's extension)."""
    train_split: str = "train"
    """Split of ``dataset_name`` used for training."""
    val_split: str | None = None
    """Split of ``dataset_name`` used for validation; None = no validation."""
    text_field: str = "text"
    """Field of a record that holds the document text (jsonl, parquet, hub datasets)."""
    sample_by: str = "document"
    """What a document is in a plain-text file: 'document' (the whole file, or with ``doc_separator``
    the text between two separators), 'paragraph' (the text between blank lines) or 'line' (each
    line; an empty one is reported as 'empty').

    Files are read 1 MiB at a time and each document handed on as it ends, so memory holds one
    document, never the file: with 'line', 'paragraph' or a separator a 1 GB file takes what its
    longest document takes. 'document' without a separator holds the whole file as the one
    document it is: reading a one-line 500 MB file took 0.9 GiB more at peak, and tokenising a
    one-line 50 MB file 2.3 GiB (docs/benchmarks.md); give such a file a separator."""
    doc_separator: str | None = None
    """With ``sample_by = "document"``, plain-text files hold many documents, separated by this
    string (e.g. ``"<|endoftext|>"`` or ``"\\f"``): the separator is dropped and the text between two
    is one document, kept as it is (a newline next to a separator stays in its document); an empty
    piece (a separator at the file's start or end, two in a row) is no document. None: a file is
    one document."""
    decode_errors: str = "replace"
    """What bytes that are not UTF-8 in a plain-text file do: 'replace' (each invalid sequence reads
    as U+FFFD; the report names each such file, how many bytes were replaced and the byte offsets
    of the first five) or 'skip_file' (the file is left out, reported as ``undecodable_file``).

    'replace' by default: a stray byte then costs one character, where 'skip_file' loses the whole
    file, at pretraining scale often gigabytes of good text; a file in another encoding is still
    seen, by its many replacements in the report. JSON-lines files with such bytes are skipped
    whole either way (their parser needs UTF-8)."""
    streaming: bool = True
    """Read sources with ``streaming=True``: one pass, no Arrow copy on disk. We tokenise in one pass anyway."""
    seq_len: int = 1024
    """Tokens per training sequence (inputs); windows hold seq_len + 1 tokens for the shifted labels."""
    micro_batch_size: int = 8
    """Sequences per rank per forward pass."""
    seed: int = 0
    """Shuffling seed; the same on every rank."""
    document_masking: bool = False
    """Tokens attend within their own packed document only (True), or across the whole window (False).

    A document is its tokens and the EOS that ends it; one starts after each
    EOS and at every window's first token. When on, each batch carries
    ``cu_seqlens`` (int32 document offsets over the flattened (B, seq_len)
    batch, flash-attn's varlen convention, the same on every SP rank) and the
    loss passes it to the model. Labels, loss, window order and resume are
    unchanged. Pretraining should use True (every shipped pretraining config
    sets it): an unrelated document is only noise to attend to, and under PLSH
    the estimator becomes exactly document-masked ALiBi over fewer keys. The
    field's default stays False, plain packing, so that a config or checkpoint
    written before this option (which has no such key) resumes, exports and
    validates exactly as it was trained, never switching mid-run."""
    min_doc_tokens: int = 32
    """Documents with fewer tokens are reported as 'short' and skipped (stubs, licence-only files)."""
    cache_dir: str = "data_cache"
    """Root of the token caches (one sub-directory per tokenizer+source)."""
    hf_cache_dir: str | None = None
    """``cache_dir`` passed to ``datasets.load_dataset``; None = the datasets default."""
    verify_cache: bool = True
    """Check the CRC32 of a cached token file on open (about 1 s per GB)."""
    corpus_dir: str = "data_cache/stdlib_corpus"
    """Where the embedded stdlib corpus is written (train.jsonl, val.jsonl)."""
    corpus_max_files: int | None = None
    """Use only this many stdlib files (smoke tests); None = all (~1800 files, ~30 MB)."""
    corpus_val_fraction: float = 0.02
    """Fraction of stdlib files held out for validation (chosen by a stable hash of the path)."""

    def __post_init__(self):
        if isinstance(self.train_files, str):
            self.train_files = [self.train_files]
        if isinstance(self.val_files, str):
            self.val_files = [self.val_files]
        check_field_types(self, "data", _DATA_EXAMPLES)
        if self.seq_len < 1:
            raise ValueError(f"DataConfig.seq_len must be >= 1, got {self.seq_len}")
        if self.micro_batch_size < 1:
            raise ValueError(f"DataConfig.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.min_doc_tokens < 0:
            raise ValueError(f"DataConfig.min_doc_tokens must be >= 0, got {self.min_doc_tokens}")
        if self.sample_by not in ("document", "paragraph", "line"):
            raise ValueError(f"DataConfig.sample_by must be 'document', 'paragraph' or 'line', got {self.sample_by!r}")
        if self.doc_separator == "":
            raise ValueError("[data].doc_separator is empty: set the string between documents (e.g. "
                             "'<|endoftext|>') or leave it out (a file is then one document)")
        if self.doc_separator is not None and self.sample_by != "document":
            raise ValueError(f"[data].doc_separator = {self.doc_separator!r} cuts files into documents and "
                             f"[data].sample_by = {self.sample_by!r} cuts them into {self.sample_by}s: keep one, "
                             "sample_by = 'document' (the default) with the separator, or no separator")
        if self.decode_errors not in ("replace", "skip_file"):
            raise ValueError(f"[data].decode_errors must be 'replace' (bytes that are not UTF-8 read as U+FFFD, "
                             f"counted) or 'skip_file' (a file with one is left out), got {self.decode_errors!r}")
        if not 0.0 <= self.corpus_val_fraction < 1.0:
            raise ValueError(f"DataConfig.corpus_val_fraction must be in [0, 1), got {self.corpus_val_fraction}")
        if self.corpus_max_files is not None and self.corpus_max_files < 1:
            raise ValueError(f"DataConfig.corpus_max_files must be >= 1 or None, got {self.corpus_max_files}")
        if isinstance(self.data_files, str):
            self.data_files = [self.data_files]
        if not self.train_files and self.dataset_name in FILE_BUILDERS and not self.data_files:
            raise ValueError(
                f"[data].dataset_name = {self.dataset_name!r} is a datasets builder that reads files, and "
                f"[data].data_files is not set: load_dataset({self.dataset_name!r}) would read whatever the "
                f"working directory holds. Set [data].data_files (e.g. --data.data_files=['corpus/*.jsonl']), or "
                "put local files in [data].train_files / [data].val_files")
        if self.data_files and not self.dataset_name:
            raise ValueError("[data].data_files is set but [data].dataset_name is not: name the builder that "
                             "reads them (e.g. --data.dataset_name=json), or use [data].train_files")
        if self.val_files and not self.train_files:
            raise ValueError("DataConfig.val_files is set but train_files is not; set both, or neither")
        if self.sources is not None:
            self._check_sources()

    def _check_sources(self) -> None:
        """Each ``[[data.sources]]`` table: its keys, types and a unique name; nothing else names the data."""
        if self.train_files or self.dataset_name:
            raise ValueError("[data].sources and [data].train_files / dataset_name both name the training data; "
                             "put every training source in [[data.sources]] (each with its train_files), or use "
                             "train_files alone")
        if not self.sources:
            raise ValueError("[data].sources is empty; give one [[data.sources]] table per source, or leave it out")
        names = []
        for i, table in enumerate(self.sources):
            where = f"[data].sources[{i}]"
            unknown = sorted(set(table) - set(SOURCE_KEYS))
            missing = [k for k, required in SOURCE_KEYS.items() if required and k not in table]
            if unknown or missing:
                raise ValueError(f"{where} = {table!r}: " + "; ".join(
                    ([f"unknown key(s) {unknown}"] if unknown else []) + ([f"missing {missing}"] if missing else []))
                    + f"; each source is a table of {list(SOURCE_KEYS)} (val_files optional)")
            name, weight = table["name"], table["weight"]
            if not isinstance(name, str) or not name or name in names:
                raise ValueError(f"{where}.name must be a non-empty string unlike the other sources', got {name!r}")
            names.append(name)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
                raise ValueError(f"{where}.weight must be a positive number, got {weight!r}")
            for key in ("train_files", "val_files"):
                value = table.get(key, [])
                if isinstance(value, str):
                    value = table[key] = [value]
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (
                        key == "train_files" and not value):
                    raise ValueError(f"{where}.{key} must be a list of file paths or globs, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)
