"""A loopback stand-in for the Hugging Face Hub's HTTP API, so that push and pull run the real client.

No usable open-source Hub server exists for tests (see the project notes), so this one speaks the
routes huggingface_hub 2.4 calls to push (`create_repo`, `upload_file`/`upload_folder`,
`push_to_hub`) and to pull (`from_pretrained`, `hf_hub_download`, `snapshot_download`), with the
answers the client builds its cache from. Clients reach it with ``HF_ENDPOINT=<server.endpoint>`` and
``HF_HUB_DISABLE_XET=1`` set before ``huggingface_hub`` is imported: every file is committed as a
regular (base64, non-LFS) file, so no LFS or Xet transfer is involved.

Repositories live in a directory: ``<root>/<namespace>/<name>/commits/<sha>/<files>`` holds the full
tree of every commit and ``refs.json`` the branches. Every request is recorded in `requests`.
`cut` makes the next requests to a route break off, as a network does: the connection is dropped
half-way through the request, or after the server has done its work but before it answers.
Handling is bounded: loopback only, request bodies up to `MAX_BODY_BYTES`, a socket timeout per
connection, at most `MAX_REQUESTS` requests, and the server shuts itself down after `lifetime`
seconds if the test session has not stopped it first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

USER = "test-user"
TOKEN = "hf_loopback_test_token"
MAX_BODY_BYTES = 64 * 2**20
MAX_REQUESTS = 5000
SOCKET_TIMEOUT_SECONDS = 30
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"  # what a new Hub repo starts with

REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
REVISION = r"(?P<revision>[^/]+)"


def git_blob_oid(content: bytes) -> str:
    """The id git gives a file's content, which the Hub reports as a regular file's oid and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubError(Exception):
    """An error answer, with the `X-Error-Code` header the client maps to its exception classes."""

    def __init__(self, status: HTTPStatus, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.commit = status, code, commit


class RepoStore:
    """Model repositories on disk: commits as full trees, branches in refs.json; one lock for all."""

    def __init__(self, root: Path):
        self.root = root
        self.lock = threading.Lock()
        self.log: list[tuple[str, str, list[str]]] = []  # (repo_id, message, changed paths) per commit

    def _repo_dir(self, repo_id: str) -> Path:
        return self.root / repo_id

    def exists(self, repo_id: str) -> bool:
        return (self._repo_dir(repo_id) / "refs.json").is_file()

    def create(self, repo_id: str, private: bool = False) -> None:
        with self.lock:
            if self.exists(repo_id):
                raise HubError(HTTPStatus.CONFLICT, "You already created this model repo")
            self._repo_dir(repo_id).mkdir(parents=True)
            (self._repo_dir(repo_id) / "private.json").write_text(json.dumps(bool(private)))
            self._write_commit(repo_id, None, {".gitattributes": GITATTRIBUTES}, "initial commit")

    def is_private(self, repo_id: str) -> bool:
        return json.loads((self._repo_dir(repo_id) / "private.json").read_text())

    def create_branch(self, repo_id: str, branch: str, starting_point: str = "main") -> None:
        """A new branch at the commit ``starting_point`` names; 409 if it exists, as the Hub answers."""
        with self.lock:
            refs = json.loads((self._repo_dir(repo_id) / "refs.json").read_text())
            if branch in refs:
                raise HubError(HTTPStatus.CONFLICT, f"Reference already exists: refs/heads/{branch}")
            refs[branch] = refs[starting_point] if starting_point in refs else starting_point
            (self._repo_dir(repo_id) / "refs.json").write_text(json.dumps(refs))

    def resolve(self, repo_id: str, revision: str) -> str:
        """The commit sha of a branch name or of a (full) sha."""
        if not self.exists(repo_id):
            raise HubError(HTTPStatus.NOT_FOUND, f"Repository {repo_id} not found", "RepoNotFound")
        refs = json.loads((self._repo_dir(repo_id) / "refs.json").read_text())
        if revision in refs:
            return refs[revision]
        if re.fullmatch(r"[0-9a-f]{40}", revision) and (self._repo_dir(repo_id) / "commits" / revision).is_dir():
            return revision
        raise HubError(HTTPStatus.NOT_FOUND, f"Invalid rev id: {revision}", "RevisionNotFound")

    def files(self, repo_id: str, sha: str) -> dict[str, Path]:
        tree = self._repo_dir(repo_id) / "commits" / sha
        return {path.relative_to(tree).as_posix(): path for path in sorted(tree.rglob("*")) if path.is_file()}

    def commit(self, repo_id: str, revision: str, changes: dict[str, bytes | None], message: str) -> str:
        """Apply additions (bytes) and deletions (None) on top of `revision`; return the new sha."""
        with self.lock:
            parent = self.resolve(repo_id, revision)
            tree = {path: file.read_bytes() for path, file in self.files(repo_id, parent).items()}
            for path, content in changes.items():
                if content is None:
                    removed = [p for p in tree if p == path or p.startswith(path.rstrip("/") + "/")]
                    if not removed:
                        message = f"A file with this name doesn't exist: {path}"
                        raise HubError(HTTPStatus.NOT_FOUND, message, "EntryNotFound")
                    for p in removed:
                        del tree[p]
                else:
                    tree[path] = content
            sha = self._write_commit(repo_id, parent, tree, message, branch=revision)
            self.log.append((repo_id, message, sorted(changes)))
            return sha

    def _write_commit(self, repo_id, parent, tree: dict[str, bytes], message: str, branch: str = "main") -> str:
        digest = hashlib.sha1(f"{parent}\n{message}\n".encode())
        for path in sorted(tree):
            digest.update(f"{path}\0{git_blob_oid(tree[path])}\n".encode())
        sha = digest.hexdigest()
        folder = self._repo_dir(repo_id) / "commits" / sha
        for path, content in tree.items():
            target = folder / path
            if not target.resolve().is_relative_to(folder.resolve()):
                raise HubError(HTTPStatus.BAD_REQUEST, f"Invalid path in repo: {path}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        folder.mkdir(parents=True, exist_ok=True)
        refs_file = self._repo_dir(repo_id) / "refs.json"
        refs = json.loads(refs_file.read_text()) if refs_file.is_file() else {}
        refs[branch] = sha
        refs_file.write_text(json.dumps(refs))
        return sha


class HubRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects; every answer has a Content-Length
    timeout = SOCKET_TIMEOUT_SECONDS
    server: LoopbackHub

    # (method, path pattern, handler name)
    ROUTES = [
        ("GET", r"/api/whoami-v2", "whoami"),
        ("POST", r"/api/repos/create", "create_repo"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("POST", rf"/api/models/{REPO}/preupload/{REVISION}", "preupload"),
        ("POST", rf"/api/models/{REPO}/commit/{REVISION}", "commit"),
        ("GET", rf"/api/models/{REPO}(?:/revision/{REVISION})?", "repo_info"),
        ("POST", rf"/api/models/{REPO}/branch/(?P<branch>[^/]+)", "create_branch"),
        ("GET", rf"/api/models/{REPO}/tree/{REVISION}(?:/(?P<path>.+))?", "tree"),
        ("HEAD", rf"/{REPO}/resolve/{REVISION}/(?P<path>.+)", "resolve"),
        ("GET", rf"/{REPO}/resolve/{REVISION}/(?P<path>.+)", "resolve"),
    ]

    def log_message(self, format, *args):  # the record in `server.requests` is enough
        pass

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        with self.server.lock:
            self.server.requests.append((method, unquote(url.path)))
            too_many = len(self.server.requests) > MAX_REQUESTS
        try:
            if too_many:
                raise HubError(HTTPStatus.SERVICE_UNAVAILABLE, f"more than {MAX_REQUESTS} requests: test runaway?")
            for route_method, pattern, name in self.ROUTES:
                match = re.fullmatch(pattern, url.path)
                if route_method == method and match:
                    arguments = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                    self.cut_when = self.server.take_cut(name)
                    if self.cut_when == "mid-request":
                        self.rfile.read(int(self.headers.get("Content-Length") or 0) // 2)
                        self._drop()
                        return
                    getattr(self, name)(**arguments)
                    return
            raise HubError(HTTPStatus.NOT_FOUND, f"{method} {url.path} is not implemented by the loopback Hub")
        except HubError as error:
            headers = {"X-Error-Message": str(error)}
            if error.code:
                headers["X-Error-Code"] = error.code
            if error.commit:
                headers["X-Repo-Commit"] = error.commit
            self._send_json({"error": str(error)}, error.status, headers)
        except Exception as error:  # a malformed request: answer it rather than drop the connection
            self._send_json({"error": f"{type(error).__name__}: {error}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    # --- plumbing -------------------------------------------------------------------------------

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            raise HubError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length; chunked bodies are not supported")
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise HubError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length)

    def _json_body(self):
        try:
            return json.loads(self._body() or b"{}")
        except json.JSONDecodeError as error:
            raise HubError(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {error}") from None

    def _require_token(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            raise HubError(HTTPStatus.UNAUTHORIZED, "Invalid credentials in Authorization header")

    def _drop(self) -> None:
        """Close the connection without an answer, as a network that breaks off does."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, status: HTTPStatus, body: bytes, headers: dict[str, str]):
        if getattr(self, "cut_when", None) == "before-answer":  # the work is done, the answer lost
            self._drop()
            return
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))  # for HEAD too: the size of what GET sends
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, payload, status: HTTPStatus = HTTPStatus.OK, headers: dict[str, str] | None = None):
        self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _endpoint(self) -> str:
        return f"http://{self.headers.get('Host')}"

    # --- routes ---------------------------------------------------------------------------------

    def whoami(self):
        self._require_token()
        self._send_json(
            {
                "type": "user",
                "id": "0",
                "name": USER,
                "fullname": "Test User",
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "tests", "role": "write"}},
            }
        )

    def create_repo(self):
        self._require_token()
        payload = self._json_body()
        if payload.get("type", "model") != "model":
            raise HubError(HTTPStatus.BAD_REQUEST, "the loopback Hub stores model repos only")
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        url = f"{self._endpoint()}/{repo_id}"
        try:
            private = payload.get("visibility", "private" if payload.get("private") else "public") == "private"
            self.server.store.create(repo_id, private=private)  # "visibility" since huggingface_hub 1.x, else "private"
        except HubError as error:
            self._send_json({"error": str(error), "url": url}, error.status)
            return
        self._send_json({"url": url, "name": repo_id, "id": repo_id})

    def validate_yaml(self):
        """The Hub rejects a README.md whose front matter is not a YAML mapping (it checks more)."""
        content = self._json_body().get("content", "")
        match = re.match(r"^---\n(.*?)\n---\n", content, re.DOTALL)
        errors = []
        if match:
            try:
                metadata = yaml.safe_load(match.group(1))
                if not isinstance(metadata, dict):
                    errors.append("metadata must be a YAML mapping")
            except yaml.YAMLError as error:
                errors.append(f"invalid YAML: {error}")
        status = HTTPStatus.BAD_REQUEST if errors else HTTPStatus.OK
        self._send_json({"errors": [{"message": m} for m in errors], "warnings": []}, status)

    def preupload(self, repo: str, revision: str):
        self._require_token()
        sha = self.server.store.resolve(repo, revision)
        existing = self.server.store.files(repo, sha)
        files = self._json_body().get("files", [])
        self._send_json(
            {
                "files": [
                    {
                        "path": file["path"],
                        "uploadMode": "regular",
                        "shouldIgnore": False,
                        "oid": git_blob_oid(existing[file["path"]].read_bytes()) if file["path"] in existing else None,
                    }
                    for file in files
                ],
                "commitOid": sha,
            }
        )

    def commit(self, repo: str, revision: str):
        self._require_token()
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(HTTPStatus.BAD_REQUEST, "a commit starts with a header line")
        header, changes = lines[0]["value"], {}
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                changes[value["path"]] = base64.b64decode(value["content"])
            elif key in ("deletedFile", "deletedFolder"):
                changes[value["path"]] = None
            else:
                raise HubError(HTTPStatus.BAD_REQUEST, f"the loopback Hub takes regular files only, not {key!r}")
        parent = header.get("parentCommit")
        if parent is not None and parent != self.server.store.resolve(repo, revision):
            raise HubError(HTTPStatus.PRECONDITION_FAILED, "parentCommit is not the head of the branch")
        sha = self.server.store.commit(repo, revision, changes, header["summary"])
        self._send_json(
            {
                "success": True,
                "commitOid": sha,
                "commitUrl": f"{self._endpoint()}/{repo}/commit/{sha}",
                "pullRequestUrl": None,
            }
        )

    def repo_info(self, repo: str, revision: str = "main"):
        sha = self.server.store.resolve(repo, revision)
        self._send_json(
            {
                "id": repo,
                "modelId": repo,
                "author": repo.split("/")[0],
                "sha": sha,
                "private": self.server.store.is_private(repo),
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": [{"rfilename": path} for path in self.server.store.files(repo, sha)],
            }
        )

    def create_branch(self, repo: str, branch: str):
        self._require_token()
        self.server.store.create_branch(repo, branch, self._json_body().get("startingPoint") or "main")
        self._send_json({})

    def tree(self, repo: str, revision: str, path: str = ""):
        sha = self.server.store.resolve(repo, revision)
        prefix = path.strip("/") + "/" if path else ""
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        entries, folders = [], set()
        for file_path, file in self.server.store.files(repo, sha).items():
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            content = file.read_bytes()
            entries.append({"type": "file", "path": file_path, "size": len(content), "oid": git_blob_oid(content)})
        if prefix and not entries and not folders:
            raise HubError(HTTPStatus.NOT_FOUND, f"{path} does not exist at {revision}", "EntryNotFound", sha)
        entries += [{"type": "directory", "path": folder, "oid": "0" * 40} for folder in sorted(folders)]
        self._send_json(entries)

    def resolve(self, repo: str, revision: str, path: str):
        sha = self.server.store.resolve(repo, revision)
        file = self.server.store.files(repo, sha).get(path)
        if file is None:
            raise HubError(HTTPStatus.NOT_FOUND, f"{path} does not exist at {revision}", "EntryNotFound", sha)
        content = file.read_bytes()
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{git_blob_oid(content)}"',
            "Content-Type": "application/octet-stream",
        }
        self._send(HTTPStatus.OK, content, headers)


class LoopbackHub(ThreadingHTTPServer):
    """The server; `start()` serves from a daemon thread, `stop()` (or the lifetime timer) ends it."""

    daemon_threads = True

    def __init__(self, root: Path, lifetime: float = 900.0):
        super().__init__(("127.0.0.1", 0), HubRequestHandler)
        self.store = RepoStore(Path(root))
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, name="loopback-hub", daemon=True)
        self._deadline = threading.Timer(lifetime, self.stop)
        self._deadline.daemon = True
        self._cuts: dict[str, list[str]] = {}  # route name -> how each of its next requests breaks off

    def cut(self, route: str, times: int = 1, when: str = "mid-request") -> None:
        """Break off the next ``times`` requests to ``route`` (a handler name: "commit", "preupload", ...):
        ``when`` "mid-request" drops the connection after half the request body, with nothing done;
        "before-answer" does the work (a commit is made) and drops the connection instead of answering."""
        if when not in ("mid-request", "before-answer"):
            raise ValueError(f"when must be 'mid-request' or 'before-answer', got {when!r}")
        with self.lock:
            self._cuts.setdefault(route, []).extend([when] * times)

    def take_cut(self, route: str) -> str | None:
        with self.lock:
            pending = self._cuts.get(route)
            return pending.pop(0) if pending else None

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LoopbackHub:
        self._thread.start()
        self._deadline.start()
        return self

    def stop(self) -> None:
        self._deadline.cancel()
        if self._thread.is_alive():
            self.shutdown()
        self.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The tree of `repo_id` at `revision`, read from the store (for assertions)."""
        sha = self.store.resolve(repo_id, revision)
        return {path: file.read_bytes() for path, file in self.store.files(repo_id, sha).items()}

    def trees(self, repo_id: str) -> list[set[str]]:
        """The files of every commit ever made to `repo_id` (what a reader could have seen at some moment)."""
        commits = self.store.root / repo_id / "commits"
        return [set(self.store.files(repo_id, sha.name)) for sha in sorted(commits.iterdir())]

    def commits(self, repo_id: str) -> list[tuple[str, list[str]]]:
        """(message, paths added or deleted) of each commit to `repo_id`, oldest first."""
        return [(message, paths) for repo, message, paths in self.store.log if repo == repo_id]


def client_environment(hub: LoopbackHub, home: Path, offline: bool = False) -> dict[str, str]:
    """Environment variables that point a fresh huggingface_hub process at `hub`, with its own cache."""
    return {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_DISABLE_XET": "1",
        "HF_TOKEN": TOKEN,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_OFFLINE": "1" if offline else "0",
    }


__all__ = ["LoopbackHub", "TOKEN", "USER", "client_environment", "git_blob_oid"]
