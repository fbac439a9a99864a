"""The gateways letsinfer is compared with: nginx as a plain reverse proxy and
the LiteLLM proxy, each started on 127.0.0.1 with its own config, one process
(nginx: one worker) like letsinfer's gateway.

LiteLLM is installed into its own virtual environment under the user's cache
(``~/.cache/letsinfer-bench/litellm-venv``), never into letsinfer's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.processes import Server, free_port

LITELLM_KEY = "sk-bench"
LITELLM_SPEC = "litellm[proxy]"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "letsinfer-bench"


class Unavailable(Exception):
    """A baseline cannot run here; the message says why."""


def _nginx_binary() -> str:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).exists():
            return candidate
    raise Unavailable("nginx is not installed (Debian package `nginx`; `./dev system-packages`)")


def nginx(
    upstream_port: int, work: Path, wrap: tuple[str, ...] = (), start_timeout: float = 60
) -> Server:
    """nginx in front of the mock, one worker; ``wrap``: a command that runs it
    (valgrind), then as one process (the worker's own code, no master)."""
    binary = _nginx_binary()
    prefix = work / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    port = free_port()
    temp = {name: prefix / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    conf = f"""
worker_processes 1;
daemon off;
master_process {"off" if wrap else "on"};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    upstream engine {{
        server 127.0.0.1:{upstream_port};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""
    (prefix / "nginx.conf").write_text(conf)
    argv = [*wrap, binary, "-e", str(prefix / "error.log"), "-p", str(prefix), "-c", "nginx.conf"]
    # Readiness: the proxied mock answers 404 on GET /.
    server = Server("nginx", argv, port, work, ready_path="/", ready_status=(404,))
    return server.start(start_timeout)


def litellm_venv(log: Path) -> Path:
    """The LiteLLM proxy's own venv, installed on first use (a few minutes)."""
    venv = CACHE / "litellm-venv"
    binary = venv / "bin" / "litellm"
    stamp = venv / ".installed"
    if stamp.exists() and binary.exists():
        return binary
    print(f"bench: installing {LITELLM_SPEC} into {venv} (first run only) ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        with log.open("wb") as out:
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", LITELLM_SPEC],
                check=True,
                timeout=1200,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    except (subprocess.SubprocessError, OSError) as exc:
        raise Unavailable(f"installing {LITELLM_SPEC} failed ({exc}); see {log}") from exc
    stamp.touch()
    return binary


def litellm(upstream_url: str, work: Path) -> Server:
    binary = litellm_venv(work / "litellm-install.log")
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        f"""model_list:
  - model_name: mock
    litellm_params:
      model: openai/mock
      api_base: {upstream_url}/v1
      api_key: none
general_settings:
  master_key: {LITELLM_KEY}
litellm_settings:
  telemetry: false
"""
    )
    env = {
        # Nothing but loopback: no price-map download, no telemetry.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
    }
    argv = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    server = Server("litellm", argv, port, work, env=env, ready_path="/health/liveliness", cwd=work)
    return server.start(timeout=180)
