"""A small Hugging Face Hub-compatible HTTP server for hermetic tests (stdlib ``http.server``).

It serves dataset and model repositories held in memory, answering the requests that the real
``huggingface_hub`` client (2.x) makes for the functions Zephon uses, and those ``transformers`` (5.x) makes for
``AutoTokenizer.from_pretrained``. Dataset repos (:meth:`HubServer.add_dataset`):

* ``GET /api/datasets/{org}/{name}`` and ``.../revision/{rev}`` — dataset info: ``sha``, ``cardData`` (the
  README's YAML front matter), ``siblings`` (with ``size``/``blobId``/``lfs`` when ``?blobs=true``);
* ``GET /api/datasets/{org}/{name}/tree/{rev}[/{path}]?recursive=&cursor=&limit=`` — tree listing with
  cursor pagination (``Link: <...>; rel="next"``, page size :attr:`HubServer.tree_page_size`);
* ``POST /api/datasets/{org}/{name}/paths-info/{rev}`` — ``get_paths_info``;
* ``GET /api/datasets/{org}/{name}/refs`` — branches, tags and ``converts`` (``refs/convert/parquet``);
* ``GET|HEAD /datasets/{org}/{name}/resolve/{rev}/{path}`` — file bytes with ``ETag``, ``X-Repo-Commit``,
  ``X-Linked-Etag``/``X-Linked-Size`` (LFS files), ``Accept-Ranges`` and single ``Range`` requests (206/416).

Model repos (:meth:`HubServer.add_model`; ids ``name`` or ``org/name``, kept apart from datasets in
:attr:`HubServer.models`) answer the same requests under the model URLs:

* ``GET /api/models/{repo}`` and ``.../revision/{rev}`` — model info (``sha``, ``siblings``; ``config`` from
  ``config.json``); transformers resolves the revision to a commit with it first;
* ``GET /api/models/{repo}/tree/{rev}[/{path}]`` — transformers lists ``additional_chat_templates`` (a missing
  folder answers 404 ``EntryNotFound``, which it treats as "no templates") and the whole tree;
* ``POST /api/models/{repo}/paths-info/{rev}`` and ``GET /api/models/{repo}/refs``;
* ``GET|HEAD /{repo}/resolve/{rev}/{path}`` — file bytes, headers as for datasets. A missing file answers 404
  with ``X-Error-Code: EntryNotFound``: the client raises ``RemoteEntryNotFoundError``, which transformers takes
  as "optional file absent" (``config.json``, ``vocab.json``, ``added_tokens.json``, ``chat_template.jinja``...).

``GET /api/agent-harnesses`` (fetched once a process by huggingface_hub to build its user agent) answers an empty
registry.

Revisions are branch names, tags, 40-hex commits or full refs (``refs/heads/x``, ``refs/tags/x``,
``refs/convert/parquet``, URL-encoded as ``refs%2Fconvert%2Fparquet``). Every commit is kept, so moving a
branch never breaks a pinned commit. Gated repos answer 401 without ``Authorization: Bearer`` and 403 with a
token not in their allow-list. Faults (``inject_faults``) answer the next N matching requests with a status
(503, 429, ...); ``truncate_responses`` cuts the next N bodies short. Every request is logged
(:class:`RequestRecord`) with its range and body size, never its token.
Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as the Hub does.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import yaml

LFS_SUFFIXES = (".parquet", ".arrow", ".gz", ".zst", ".bin")
LFS_MIN_SIZE = 10_000
# Model repos: what the Hub's default .gitattributes sends to LFS (weights, archives), and files of 10 MB or more.
MODEL_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".model")
MODEL_LFS_MIN = 10_000_000
CONVERSION_REF = "refs/convert/parquet"
_SHA = re.compile(r"[0-9a-f]{40}")
_DATE = "2024-01-01T00:00:00.000Z"


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Blob:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def oid(self) -> str:  # the git object id of what git stores: the pointer for LFS files
        return git_blob_oid(self.pointer if self.lfs else self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid


@dataclass
class Repo:
    repo_id: str
    commits: dict[str, dict[str, Blob]]
    branches: dict[str, str]
    tags: dict[str, str]
    converts: dict[str, str]
    tokens: frozenset[str] | None = None  # gated when set
    repo_type: str = "dataset"  # "dataset" or "model"


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str  # URL path, percent-decoded
    raw_path: str
    query: dict[str, list[str]]
    range: str | None
    status: int
    body_bytes: int  # bytes of body sent (0 for HEAD)
    authorized: bool  # an Authorization header was sent (its value is never logged)


class _HubHTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that reset its connection (a run that stopped reading, a test that ended) is expected: no
        traceback on stderr. Any other error is printed as usual."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class HubServer:
    """In-memory Hub. Start with :meth:`start` (random port on 127.0.0.1); ``url`` is the endpoint."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.repos: dict[str, Repo] = {}  # dataset repos
        self.models: dict[str, Repo] = {}  # model repos (ids with or without an org: "gpt2", "org/name")
        self.tree_page_size = 1000
        self._host = host
        self._lock = threading.Lock()
        self._log: list[RequestRecord] = []
        self._faults: list[list[object]] = []  # [status (0: truncate), remaining, path_contains, retry_after]
        self._counter = 0
        self._httpd: ThreadingHTTPServer | None = None

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> HubServer:
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._httpd = _HubHTTPServer((self._host, 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="hub-server", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        return f"http://{self._host}:{self._httpd.server_address[1]}"

    # -- repositories -----------------------------------------------------------------------------------
    def add_dataset(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str],
        *,
        readme: str | None = None,
        lfs: Iterable[str] | None = None,
    ) -> str:
        """Create a dataset repo whose ``main`` holds ``files`` (+ README.md); returns the commit sha."""
        if repo_id in self.repos:
            raise ValueError(f"repo {repo_id} exists")
        self.repos[repo_id] = Repo(repo_id, {}, {}, {}, {})
        return self.commit(repo_id, files, readme=readme, lfs=lfs)

    def add_model(self, repo_id: str, files: Mapping[str, bytes | str], *, branch: str = "main") -> str:
        """Create model repo ``repo_id`` (``"gpt2"`` or ``"org/name"``) holding ``files`` on ``branch``.

        When the repo exists, ``files`` become a new commit on ``branch`` (created if new) instead. Weights
        (``.safetensors``, ``.bin``, ...) and files of 10 MB or more are stored as LFS files, as the Hub's default
        ``.gitattributes`` does. Returns the commit sha.
        """
        if not repo_id or repo_id.count("/") > 1 or "" in repo_id.split("/"):
            raise ValueError(f"model repo id must be 'name' or 'org/name', got {repo_id!r}")
        self.models.setdefault(repo_id, Repo(repo_id, {}, {}, {}, {}, repo_type="model"))
        lfs = [path for path, data in files.items() if path.endswith(MODEL_LFS_SUFFIXES) or len(data) >= MODEL_LFS_MIN]
        return self.commit(repo_id, files, branch=branch, lfs=lfs, repo_type="model")

    def commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str],
        *,
        branch: str = "main",
        readme: str | None = None,
        lfs: Iterable[str] | None = None,
        keep: bool = False,
        delete: Iterable[str] = (),
        repo_type: str = "dataset",
    ) -> str:
        """Commit on ``branch`` (created if new) and move it there. ``keep`` starts from the parent's files."""
        repo = self._repo(repo_id, repo_type)
        parent = self._branch_target(repo, branch)
        tree = dict(repo.commits[parent]) if keep and parent else {}
        for path in delete:
            tree.pop(path, None)
        lfs_paths = set(lfs) if lfs is not None else None
        if readme is not None:
            tree["README.md"] = Blob(readme.encode(), lfs=False)
        for path, data in files.items():
            raw = data.encode() if isinstance(data, str) else bytes(data)
            is_lfs = (
                path in lfs_paths if lfs_paths is not None else path.endswith(LFS_SUFFIXES) or len(raw) >= LFS_MIN_SIZE
            )
            tree[path] = Blob(raw, lfs=is_lfs and path not in ("README.md", ".gitattributes"))
        self._counter += 1
        digest = hashlib.sha1(f"{repo_id}\n{parent}\n{self._counter}\n".encode())
        for path in sorted(tree):
            digest.update(f"{path}\0{tree[path].oid}\n".encode())
        sha = digest.hexdigest()
        repo.commits[sha] = tree
        self._set_branch(repo, branch, sha)
        return sha

    def create_branch(self, repo_id: str, name: str, revision: str = "main", *, repo_type: str = "dataset") -> str:
        repo = self._repo(repo_id, repo_type)
        sha = self._resolve(repo, revision)
        assert sha is not None, f"unknown revision {revision}"
        self._set_branch(repo, name, sha)
        return sha

    move_branch = create_branch  # point an existing branch at another revision

    def create_tag(self, repo_id: str, name: str, revision: str = "main", *, repo_type: str = "dataset") -> str:
        repo = self._repo(repo_id, repo_type)
        sha = self._resolve(repo, revision)
        assert sha is not None, f"unknown revision {revision}"
        repo.tags[name] = sha
        return sha

    def add_parquet_conversion(self, repo_id: str, files: Mapping[str, bytes]) -> str:
        """Commit ``files`` (``{config}/{split}/NNNN.parquet``) on branch ``refs/convert/parquet``."""
        return self.commit(repo_id, files, branch=CONVERSION_REF)

    def gate(self, repo_id: str, tokens: Iterable[str], *, repo_type: str = "dataset") -> None:
        """Require ``Authorization: Bearer <one of tokens>``: 401 without a token, 403 with another one."""
        self._repo(repo_id, repo_type).tokens = frozenset(tokens)

    def resolve(self, repo_id: str, revision: str = "main", *, repo_type: str = "dataset") -> str:
        sha = self._resolve(self._repo(repo_id, repo_type), revision)
        assert sha is not None, f"unknown revision {revision}"
        return sha

    def files_at(self, repo_id: str, revision: str = "main", *, repo_type: str = "dataset") -> dict[str, bytes]:
        repo = self._repo(repo_id, repo_type)
        return {p: b.data for p, b in repo.commits[self.resolve(repo_id, revision, repo_type=repo_type)].items()}

    # -- faults and log ---------------------------------------------------------------------------------
    def inject_faults(
        self, status: int, count: int = 1, *, path_contains: str | None = None, retry_after: int | None = None
    ) -> None:
        """Answer the next ``count`` requests (whose path contains ``path_contains``) with ``status``."""
        with self._lock:
            self._faults.append([status, count, path_contains, retry_after])

    def truncate_responses(self, count: int = 1, *, path_contains: str | None = None) -> None:
        """Cut the body of the next ``count`` matching responses in half, then close the connection."""
        with self._lock:
            self._faults.append([0, count, path_contains, None])

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def bytes_served(self, path_contains: str = "") -> int:
        return sum(r.body_bytes for r in self.requests if path_contains in r.path)

    # -- internals --------------------------------------------------------------------------------------
    def _repos_of(self, repo_type: str) -> dict[str, Repo]:
        if repo_type not in ("dataset", "model"):
            raise ValueError(f"repo_type must be 'dataset' or 'model', got {repo_type!r}")
        return self.repos if repo_type == "dataset" else self.models

    def _repo(self, repo_id: str, repo_type: str) -> Repo:
        return self._repos_of(repo_type)[repo_id]

    @staticmethod
    def _set_branch(repo: Repo, branch: str, sha: str) -> None:
        if branch == CONVERSION_REF:
            repo.converts["parquet"] = sha
        else:
            repo.branches[branch.removeprefix("refs/heads/")] = sha

    def _branch_target(self, repo: Repo, branch: str) -> str | None:
        return repo.converts.get("parquet") if branch == CONVERSION_REF else repo.branches.get(branch)

    @staticmethod
    def _resolve(repo: Repo, revision: str) -> str | None:
        if _SHA.fullmatch(revision):
            return revision if revision in repo.commits else None
        if revision.startswith("refs/convert/"):
            return repo.converts.get(revision.removeprefix("refs/convert/"))
        if revision.startswith("refs/heads/"):
            return repo.branches.get(revision.removeprefix("refs/heads/"))
        if revision.startswith("refs/tags/"):
            return repo.tags.get(revision.removeprefix("refs/tags/"))
        return repo.branches.get(revision) or repo.tags.get(revision)

    def _take_fault(self, path: str) -> tuple[int, int | None] | None:
        with self._lock:
            for fault in self._faults:
                status, remaining, contains, retry_after = fault
                if remaining and (contains is None or contains in path):  # type: ignore[operator]
                    fault[1] = remaining - 1  # type: ignore[operator]
                    return status, retry_after  # type: ignore[return-value]
        return None

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._log.append(record)


