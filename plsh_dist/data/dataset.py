"""From configuration to token streams: sources, tokenizer, caches.

``prepare_data`` is the one call a launcher makes (on one rank first, then a
barrier, then on every rank: the second call only opens the caches):

    stdlib corpus (if no data given) -> tokenizer (load or train)
      -> token cache per split (load or tokenise) -> PreparedData

``build_loader`` then turns a split into batches for one (dp_rank, sp_rank).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from plsh_dist.data.config import DataConfig, TokenizerConfig
from plsh_dist.data.corpus import write_stdlib_corpus
from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.report import BadDataReport
from plsh_dist.data.sources import is_text_file, iter_documents, resolve_files, saved_dataset_dir
from plsh_dist.data.token_cache import TokenStream, cache_key, load_or_build_token_stream
from plsh_dist.data.tokenizer import Tokenizer, load_or_train_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """One split's documents: local files/globs, or a ``datasets`` name and split."""

    files: tuple[str, ...] | None = None
    dataset_name: str | None = None
    dataset_config: str | None = None
    split: str = "train"
    data_files: tuple[str, ...] | None = None

    def label(self) -> str:
        """The source as a user names it: its files, or the dataset and split."""
        if self.files is not None:
            return str(list(self.files))
        files = f", data_files {list(self.data_files)}" if self.data_files is not None else ""
        return f"{self.dataset_name!r} (split {self.split!r}{files})"

    def describe(self, cfg: DataConfig) -> dict:
        """What identifies the documents, for the cache key. Local files: path, size, mtime."""
        if self.files is not None:
            paths = resolve_files(list(self.files))
            stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
            key = {"files": stats, "text_field": cfg.text_field, "sample_by": cfg.sample_by}
            if any(map(is_text_file, paths)):  # how a text file is cut and decoded changes its tokens
                key.update(doc_separator=cfg.doc_separator, decode_errors=cfg.decode_errors)
            return key
        key = {"dataset": self.dataset_name, "config": self.dataset_config, "split": self.split,
               "text_field": cfg.text_field}
        saved = saved_dataset_dir(self.dataset_name)
        if saved is not None:  # a save_to_disk directory: its files, as local files are keyed
            key["saved"] = [(str(p.relative_to(saved)), p.stat().st_size, p.stat().st_mtime_ns)
                            for p in sorted(saved.rglob("*")) if p.is_file()]
        if self.data_files is not None:  # a file builder (json, parquet, ...): its files as local files are keyed
            key["data_files"] = [(str(p), p.stat().st_size, p.stat().st_mtime_ns)
                                 for p in resolve_files(list(self.data_files))]
        return key

    def documents(self, cfg: DataConfig, report: BadDataReport, with_location: bool = False):
        """Iterator over the usable document texts (skips counted in ``report``)."""
        return iter_documents(
            list(self.files) if self.files is not None else None, dataset_name=self.dataset_name,
            dataset_config=self.dataset_config, split=self.split, text_field=cfg.text_field,
            data_files=list(self.data_files) if self.data_files is not None else None,
            streaming=cfg.streaming, sample_by=cfg.sample_by, doc_separator=cfg.doc_separator,
            decode_errors=cfg.decode_errors, hf_cache_dir=cfg.hf_cache_dir, report=report,
            with_location=with_location,
        )


def data_sources(cfg: DataConfig, corpus_report: BadDataReport | None = None) -> dict[str, Source]:
    """``{"train": Source, "val": Source}`` ("val" absent when there is none); with
    ``[data].sources``, ``{"train/<name>": ..., "val/<name>": ...}`` per source, in its order.

    With neither files nor a dataset name, writes (or reuses) the stdlib corpus
    and adds its skipped files (empty, undecodable) to ``corpus_report``.
    """
    if cfg.sources:
        out = {f"train/{t['name']}": Source(files=tuple(t["train_files"])) for t in cfg.sources}
        out.update({f"val/{t['name']}": Source(files=tuple(t["val_files"])) for t in cfg.sources if t.get("val_files")})
        return out
    if cfg.train_files:
        out = {"train": Source(files=tuple(cfg.train_files))}
        if cfg.val_files:
            out["val"] = Source(files=tuple(cfg.val_files))
        return out
    if cfg.dataset_name:
        files = tuple(cfg.data_files) if cfg.data_files else None
        out = {"train": Source(dataset_name=cfg.dataset_name, dataset_config=cfg.dataset_config, split=cfg.train_split,
                               data_files=files)}
        if cfg.val_split:
            out["val"] = Source(dataset_name=cfg.dataset_name, dataset_config=cfg.dataset_config, split=cfg.val_split,
                                data_files=files)
        return out
    corpus = write_stdlib_corpus(cfg.corpus_dir, cfg.corpus_val_fraction, cfg.corpus_max_files, cfg.seed)
    if corpus_report is not None:
        corpus_report.merge(corpus.stats.report)
    out = {"train": Source(files=(str(corpus.train),))}
    if corpus.stats.val_docs:
        out["val"] = Source(files=(str(corpus.val),))
    return out


