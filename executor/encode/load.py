"""Loading a tokenizer: ``load_tokenizer(tokenizer_id)`` → the ``tokenizers.Tokenizer`` and its special tokens.

``tokenizer_id`` is a Hub id (``"gpt2"``, loaded through transformers and its cache), a local directory
(``tokenizer.json`` plus ``tokenizer_config.json``), or a path to a ``tokenizer.json`` file. Failures say which
it was, at once: an id that can only be a path (``zephon.storage.local.looks_like_local_path``) and does not
exist is refused without asking the Hub; a Hub id gets one request, not retried, and when the Hub cannot be
reached the Hugging Face cache is used, or the error names the endpoint and the fix (a local path, or
``HF_HUB_OFFLINE=1`` with a cached copy); with ``HF_HUB_OFFLINE`` set only the cache is read. A tokenizer.json is
parsed once per process (by path, size and modification time).

Example: ``load_tokenizer("tok/")`` → ``(Tokenizer, {"eos_token": "</s>", "bos_token": "<s>"})`` from
``tok/tokenizer.json`` and ``tok/tokenizer_config.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path

from tokenizers import Tokenizer

from zephon.errors import TokenizerError, one_line
from zephon.storage.local import display_missing, display_path, looks_like_local_path

log = logging.getLogger(__name__)

EOS_GUESSES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
#: A Hub model id: ``name`` or ``org/name`` of letters, digits, ``_ - .`` (huggingface_hub's own check, less
#: its length limit, which the Hub reports).
_HUB_ID = re.compile(r"^(?:[\w\-.]+/)?[\w\-.]+$")


def _special_tokens_from_config(directory: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = directory / name
        if file.is_file():
            data = json.loads(file.read_text(encoding="utf-8"))
            for key in ("eos_token", "bos_token", "pad_token"):
                value = data.get(key)
                if isinstance(value, dict):
                    value = value.get("content")
                if isinstance(value, str) and key not in out:
                    out[key] = value
    return out


#: tokenizer.json files loaded in this process, by (path, size, modification time): planning and the executor
#: of one ``Pipeline(work_source)`` parse a large tokenizer.json once (about a second for 6-14 MB).
_LOADED: dict[tuple[str, int, int], Tokenizer] = {}
#: Each loaded tokenizer's ``to_str()``, by ``id`` (the tokenizer kept beside it, so the id stays its own): the
#: encoder's fingerprint and engines are made from it, and a large tokenizer serializes in ~0.3 CPU s — once per
#: encoder before, so once in every DataLoader worker (a forked worker inherits both caches).
_CONFIGS: dict[int, tuple[Tokenizer, str]] = {}


def tokenizer_config(tokenizer: Tokenizer) -> str:
    """``tokenizer.to_str()``, serialized once per tokenizer object in this process (and its forked children)."""
    kept = _CONFIGS.get(id(tokenizer))
    if kept is None or kept[0] is not tokenizer:
        kept = _CONFIGS[id(tokenizer)] = (tokenizer, tokenizer.to_str())
    return kept[1]


def _from_file(file: Path) -> Tokenizer:
    st = file.stat()
    key = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    tokenizer = _LOADED.get(key)
    if tokenizer is None:
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception for a truncated or foreign file
            raise TokenizerError(
                f"{display_path(file)} must be a tokenizer.json that tokenizers can load, got: {one_line(exc)} — "
                "restore the file, or save the tokenizer again with save_pretrained()"
            ) from None
        _LOADED[key] = tokenizer
    return tokenizer


def load_tokenizer(tokenizer_id: str) -> tuple[Tokenizer, dict[str, str]]:
    """The tokenizer of ``tokenizer_id`` and its special tokens (``eos_token``, ``bos_token``, ``pad_token``)."""
    path = Path(tokenizer_id).expanduser()
    if path.is_file():
        return _from_file(path), _special_tokens_from_config(path.parent)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"tokenizer directory must contain tokenizer.json, got none in {display_path(path)} — save the "
                "tokenizer with save_pretrained() (a fast tokenizer)"
            )
        return _from_file(file), _special_tokens_from_config(path)
    if looks_like_local_path(tokenizer_id):
        raise TokenizerError(
            "tokenizer_id must be an existing directory or tokenizer.json, or a Hub id, got path "
            f"{display_missing(tokenizer_id)} which does not exist — fix the path"
        )
    if not _HUB_ID.match(tokenizer_id) or "--" in tokenizer_id or ".." in tokenizer_id:
        raise TokenizerError(
            "tokenizer_id must be an existing directory or tokenizer.json, or a Hub id (name or org/name), got "
            f"{tokenizer_id!r}, which is neither — fix it"
        )
    return _load_from_hub(tokenizer_id)


def _load_from_hub(tokenizer_id: str) -> tuple[Tokenizer, dict[str, str]]:
    """A Hub tokenizer: from the Hugging Face cache when offline or when the Hub cannot be reached (one quick
    attempt, no retries: ``_hub_unreachable``), else downloaded (``tokenizer.json``), else through transformers."""
    offline = _offline()
    problem = None if offline else _hub_unreachable(tokenizer_id)
    if offline or problem is not None:
        cached = _hub_tokenizer_files(tokenizer_id, local_files_only=True)
        if cached is not None:
            if problem is not None:
                log.warning(
                    "the Hugging Face Hub could not be reached (%s): tokenizer %r loaded from the cache",
                    problem,
                    tokenizer_id,
                )
            return _from_file(cached / "tokenizer.json"), _special_tokens_from_config(cached)
        if _cached_configs(tokenizer_id):  # a cached repo without tokenizer.json: transformers converts it
            with contextlib.suppress(TokenizerError):
                return _transformers_tokenizer(tokenizer_id, local_files_only=True)
        if problem is None:
            raise TokenizerError(
                f"tokenizer {tokenizer_id!r} must be in the Hugging Face cache while HF_HUB_OFFLINE is set, got no "
                "cached copy — unset HF_HUB_OFFLINE to download it, or pass a local directory or tokenizer.json path"
            )
        raise TokenizerError(
            f"tokenizer {tokenizer_id!r} must be downloadable from the Hugging Face Hub or cached, got {problem} and "
            "no cached copy — pass a local directory or tokenizer.json path, or download it once where the Hub is "
            "reachable and set HF_HUB_OFFLINE=1 to use the cached copy"
        )
    hub_files = _hub_tokenizer_files(tokenizer_id)
    if hub_files is not None:
        return _from_file(hub_files / "tokenizer.json"), _special_tokens_from_config(hub_files)
    return _transformers_tokenizer(tokenizer_id)


def _cached_configs(tokenizer_id: str) -> bool:
    """Whether the Hugging Face cache holds a config of the repo (worth asking transformers, which takes
    seconds to import, to build the tokenizer from the cache)."""
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(tokenizer_id, name), str) for name in ("tokenizer_config.json", "config.json")
    )


def _offline() -> bool:
    """``HF_HUB_OFFLINE`` set now, or when huggingface_hub was imported (it reads the variable once)."""
    from huggingface_hub import constants

    set_now = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return set_now or bool(constants.HF_HUB_OFFLINE)


def _hub_unreachable(tokenizer_id: str) -> str | None:
    """Why the Hub cannot be reached (``"no connection to URL (ConnectError: ...)"``, ``"HTTP 503 from URL"``),
    or None when it answered. One HEAD request for the repo's ``tokenizer.json``, not retried: a Hub that
    cannot be reached fails in one connection timeout (``HF_HUB_ETAG_TIMEOUT``, 10 s) instead of
    huggingface_hub's retry loop (about 23 s per file, over a minute for a tokenizer's files)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    from zephon.storage.hub.errors import RETRY_STATUSES, http_status

    url = hf_hub_url(tokenizer_id, "tokenizer.json")
    endpoint = constants.ENDPOINT
    try:
        get_hf_file_metadata(url, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as exc:  # the Hub client raises HTTP errors, network errors of httpx, offline mode
        status = http_status(exc)
        if status is None:
            return f"no connection to {endpoint} ({type(exc).__name__}: {one_line(exc)})"
        if status in (408, *RETRY_STATUSES):
            return f"HTTP {status} from {endpoint}"
    return None  # it answered: found, or a definite answer (404, 401) that the download below reports


def _hub_tokenizer_files(tokenizer_id: str, *, local_files_only: bool = False) -> Path | None:
    """Download a Hub model's ``tokenizer.json`` (and its configs) through the Hugging Face cache
    (``local_files_only``: only look in the cache).

    A Hub tokenizer is read from the same files a local directory holds, so the same tokenizer gets the
    same fingerprint wherever it was loaded from. Returns None when the repo has no ``tokenizer.json``
    (then transformers converts it) or cannot be reached (transformers reports why).
    """
    try:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(tokenizer_id, "tokenizer.json", local_files_only=local_files_only))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            with contextlib.suppress(Exception):  # optional files: absent is fine
                hf_hub_download(tokenizer_id, name, local_files_only=local_files_only)
    except Exception:
        return None
    return path.parent


def _transformers_tokenizer(tokenizer_id: str, *, local_files_only: bool = False) -> tuple[Tokenizer, dict[str, str]]:
    """A Hub tokenizer without ``tokenizer.json``, converted by transformers (which must give a fast one)."""
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(tokenizer_id, local_files_only=local_files_only)
    except Exception as exc:  # transformers raises many types: OSError, ValueError, HTTP errors
        raise TokenizerError(
            f"tokenizer {tokenizer_id!r} could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}) "
            "— pass a local directory or tokenizer.json path, or make the Hub reachable (HF_TOKEN for gated models)"
        ) from exc
    if not getattr(hf, "is_fast", False):
        raise TokenizerError(f"tokenizer {tokenizer_id!r} must have a fast (Rust) version, got a slow one")
    specials = {k: v for k in ("eos_token", "bos_token", "pad_token") if isinstance(v := getattr(hf, k, None), str)}
    return hf.backend_tokenizer, specials
