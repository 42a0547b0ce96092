"""Data pipeline: tokenizer, corpus, datasets, packing, DP/SP sharding.

    documents (local files | datasets name | embedded stdlib corpus)
      -> Tokenizer (SentencePiece BPE, exact round-trip)
      -> TokenStream (cached flat tokens, EOS after each document)
      -> PackedLoader: windows of seq_len + 1, shuffled per epoch, dealt to
         DP ranks, shifted globally, cut into SP chunks
      -> {"input_ids", "labels", "position_ids"}: int64 (B, seq_len / sp_size)
         (+ "cu_seqlens": int32 document offsets of the whole batch, with
         [data].document_masking)
"""

from plsh_dist.data.config import DataConfig, TokenizerConfig
from plsh_dist.data.corpus import CorpusFiles, CorpusStats, write_stdlib_corpus
from plsh_dist.data.dataset import PreparedData, Source, build_loader, data_sources, load_token_stream, prepare_data
from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.packing import document_cu_seqlens, gather_windows, max_document_length, num_windows, split_for_sp
from plsh_dist.data.report import SKIP_REASONS, BadDataReport
from plsh_dist.data.sampler import ShardedSampler, epoch_permutation
from plsh_dist.data.sources import iter_documents, resolve_files
from plsh_dist.data.token_cache import TokenStream, load_or_build_token_stream
from plsh_dist.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, load_or_train_tokenizer, train_tokenizer

__all__ = [
    "DataConfig", "TokenizerConfig",
    "CorpusFiles", "CorpusStats", "write_stdlib_corpus",
    "PreparedData", "Source", "build_loader", "data_sources", "load_token_stream", "prepare_data",
    "PackedLoader",
    "document_cu_seqlens", "gather_windows", "max_document_length", "num_windows", "split_for_sp",
    "SKIP_REASONS", "BadDataReport",
    "ShardedSampler", "epoch_permutation",
    "iter_documents", "resolve_files",
    "TokenStream", "load_or_build_token_stream",
    "EOS_ID", "PAD_ID", "Tokenizer", "load_or_train_tokenizer", "train_tokenizer",
]