Response = tuple[int, dict[str, str], bytes]


def _error(status: int, code: str | None, message: str) -> Response:
    headers = {"Content-Type": "application/json", "X-Error-Message": message}
    if code:
        headers["X-Error-Code"] = code
    return status, headers, json.dumps({"error": message}).encode()


def _json(payload: object, headers: dict[str, str] | None = None) -> Response:
    return 200, {"Content-Type": "application/json", **(headers or {})}, json.dumps(payload).encode()


def _card_data(files: Mapping[str, Blob]) -> dict[str, object] | None:
    readme = files.get("README.md")
    if readme is None:
        return None
    match = re.match(r"---\n(.*?)\n---\s*\n", readme.data.decode(), re.S)
    data = yaml.safe_load(match.group(1)) if match else None
    return data if isinstance(data, dict) else None


_MODEL_API_KINDS = ("revision", "tree", "paths-info", "refs")


def _split_model_id(segments: list[str], models: Mapping[str, Repo], kinds: tuple[str, ...]) -> tuple[str, list[str]]:
    """Split URL segments into a model id (``name`` or ``org/name``) and the rest, preferring a known repo."""
    names = [unquote(s) for s in segments[:2]]
    if len(names) == 2 and "/".join(names) in models:
        return "/".join(names), segments[2:]
    if names[0] in models:
        return names[0], segments[1:]
    if len(names) == 2 and segments[1] not in kinds:  # an unknown repo: guess the id's shape from the URL
        return "/".join(names), segments[2:]
    return names[0], segments[1:]