def load_token_stream(source: Source, cfg: DataConfig, tokenizer: Tokenizer,
                      report: BadDataReport | None = None, *, threads: int = 1, label: str = "train",
                      status: Callable[[str], None] | None = None) -> TokenStream:
    """The cached token stream of ``source`` (built on first use on ``threads`` threads, with a
    progress bar ``tokenizing <label>`` whose line also goes to ``status``)."""
    return load_or_build_token_stream(
        lambda r: source.documents(cfg, r, with_location=True), tokenizer, cfg.cache_dir, source.describe(cfg),
        cfg.min_doc_tokens, report=report, verify=cfg.verify_cache, threads=threads, label=label,
        size_bytes=source_bytes(source), status=status,
    )


def source_bytes(source: Source) -> int | None:
    """About how much text ``source`` holds, in bytes, for a progress bar: its local files' sizes
    (a parquet file's uncompressed size); None for a dataset read by name."""
    if source.files is not None:
        paths = resolve_files(list(source.files))
    elif (saved := saved_dataset_dir(source.dataset_name)) is not None:
        paths = [p for p in saved.rglob("*.arrow")]
    elif source.data_files is not None:
        paths = resolve_files(list(source.data_files))
    else:
        return None
    total = 0
    for p in paths:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(p).metadata
            total += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        else:
            total += p.stat().st_size
    return total


@dataclass(frozen=True)
class PlannedWrite:
    """A directory ``prepare_data`` will write into, and the setting that names it."""

    setting: str
    """The field, e.g. ``"[data].cache_dir"``."""
    value: str
    """The field's value (for the tokenizer, the ``.model`` file; ``directory`` is its folder)."""
    directory: Path
    what: str
    """What is written there, as a clause: ``"the tokenizer is trained and written there"``."""


def planned_writes(cfg: DataConfig, tok_cfg: TokenizerConfig) -> list[PlannedWrite]:
    """Where ``prepare_data`` will write, found without writing: the tokenizer's folder when
    [tokenizer].model_path does not exist yet, [data].corpus_dir when the embedded corpus is
    used and not written yet, [data].cache_dir when a split has no token cache for this
    tokenizer and data. Empty when everything is there already (read-only caches are fine).

    The data paths must resolve (``load_config`` checks them first); the corpus counts as
    written when its manifest and both files exist (``write_stdlib_corpus`` compares the
    manifest's contents when it runs)."""
    writes = []
    model_path = Path(tok_cfg.model_path)
    if not model_path.is_file():
        writes.append(PlannedWrite("[tokenizer].model_path", tok_cfg.model_path, model_path.parent,
                                   "it does not exist, so the tokenizer is trained and written there"))
    sources: dict[str, Source] | None
    if cfg.train_files or cfg.dataset_name or cfg.sources:
        sources = data_sources(cfg)
    else:
        corpus = Path(cfg.corpus_dir)
        sources = None
        if all((corpus / name).is_file() for name in ("manifest.json", "train.jsonl", "val.jsonl")):
            sources = {"train": Source(files=(str(corpus / "train.jsonl"),))}
            if (corpus / "val.jsonl").stat().st_size:
                sources["val"] = Source(files=(str(corpus / "val.jsonl"),))
        else:
            writes.append(PlannedWrite("[data].corpus_dir", cfg.corpus_dir, corpus,
                                       "the embedded stdlib corpus (no [data].train_files or dataset_name set) "
                                       "is written there"))
    if sources is None or not model_path.is_file():
        missing = ["train"]  # nothing to key a cache by yet: every split is tokenised anew
    else:
        tokenizer = Tokenizer.load(model_path)
        missing = [name for name, src in sources.items() if not (
            Path(cfg.cache_dir) / cache_key(tokenizer, src.describe(cfg), cfg.min_doc_tokens) / "meta.json").is_file()]
    if missing:
        writes.append(PlannedWrite("[data].cache_dir", cfg.cache_dir, Path(cfg.cache_dir),
                                   f"the token cache of split {missing[0]!r} is built there"))
    return writes


