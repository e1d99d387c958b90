"""Checkpoints by name, as Hugging Face users get them: from the hub's cache, else downloaded into it.

The cache is the hub's own layout, so that transformers, huggingface_hub and spec reuse each other's downloads:
  $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub
    models--openai-community--gpt2-xl/refs/main                      the revision that main resolved to
    models--openai-community--gpt2-xl/snapshots/<revision>/config.json, model.safetensors
HF_ENDPOINT is the hub's base URL (a mirror; the tests' local server); HF_HUB_OFFLINE=1 forbids any network access.
The environment is read at each call, not at import. A download is complete or absent: the weights are written to a
temporary file, checked against the announced length and their own safetensors header, then renamed into place.
"""
from __future__ import annotations
import hashlib, http.client, json, os, pathlib, struct, sys, tempfile, urllib.error, urllib.request

FILES = ("config.json", "model.safetensors")

class HubError(Exception):
  """A checkpoint that cannot be had by name: the message says why and what to do."""

def cache_dir() -> pathlib.Path:
  if os.environ.get("HF_HUB_CACHE"): return pathlib.Path(os.environ["HF_HUB_CACHE"])
  if os.environ.get("HF_HOME"): return pathlib.Path(os.environ["HF_HOME"]) / "hub"
  return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "huggingface" / "hub"

def offline() -> bool: return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")

def endpoint() -> str: return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")

def repo_dir(repo:str) -> pathlib.Path: return cache_dir() / f"models--{repo.replace('/', '--')}"

def cached(repo:str) -> pathlib.Path|None:
  """The snapshot holding both files: the one refs/main names, else the newest complete one; None if there is none."""
  root = repo_dir(repo)
  ref = root / "refs" / "main"
  snapshots = [root / "snapshots" / ref.read_text().strip()] if ref.is_file() else \
    sorted((root / "snapshots").glob("*"), key=lambda d: d.stat().st_mtime, reverse=True)
  return next((d for d in snapshots if all((d / f).is_file() for f in FILES)), None)

def snapshot(repo:str) -> pathlib.Path:
  """A directory with config.json and model.safetensors for repo: from the cache, else downloaded into it."""
  if (found := cached(repo)) is not None: return found
  if offline():
    raise HubError(f"{repo} is not in the Hugging Face cache ({repo_dir(repo)}) and HF_HUB_OFFLINE is set: download it "
                   "where there is network (unset HF_HUB_OFFLINE), or pass a local checkpoint directory")
  config, revision = _get(repo, "config.json")
  snap = repo_dir(repo) / "snapshots" / revision
  snap.mkdir(parents=True, exist_ok=True)
  _download_weights(repo, snap / "model.safetensors")
  _write_atomically(snap / "config.json", config)        # last: a snapshot is complete once both files are there
  _write_atomically(repo_dir(repo) / "refs" / "main", revision.encode())
  return snap

def _url(repo:str, file:str) -> str: return f"{endpoint()}/{repo}/resolve/main/{file}"

def _open(repo:str, file:str):
  request = urllib.request.Request(_url(repo, file), headers={"User-Agent": "spec"})
  try: return urllib.request.urlopen(request, timeout=30)
  except urllib.error.HTTPError as e:
    raise HubError(f"cannot download {_url(repo, file)}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e:
    raise HubError(f"cannot download {repo} from {endpoint()} ({getattr(e, 'reason', e)}): offline? set "
                   "HF_HUB_OFFLINE=1 with the model in the Hugging Face cache, or pass a local checkpoint directory") \
                   from None

def _get(repo:str, file:str) -> tuple[bytes, str]:
  """A small file and the revision main resolved to (the hub's X-Repo-Commit; else a hash of the file)."""
  with _open(repo, file) as r:
    try: body = r.read()
    except (OSError, http.client.HTTPException) as e:
      raise HubError(f"download of {_url(repo, file)} failed ({e!r})") from None
    return body, r.headers.get("X-Repo-Commit") or hashlib.sha1(body).hexdigest()

def _download_weights(repo:str, dest:pathlib.Path) -> None:
  """Stream the weights into a temporary file beside dest, with progress on a terminal; rename only when complete."""
  fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".incomplete")
  os.close(fd)
  tmp = pathlib.Path(name)
  try:
    with _open(repo, dest.name) as r, open(tmp, "wb") as f:
      total, done = int(r.headers.get("Content-Length") or 0), 0
      try:
        while chunk := r.read(1 << 20):
          done += f.write(chunk)
          if sys.stderr.isatty():
            print(f"\rdownloading {repo} {dest.name}: {done/1e6:.0f} of {total/1e6:.0f} MB", end="", file=sys.stderr)
      except (OSError, http.client.HTTPException) as e:
        raise HubError(f"download of {_url(repo, dest.name)} was cut off after {done} bytes ({e!r}); nothing was "
                       "cached") from None
      if sys.stderr.isatty(): print(file=sys.stderr)
    if total and done < total:
      raise HubError(f"download of {_url(repo, dest.name)} was cut off: {done} of {total} bytes; nothing was cached")
    _check_safetensors(tmp, _url(repo, dest.name))
    tmp.rename(dest)
  finally: tmp.unlink(missing_ok=True)

def safetensors_header(fn:pathlib.Path) -> tuple[dict, int]:
  """A safetensors file's tensors (name -> dtype, shape, data_offsets) and where their data starts."""
  with open(fn, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
  return {k: v for k, v in header.items() if k != "__metadata__"}, 8 + n

def safetensors_extent(fn:pathlib.Path) -> tuple[int, int]:
  """(bytes the safetensors header describes, bytes the file has): a complete file's first is <= its second."""
  header, start = safetensors_header(fn)
  return start + max((v["data_offsets"][1] for v in header.values()), default=0), fn.stat().st_size

def _check_safetensors(fn:pathlib.Path, what:str) -> None:
  """The header's tensors must all lie within the bytes that arrived (a server may announce a short length)."""
  try: end, size = safetensors_extent(fn)
  except (struct.error, ValueError, KeyError, TypeError) as e:
    raise HubError(f"{what} is not a valid safetensors file ({e}); nothing was cached") from None
  if end > size:
    raise HubError(f"download of {what} is incomplete: its header describes {end} bytes, {size} arrived; nothing was "
                   "cached")

def _write_atomically(fn:pathlib.Path, data:bytes) -> None:
  fn.parent.mkdir(parents=True, exist_ok=True)
  tmp = fn.with_name(f".{fn.name}.incomplete")
  tmp.write_bytes(data)
  tmp.rename(fn)