def _json_file(files: Mapping[str, Blob], path: str) -> dict[str, object] | None:
    blob = files.get(path)
    try:
        data = json.loads(blob.data) if blob is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _file_entry(path: str, blob: Blob) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "oid": blob.oid, "size": len(blob.data), "path": path}
    if blob.lfs:
        entry["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": len(blob.pointer)}
    return entry


def _tree_entries(files: Mapping[str, Blob], sha: str) -> dict[str, dict[str, object]]:
    entries: dict[str, dict[str, object]] = {p: _file_entry(p, b) for p, b in files.items()}
    for path in files:
        parts = path.split("/")
        for i in range(1, len(parts)):
            directory = "/".join(parts[:i])
            oid = hashlib.sha1(f"{sha}:{directory}".encode()).hexdigest()
            entries[directory] = {"type": "directory", "oid": oid, "size": 0, "path": directory}
    return entries


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: avoid 40 ms delayed-ACK stalls
    server_hub: HubServer

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        hub = self.server_hub
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = hub._take_fault(unquote(split.path))
        truncate = fault is not None and fault[0] == 0
        if fault is not None and not truncate:
            status, headers, payload = _error(fault[0], None, f"Injected fault {fault[0]}")
            if fault[1] is not None:
                headers["Retry-After"] = str(fault[1])
        else:
            try:
                status, headers, payload = self._route(method, split.path, query, body)
            except Exception as exc:  # surface server bugs as 500s with a message
                status, headers, payload = _error(500, None, f"server error: {type(exc).__name__}: {exc}")
        sent = 0 if method == "HEAD" else len(payload) // 2 if truncate else len(payload)
        # Logged before answering, so a client that got its response always finds its request in the log.
        record = RequestRecord(
            method,
            unquote(split.path),
            split.path,
            query,
            self.headers.get("Range"),
            status,
            sent,
            self.headers.get("Authorization") is not None,
        )
        hub._record(record)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if sent:
            self.wfile.write(payload[:sent])
        if truncate:
            self.close_connection = True  # the client sees a body shorter than Content-Length

    def _route(self, method: str, raw: str, query: dict[str, list[str]], body: bytes) -> Response:
        parts = raw.split("/")[1:]
        hub = self.server_hub
        repos = hub.repos
        if parts == ["api", "agent-harnesses"] and method == "GET":  # huggingface_hub's user-agent detection
            return _json({"standardEnvVars": [], "harnesses": {}})
        if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            repo_id, rest = f"{unquote(parts[2])}/{unquote(parts[3])}", parts[4:]
        elif parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            repo_id, rest = f"{unquote(parts[1])}/{unquote(parts[2])}", parts[3:]
        elif parts[:2] == ["api", "models"] and len(parts) >= 3 and parts[2]:
            repos = hub.models
            repo_id, rest = _split_model_id(parts[2:], hub.models, _MODEL_API_KINDS)
        elif parts[:1] != ["api"] and ("resolve" in parts[1:3]) and parts[0]:
            repos = hub.models
            repo_id, rest = _split_model_id(parts, hub.models, ("resolve",))
            if rest[:1] != ["resolve"] or len(rest) < 3:
                return _error(404, None, f"Not found: {raw}")
        else:
            return _error(404, None, f"Not found: {raw}")
        repo = repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository not found: {repo_id}")
        denied = self._check_auth(repo)
        if denied is not None:
            return denied
        if not rest:
            return self._info(repo, "main", query)
        kind, rev = rest[0], unquote(rest[1]) if len(rest) > 1 else ""
        sha = hub._resolve(repo, rev) if rev else None
        if kind == "refs" and len(rest) == 1:
            return self._refs(repo, query)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        path = unquote("/".join(rest[2:]))
        if kind == "revision" and len(rest) == 2:
            return self._info(repo, sha, query)
        if kind == "tree":
            return self._tree(repo, sha, path, query, raw)
        if kind == "paths-info" and method == "POST":
            form = parse_qs(body.decode())
            entries = _tree_entries(repo.commits[sha], sha)
            return _json([entries[p] for p in form.get("paths", []) if p in entries])
        if kind == "resolve" and method in ("GET", "HEAD"):
            return self._resolve_file(repo, sha, path)
        return _error(404, None, f"Not found: {raw}")

    def _check_auth(self, repo: Repo) -> Response | None:
        if repo.tokens is None:
            return None
        header = self.headers.get("Authorization") or ""
        if not header.startswith("Bearer "):
            return _error(
                401,
                "GatedRepo",
                f"Access to {repo.repo_type} {repo.repo_id} is restricted. You must have "
                "access to it and be authenticated to access it. Please log in.",
            )
        if header.removeprefix("Bearer ") not in repo.tokens:
            return _error(
                403,
                "GatedRepo",
                f"Access to {repo.repo_type} {repo.repo_id} is restricted and you are not in the authorized list.",
            )
        return None

    def _info(self, repo: Repo, revision: str, query: dict[str, list[str]]) -> Response:
        sha = self.server_hub._resolve(repo, revision)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        files = repo.commits[sha]
        blobs = query.get("blobs", [""])[0].lower() in ("true", "1")
        siblings = []
        for path in sorted(files):
            sibling: dict[str, object] = {"rfilename": path}
            if blobs:
                blob = files[path]
                sibling.update(size=len(blob.data), blobId=blob.oid)
                if blob.lfs:
                    sibling["lfs"] = {"sha256": blob.sha256, "size": len(blob.data), "pointerSize": len(blob.pointer)}
            siblings.append(sibling)
        info: dict[str, object] = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": sha,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": False,
            "gated": "manual" if repo.tokens is not None else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(len(b.data) for b in files.values()),
        }
        card = _card_data(files)
        if card is not None:
            info["cardData"] = card
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
            config = _json_file(files, "config.json")
            if config is not None:
                info["library_name"] = "transformers"
                info["config"] = {k: config[k] for k in ("architectures", "model_type") if k in config}
        return _json(info)

    def _tree(self, repo: Repo, sha: str, path: str, query: dict[str, list[str]], raw: str) -> Response:
        entries = _tree_entries(repo.commits[sha], sha)
        path = path.strip("/")
        if path and entries.get(path, {}).get("type") != "directory":
            return _error(404, "EntryNotFound", f'{path} does not exist on "{sha}"')
        recursive = query.get("recursive", [""])[0].lower() in ("true", "1")
        prefix = f"{path}/" if path else ""
        listed = [
            entries[p] for p in sorted(entries) if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])
        ]
        start = int(query.get("cursor", ["0"])[0] or 0)
        limit = min(int(query.get("limit", [str(self.server_hub.tree_page_size)])[0]), self.server_hub.tree_page_size)
        headers = {}
        if start + limit < len(listed):
            next_query = {k: v[0] for k, v in query.items()} | {"cursor": str(start + limit)}
            headers["Link"] = f'<{self.server_hub.url}{raw}?{urlencode(next_query)}>; rel="next"'
        return _json(listed[start : start + limit], headers)

    def _refs(self, repo: Repo, query: dict[str, list[str]]) -> Response:
        def refs(kind: str, items: Mapping[str, str]) -> list[dict[str, str]]:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": s} for n, s in sorted(items.items())]

        payload = {
            "branches": refs("heads", repo.branches),
            "tags": refs("tags", repo.tags),
            "converts": refs("convert", repo.converts),
        }
        if query.get("include_prs"):
            payload["pullRequests"] = []
        return _json(payload)

    def _resolve_file(self, repo: Repo, sha: str, path: str) -> Response:
        blob = repo.commits[sha].get(path)
        if blob is None:
            return _error(404, "EntryNotFound", f'{path} does not exist on "{sha}"')
        size = len(blob.data)
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": sha,
            "ETag": f'"{blob.etag}"',
        }
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(size)})
        spec = self.headers.get("Range")
        if spec is None:
            return 200, headers, blob.data
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip())
        if match is None or match.groups() == ("", ""):
            return 200, headers, blob.data  # multi-range or malformed: ignore the header, as RFC 9110 allows
        first, last = match.groups()
        if first == "":
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), min(int(last), size - 1) if last else size - 1
        if start >= size or start > end:
            return 416, {**headers, "Content-Range": f"bytes */{size}"}, b""
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return 206, headers, blob.data[start : end + 1]