@dataclass(frozen=True)
class PreparedData:
    """Tokenizer and token streams of every split.

    Attributes:
        tokenizer: the loaded (or freshly trained) tokenizer.
        train: training token stream.
        val: validation token stream, or None.
        reports: split -> skip counts of that split; "corpus" -> files the
            stdlib corpus writer skipped (when the embedded corpus is used).
    """

    tokenizer: Tokenizer
    train: TokenStream | None
    """The training stream; None for a mixture (``mixture``)."""
    val: TokenStream | None
    reports: dict[str, BadDataReport]
    tokenizer_trained: bool = False
    """The tokenizer was trained by this call (its model_path did not exist), not loaded."""
    mixture: tuple[tuple[str, float, TokenStream, TokenStream | None], ...] = ()
    """``[data].sources``: ``(name, weight, training stream, validation stream or None)`` per source."""

    def tokenizer_origin(self) -> str:
        """Which tokenizer the run uses and why, for the start-up summary."""
        tok = self.tokenizer
        if self.tokenizer_trained:
            return f"{tok.path} (trained now on the training data: {tok.vocab_size} pieces)"
        return (f"{tok.path} (an existing file, {tok.vocab_size} pieces, used as it is: not retrained on this "
                f"run's data; to train a new one on it, set --tokenizer.model_path to a .model path that does "
                f"not exist yet, or run launchers/train_tokenizer.py)")


def prepare_data(cfg: DataConfig, tok_cfg: TokenizerConfig, *, log_reports: bool = True, threads: int = 1,
                 status: Callable[[str], None] | None = None) -> PreparedData:
    """Corpus, tokenizer and token caches for a run; idempotent and cheap when warm.

    The tokenizer, when missing, is trained on the training source only (so
    validation text never shapes the vocabulary). ``log_reports=False``: the
    per-split reports are returned but not logged (a rank that only reopens
    the caches rank 0 built and reported). ``threads``: SentencePiece threads that
    tokenise a cache to build; ``status``: called with what is being done and how far it is.
    """
    status = status or (lambda text: None)
    corpus_report = BadDataReport()
    status("reading the data sources")
    sources = data_sources(cfg, corpus_report)
    train_srcs = [src for name, src in sources.items() if name == "train" or name.startswith("train/")]
    trained = not Path(tok_cfg.model_path).is_file()
    status(f"training the tokenizer {tok_cfg.model_path}" if trained else "loading the tokenizer")
    tokenizer = load_or_train_tokenizer(
        tok_cfg.model_path,
        # A generator, so nothing is read when the model file already exists;
        # its skip counts are reported again (and kept) by the token cache build.
        itertools.chain.from_iterable(src.documents(cfg, BadDataReport()) for src in train_srcs),
        tok_cfg.vocab_size,
        text_field=cfg.text_field,
        input_sentence_size=tok_cfg.input_sentence_size,
        seed=tok_cfg.seed,
        data_label=" + ".join(src.label() for src in train_srcs),
    )
    reports = {name: BadDataReport() for name in sources}
    if corpus_report.kept or corpus_report.counts:
        reports["corpus"] = corpus_report
    streams = {name: load_token_stream(src, cfg, tokenizer, reports[name], threads=threads, label=name,
                                       status=status) for name, src in sources.items()}
    for name, stream in streams.items():
        reports[name].tokens_kept = stream.num_tokens
        # Files read, documents and tokens kept, skips per cause: a warning when anything was skipped.
        if log_reports:
            reports[name].log(logger, f"{name} ({stream.path})")
    mixture = tuple((t["name"], float(t["weight"]), streams[f"train/{t['name']}"], streams.get(f"val/{t['name']}"))
                    for t in cfg.sources or ())
    return PreparedData(tokenizer, streams.get("train"), streams.get("val"), reports, tokenizer_trained=trained,
                        mixture=mixture)


def build_loader(stream: TokenStream | PreparedData, cfg: DataConfig, *, dp_rank: int = 0, dp_size: int = 1,
                 sp_rank: int = 0, sp_size: int = 1, train: bool = True, start: int = 0,
                 seq_len: int | None = None) -> PackedLoader:
    """Batches of ``stream`` for one rank; given the ``PreparedData`` of a mixture, its training batches.

    ``train=True``: shuffled with ``cfg.seed``, endless, resumable from
    global stream position ``start`` (sampler.py). ``train=False``: stream order, one epoch. ``seq_len``
    overrides ``cfg.seq_len`` (evaluating at longer contexts reuses the cache).
    Batches carry ``cu_seqlens`` when ``cfg.document_masking`` is on.
    """
    if isinstance(stream, PreparedData):  # a mixture's sources, by weight (data/mixture.py)
        return PackedLoader([m[2].tokens for m in stream.mixture], cfg.seq_len if seq_len is None else seq_len,
                            cfg.micro_batch_size, dp_rank=dp_rank, dp_size=dp_size, sp_rank=sp_rank,
                            sp_size=sp_size, seed=cfg.seed, start=start, document_masking=cfg.document_masking,
                            eos_id=stream.mixture[0][2].eos_id, weights=[m[1] for m in stream.mixture])
    return PackedLoader(
        stream.tokens, cfg.seq_len if seq_len is None else seq_len, cfg.micro_batch_size,
        dp_rank=dp_rank, dp_size=dp_size, sp_rank=sp_rank, sp_size=sp_size, seed=cfg.seed,
        shuffle=train, loop=train, start=start, document_masking=cfg.document_masking, eos_id=stream.eos_id,
    )
