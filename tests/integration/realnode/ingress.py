"""ingress-nginx's external-auth contract, played by Debian's nginx (``auth_request``).

An environment's Ingress (workspaces/pods.py ``_ingress``) carries ``auth-url`` (Camp's
``/workspaces/auth/<id>/``) and ``auth-always-set-cookie``. ingress-nginx turns that into an
``auth_request`` subrequest with ``X-Original-URI``/``X-Original-Method`` and the client's
cookies, passes the auth answer's ``Set-Cookie`` to the client, answers 401 when Camp refuses,
and otherwise proxies to the Ingress' Service. This config does the same, with the Service's
ClusterIP (kube-proxy's rules on this host) as the upstream. Started on a free loopback port,
in its own prefix; stopped by its PID file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.integration.realkube.harness import free_port, wait_until

CONF = """
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 64; }}
http {{
  access_log {prefix}/access.log;
  client_body_temp_path {prefix}/tmp; proxy_temp_path {prefix}/tmp;
  fastcgi_temp_path {prefix}/tmp; uwsgi_temp_path {prefix}/tmp; scgi_temp_path {prefix}/tmp;
  server {{
    listen 127.0.0.1:{port};
    location = /_external-auth {{
      internal;
      proxy_pass {auth_url};
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Original-URI $request_uri;
      proxy_set_header X-Original-Method $request_method;
      proxy_set_header X-Forwarded-Proto http;
      proxy_set_header Host {camp_host};
    }}
    location {path} {{
      auth_request /_external-auth;
      auth_request_set $auth_cookie $upstream_http_set_cookie;
      add_header Set-Cookie $auth_cookie always;
      proxy_pass http://{upstream};
      proxy_http_version 1.1;
      proxy_set_header Host $host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
    }}
  }}
}}
"""


class IngressNginx:
    def __init__(self, *, path: str, auth_url: str, camp_host: str, upstream: str) -> None:
        self.prefix = Path(tempfile.mkdtemp(prefix="camp-ingress-"))
        (self.prefix / "tmp").mkdir()
        self.port = free_port()
        (self.prefix / "nginx.conf").write_text(CONF.format(
            prefix=self.prefix, port=self.port, path=path, auth_url=auth_url, camp_host=camp_host,
            upstream=upstream))
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> IngressNginx:
        subprocess.run(["nginx", "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf")], check=True,
                       timeout=30)
        wait_until(lambda: (self.prefix / "nginx.pid").exists(), "nginx to start")
        return self

    def __exit__(self, *exc: object) -> None:
        pid_file = self.prefix / "nginx.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGQUIT)
            wait_until(lambda: not pid_file.exists(), "nginx to stop", timeout=30)

    def log(self) -> str:
        return (self.prefix / "error.log").read_text(errors="replace")[-3000:]
