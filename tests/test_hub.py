"""Weights by name through the Hugging Face cache and HF_ENDPOINT, offline: a local server on 127.0.0.1 serves the shared
checkpoints in the hub's URL layout (/<org>/<repo>/resolve/main/<file>) under hub names."""
import contextlib, http.server, os, shutil, subprocess, sys, threading
import numpy as np
import pytest
from tinygrad import Tensor
import models
from models import hub
from conftest import ROOT, shared_dir

REVISION = "0123456789abcdef0123456789abcdef01234567"

class Hub(http.server.ThreadingHTTPServer):
  """Serves files[url path] = bytes with the hub's headers; cut: send only the first `cut` bytes of model.safetensors
  (with the full Content-Length announced, then close), or announce only what it sends (announce_cut)."""
  def __init__(self, files:dict, cut:int=0, announce_cut:bool=False):
    self.files, self.cut, self.announce_cut, self.requests = files, cut, announce_cut, []
    super().__init__(("127.0.0.1", 0), Handler)

class Handler(http.server.BaseHTTPRequestHandler):
  def do_GET(self):
    srv = self.server
    srv.requests.append(self.path)
    if self.path not in srv.files: return self.send_error(404)
    body = srv.files[self.path]
    sent = body[:srv.cut] if srv.cut and self.path.endswith(".safetensors") else body
    self.send_response(200)
    self.send_header("Content-Length", str(len(sent) if srv.announce_cut else len(body)))
    self.send_header("X-Repo-Commit", REVISION)
    self.end_headers()
    self.wfile.write(sent)
    self.wfile.flush()
    self.close_connection = True
  def log_message(self, *args): pass

def served(names=("gpt2",)) -> dict:
  """docs-target under the hub names (its config.json says what it is: 4 layers of 256)."""
  src = shared_dir() / "docs-target"
  return {f"/openai-community/{n}/resolve/main/{f}": (src / f).read_bytes() for n in names for f in hub.FILES}

@contextlib.contextmanager
def running(server:Hub):
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try: yield f"http://127.0.0.1:{server.server_address[1]}"
  finally: server.shutdown(); server.server_close(); thread.join(timeout=5)

@pytest.fixture
def cache(tmp_path, monkeypatch):
  for var in ("HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "HF_ENDPOINT"): monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  return tmp_path / "hub"

def same_model(model) -> bool:
  reference = models.load(str(shared_dir() / "docs-target"), "float32")
  x = Tensor([[464, 11361, 28846]])
  return np.allclose(model.forward(x, 0).numpy(), reference.forward(x, 0).numpy())

def test_download_into_the_cache_then_load_without_a_server(cache, monkeypatch):
  server = Hub(served())
  with running(server) as url:
    monkeypatch.setenv("HF_ENDPOINT", url)
    model = models.load("gpt2", "float32")
  assert sorted(server.requests) == ["/openai-community/gpt2/resolve/main/config.json", "/openai-community/gpt2/resolve/main/model.safetensors"]
  assert model.cfg.n_layer == 4 and model.cfg.n_embd == 256 and same_model(model)   # built from the downloaded config.json
  repo = cache / "models--openai-community--gpt2"
  assert (repo / "refs" / "main").read_text() == REVISION
  assert sorted(p.name for p in (repo / "snapshots" / REVISION).iterdir()) == ["config.json", "model.safetensors"]
  # the server is gone: the second load reads the cache and opens no connection
  assert same_model(models.load("gpt2", "float32"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  assert same_model(models.load("gpt2", "float32"))

@pytest.mark.parametrize("announce_cut", [False, True], ids=["fewer-bytes-than-announced", "header-beyond-the-data"])
def test_a_cut_download_is_one_error_and_caches_nothing(cache, monkeypatch, announce_cut):
  files = served()
  size = len(files["/openai-community/gpt2/resolve/main/model.safetensors"])
  with running(Hub(files, cut=size // 2, announce_cut=announce_cut)) as url:
    monkeypatch.setenv("HF_ENDPOINT", url)
    with pytest.raises(models.CheckpointError) as e: models.load("gpt2", "float32")
  assert "\n" not in str(e.value) and "nothing was cached" in str(e.value)
  assert ("cut off" in str(e.value)) != announce_cut and ("header describes" in str(e.value)) == announce_cut
  assert hub.cached("openai-community/gpt2") is None
  assert not [p for p in cache.rglob("*") if p.is_file()], "a file of the cut download was left in the cache"
  # the next run, with a good server, downloads it whole
  with running(Hub(files)) as url:
    monkeypatch.setenv("HF_ENDPOINT", url)
    assert same_model(models.load("gpt2", "float32"))

@pytest.mark.parametrize("where", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_model_placed_in_the_cache_layout_loads_offline(tmp_path, monkeypatch, where):
  for var in ("HF_HUB_CACHE", "HF_HOME", "HF_ENDPOINT"): monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv(where, str(tmp_path / "hf"))
  monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")        # nothing listens: any network attempt fails
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  repo = (tmp_path / "hf" / ("hub" if where == "HF_HOME" else "")) / "models--openai-community--gpt2-xl"
  shutil.copytree(shared_dir() / "docs-target", repo / "snapshots" / REVISION)
  (repo / "snapshots" / "older").mkdir()                          # refs/main decides, not what else lies there
  (repo / "refs").mkdir(); (repo / "refs" / "main").write_text(REVISION)
  assert same_model(models.load("gpt2-xl", "float32"))

def test_offline_without_the_model_names_it_and_what_to_do(cache, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(models.CheckpointError) as e: models.load("gpt2-medium", "float32")
  assert "openai-community/gpt2-medium is not in the Hugging Face cache" in str(e.value) and "local checkpoint directory" in str(e.value)

def test_unreachable_endpoint_asks_for_the_cache_or_a_directory(cache, monkeypatch):
  monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
  with pytest.raises(models.CheckpointError) as e: models.load("gpt2", "float32")
  assert "cannot download openai-community/gpt2 from http://127.0.0.1:9" in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)

def test_cli_cut_download_is_one_line_exit_2(cache):
  files = served(("gpt2", "gpt2-xl"))
  with running(Hub(files, cut=1000)) as url:
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_CACHE": str(cache), "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "spec.py", "--prompt", "x", "--dtype", "float32"], cwd=ROOT, capture_output=True,
                         text=True, env=env, timeout=300)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and "was cut off" in out.stderr, out.stderr
  assert hub.cached("openai-community/gpt2-xl") is None
