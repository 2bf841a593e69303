"""Image reference validation, after the grammar of the distribution project's
``reference`` package (docker/distribution, reference/reference.go), written anew:

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [ domain "/" ] path-component ( "/" path-component )*
    domain     := host [ ":" port ]            (a first component with ".", ":" or "localhost")
    path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := "sha256:" 64 lowercase hex (the only algorithm registries serve today)

The name (domain and path) is at most 255 characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$")
_HOST_LABEL = re.compile(r"^(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])$")
_IPV6 = re.compile(r"^\[[0-9A-Fa-f:.]+\]$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME_MAX = 255


class ReferenceError(ValueError):  # noqa: N818 (a message for users, not a program error)
    pass


@dataclass(frozen=True)
class Reference:
    domain: str
    path: str
    tag: str
    digest: str

    @property
    def registry_host(self) -> str:
        """Where it is pulled from; Docker Hub when no domain is named."""
        return self.domain or "docker.io"


def _domain_ok(domain: str) -> bool:
    host, _, port = domain.rpartition(":") if not domain.endswith("]") else (domain, "", "")
    if not host:
        host, port = domain, ""
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        return False
    if _IPV6.match(host):
        return True
    return all(_HOST_LABEL.match(label) for label in host.split("."))


def parse_reference(text: str) -> Reference:
    """Split and check an image reference; raise ReferenceError naming what is wrong."""
    ref = text.strip()
    if not ref:
        raise ReferenceError("Give an image reference, e.g. "
                             "docker.io/pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime.")
    if any(c.isspace() for c in ref):
        raise ReferenceError("An image reference contains no spaces.")
    name, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ReferenceError("The digest must be sha256: followed by 64 lowercase hex digits.")
    tag = ""
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.match(tag):
            raise ReferenceError(f"Invalid tag {tag!r}: letters, digits, '_', '.', '-', at most 128, "
                                 "not starting with '.' or '-'.")
    if not name:
        raise ReferenceError("The image name is missing.")
    if len(name) > NAME_MAX:
        raise ReferenceError(f"The image name is longer than {NAME_MAX} characters.")
    parts = name.split("/")
    domain = ""
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"
                           or parts[0] != parts[0].lower()):
        domain = parts.pop(0)
        if not _domain_ok(domain):
            raise ReferenceError(f"Invalid registry host {domain!r}.")
    for part in parts:
        if not _COMPONENT.match(part):
            raise ReferenceError(
                f"Invalid path component {part!r}: lowercase letters and digits, separated by "
                "'.', '_', '__' or '-'.")
    return Reference(domain=domain, path="/".join(parts), tag=tag, digest=digest)


def host_of(server: str) -> str:
    """A registry server as users write it (maybe with https:// and a path) → host[:port]."""
    s = server.strip()
    for prefix in ("https://", "http://"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s.split("/")[0].lower()
