#!/usr/bin/env bash
# What the test suite needs from the machine, in one place for `make test` and `.ci/run`
# (which only calls `make test`), so the two cannot drift.
#
#   tools/test-deps.sh           as root: install what is missing and start PostgreSQL / Redis;
#                                otherwise: print exactly what to install and exit 1
#   tools/test-deps.sh --check   only report (exit 1 when something is missing)
#
# Non-interactive (CI=true, no stdin). `make demo` never calls this: the demo needs only
# Python and pip packages.
set -euo pipefail

check_only=0
[ "${1:-}" = "--check" ] && check_only=1
PYTHON=${PYTHON:-python3.11}

# Each line: Debian package, then the file whose absence means it is missing.
# Keep the why next to each: a package nobody can name a reason for goes.
packages=(
  "make              /usr/bin/make"                  # the README's two commands
  "gcc               /usr/bin/gcc"                   # python-ldap builds from source (requirements-ldap.txt)
  "libldap2-dev      /usr/include/ldap.h"            # python-ldap's headers
  "libsasl2-dev      /usr/include/sasl/sasl.h"       # python-ldap's headers
  "postgresql        /usr/bin/pg_ctlcluster"         # the database every integration test uses
  "redis-server      /usr/bin/redis-server"          # Celery broker, cache, Channels layer
  "slapd             /usr/sbin/slapd"                # LDAP sign-in tests (tests/integration/sso)
  "ldap-utils        /usr/bin/ldapadd"               # seeds that slapd
  "chromium          /usr/bin/chromium"              # browser tests (Playwright drives Debian's chromium)
  "prometheus        /usr/bin/prometheus"            # the utilisation feed's test scrapes a real one
  "etcd-server       /usr/bin/etcd"                  # the real kube-apiserver in ../shared/tools needs etcd
  "xmlsec1           /usr/bin/xmlsec1"               # SAML signatures (pysaml2 calls the xmlsec1 binary)
  # The real-node tier (tests/integration/realnode: ../shared/tools/node runs a real kubelet):
  "containerd        /usr/bin/containerd"            # the node's container runtime (CRI)
  "runc              /usr/sbin/runc"                 # containerd's OCI runtime
  "containernetworking-plugins /usr/lib/cni/bridge"  # the node's pod network (bridge, host-local, loopback)
  "iptables          /usr/sbin/iptables"             # kube-proxy's Service rules, the bridge's FORWARD rules
  "conntrack         /usr/sbin/conntrack"            # kube-proxy clears stale UDP flows with it
  "openssl           /usr/bin/openssl"               # the apiserver's CA and certificates
  "curl              /usr/bin/curl"                  # start-node.sh's health checks
  "iproute2          /usr/sbin/ip"                   # the node's bridge
  "debootstrap       /usr/sbin/debootstrap"          # builds the tier's images (Debian root filesystems)
  "nginx-light       /usr/sbin/nginx"                # ingress-nginx's external auth, played by nginx's auth_request
)

missing=()
for line in "${packages[@]}"; do
  read -r pkg file <<<"$line"
  [ -e "$file" ] || missing+=("$pkg")
done
# Python's own headers, for python-ldap (a Debian python3.11 needs python3.11-dev; a
# python built from source, e.g. pyenv, ships them).
if command -v "$PYTHON" >/dev/null 2>&1; then
  if ! "$PYTHON" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    missing+=(python3.11-dev)
  fi
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3.11-venv)
else
  missing+=(python3.11 python3.11-venv python3.11-dev)
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$check_only" = 1 ] || [ "$(id -u)" != 0 ]; then
    echo "The test suite needs these Debian packages, which are missing:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    echo "(run that as root, or run 'make test' as root and it installs them)" >&2
    exit 1
  fi
  echo "test-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq </dev/null
  apt-get install -y -qq "${missing[@]}" </dev/null >/dev/null
fi

# PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (DATABASE_URL / REDIS_URL point
# the suite elsewhere; then these are left alone).
if [ -z "${DATABASE_URL:-}" ] && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  if [ "$check_only" = 1 ] || [ "$(id -u)" != 0 ]; then
    echo "PostgreSQL is not answering on 127.0.0.1:5432: start it, or set DATABASE_URL" >&2
    exit 1
  fi
  version=$(ls /etc/postgresql | sort -V | tail -n1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if [ -z "${REDIS_URL:-}" ] && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if [ "$check_only" = 1 ] || [ "$(id -u)" != 0 ]; then
    echo "Redis is not answering on 127.0.0.1:6379: start it, or set REDIS_URL" >&2
    exit 1
  fi
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
# The suite connects as user postgres without a password (DESIGN.md §6).
if [ -z "${DATABASE_URL:-}" ] && ! psql -h 127.0.0.1 -U postgres -Atqc 'select 1' >/dev/null 2>&1; then
  echo "PostgreSQL answers but refuses 'postgres' without a password on 127.0.0.1:" >&2
  echo "  set DATABASE_URL=postgres://USER:PASSWORD@127.0.0.1:5432/camp for the suite" >&2
  exit 1
fi
